"""The S3 store: ListObjectsV2, HEAD, (ranged) GET, PUT, multipart, copy and delete over
aiohttp, signed with our own SigV4 (``sigv4.py``).

Owns: ``S3Store``: addressing (path / virtual-hosted), the request core (signing, retries
with full-jitter backoff under a per-call deadline), the one place that turns HTTP/S3
errors into ``BackendError`` subclasses (``_error``, and ``_embedded_error`` for an error
inside a 200 reply), bounds on connections and requests in flight, LIST, HEAD and GET. The
writes are ``s3write.S3Writes`` (a mixin over ``_call``), the checks of GET bodies
``s3verify.BodyCheck``. Credentials and the region come from ``credentials.py``; bodies and
header values are parsed by ``s3wire.py``. Must not: import nfsproto or know about NFS,
call boto3/botocore (``credentials.py`` runs botocore, in a thread), parse XML itself, or
block the event loop.

Why not boto3: measured on the reference machine boto3 costs ~1 ms of CPU per GET and ~60 ms
per 1,000-key LIST page; aiohttp plus this signer costs a fraction of that
(``benchmarks/s3_client_cpu.py``).

Two wires: GET, HEAD and LIST go over ``http1.Pool`` (a lean HTTP/1.1 keep-alive pool, the
body received into one buffer; ~1.5x less CPU per GET and HEAD than aiohttp, docs/benchmarks.md
"A lean GET"), everything else over aiohttp. ``lean_http=False`` (``[s3] lean_http``), or
``NFSGW_S3_LEAN_HTTP=0`` in the environment, keeps them on aiohttp; a GET or HEAD reply
with a 2xx body without a Content-Length switches the store to aiohttp for good
(``_lean_off``); LIST pages may come chunked (Amazon S3 sends them so), bounded by
``_MAX_LIST_BODY``.

Listings: every page carries its digest (``s3wire.list_reply``); ``list_page_if_changed``
returns a page whose digest the caller knew ``Unchanged``, unparsed (the namespace's re-list of
an unchanged directory costs its LIST requests and no parse). Everything above the wire (signing,
retries, ``_error``, ``_get_result``, checksums, the observer) is shared.

Observer contract: ``observer(op, outcome, seconds)`` is called exactly once per HTTP request
sent. Attempts that will be retried report ``"retry"``; the last attempt reports ``"ok"``,
``"not_found"``, ``"precondition"`` or ``"error"``. A GET whose body failed its checksum
reports ``"checksum_mismatch"``, retried or not.

Every byte verified (``ChecksumPolicy``): a GET whose body is the whole object (no range, a
range the server ignored, or a range that covers the object) is checked against the
cheapest full-object checksum its reply carries and the policy allows
(``checksums.body_checksum``: a stored CRC64NVME/CRC32C/CRC32/SHA-1/SHA-256, also a COMPOSITE
one of a multipart upload, whose parts' sizes one GetObjectAttributes request per object
version tells, ``s3verify``; optionally a single-part object's MD5 ETag). A mismatch is
logged and retried like a short body; when the retries run out the GET fails with
``ChecksumMismatch`` (NFS3ERR_IO). A body of part of an object has nothing to be checked
against and is not. Single-request PUTs carry a CRC32 (``x-amz-checksum-crc32``), so objects
nfsgw writes are verifiable. Where hashing runs: ``s3verify``.

Bodies bounded by what was asked (issue 37), on both wires, before they are allocated: a
ranged GET's reply by the range's length (or 1 MiB, ``_RANGE_IGNORED``, or the object's size
when known: a server may ignore Range), a whole-object GET's by the object's size when the
caller knows it (``get(..., size=)``: the listing said), else by ``_MAX_UNSIZED_BODY`` (and
received as it arrives, not preallocated: ``http1``), an error reply's by ``max_error_body``
(``[s3] max_error_body``), a LIST page's by ``_MAX_LIST_BODY``, the XML replies of writes by
``_MAX_XML_BODY``. A reply claiming more fails at once with ``BackendError`` naming the claimed
and the allowed length (an error reply with a retryable status is retried, its body unread);
a server that ignored ``Range`` for a bigger object than the range is one.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Final, Literal, TypeVar
from urllib.parse import urlsplit

import aiohttp
import structlog
from yarl import URL

from gateway.backend.base import (
    AccessDeniedError,
    BackendError,
    BackendUnavailable,
    GetResult,
    ListPage,
    ObjectInfo,
    ObjectNotFound,
    PreconditionFailed,
    RequestObserver,
    StoreBase,
    StoreTraits,
    Unchanged,
)
from gateway.backend.config import AddressingStyle, ChecksumPolicy, RetryPolicy
from gateway.backend.credentials import CredentialCache, resolve_region
from gateway.backend.http1 import BodyTooLarge, Pool, Reply, Unframed
from gateway.backend.s3verify import BodyCheck, ChecksumMismatch, Parts, _BadChecksum
from gateway.backend.s3wire import (
    MalformedReply,
    http_date_ns,
    list_reply,
    object_info,
    parse_content_range,
    parse_error,
    parse_object_parts,
    parse_unsatisfied_range,
    request_bytes,
    unquote_etag,
    user_metadata,
)
from gateway.backend.s3write import _MAX_XML_BODY, S3Writes
from gateway.backend.s3write import read_bounded as _read
from gateway.backend.sigv4 import (
    EMPTY_SHA256,
    Credentials,
    SigV4Signer,
    canonical_query,
    encode_path,
)

__all__ = ["ChecksumMismatch", "S3Store"]

log = structlog.get_logger(__name__)

T = TypeVar("T")
PayloadSigning = Literal["auto", "always", "never"]

DEFAULT_MAX_ERROR_BODY: Final = 64 << 10  # S3 error documents are well under 1 KiB
# A GET of no range end whose caller does not know the object's size (pack tooling, index
# parts): bounded all the same, and grown as it arrives past 16 MiB (http1).
_MAX_UNSIZED_BODY: Final = 1 << 30
# A ranged GET's reply may be this long even when the range is shorter: a server that ignores
# Range for a small object sends all of it (sliced here); for a bigger one, pass ``size``.
_RANGE_IGNORED: Final = 1 << 20
# A LIST page sent chunked (Amazon S3 does): 1,000 keys of up to 1,024 bytes, URL-encoded,
# with their ETags, dates and owners stay well under it.
_MAX_LIST_BODY: Final = 16 << 20
# Retryable statuses: throttling and server-side failures (501 Not Implemented is final).
_RETRY_STATUS: Final = frozenset({408, 429, 500, 502, 503, 504})
_RETRY_CODES: Final = frozenset(
    {"RequestTimeout", "SlowDown", "InternalError", "ServiceUnavailable", "Throttling"}
)
_EXPIRED_CODES: Final = frozenset({"ExpiredToken", "ExpiredTokenException", "TokenRefreshRequired"})

_LEAN_ENV: Final = "NFSGW_S3_LEAN_HTTP"
_OFF: Final = frozenset({"0", "false", "no", "off"})


_S200: Final = frozenset({200})
_SGET: Final = frozenset({200, 206, 416})


class _Retry(Exception):
    """An attempt failed in a way worth retrying (5xx, throttling, short body)."""

    def __init__(self, reason: str, *, expired_creds: bool = False) -> None:
        super().__init__(reason)
        self.expired_creds = expired_creds


class S3Store(S3Writes, StoreBase):
    """``ObjectStore`` over one S3 bucket. Keys are full keys (the export prefix included).

    ``endpoint_url`` selects an S3-compatible server (SeaweedFS, MinIO, Ceph RGW);
    ``addressing_style="auto"`` means path-style when an endpoint is given (or the bucket
    name contains dots), virtual-hosted for AWS. ``region=None`` follows the AWS chain
    (``credentials.resolve_region``: AWS_REGION, AWS_DEFAULT_REGION, the profile's region,
    else us-east-1), resolved off the loop on first use. Credentials: explicit
    ``access_key``/``secret_key`` (+ ``session_token``), else the botocore chain
    (``profile``), or ``anonymous=True``.
    ``payload_signing="auto"`` signs the SHA-256 of bodies over plain HTTP and sends
    UNSIGNED-PAYLOAD over HTTPS (TLS protects integrity), like botocore.
    """

    def __init__(
        self,
        bucket: str,
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        addressing_style: AddressingStyle = "auto",
        access_key: str | None = None,
        secret_key: str | None = None,
        session_token: str | None = None,
        profile: str | None = None,
        anonymous: bool = False,
        max_connections: int = 64,
        max_inflight: int | None = None,
        retry: RetryPolicy | None = None,
        checksums: ChecksumPolicy | None = None,
        payload_signing: PayloadSigning = "auto",
        observer: RequestObserver | None = None,
        name: str | None = None,
        lean_http: bool | None = None,
        max_error_body: int = DEFAULT_MAX_ERROR_BODY,
    ) -> None:
        if not bucket or "/" in bucket:
            raise ValueError(f"bad bucket name {bucket!r}")
        if (access_key is None) != (secret_key is None):
            raise ValueError("access_key and secret_key go together")
        self.bucket = bucket
        self.name = name or f"s3://{bucket}"
        self.retry = retry or RetryPolicy()
        self.checksums = checksums or ChecksumPolicy()
        self._observer = observer
        self.traits = StoreTraits(
            "s3",
            latency_to_hide=True,
            endpoint=endpoint_url or f"AWS S3 ({region or 'region from the AWS chain'})",
        )
        self._profile = profile
        self._region = region
        self._max_connections = max_connections
        self._sem = asyncio.Semaphore(max_inflight or max_connections)
        static = (
            Credentials(access_key, secret_key, session_token or None)
            if access_key is not None and secret_key is not None
            else None
        )
        self._creds = CredentialCache(static=static, profile=profile, anonymous=anonymous)

        if endpoint_url:
            parts = urlsplit(endpoint_url)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise ValueError(f"bad endpoint_url {endpoint_url!r}")
            self._scheme = parts.scheme
            self._netloc: str | None = parts.netloc
            self._base_path = parts.path.rstrip("/")
        else:
            self._scheme = "https"
            self._netloc = None  # s3.<region>.amazonaws.com once the region is known
            self._base_path = ""
        style = addressing_style
        if style == "auto":
            style = "path" if endpoint_url or "." in bucket else "virtual"
        self._style = style
        self._sign_payload = payload_signing == "always" or (
            payload_signing == "auto" and self._scheme == "http"
        )

        # Filled by _setup() inside the loop (the region may need botocore's config files).
        self._signer: SigV4Signer | None = None
        self._origin = ""  # scheme://host
        self._host = ""  # the Host header (signed)
        self._root = ""  # encoded path of the bucket: "/bucket" (path) or "" (virtual)
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._setup_lock: asyncio.Lock | None = None
        self._timeout = aiohttp.ClientTimeout(
            total=self.retry.request_timeout_s, sock_connect=self.retry.connect_timeout_s
        )
        self._part_sizes: dict[str, dict[int, int]] = {}
        self._body_check = BodyCheck(bucket, self.checksums, self._attributes)
        if lean_http is None:
            lean_http = os.environ.get(_LEAN_ENV, "1").strip().lower() not in _OFF
        self._lean_http = lean_http
        self._max_error_body = max_error_body
        self._pool: Pool | None = None  # the lean GET/HEAD wire (http1.py), once set up

    @property
    def region(self) -> str | None:
        """The signing region; None until first use when it comes from the AWS chain."""
        return self._region

    # ----------------------------------------------------------------- set-up / close

    async def _setup(self) -> aiohttp.ClientSession:
        """Create the session (bound to the running loop) and the signer, once."""
        loop = asyncio.get_running_loop()
        session = self._session
        if session is not None:
            if self._loop is not loop:
                raise RuntimeError(f"{self.name}: store used from a different event loop")
            return session
        if self._setup_lock is None:
            self._setup_lock = asyncio.Lock()
        async with self._setup_lock:
            if self._session is not None:  # set up by a caller that held the lock first
                return self._session
            if self._region is None:
                try:
                    self._region = await asyncio.to_thread(resolve_region, None, self._profile)
                except ValueError as e:  # a named profile that does not exist
                    raise BackendError(f"{self.name}: region: {e}") from e
            region = self._region
            netloc = self._netloc or f"s3.{region}.amazonaws.com"
            if self._style == "virtual":
                self._host = f"{self.bucket}.{netloc}"
                self._root = self._base_path
            else:
                self._host = netloc
                self._root = f"{self._base_path}/{encode_path(self.bucket)}"
            self._origin = f"{self._scheme}://{self._host}"
            self._signer = SigV4Signer(region)
            # One TLS context for both wires: aiohttp's default (verified, ALPN http/1.1),
            # made in a thread (it reads the CA files).
            tls = await asyncio.to_thread(_tls_context) if self._scheme == "https" else None
            connector = aiohttp.TCPConnector(
                limit=self._max_connections,
                limit_per_host=0,
                ttl_dns_cache=60,
                ssl=tls if tls is not None else True,
            )
            if self._lean_http:
                # The session does not trust the environment (no HTTP(S)_PROXY), so neither
                # wire goes through a proxy.
                where = urlsplit(self._origin)
                assert where.hostname is not None
                self._pool = Pool(
                    where.hostname,
                    where.port or (443 if tls is not None else 80),
                    ssl_context=tls,
                    server_hostname=where.hostname,
                    limit=self._max_connections,
                    max_error_body=self._max_error_body,
                    max_body=_MAX_UNSIZED_BODY,
                )
            self._session = aiohttp.ClientSession(
                connector=connector,
                auto_decompress=False,  # bytes are the object's bytes, whatever its encoding
                skip_auto_headers=("Accept-Encoding", "User-Agent"),
                timeout=self._timeout,
            )
            self._loop = loop
            return self._session

    async def close(self) -> None:
        await self._creds.close()
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    # ------------------------------------------------------------------ request core

    def _object_path(self, key: str) -> str:
        if not key:
            raise ValueError("empty object key")
        return f"{self._root}/{encode_path(key)}"

    async def _call(
        self,
        op: str,
        method: str,
        key: str,
        *,
        bucket_level: bool = False,
        query: str = "",
        headers: Mapping[str, str] | None = None,
        body: bytes | None = None,
        payload_hash: str = EMPTY_SHA256,
        expect: frozenset[int] = _S200,
        handle: Callable[[aiohttp.ClientResponse], Awaitable[T]],
        lean: Callable[[Reply], Awaitable[T]] | None = None,
        unframed_body: int = 0,
        max_body: int | None = None,
        bounded: bool = True,
    ) -> T:
        """Send one logical request with retries. ``handle`` reads the response (status in
        ``expect``) and may raise ``_Retry`` (e.g. a short body). With ``lean`` (GET, HEAD
        and LIST: no request body) the request goes over the lean wire (``http1.Pool``) when
        it is on, and ``lean`` reads its reply: the same checks on the same values, only the
        wire differs. ``unframed_body``: the lean wire takes a 2xx body without a length
        (chunked) up to that size (LIST), instead of refusing it (``Unframed``). ``max_body``:
        the longest 2xx body the lean wire takes (None: ``_MAX_UNSIZED_BODY``; ``handle``
        bounds aiohttp's itself, ``_read``); a longer one fails the call (``BackendError``).
        ``bounded=False``: not under the in-flight semaphore (a request made while handling
        another's reply, which holds a place: ``_attributes`` for ``BodyCheck``)."""
        session = await self._setup()
        signer = self._signer
        assert signer is not None
        path = (self._root or "/") if bucket_level else self._object_path(key)
        url = URL(
            f"{self._origin}{path}?{query}" if query else f"{self._origin}{path}", encoded=True
        )
        policy = self.retry
        loop = asyncio.get_running_loop()
        deadline = loop.time() + policy.deadline_s
        observer = self._observer
        attempt = 0
        while True:
            attempt += 1
            sent = False
            last: BaseException
            t0 = time.perf_counter()
            try:
                async with self._sem if bounded else contextlib.nullcontext():
                    creds = await self._creds.get()
                    h: dict[str, str] = {"host": self._host}
                    if headers:
                        h.update(headers)
                    if creds is not None:
                        signer.sign(creds, method, path, query, h, payload_hash)
                    remaining = deadline - loop.time()
                    t0 = time.perf_counter()  # the observer times the request, not queueing
                    sent = True
                    pool = self._pool
                    if lean is not None and pool is not None:
                        reply = await pool.request(
                            request_bytes(method, path, query, h),
                            head=method == "HEAD",
                            timeout_s=max(min(remaining, policy.request_timeout_s), 0.001),
                            connect_timeout_s=policy.connect_timeout_s,
                            unframed_body=unframed_body,
                            max_body=max_body,
                        )
                        if reply.status not in expect:
                            raise self._error(
                                op, key, reply.status, reply.headers, bytes(reply.body)
                            )
                        result = await lean(reply)
                    else:
                        timeout = (
                            self._timeout
                            if remaining >= policy.request_timeout_s
                            else aiohttp.ClientTimeout(
                                total=max(remaining, 0.001),
                                sock_connect=min(policy.connect_timeout_s, max(remaining, 0.001)),
                            )
                        )
                        async with session.request(
                            method,
                            url,
                            headers=h,
                            data=body,
                            timeout=timeout,
                            allow_redirects=False,
                        ) as resp:
                            if resp.status not in expect:
                                raise await self._status_error(op, key, resp)
                            result = await handle(resp)
            except BodyTooLarge as e:
                # Refused unread. An error reply: what its status says (retried or not).
                mapped = (
                    BackendError(f"{op} {self.bucket}/{key}: {e}")
                    if 200 <= e.status < 300
                    else self._error(op, key, e.status, e.headers, b"", note=str(e))
                )
                if isinstance(mapped, _Retry):
                    last = mapped
                else:
                    if observer is not None:
                        observer(op, _outcome(mapped), time.perf_counter() - t0)
                    raise mapped from None
            except _Retry as e:
                last = e
                if e.expired_creds:
                    self._creds.invalidate()
            except (MalformedReply, aiohttp.ClientError, TimeoutError, OSError) as e:
                last = e
                if isinstance(e, Unframed):
                    self._lean_off(e)
            except BackendError as e:
                if sent and observer is not None:
                    observer(op, _outcome(e), time.perf_counter() - t0)
                raise
            except BaseException:
                # Cancellation (or a bug): the request may have gone out; count it once.
                if sent and observer is not None:
                    observer(op, "error", time.perf_counter() - t0)
                raise
            else:
                if observer is not None:
                    observer(op, "ok", time.perf_counter() - t0)
                return result
            # A retryable failure.
            elapsed = time.perf_counter() - t0
            delay = policy.backoff(attempt)
            bad_body = isinstance(last, _BadChecksum)
            if attempt >= policy.max_attempts or loop.time() + delay >= deadline:
                if observer is not None and sent:
                    observer(op, "checksum_mismatch" if bad_body else "error", elapsed)
                what = f"{op} {self.bucket}/{key}: giving up after {attempt} attempt(s)"
                if bad_body:
                    raise ChecksumMismatch(f"{what}: {last}") from last
                raise BackendUnavailable(f"{what}: {type(last).__name__}: {last}") from last
            if observer is not None and sent:
                observer(op, "checksum_mismatch" if bad_body else "retry", elapsed)
            await asyncio.sleep(delay)

    async def _status_error(
        self, op: str, key: str, resp: aiohttp.ClientResponse
    ) -> BackendError | _Retry:
        """``_error`` of an aiohttp response (its error document read, if small)."""
        body = b""
        note = ""
        if resp.method != "HEAD":
            try:
                body = await _read(resp, self._max_error_body)
            except BodyTooLarge as e:
                note = str(e)  # not read
            except (aiohttp.ClientError, TimeoutError):
                pass
        return self._error(op, key, resp.status, resp.headers, body, note=note)

    def _error(
        self,
        op: str,
        key: str,
        status: int,
        headers: Mapping[str, str],
        body: bytes,
        *,
        note: str = "",
    ) -> BackendError | _Retry:
        """The one mapping from an unexpected HTTP status to our errors. ``headers`` are
        looked up by lowercase name (aiohttp's are case-insensitive, the lean wire's
        lowercase). ``note``: why the body was not read (too long), said in the message."""
        code, message = parse_error(body)
        what = f"{op} {self.bucket}/{key}: HTTP {status}" + (f" {code}" if code else "")
        if message:
            what += f": {message}"
        if note:
            what += f" (error body not read: {note})"
        if code in _EXPIRED_CODES:
            return _Retry(what, expired_creds=True)
        if status in _RETRY_STATUS or code in _RETRY_CODES or (status >= 500 and status != 501):
            return _Retry(what)
        if status == 404:
            if code == "NoSuchBucket":
                return BackendError(what)
            return ObjectNotFound(what)
        if status == 412:
            return PreconditionFailed(what)
        if status == 403:
            return AccessDeniedError(what)
        if status in (301, 307, 400) and (region := headers.get("x-amz-bucket-region")):
            return BackendError(f"{what} (the bucket is in region {region})")
        return BackendError(what)

    def _embedded_error(self, what: str, code: str, message: str) -> BackendError | _Retry:
        """An ``<Error>`` in a 200 reply: retried if its code says so, else final."""
        msg = f"{what}: {code}: {message}"
        return _Retry(msg) if code in _RETRY_CODES else BackendError(msg)

    def _lean_off(self, why: BaseException) -> None:
        """The store sent a 2xx body the lean wire does not take (no Content-Length): GET
        and HEAD go over aiohttp from now on (the retry too)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()
            log.warning("s3_lean_http_disabled", bucket=self.bucket, reason=str(why))

    async def _attributes(self, key: str, headers: dict[str, str]) -> Parts:
        """A page of GetObjectAttributes (``BodyCheck``: a multipart object's part sizes)."""

        async def handle(resp: aiohttp.ClientResponse) -> Parts:
            return parse_object_parts(await _read(resp, _MAX_XML_BODY))

        async def lean(reply: Reply) -> Parts:
            return parse_object_parts(reply.body)

        return await self._call(
            "attributes",
            "GET",
            key,
            query="attributes=",
            headers=headers,
            handle=handle,
            lean=lean,
            max_body=_MAX_XML_BODY,
            bounded=False,
        )

    # ------------------------------------------------------------------- operations

    async def _list_page(
        self, prefix: str, delimiter: str | None, token: str | None, after: str | None, limit: int
    ) -> ListPage:
        page = await self._list(prefix, delimiter, token, after, limit, b"")
        assert isinstance(page, ListPage)
        return page

    async def list_page_if_changed(
        self,
        prefix: str,
        *,
        delimiter: str | None = "/",
        token: str | None = None,
        max_keys: int = 1000,
        known: bytes,
    ) -> ListPage | Unchanged:
        """``list_page``, but a page whose bytes have the digest ``known`` (the same page of
        the previous listing) comes back ``Unchanged``, not parsed (``s3wire.list_reply``)."""
        return await self._list(prefix, delimiter, token, None, max_keys, known)

    async def _list(
        self,
        prefix: str,
        delimiter: str | None,
        token: str | None,
        start_after: str | None,
        max_keys: int,
        known: bytes,
    ) -> ListPage | Unchanged:
        params = [("list-type", "2"), ("encoding-type", "url"), ("max-keys", str(max_keys))]
        if prefix:
            params.append(("prefix", prefix))
        if delimiter:
            params.append(("delimiter", delimiter))
        if token:
            params.append(("continuation-token", token))
        if start_after:
            params.append(("start-after", start_after))

        async def handle(resp: aiohttp.ClientResponse) -> ListPage | Unchanged:
            return list_reply(await _read(resp, _MAX_LIST_BODY), known)

        async def lean(reply: Reply) -> ListPage | Unchanged:
            return list_reply(reply.body, known)

        return await self._call(
            "list",
            "GET",
            prefix,
            bucket_level=True,
            query=canonical_query(params),
            handle=handle,
            lean=lean,
            unframed_body=_MAX_LIST_BODY,
            max_body=_MAX_LIST_BODY,
        )

    async def head(self, key: str) -> ObjectInfo:
        async def handle(resp: aiohttp.ClientResponse) -> ObjectInfo:
            return object_info(key, resp.headers)

        async def lean(reply: Reply) -> ObjectInfo:
            return object_info(key, reply.headers)

        return await self._call("head", "HEAD", key, handle=handle, lean=lean)

    async def get(
        self,
        key: str,
        start: int = 0,
        end: int | None = None,
        *,
        if_match: str | None = None,
        size: int | None = None,
    ) -> GetResult:
        """``ObjectStore.get``; ``size``: the object's size if the caller knows it (its
        listing), which bounds the reply of a GET without a range end."""
        if start < 0 or (end is not None and end < 0):
            raise ValueError(f"bad range [{start}, {end})")
        return await self._get(key, start, end, if_match, size)

    async def _get(
        self,
        key: str,
        start: int,
        end: int | None,
        if_match: str | None,
        size: int | None = None,
    ) -> GetResult:
        if end is not None and end <= start:
            # An empty range cannot be expressed as an HTTP Range; answer from a HEAD.
            info = await self.head(key)
            if if_match is not None and info.etag != if_match:
                raise PreconditionFailed(f"get {self.bucket}/{key}: etag changed")
            return GetResult(b"", info.etag, info.size, info.mtime_ns, info.metadata)
        headers: dict[str, str] = {}
        ranged = start > 0 or end is not None
        if ranged:
            headers["range"] = f"bytes={start}-" if end is None else f"bytes={start}-{end - 1}"
        if if_match is not None:
            headers["if-match"] = f'"{if_match}"'
        if self.checksums.stored or self.checksums.python_crcs:
            headers["x-amz-checksum-mode"] = "ENABLED"
        # The longest body asked for: the range's (a 206), or the whole object's when its size
        # is known (a 200: no Range, or a server that ignored it).
        bound: int | None = size
        if end is not None:
            bound = max(end - start, size or 0, _RANGE_IGNORED)

        async def handle(resp: aiohttp.ClientResponse) -> GetResult:
            limit = _MAX_UNSIZED_BODY if bound is None else bound
            try:
                data = await _read(resp, limit if resp.status < 300 else self._max_error_body)
            except BodyTooLarge as e:
                raise BackendError(f"get {self.bucket}/{key}: {e}") from None
            return await self._get_result(
                key, start, end, if_match, resp.status, resp.headers, data, resp.content_length
            )

        async def lean(reply: Reply) -> GetResult:
            # The body is exactly Content-Length bytes (http1 framing), received in place into
            # the bytes handed over here (http1's BodyBuffer): no copy, which for a pack's
            # 8 MiB group was a second fresh 8 MiB buffer. GetResult.data is bytes (the cache
            # and the pack keep it as it is).
            body = reply.body if type(reply.body) is bytes else bytes(reply.body)
            return await self._get_result(
                key, start, end, if_match, reply.status, reply.headers, body, len(body)
            )

        return await self._call(
            "get",
            "GET",
            key,
            headers=headers,
            expect=_SGET,
            handle=handle,
            lean=lean,
            max_body=bound,
        )

    async def _get_result(
        self,
        key: str,
        start: int,
        end: int | None,
        if_match: str | None,
        status: int,
        h: Mapping[str, str],
        data: bytes,
        clen: int | None,
    ) -> GetResult:
        """A GET reply (200, 206 or 416) to the result: lengths and the range checked, the
        body verified when it is the whole object. ``h`` is looked up by lowercase name."""
        if status == 416:
            # Start at or past the end: no bytes. Content-Range is "bytes */<size>".
            size = parse_unsatisfied_range(h.get("content-range", ""))
            etag = unquote_etag(h.get("etag", "")) or (if_match or "")
            return GetResult(b"", etag, size, http_date_ns(h.get("last-modified", "")))
        if clen is not None and len(data) != clen:
            raise _Retry(f"short body: {len(data)} of {clen} bytes")
        etag = unquote_etag(h.get("etag", ""))
        if status == 206:
            first, last, total = parse_content_range(h.get("content-range", ""))
            if first != start:
                raise BackendError(f"get {self.bucket}/{key}: asked {start}, got {first}")
            if len(data) != last - first + 1:
                raise _Retry(f"short body: {len(data)} of {last - first + 1} bytes")
            size = total if total >= 0 else start + len(data)
            whole = first == 0 and last + 1 == total
        else:
            size = len(data)
            whole = True
        if whole and self._body_check.wanted:
            await self._body_check.check(key, h, etag, data)
        if status != 206 and (start > 0 or end is not None):
            data = data[start:end]  # the server ignored Range: cut the slice ourselves
        return GetResult(
            data,
            etag,
            size,
            http_date_ns(h.get("last-modified", "")),
            user_metadata(h),
        )


# ----------------------------------------------------------------------- helpers


def _tls_context() -> ssl.SSLContext:
    """aiohttp's default client context (``aiohttp.connector._make_ssl_context(True)``):
    system CAs, hostname checked, ALPN http/1.1."""
    ctx = ssl.create_default_context()
    ctx.set_alpn_protocols(("http/1.1",))
    return ctx


def _outcome(e: BackendError) -> str:
    if isinstance(e, ObjectNotFound):
        return "not_found"
    if isinstance(e, PreconditionFailed):
        return "precondition"
    return "error"
