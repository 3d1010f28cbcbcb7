"""Object-store backends, and ``open_store`` which builds one from a URL.

URLs:

- ``s3://bucket`` or ``s3://bucket/some/prefix`` -> ``S3Store``. Query parameters set
  defaults for the keyword arguments: ``endpoint`` (alias ``endpoint_url``), ``region``,
  ``addressing`` (alias ``addressing_style``: path | virtual | auto), ``profile``,
  ``anonymous`` (1/true). Keyword arguments win over the query; ``lean_http`` (keyword only:
  None follows ``NFSGW_S3_LEAN_HTTP``, see ``S3Store``). Without a region the store
  follows the AWS chain on first use (``credentials.resolve_region``).
- ``file:///abs/dir`` -> ``LocalStore`` (``create=1`` makes the directory).

The store always works with full keys; the export prefix is ``parse_store_url(url).prefix``
(normalised to end in '/', or '' for the whole bucket / directory).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, unquote, urlsplit

from gateway.backend.base import ObjectStore, RequestObserver

if TYPE_CHECKING:
    from gateway.backend.config import ChecksumPolicy, RetryPolicy

__all__ = ["StoreUrl", "open_store", "parse_store_url"]

_TRUE = frozenset({"1", "true", "yes", "on"})


@dataclass(frozen=True, slots=True)
class StoreUrl:
    """A parsed store URL. ``location`` is the bucket (s3) or the directory (file)."""

    scheme: str
    location: str
    prefix: str
    options: dict[str, str] = field(default_factory=dict)


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
        return StoreUrl("s3", bucket, prefix, options)
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise ValueError(f"{url}: only local file URLs (file:///dir)")
        path = unquote(parts.path)
        if not path.startswith("/"):
            raise ValueError(f"{url}: the directory must be absolute (file:///dir)")
        return StoreUrl("file", path, "", options)
    raise ValueError(f"{url}: unsupported store URL (use s3://bucket/prefix or file:///dir)")


def open_store(
    url: str,
    *,
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
) -> ObjectStore:
    """Build the store for ``url`` (see the module docstring). Nothing connects yet: the
    S3 session is created on first use inside the running event loop."""
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

    style = addressing_style or q.get("addressing") or q.get("addressing_style") or "auto"
    if style not in ("path", "virtual", "auto"):
        raise ValueError(f"{url}: addressing must be path, virtual or auto, not {style!r}")
    kw: dict[str, Any] = {
        "endpoint_url": endpoint_url or q.get("endpoint") or q.get("endpoint_url") or None,
        "region": region or q.get("region") or None,
        "addressing_style": style,
        "access_key": access_key,
        "secret_key": secret_key,
        "session_token": session_token,
        "profile": profile or q.get("profile") or None,
        "anonymous": anonymous if anonymous is not None else q.get("anonymous", "") in _TRUE,
        "retry": retry,
        "checksums": checksums,
        "max_inflight": max_inflight,
        "observer": observer,
        "name": f"s3://{u.location}/{u.prefix}",
        "lean_http": lean_http,
    }
    if max_connections is not None:
        kw["max_connections"] = max_connections
    return S3Store(u.location, **kw)
