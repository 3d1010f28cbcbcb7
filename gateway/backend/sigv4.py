"""AWS Signature Version 4 for S3 requests sent with aiohttp (header-based auth only).

Owns: URI encoding of object keys and query strings, the canonical request, the string to
sign, signing-key derivation (cached per secret and day) and the ``Authorization`` header.
Must not: do I/O, read clocks other than through ``amz_date``'s default, or know about
retries or credentials chains (``s3.py`` owns those).

Reference: "Authenticating Requests: Using the Authorization Header (AWS Signature Version 4)"
in the Amazon S3 API reference. S3 differs from other services in two ways we rely on: the
path is URI-encoded exactly once and never normalised (keys may contain ``//`` or ``./``), and
the payload hash may be the literal ``UNSIGNED-PAYLOAD``.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Iterable, MutableMapping
from dataclasses import dataclass
from urllib.parse import quote

UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
ALGORITHM = "AWS4-HMAC-SHA256"


@dataclass(frozen=True, slots=True)
class Credentials:
    """One set of frozen credentials. ``token`` is set for temporary (session) credentials."""

    access_key: str
    secret_key: str
    token: str | None = None


def encode_path(key: str) -> str:
    """URI-encode an object key for the path: RFC 3986 unreserved characters and '/' stay,
    everything else (UTF-8 bytes) becomes %XX. Used for the wire URL and the canonical URI,
    so both are identical by construction."""
    # quote() keeps A-Z a-z 0-9 "_.-~" plus ``safe``; it encodes str as UTF-8.
    return quote(key, safe="/")


def encode_query_part(s: str) -> str:
    """URI-encode a query-string name or value ('/' is encoded too)."""
    return quote(s, safe="")


def canonical_query(params: Iterable[tuple[str, str]]) -> str:
    """The canonical (and wire) query string: encoded names and values, sorted by encoded
    name then value, joined with '&'. A parameter without a value is ``name=``."""
    enc = sorted((encode_query_part(k), encode_query_part(v)) for k, v in params)
    return "&".join(f"{k}={v}" for k, v in enc)


_date_cache: tuple[int, str] = (-1, "")


def amz_date(now: float | None = None) -> str:
    """``YYYYMMDDTHHMMSSZ`` for ``now`` (default: the wall clock), cached per second."""
    global _date_cache
    t = int(time.time() if now is None else now)
    cached_t, cached = _date_cache
    if t == cached_t:
        return cached
    s = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(t))
    _date_cache = (t, s)
    return s


def _hmac(key: bytes, msg: str) -> bytes:
    return hmac.new(key, msg.encode("utf-8"), hashlib.sha256).digest()


def _canonical_header_value(v: str) -> str:
    # Trim and collapse runs of spaces (the spec's Trimall); the common case has none.
    v = v.strip()
    if "  " in v:
        v = " ".join(v.split())
    return v


class SigV4Signer:
    """Signs requests for one region and service. Thread-compatible (the key cache is a
    dict swap); one instance per store."""

    __slots__ = ("_key_cache", "region", "service")

    def __init__(self, region: str, service: str = "s3") -> None:
        self.region = region
        self.service = service
        self._key_cache: tuple[str, str, bytes] | None = None

    def signing_key(self, secret_key: str, datestamp: str) -> bytes:
        cached = self._key_cache
        if cached is not None and cached[0] == secret_key and cached[1] == datestamp:
            return cached[2]
        k = _hmac(("AWS4" + secret_key).encode("utf-8"), datestamp)
        k = _hmac(k, self.region)
        k = _hmac(k, self.service)
        k = _hmac(k, "aws4_request")
        self._key_cache = (secret_key, datestamp, k)
        return k

    def sign(
        self,
        creds: Credentials,
        method: str,
        path: str,
        query: str,
        headers: MutableMapping[str, str],
        payload_hash: str = UNSIGNED_PAYLOAD,
        *,
        date: str | None = None,
    ) -> None:
        """Sign in place. ``path`` is the encoded path (see ``encode_path``), ``query`` the
        canonical query string (see ``canonical_query``), ``headers`` lowercase names that
        will all be signed and must include ``host``. Adds ``x-amz-date``,
        ``x-amz-content-sha256``, ``x-amz-security-token`` (session credentials) and
        ``authorization``."""
        date = date or amz_date()
        headers["x-amz-date"] = date
        headers["x-amz-content-sha256"] = payload_hash
        if creds.token:
            headers["x-amz-security-token"] = creds.token
        names = sorted(headers)
        signed_headers = ";".join(names)
        canonical_headers = "".join(f"{n}:{_canonical_header_value(headers[n])}\n" for n in names)
        canonical_request = "\n".join(
            (method, path, query, canonical_headers, signed_headers, payload_hash)
        )
        datestamp = date[:8]
        scope = f"{datestamp}/{self.region}/{self.service}/aws4_request"
        string_to_sign = "\n".join(
            (
                ALGORITHM,
                date,
                scope,
                hashlib.sha256(canonical_request.encode("utf-8")).hexdigest(),
            )
        )
        signature = hmac.new(
            self.signing_key(creds.secret_key, datestamp),
            string_to_sign.encode("utf-8"),
            hashlib.sha256,
        ).hexdigest()
        headers["authorization"] = (
            f"{ALGORITHM} Credential={creds.access_key}/{scope}, "
            f"SignedHeaders={signed_headers}, Signature={signature}"
        )
