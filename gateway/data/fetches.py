"""The bookkeeping of the data layer's fetches (``ObjectReader``): one backend GET and the
blocks it answers (``Fetch``, ``Pending``), the sequential streams read-ahead follows
(``Stream``, ``ObjectStreams``), and the small rules both the reader and the warm-ups use
(``block_runs``, ``same_etag``, what a GET's body may be kept as).

Must not: start or await anything (the reader does).
"""

from __future__ import annotations

import asyncio

from gateway.backend.base import ObjectStore
from gateway.data.cache import BlockKey
from gateway.data.disk.fileformat import DiskKey
from gateway.data.mappings import is_mapping

__all__ = [
    "Fetch",
    "ObjectStreams",
    "Pending",
    "Stream",
    "block_runs",
    "first_missing",
    "is_group_slice",
    "keepable",
    "mark_retrieved",
    "same_etag",
]


class Fetch:
    """One backend GET covering ``blocks`` (consecutive) of one object version."""

    __slots__ = (
        "store",
        "key",
        "etag",
        "size",
        "start",
        "origin",
        "end",
        "blocks",
        "demand",
        "slot_ra",
        "waiter",
        "cacheable",
        "nbytes",
        "ra_bytes",
        "task",
        "skip",
        "dkeys",
        "ahead",
        "defer",
    )

    def __init__(
        self, store: ObjectStore, key: str, etag: str, size: int, start: int, end: int | None
    ) -> None:
        self.store = store
        self.key = key
        self.etag = etag
        self.size = size
        self.start = start
        self.origin = start  # ``start`` before the disk tier narrowed the span
        self.end = end  # None: the whole object, no Range header
        self.blocks: list[tuple[BlockKey, Pending, int, int]] = []
        self.demand = False
        # A prefetch of a piece another fleet member owns: missing from the shared tier it
        # fails with ``NotFilledYet`` (retried later) rather than going to the origin, unless
        # a READ joined it meanwhile.
        self.defer = False
        self.slot_ra = False
        self.waiter: asyncio.Future[None] | None = None
        self.cacheable = True
        self.nbytes = (size if end is None else end) - start
        self.ra_bytes = 0  # counted in ObjectReader._ra_inflight_bytes until it finishes
        self.task: asyncio.Task[None] | None = None
        self.skip = 0  # the GET starts this far into the span (blocks found on disk)
        self.dkeys: list[DiskKey] = []  # the disk tier's key of each block
        self.ahead = False  # the data prefetcher's (``prefetch``)


class Pending:
    __slots__ = ("future", "fetch", "demanded")

    def __init__(
        self, future: asyncio.Future[bytes | memoryview], fetch: Fetch, demanded: bool
    ) -> None:
        self.future = future
        self.fetch = fetch
        self.demanded = demanded


class Stream:
    __slots__ = ("next_offset", "window", "ra_end")

    def __init__(self, next_offset: int, window: int, ra_end: int) -> None:
        self.next_offset = next_offset  # highest end of the READs that matched
        self.window = window  # 0: not sequential (yet)
        self.ra_end = ra_end  # blocks below this are cached, in flight or demanded


class ObjectStreams:
    __slots__ = ("etag", "streams")

    def __init__(self, etag: str) -> None:
        self.etag = etag
        self.streams: list[Stream] = []


def mark_retrieved(fut: asyncio.Future[bytes | memoryview]) -> None:
    # Mark a failed block future's exception as retrieved: read-ahead blocks nobody waited for
    # must not log "Future exception was never retrieved".
    if not fut.cancelled():
        fut.exception()


def block_runs(blocks: list[int], max_n: int) -> list[tuple[int, int]]:
    """Sorted block indexes -> (first, count) runs of consecutive blocks, <= max_n long."""
    runs: list[tuple[int, int]] = []
    for b in blocks:
        if runs and runs[-1][0] + runs[-1][1] == b and runs[-1][1] < max_n:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((b, 1))
    return runs


def first_missing(f: Fetch) -> int:
    """The index of ``f``'s first block not yet answered (by the disk tier)."""
    return next((i for i, (_, p, _, _) in enumerate(f.blocks) if not p.future.done()), 0)


def keepable(body: bytes | memoryview | bytearray) -> bytes | memoryview:
    """A GET's body as the cache may keep it: ``bytes``, a view of ``bytes`` (a pack member:
    a slice of its group's buffer) or a mapping of the disk tier as they are; any other
    buffer (its owner may reuse it) copied."""
    if type(body) is bytes:
        return body
    if type(body) is memoryview and (type(body.obj) is bytes or is_mapping(body)):
        return body
    return bytes(body)


def is_group_slice(body: bytes | memoryview) -> bool:
    """A view of ``bytes``: a pack member, a slice of its group's buffer (``keepable``)."""
    return type(body) is memoryview and type(body.obj) is bytes


def same_etag(a: str, b: str) -> bool:
    return a == b or a.strip('"') == b.strip('"')
