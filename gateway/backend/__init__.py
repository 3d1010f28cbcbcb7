"""Object-store backends, and ``open_store`` which builds one from a URL.

URLs:

- ``s3://bucket`` or ``s3://bucket/some/prefix`` -> ``S3Store``. Query parameters set
  defaults for the keyword arguments: ``endpoint`` (alias ``endpoint_url``), ``region``,
  ``addressing`` (alias ``addressing_style``: path | virtual | auto), ``profile``,
  ``anonymous`` (1/true). Keyword arguments win over the query; ``s3=`` (an ``S3Config``, the
  ``[s3]`` section) supplies those not given; ``lean_http`` (keyword only: None follows
  ``NFSGW_S3_LEAN_HTTP``, see ``S3Store``). Without a region the store
  follows the AWS chain on first use (``credentials.resolve_region``).
- ``file:///abs/dir`` -> ``LocalStore`` (``create=1`` makes the directory).

The store always works with full keys; the export prefix is ``parse_store_url(url).prefix``
(normalised to end in '/', or '' for the whole bucket / directory).
Decisions that depend on the kind of store read ``store.traits`` (``StoreTraits``), never the
URL's scheme; ``check_store_url`` validates a configuration's URL, ``StoreUrl.space()`` tells
whether two URLs overlap.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, unquote, urlsplit

from gateway.backend.base import ObjectStore, RequestObserver, StoreTraits

if TYPE_CHECKING:
    from gateway.backend.config import ChecksumPolicy, RetryPolicy, S3Config
    from gateway.backend.s3 import PayloadSigning

__all__ = [
    "StoreTraits",
    "StoreUrl",
    "StoreUrlError",
    "check_store_url",
    "open_store",
    "parse_store_url",
]

_TRUE = frozenset({"1", "true", "yes", "on"})


@dataclass(frozen=True, slots=True)
class StoreUrl:
    """A parsed store URL. ``location`` is the bucket (s3) or the directory (file); ``url``
    the text it was parsed from."""

    scheme: str
    location: str
    prefix: str
    options: dict[str, str] = field(default_factory=dict)
    url: str = field(default="", compare=False)

    def space(self) -> tuple[str, str]:
        """(store, key prefix) the URL covers: two URLs overlap when their stores are equal
        and one prefix starts with the other (a directory counts as a prefix)."""
        if self.scheme == "file":
            return "file", self.location.rstrip("/") + "/"
        return f"s3:{self.location}", self.prefix

    def canonical(self) -> str:
        """The URL as a store names it: ``s3://bucket/prefix/`` (query dropped); a ``file``
        URL as given."""
        if self.scheme == "s3":
            return f"s3://{self.location}/{self.prefix}"
        return self.url


class StoreUrlError(ValueError):
    """A store URL that cannot be used: ``str(e)`` says why, ``hint`` what would do."""

    def __init__(self, message: str, hint: str) -> None:
        super().__init__(message)
        self.hint = hint


def parse_store_url(url: str) -> StoreUrl:
    parts = urlsplit(url)
    options = dict(parse_qsl(parts.query, keep_blank_values=True))
    if parts.scheme == "s3":
        bucket = parts.netloc
        if not bucket:
            raise ValueError(f"{url}: no bucket (expected s3://bucket/prefix)")
        prefix = unquote(parts.path).lstrip("/")
        if prefix and not prefix.endswith("/"):
            prefix += "/"
        return StoreUrl("s3", bucket, prefix, options, url)
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise ValueError(f"{url}: only local file URLs (file:///dir)")
        path = unquote(parts.path)
        if not path.startswith("/"):
            raise ValueError(f"{url}: the directory must be absolute (file:///dir)")
        return StoreUrl("file", path, "", options, url)
    raise ValueError(f"{url}: unsupported store URL (use s3://bucket/prefix or file:///dir)")


def check_store_url(url: str, *, object_store: bool = False) -> StoreUrl:
    """``url`` parsed, or ``StoreUrlError`` saying why it names no store (a configuration's
    check; ``open_store`` takes more). ``object_store``: only a bucket will do (a pack)."""
    try:
        u = parse_store_url(url)
    except ValueError as e:
        raise StoreUrlError(str(e), 'use "s3://BUCKET/PREFIX/" or "file:///DIR"') from None
    if u.scheme == "s3" and not re.fullmatch(r"[A-Za-z0-9._-]{1,255}", u.location):
        raise StoreUrlError(
            f"{u.location!r} is not a bucket name", "bucket names are letters, digits, '.', '-'"
        )
    if not re.match(r"^(s3://[^/]+(/.*)?|file:///.+)$", url):
        raise StoreUrlError(
            f"{url!r} is not s3://BUCKET[/PREFIX] or file:///DIR", 'e.g. "s3://datasets/imagenet/"'
        )
    if object_store and u.scheme != "s3":
        raise StoreUrlError(
            f"{url!r}: a pack is in S3", 'e.g. "s3://datasets/packs/imagenet-train"'
        )
    return u


def _from_config(s3: S3Config) -> dict[str, Any]:
    """The ``[s3]`` section as ``S3Store`` keywords (None: not set, the URL's query or the
    store decides)."""
    return {
        "endpoint_url": s3.endpoint_url,
        "region": s3.region,  # None: the store follows the AWS region chain
        "addressing_style": s3.addressing_style,
        "profile": s3.profile,
        "anonymous": s3.anonymous or None,
        "lean_http": s3.lean_http and None,  # true: NFSGW_S3_LEAN_HTTP decides (default on)
        "max_connections": s3.max_connections,
        "max_error_body": s3.max_error_body,
        "retry": s3.retry,
        "checksums": s3.checksums,
    }


def open_store(
    url: str,
    *,
    s3: S3Config | None = None,
    observer: RequestObserver | None = None,
    endpoint_url: str | None = None,
    region: str | None = None,
    addressing_style: str | None = None,
    access_key: str | None = None,
    secret_key: str | None = None,
    session_token: str | None = None,
    profile: str | None = None,
    anonymous: bool | None = None,
    max_connections: int | None = None,
    max_inflight: int | None = None,
    retry: RetryPolicy | None = None,
    checksums: ChecksumPolicy | None = None,
    lean_http: bool | None = None,
    workers: int | None = None,
    create: bool | None = None,
    payload_signing: PayloadSigning | None = None,
) -> ObjectStore:
    """Build the store for ``url`` (see the module docstring). ``s3`` (the ``[s3]`` section)
    gives an ``s3://`` store its defaults; a keyword given (not None) wins over it. Nothing
    connects yet: the S3 session is created on first use inside the running event loop."""
    u = parse_store_url(url)
    q = u.options
    if u.scheme == "file":
        from gateway.backend.local import LocalStore

        local_kw: dict[str, Any] = {"observer": observer, "name": url, "list_process": True}
        if workers is not None:
            local_kw["workers"] = workers
        local_kw["create"] = create if create is not None else q.get("create", "") in _TRUE
        return LocalStore(u.location, **local_kw)

    from gateway.backend.s3 import S3Store

    given: dict[str, Any] = _from_config(s3) if s3 is not None else {}
    for k, v in (
        ("endpoint_url", endpoint_url),
        ("region", region),
        ("addressing_style", addressing_style),
        ("profile", profile),
        ("anonymous", anonymous),
        ("lean_http", lean_http),
        ("max_connections", max_connections),
        ("retry", retry),
        ("checksums", checksums),
    ):
        if v is not None:
            given[k] = v
    style = given.get("addressing_style") or q.get("addressing") or q.get("addressing_style")
    style = style or "auto"
    if style not in ("path", "virtual", "auto"):
        raise ValueError(f"{url}: addressing must be path, virtual or auto, not {style!r}")
    anon = given.get("anonymous")
    kw: dict[str, Any] = {
        "endpoint_url": given.get("endpoint_url")
        or q.get("endpoint")
        or q.get("endpoint_url")
        or None,
        "region": given.get("region") or q.get("region") or None,
        "addressing_style": style,
        "access_key": access_key,
        "secret_key": secret_key,
        "session_token": session_token,
        "profile": given.get("profile") or q.get("profile") or None,
        "anonymous": anon if anon is not None else q.get("anonymous", "") in _TRUE,
        "retry": given.get("retry"),
        "checksums": given.get("checksums"),
        "max_inflight": max_inflight,
        "observer": observer,
        "name": u.canonical(),
        "lean_http": given.get("lean_http"),
    }
    if given.get("max_connections") is not None:
        kw["max_connections"] = given["max_connections"]
    if given.get("max_error_body") is not None:
        kw["max_error_body"] = given["max_error_body"]
    if payload_signing is not None:
        kw["payload_signing"] = payload_signing
    return S3Store(u.location, **kw)
