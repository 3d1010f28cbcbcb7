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


def payload_sha256(body: bytes) -> str:
    """A body's signed payload hash (``x-amz-content-sha256``)."""
    return hashlib.sha256(body).hexdigest()


@dataclass(frozen=True, slots=True, repr=False)
class Credentials:
    """One set of frozen credentials. ``token`` is set for temporary (session) credentials.
    Its ``repr`` (and ``str``) never shows the secret key or the token, and only the first 4
    characters of the access key: a traceback or a log line may print it."""

    access_key: str
    secret_key: str
    token: str | None = None

    def __repr__(self) -> str:
        token = ", token=<hidden>" if self.token else ""
        return f"Credentials(access_key={redacted(self.access_key)!r}, secret_key=<hidden>{token})"

    __str__ = __repr__


def redacted(access_key: str) -> str:
    """An access key as a log may show it: its first 4 characters (AWS's say the key's kind,
    ``AKIA``/``ASIA``), the rest elided; a key shorter than 12 characters not at all."""
    return f"{access_key[:4]}…" if len(access_key) >= 12 else "…"


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

    __slots__ = ("_key_cache", "_pads", "region", "service")

    def __repr__(self) -> str:  # never the cached signing key, nor the secret it came from
        return f"SigV4Signer(region={self.region!r}, service={self.service!r})"

    def __init__(self, region: str, service: str = "s3") -> None:
        self.region = region
        self.service = service
        self._key_cache: tuple[str, str, bytes] | None = None
        self._pads: tuple[str, str, _Pads, str] | None = None

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
        ``authorization``.

        One HMAC per request: the signing key (four HMACs) is cached per secret and day
        (``signing_key``) with its HMAC pads and the scope (``_day``, ``_hmac_pads``)."""
        date = date or amz_date()
        headers["x-amz-date"] = date
        headers["x-amz-content-sha256"] = payload_hash
        if creds.token:
            headers["x-amz-security-token"] = creds.token
        names = sorted(headers)
        signed_headers = ";".join(names)
        parts = [method, path, query]
        for n in names:
            v = headers[n].strip()  # Trimall, inlined: the common value has no runs
            if "  " in v:
                v = " ".join(v.split())
            parts.append(f"{n}:{v}")
        parts.append("")
        parts.append(signed_headers)
        parts.append(payload_hash)
        datestamp = date[:8]
        key, scope = self._day(creds.secret_key, datestamp)
        canonical_hash = hashlib.sha256("\n".join(parts).encode()).hexdigest()
        string_to_sign = f"{ALGORITHM}\n{date}\n{scope}\n{canonical_hash}"
        inner = key[0].copy()
        inner.update(string_to_sign.encode())
        outer = key[1].copy()
        outer.update(inner.digest())
        signature = outer.hexdigest()
        headers["authorization"] = (
            f"{ALGORITHM} Credential={creds.access_key}/{scope}, "
            f"SignedHeaders={signed_headers}, Signature={signature}"
        )

    def _day(self, secret_key: str, datestamp: str) -> tuple[_Pads, str]:
        """(the signing key's HMAC pads, credential scope) for ``datestamp``."""
        cached = self._pads
        if cached is None or cached[0] != secret_key or cached[1] != datestamp:
            pads = _hmac_pads(self.signing_key(secret_key, datestamp))
            scope = f"{datestamp}/{self.region}/{self.service}/aws4_request"
            cached = self._pads = (secret_key, datestamp, pads, scope)
        return cached[2], cached[3]


_Pads = tuple["hashlib._Hash", "hashlib._Hash"]


def _hmac_pads(key: bytes) -> _Pads:
    """SHA-256 states after the HMAC inner and outer pads of ``key`` (RFC 2104): the HMAC of
    a message is then two ``copy()``+``update`` calls, ~0.75 µs against ~1.7 µs for
    ``hmac.new``/``hmac.digest``, which set up both pads every call."""
    k = key.ljust(64, b"\0")  # keys longer than the block are hashed first; ours are 32 B
    return (
        hashlib.sha256(bytes(b ^ 0x36 for b in k)),
        hashlib.sha256(bytes(b ^ 0x5C for b in k)),
    )
