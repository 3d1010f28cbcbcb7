"""The object-store interface every backend implements, and its error hierarchy.

Owns: the narrow contract between the gateway and an object store (list page, head, get
range, put, multipart, copy, delete) and the request counters that make "backend requests
per file" readable. Must not: import nfsproto or know about NFS; the gateway maps
``BackendError`` subclasses to NFS status codes in one place.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True, slots=True)
class StoreTraits:
    """What the layers above may decide from a store without knowing its kind's class or URL.

    ``kind``: ``"s3"``, ``"local"``, ``"memory"`` (a pack's store forwards its bucket's).
    ``latency_to_hide``: whether a request costs a round trip worth prefetching ahead of
    READs (False for a local directory: the page cache holds its files, a prefetch would only
    take CPU from READs). ``endpoint``: where requests go, as the startup probe logs it."""

    kind: str
    latency_to_hide: bool
    endpoint: str


class BackendError(Exception):
    """A backend request failed for good (after retries). Maps to NFS3ERR_IO."""


class ObjectNotFound(BackendError):
    """404 / NoSuchKey. Maps to NOENT or STALE depending on the caller."""


class PreconditionFailed(BackendError):
    """412: the object changed under an If-Match. The caller refetches attributes."""


class BackendUnavailable(BackendError):
    """Retries exhausted on 5xx/SlowDown/connection errors or a timeout: retry later
    (NFS3ERR_JUKEBOX where the export allows it)."""


class AccessDeniedError(BackendError):
    """403 from the store. Maps to NFS3ERR_ACCES."""


@dataclass(slots=True)
class ObjectInfo:
    """One object as a listing or a HEAD describes it. ``key`` is the full key."""

    key: str
    size: int
    etag: str
    mtime_ns: int
    metadata: Mapping[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class ListPage:
    """One ListObjectsV2 page with ``Delimiter='/'``. ``prefixes`` are full common prefixes
    (ending in '/'). ``next_token`` is None on the last page. ``skipped`` counts keys the
    backend could not represent (e.g. not UTF-8)."""

    objects: list[ObjectInfo]
    prefixes: list[str]
    next_token: str | None
    skipped: int = 0
    # Identifies the page's bytes (``checksums.page_digest``; b"": the store gives none). A
    # page with a digest carries no object metadata (ListObjectsV2 pages have none).
    digest: bytes = b""


class Unchanged:
    """A page received whose bytes have the digest the caller said it knew
    (``list_page_if_changed``): not parsed; ``parse()`` parses it (and raises
    ``BackendError`` if it cannot)."""

    __slots__ = ("_parse", "digest", "nbytes")

    def __init__(self, digest: bytes, nbytes: int, parse: Callable[[], ListPage]) -> None:
        self.digest = digest
        self.nbytes = nbytes  # what holding it costs
        self._parse = parse

    def parse(self) -> ListPage:
        return self._parse()


@dataclass(slots=True)
class GetResult:
    """Body of a (ranged) GET. ``size`` is the whole object's size, ``etag`` its version."""

    data: bytes
    etag: str
    size: int
    mtime_ns: int
    metadata: Mapping[str, str] = field(default_factory=dict)


# Called once per backend request: (operation, outcome, seconds). Operations: "list", "head",
# "get", "put", "create_multipart", "upload_part", "complete_multipart", "abort_multipart",
# "copy", "delete", "attributes" (GetObjectAttributes: a multipart object's parts). Outcomes:
# "ok", "not_found", "precondition", "error", "retry".
RequestObserver = Callable[[str, str, float], None]


class ObjectStore(Protocol):
    """An export's view of one bucket (or directory) under one prefix. Keys passed in and out
    are full keys; the namespace strips and adds the export prefix.

    Optional, asked for with ``getattr`` (``S3Store`` has it; a ``StoreWrapper`` does not
    forward it, so a wrapper that answers listings itself is never bypassed):
    ``list_page_if_changed(prefix, *, delimiter, token, max_keys, known: bytes) -> ListPage |
    Unchanged``, ``list_page`` that skips the parse when the page's digest is ``known``;
    ``watch_listing(prefix) -> token | None`` and ``unchanged_since(token) -> bool``
    (``LocalStore``: inotify), whether anything changed in a directory since a listing of it
    started; ``covered(key) -> bool`` and ``fetch_group(key) -> Hashable | None``
    (``PackedStore``): whether a whole-object GET of ``key`` would join another request's
    fetch already under way (a pack member's group), and the fetch it would share with
    other keys (its group): the data layer then does not look for it in its disk tier first,
    nor for more than one key of a group at a time."""

    name: str

    @property
    def traits(self) -> StoreTraits: ...

    async def list_page(
        self,
        prefix: str,
        *,
        delimiter: str | None = "/",
        token: str | None = None,
        start_after: str | None = None,
        max_keys: int = 1000,
    ) -> ListPage: ...

    async def head(self, key: str) -> ObjectInfo: ...

    async def get(
        self,
        key: str,
        start: int = 0,
        end: int | None = None,
        *,
        if_match: str | None = None,
        size: int | None = None,
    ) -> GetResult:
        """Bytes [start, end) of the object (end None = to the end). ``if_match`` pins the
        version: a changed object raises PreconditionFailed. ``size``: the object's size
        when the caller knows it (its listing): a hint that bounds the reply of a GET
        without a range end (``S3Store``: a longer body is refused before it is received)."""
        ...

    async def put(
        self, key: str, data: bytes, metadata: Mapping[str, str] | None = None
    ) -> ObjectInfo: ...

    async def create_multipart(
        self, key: str, metadata: Mapping[str, str] | None = None
    ) -> str: ...

    async def upload_part(self, key: str, upload_id: str, part_no: int, data: bytes) -> str: ...

    async def complete_multipart(
        self, key: str, upload_id: str, parts: list[tuple[int, str]]
    ) -> ObjectInfo: ...

    async def abort_multipart(self, key: str, upload_id: str) -> None: ...

    async def copy(
        self, src: str, dst: str, metadata: Mapping[str, str] | None = None
    ) -> ObjectInfo: ...

    async def delete(self, key: str) -> None: ...

    async def close(self) -> None: ...


class StoreBase(ABC):
    """The template every store class builds on: the one signature of ``list_page`` and
    ``get`` (as ``ObjectStore`` documents them) and the range check, over the ``_list_page``
    and ``_get`` a store implements with every argument given. Costs one coroutine frame per
    request."""

    name: str

    async def list_page(
        self,
        prefix: str,
        *,
        delimiter: str | None = "/",
        token: str | None = None,
        start_after: str | None = None,
        max_keys: int = 1000,
    ) -> ListPage:
        return await self._list_page(prefix, delimiter, token, start_after, max_keys)

    async def get(
        self,
        key: str,
        start: int = 0,
        end: int | None = None,
        *,
        if_match: str | None = None,
        size: int | None = None,
    ) -> GetResult:
        # ``size`` is a hint only S3Store (which overrides this) uses.
        if start < 0 or (end is not None and end < 0):
            raise ValueError(f"bad range [{start}, {end})")
        return await self._get(key, start, end, if_match)

    @abstractmethod
    async def _list_page(
        self, prefix: str, delimiter: str | None, token: str | None, after: str | None, limit: int
    ) -> ListPage: ...

    @abstractmethod
    async def _get(
        self, key: str, start: int, end: int | None, if_match: str | None
    ) -> GetResult: ...


class StoreWrapper(StoreBase):
    """An ``ObjectStore`` that hands every request to ``inner`` unchanged; a wrapper that
    changes some (a pack's store answers GETs from shards, a test's spy records them)
    subclasses it and overrides only those."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.name = inner.name

    @property
    def traits(self) -> StoreTraits:
        return self.inner.traits

    async def _list_page(
        self, prefix: str, delimiter: str | None, token: str | None, after: str | None, limit: int
    ) -> ListPage:
        return await self.inner.list_page(
            prefix, delimiter=delimiter, token=token, start_after=after, max_keys=limit
        )

    async def _get(self, key: str, start: int, end: int | None, if_match: str | None) -> GetResult:
        return await self.inner.get(key, start, end, if_match=if_match)

    async def head(self, key: str) -> ObjectInfo:
        return await self.inner.head(key)

    async def put(
        self, key: str, data: bytes, metadata: Mapping[str, str] | None = None
    ) -> ObjectInfo:
        return await self.inner.put(key, data, metadata)

    async def create_multipart(self, key: str, metadata: Mapping[str, str] | None = None) -> str:
        return await self.inner.create_multipart(key, metadata)

    async def upload_part(self, key: str, upload_id: str, part_no: int, data: bytes) -> str:
        return await self.inner.upload_part(key, upload_id, part_no, data)

    async def complete_multipart(
        self, key: str, upload_id: str, parts: list[tuple[int, str]]
    ) -> ObjectInfo:
        return await self.inner.complete_multipart(key, upload_id, parts)

    async def abort_multipart(self, key: str, upload_id: str) -> None:
        await self.inner.abort_multipart(key, upload_id)

    async def copy(
        self, src: str, dst: str, metadata: Mapping[str, str] | None = None
    ) -> ObjectInfo:
        return await self.inner.copy(src, dst, metadata)

    async def delete(self, key: str) -> None:
        await self.inner.delete(key)

    async def close(self) -> None:
        await self.inner.close()
