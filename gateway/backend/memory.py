"""An in-memory ``ObjectStore`` for tests: exact S3 ListObjectsV2 semantics, request counting,
injected latency and injected failures.

Owns: a dict of objects ordered like S3 orders keys (by their UTF-8 bytes, not by code point),
and the listing algorithm: ``Prefix``, ``Delimiter`` with common-prefix roll-up, ``StartAfter``,
opaque continuation tokens and ``MaxKeys`` where every common prefix counts as one key, as
``IsTruncated``/``NextContinuationToken`` behave on S3. Like S3, listings carry no user metadata
(only HEAD/GET do). Must not: import nfsproto or anything above the backend layer.

Keys may be any ``str``, including ones no real store would accept (lone surrogates standing in
for non-UTF-8 bytes, NUL), so the namespace's key filtering can be tested; they sort by their
``surrogatepass`` encoding.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import itertools
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from sortedcontainers import SortedDict  # type: ignore[import-untyped]

from gateway.backend.base import (
    BackendError,
    GetResult,
    ListPage,
    ObjectInfo,
    ObjectNotFound,
    PreconditionFailed,
    RequestObserver,
    StoreBase,
    StoreTraits,
)
from gateway.clock import Clock, SystemClock

# (operation, key or prefix) -> an exception to raise instead of serving the request, or None.
FailureHook = Callable[[str, str], BaseException | None]


def _sort_key(key: str) -> bytes:
    return key.encode("utf-8", "surrogatepass")


def _successor_of_prefix(prefix: bytes) -> bytes | None:
    """The smallest byte string greater than every string that starts with ``prefix`` (None if
    there is none, i.e. the prefix is all 0xFF)."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes([stripped[-1] + 1])


@dataclass(slots=True)
class _Object:
    key: str
    data: bytes
    etag: str
    mtime_ns: int
    metadata: dict[str, str] = field(default_factory=dict)

    def info(self, *, with_metadata: bool) -> ObjectInfo:
        meta = dict(self.metadata) if with_metadata else {}
        return ObjectInfo(self.key, len(self.data), self.etag, self.mtime_ns, meta)


@dataclass(slots=True)
class _Upload:
    key: str
    metadata: dict[str, str]
    parts: dict[int, tuple[str, bytes]] = field(default_factory=dict)


def _etag(data: bytes) -> str:
    return '"' + hashlib.md5(data, usedforsecurity=False).hexdigest() + '"'


class MemoryStore(StoreBase):
    """A fake bucket (already scoped by the caller's full keys, like every ``ObjectStore``).

    ``requests`` counts served requests per operation ("list", "head", "get", ...), failed ones
    included; ``log`` keeps ``(op, key_or_prefix)`` of each. ``latency_s`` (a float for every
    operation or a per-operation mapping) is awaited with ``asyncio.sleep`` before each request.
    Reads (list, head, get) see the bucket as it is when the request arrives and then
    wait; writes wait, then apply. ``fail`` is called before each request and may return an
    exception to raise. ``seed`` adds objects without counting a request.
    """

    # True like a remote store: the layers above treat the fake bucket as S3.
    traits = StoreTraits("memory", latency_to_hide=True, endpoint="memory")

    def __init__(
        self,
        name: str = "memory",
        *,
        clock: Clock | None = None,
        latency_s: float | Mapping[str, float] = 0.0,
        fail: FailureHook | None = None,
        observer: RequestObserver | None = None,
    ) -> None:
        self.name = name
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.latency_s = latency_s
        self.fail = fail
        self.observer = observer
        self.requests: Counter[str] = Counter()
        self.log: list[tuple[str, str]] = []
        self._objects: SortedDict[bytes, _Object] = SortedDict()
        self._uploads: dict[str, _Upload] = {}
        self._upload_ids = itertools.count(1)
        self.closed = False

    # -- test helpers (no request counted) ---------------------------------------------------

    def seed(
        self,
        key: str,
        data: bytes = b"",
        *,
        metadata: Mapping[str, str] | None = None,
        mtime_ns: int | None = None,
    ) -> ObjectInfo:
        obj = _Object(
            key,
            data,
            _etag(data),
            self.clock.time_ns() if mtime_ns is None else mtime_ns,
            dict(metadata or {}),
        )
        self._objects[_sort_key(key)] = obj
        return obj.info(with_metadata=True)

    def unseed(self, key: str) -> None:
        self._objects.pop(_sort_key(key), None)

    def keys(self) -> list[str]:
        return [o.key for o in self._objects.values()]

    def reset_counts(self) -> None:
        self.requests.clear()
        self.log.clear()

    # -- request plumbing --------------------------------------------------------------------

    async def _begin(self, op: str, key: str) -> None:
        """Count the request and apply the failure hook (latency is ``_delay``'s)."""
        self.requests[op] += 1
        self.log.append((op, key))
        if self.fail is not None:
            exc = self.fail(op, key)
            if exc is not None:
                self._observe(op, "error")
                raise exc

    async def _delay(self, op: str) -> None:
        lat = self.latency_s if isinstance(self.latency_s, float | int) else self.latency_s.get(op)
        if lat:
            await asyncio.sleep(lat)

    def _observe(self, op: str, outcome: str) -> None:
        if self.observer is not None:
            self.observer(op, outcome, 0.0)

    def _get_obj(self, op: str, key: str) -> _Object:
        obj: _Object | None = self._objects.get(_sort_key(key))
        if obj is None:
            self._observe(op, "not_found")
            raise ObjectNotFound(key)
        return obj

    # -- ObjectStore -------------------------------------------------------------------------

    async def _list_page(
        self, prefix: str, delimiter: str | None, token: str | None, after: str | None, limit: int
    ) -> ListPage:
        # Reads see the bucket as it is when the request arrives; the latency is the response's.
        await self._begin("list", prefix)
        try:
            return self._list_now(prefix, delimiter, token, after, limit)
        finally:
            await self._delay("list")

    def _list_now(
        self,
        prefix: str,
        delimiter: str | None,
        token: str | None,
        start_after: str | None,
        max_keys: int,
    ) -> ListPage:
        if max_keys < 0 or max_keys > 1000:
            raise BackendError(f"invalid max_keys {max_keys}")
        prefix_b = _sort_key(prefix)
        # Where to resume: a token (which wins over start_after, as on S3) names the last key
        # or common prefix returned; start_after names a key.
        minimum: bytes | None = prefix_b
        exclusive: bytes | None = None
        if token is not None:
            kind, marker = _decode_token(token)
            if kind == "p":
                minimum = _successor_of_prefix(marker)
                if minimum is None:
                    self._observe("list", "ok")
                    return ListPage([], [], None)
            else:
                minimum, exclusive = marker, marker
        elif start_after is not None:
            sa = _sort_key(start_after)
            if sa >= prefix_b:
                minimum, exclusive = sa, sa
        items: list[tuple[str, bytes, _Object | str]] = []
        if max_keys == 0:
            self._observe("list", "ok")
            return ListPage([], [], None)
        for item in self._iter_items(prefix, prefix_b, delimiter, minimum, exclusive):
            if len(items) == max_keys:
                # One more item exists past this page: the listing is truncated, and the
                # token resumes after the last item returned.
                last_kind, last_b, _ = items[-1]
                self._observe("list", "ok")
                return self._page(items, _encode_token(last_kind, last_b))
            items.append(item)
        self._observe("list", "ok")
        return self._page(items, None)

    def _iter_items(
        self,
        prefix: str,
        prefix_b: bytes,
        delimiter: str | None,
        minimum: bytes | None,
        exclusive: bytes | None,
    ) -> Iterator[tuple[str, bytes, _Object | str]]:
        """Yield ("k", key bytes, object) and ("p", prefix bytes, common prefix) in order."""
        cursor = minimum
        while True:
            keys = self._objects.irange(minimum=cursor, inclusive=(True, True))
            rolled: bytes | None = None
            for kb in keys:
                if exclusive is not None and kb == exclusive:
                    continue
                if not kb.startswith(prefix_b):
                    return
                obj: _Object = self._objects[kb]
                rest = obj.key[len(prefix) :]
                if delimiter:
                    idx = rest.find(delimiter)
                    if idx >= 0:
                        cp = prefix + rest[: idx + len(delimiter)]
                        cp_b = _sort_key(cp)
                        yield ("p", cp_b, cp)
                        rolled = cp_b
                        break
                yield ("k", kb, obj)
            else:
                return
            # Skip every key under the common prefix just returned.
            assert rolled is not None
            nxt = _successor_of_prefix(rolled)
            if nxt is None:
                return
            cursor, exclusive = nxt, None

    @staticmethod
    def _page(items: list[tuple[str, bytes, _Object | str]], next_token: str | None) -> ListPage:
        objects: list[ObjectInfo] = []
        prefixes: list[str] = []
        for _kind, _b, val in items:
            if isinstance(val, str):
                prefixes.append(val)
            else:
                objects.append(val.info(with_metadata=False))
        return ListPage(objects, prefixes, next_token)

    async def head(self, key: str) -> ObjectInfo:
        await self._begin("head", key)
        try:
            obj = self._get_obj("head", key)
            self._observe("head", "ok")
            return obj.info(with_metadata=True)
        finally:
            await self._delay("head")

    async def _get(self, key: str, start: int, end: int | None, if_match: str | None) -> GetResult:
        await self._begin("get", key)
        try:
            obj = self._get_obj("get", key)
            if if_match is not None and if_match != obj.etag:
                self._observe("get", "precondition")
                raise PreconditionFailed(key)
            stop = len(obj.data) if end is None else min(end, len(obj.data))
            self._observe("get", "ok")
            return GetResult(
                obj.data[start:stop], obj.etag, len(obj.data), obj.mtime_ns, dict(obj.metadata)
            )
        finally:
            await self._delay("get")

    async def put(
        self, key: str, data: bytes, metadata: Mapping[str, str] | None = None
    ) -> ObjectInfo:
        await self._begin("put", key)
        await self._delay("put")
        self._observe("put", "ok")
        return self.seed(key, bytes(data), metadata=metadata)

    async def create_multipart(self, key: str, metadata: Mapping[str, str] | None = None) -> str:
        await self._begin("create_multipart", key)
        await self._delay("create_multipart")
        upload_id = f"upload-{next(self._upload_ids)}"
        self._uploads[upload_id] = _Upload(key, dict(metadata or {}))
        self._observe("create_multipart", "ok")
        return upload_id

    def _upload(self, op: str, key: str, upload_id: str) -> _Upload:
        up = self._uploads.get(upload_id)
        if up is None or up.key != key:
            self._observe(op, "not_found")
            raise ObjectNotFound(f"{key} (upload {upload_id})")
        return up

    async def upload_part(self, key: str, upload_id: str, part_no: int, data: bytes) -> str:
        await self._begin("upload_part", key)
        await self._delay("upload_part")
        up = self._upload("upload_part", key, upload_id)
        etag = _etag(bytes(data))
        up.parts[part_no] = (etag, bytes(data))
        self._observe("upload_part", "ok")
        return etag

    async def complete_multipart(
        self, key: str, upload_id: str, parts: list[tuple[int, str]]
    ) -> ObjectInfo:
        await self._begin("complete_multipart", key)
        await self._delay("complete_multipart")
        up = self._upload("complete_multipart", key, upload_id)
        chunks: list[bytes] = []
        digests = b""
        for part_no, etag in parts:
            stored = up.parts.get(part_no)
            if stored is None or stored[0] != etag:
                self._observe("complete_multipart", "error")
                raise BackendError(f"invalid part {part_no} for {key}")
            chunks.append(stored[1])
            digests += bytes.fromhex(etag.strip('"'))
        del self._uploads[upload_id]
        data = b"".join(chunks)
        info = self.seed(key, data, metadata=up.metadata)
        md5 = hashlib.md5(digests, usedforsecurity=False).hexdigest()
        info.etag = f'"{md5}-{len(parts)}"'
        self._objects[_sort_key(key)].etag = info.etag
        self._observe("complete_multipart", "ok")
        return info

    async def abort_multipart(self, key: str, upload_id: str) -> None:
        await self._begin("abort_multipart", key)
        await self._delay("abort_multipart")
        self._uploads.pop(upload_id, None)
        self._observe("abort_multipart", "ok")

    async def copy(
        self, src: str, dst: str, metadata: Mapping[str, str] | None = None
    ) -> ObjectInfo:
        await self._begin("copy", src)
        await self._delay("copy")
        obj = self._get_obj("copy", src)
        meta = dict(obj.metadata) if metadata is None else dict(metadata)
        self._observe("copy", "ok")
        return self.seed(dst, obj.data, metadata=meta)

    async def delete(self, key: str) -> None:
        # S3 DeleteObject of a missing key succeeds.
        await self._begin("delete", key)
        await self._delay("delete")
        self._objects.pop(_sort_key(key), None)
        self._observe("delete", "ok")

    async def close(self) -> None:
        self.closed = True


def _encode_token(kind: str, marker: bytes) -> str:
    return base64.urlsafe_b64encode(kind.encode() + marker).decode("ascii")


def _decode_token(token: str) -> tuple[str, bytes]:
    try:
        raw = base64.urlsafe_b64decode(token.encode("ascii"))
    except (binascii.Error, UnicodeEncodeError, ValueError) as exc:
        raise BackendError(f"invalid continuation token {token!r}") from exc
    if not raw or raw[:1] not in (b"k", b"p"):
        raise BackendError(f"invalid continuation token {token!r}")
    return raw[:1].decode(), raw[1:]
