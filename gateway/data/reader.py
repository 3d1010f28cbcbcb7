"""The READ path of the data layer: read coalescing, read-ahead, single-flight fetches.

Owns: turning ``(object version, offset, count)`` into bytes with as few backend GETs as
possible, the per-object stream state that drives read-ahead, and the bound on concurrent
GETs. Must not: store bytes itself (``DataCache`` and ``DiskStore`` do), know about NFS or
file handles, or catch ``CancelledError`` without re-raising it.

Two tiers: a fetch (single-flight, below) first asks the disk tier (``gateway.data.disk``) for
its blocks, before it takes a GET slot; the blocks found are served and cached in memory as
``on_disk``; a ranged fetch is narrowed to the span of the missing ones. Not asked (an unshared
tier): a pack member whose group is being fetched, or one of whose group-mates was just looked
for in vain (``_look_on_disk``). Blocks the backend
returns are published to the disk tier when it admits them (in the background: a READ never
waits for a disk write), except a pack member that one worker keeps in memory (``deposit``).

Geometry
--------
* **Small objects** (``size <= small_file_max``, 4 MiB) are one cache entry: the first READ
  fetches the whole object with one GET (no Range header) and every later READ at any offset is
  a memoryview slice of it. A zero-byte object costs no request at all.
* **Large objects** are cut into aligned ``block_size`` blocks, 1 MiB by default because:
  Linux clients READ at most ``rsize`` = 1 MiB, so an aligned READ touches one block and any
  READ at most two; a random 4 KiB READ costs a 1 MiB GET, which on S3 (~20-50 ms to first
  byte, ~100 MB/s per connection) is ~10 ms of transfer on top of the latency it pays anyway;
  per-entry overhead is 0.06 %; and the request size of read-ahead is decoupled from it (see
  ``max_request_bytes``), so sequential throughput does not depend on the block size.

Read-ahead
----------
Per object version, up to ``max_streams_per_object`` streams (LRU), over at most
``max_streams`` objects (LRU). A READ belongs to a stream when it starts within
``[next_offset - max(window, block), next_offset + block]`` (the Linux client's parallel
READs arrive slightly out of order); otherwise it opens a new stream, which is how random
access resets the window (a stream that is not sequential yet only matches an exact
continuation). A stream opened at offset 0, or continued sequentially, reads ahead:
when fewer than ``max(window/2, block)`` bytes remain ahead of the READ, blocks up to
``end + window`` are requested and the window doubles, up to ``max_readahead`` (32 MiB) and to
half the cache's read-ahead share. Adjacent missing blocks are fetched as one ranged GET of up
to ``max_request_bytes`` (8 MiB) and split; demand fetches only cover the blocks the READ
needs, so a READ never waits for 8 MiB it did not ask for.

Mapped entries
--------------
A disk-tier hit may be a read-only mapping of the entry's pages (``gateway.data.disk.entries``,
"Mappings"), verified once when mapped. Its file can still be truncated, removed and
truncated, or fail to read back under it (another program, a failing disk): a user-space
touch of such a page raises SIGBUS, which would kill the worker. So a READ answered from a
mapping checks it first, with no signal possible (``fastwire.mapped_readable``: the kernel
populates the pages the READ sends, EFAULT instead of SIGBUS), and hands the transport the
mapping itself: the send copies it in the kernel, where a page broken in the microseconds
since fails with EFAULT (the transport closes that connection; the client retries) rather
than SIGBUS. Where user space would copy the bytes (several blocks joined into one READ's
answer; a transport that joins its buffers: the standard asyncio loop before Python 3.12),
they are copied here under a SIGBUS guard instead (``fastwire.copy_mapped``). A broken
mapping is dropped from memory (its version's blocks), its disk entry is checked again from
the file and dropped when bad (``DiskStore.drop``: logged, ``nfsgw_disk_cache_corrupt_total``),
and the READ fetches again (the disk tier now misses: the backend); a second broken mapping
in the same READ answers ``IoError`` (NFS3ERR_IO). The pure-Python twin has no guard: its
check is an ``fstat`` and ``madvise`` just before the copy or send (``fastwire``).

Single-flight and bounds
------------------------
Every block being fetched has one ``Future`` in ``_inflight``; a READ that needs it awaits
``asyncio.shield(future)``, so a cancelled READ never cancels the fetch others wait on. One
GET (a ``Task``) resolves the futures of all blocks it covers; on failure every waiter gets
the exception and nothing is cached; the next READ retries. ``PreconditionFailed`` (the etag
changed) also drops the cached blocks and streams of that version and reaches each caller as
the domain's ``errors.VersionChanged`` (a fresh one per caller); ``read_current`` refreshes the
version once through the caller's callback and reads the new one.

GETs run under ``max_inflight_fetches`` slots; read-ahead may hold at most
``max_readahead_fetches`` of them, and a freed slot always goes to a waiting demand fetch
first (a READ waiting on a queued read-ahead fetch promotes it). Memory outside the cache
budget: bodies being received are bounded by the slots (``max_inflight_fetches x
max_request_bytes``, 320 MiB by default; a demand GET is at most one small object or the
blocks of one READ); read-ahead requested but not landed is capped at
``max_readahead_inflight_bytes`` (queued fetches hold no buffer). Landed read-ahead is charged
to the cache (its prefetch share). Demand fetches are not capped here: each READ starts at most
``ceil(count / block) + 1``, so the transport's calls-in-flight cap bounds them.
"""

from __future__ import annotations

import asyncio
import sys
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, Final, Protocol, TypeVar

from gateway import fastwire
from gateway.backend.base import (
    BackendError,
    BackendUnavailable,
    ObjectStore,
    PreconditionFailed,
)
from gateway.data.cache import BLOCK_ENTRY_CHARGE_BYTES, BlockKey, DataCache
from gateway.data.config import DataConfig
from gateway.data.disk.fileformat import disk_key
from gateway.data.disk.store import DiskStore
from gateway.data.events import FileOpened
from gateway.data.fetches import (
    Fetch,
    ObjectStreams,
    Pending,
    Stream,
    block_runs,
    first_missing,
    is_group_slice,
    keepable,
    mark_retrieved,
    same_etag,
)
from gateway.data.mappings import is_mapping
from gateway.data.shared import NotFilledYet
from gateway.data.slots import FetchSlots
from gateway.data.stats import DataStats
from gateway.data.tiers import Piece, Tier
from gateway.errors import IoError, VersionChanged

__all__ = ["DataConfig", "ObjectReader", "Version"]

MiB = 1024 * 1024


class Version(Protocol):
    """What ``read_current`` needs of an object version (a namespace entry is one)."""

    @property
    def etag(self) -> str: ...

    @property
    def size(self) -> int: ...


V = TypeVar("V", bound=Version)


class ObjectReader:
    """Serves READs of object versions from ``cache``, fetching what is missing."""

    def __init__(
        self,
        cache: DataCache,
        config: DataConfig | None = None,
        stats: DataStats | None = None,
        disk: DiskStore | None = None,
        *,
        opened: FileOpened | None = None,
        shared: Tier | None = None,
    ) -> None:
        self.cache: Final = cache
        self.disk: Final = disk
        self.shared: Final = shared
        """The fleet's shared tier (``gateway.data.shared``): whole objects a disk miss looks
        for before the origin, and fills with what the origin sent."""
        self.opened: Final = opened if opened is not None else FileOpened()
        """Told (store name, key, memory hit) at every READ at offset 0 of a small object
        (the data prefetcher's record of what this pass has read, and of whether READs find
        their files in memory)."""
        self.config: Final = config if config is not None else DataConfig()
        cfg = self.config
        self.stats = stats if stats is not None else cache.stats
        self._inflight: dict[BlockKey, Pending] = {}
        # Pack groups (store name, group) one of whose members is being looked for in the
        # disk tier: whether it was missing (``_look_on_disk``).
        self._looking: dict[tuple[str, object], asyncio.Future[bool]] = {}
        self._fetches: set[Fetch] = set()
        self._drops: set[asyncio.Task[None]] = set()  # DiskStore.drop of broken mappings
        self._send_copies: bool | None = None  # ``_copies_on_send``, once known
        self.slots: Final = FetchSlots(
            cfg.max_inflight_fetches, cfg.max_readahead_fetches, self.stats
        )
        """The GET slots (``gateway.data.warm`` takes read-ahead's share of them)."""
        self._streams: OrderedDict[tuple[str, str], ObjectStreams] = OrderedDict()
        self._ra_inflight_bytes = 0
        self.warming: dict[tuple[str, str, str], asyncio.Future[tuple[str, int]]] = {}
        """Object versions being written to the disk tier by ``warm.warm_object`` (its
        single-flight: a warm-up job and the data prefetcher may ask for the same one)."""
        self.max_run: Final = max(1, cfg.max_request_bytes // cfg.block_size)
        """Blocks one ranged GET may cover."""
        # Read-ahead lands in the cache's prefetch share: a window larger than half of it
        # would push its own blocks out before they are read.
        self._ra_max = min(cfg.max_readahead, cache.prefetch_cap_bytes // 2)
        if self._ra_max < cfg.block_size + BLOCK_ENTRY_CHARGE_BYTES or cfg.initial_readahead == 0:
            self._ra_max = 0

    # -- READ ----------------------------------------------------------------------------

    async def read_current(
        self,
        store: ObjectStore,
        key: str,
        version: V,
        offset: int,
        count: int,
        refresh: Callable[[], Awaitable[V]],
    ) -> tuple[V, bytes | memoryview, bool]:
        """``read`` of ``version``; when the object changed since (``VersionChanged``), one
        ``refresh()`` (the caller's HEAD) and one read of the new version. The bytes always
        come from the version returned. A second change (an object that keeps changing, or a
        backend whose replies never match the version it lists) is ``IoError``: retrying the
        same handle cannot help the client, and the handle itself is not stale."""
        try:
            data, eof = await self.read(store, key, version.etag, version.size, offset, count)
        except VersionChanged:
            version = await refresh()
            try:
                data, eof = await self.read(store, key, version.etag, version.size, offset, count)
            except VersionChanged as e:
                raise IoError(f"{key}: changed again while being read ({e})") from e
        return version, data, eof

    async def read(
        self, store: ObjectStore, key: str, etag: str, size: int, offset: int, count: int
    ) -> tuple[bytes | memoryview, bool]:
        """Up to ``count`` bytes of version ``etag`` (``size`` bytes long) at ``offset``, and
        whether they reach the end of the object. Raises ``VersionChanged`` when the object is
        no longer ``etag``, the backend's errors otherwise."""
        try:
            return await self._read(store, key, etag, size, offset, count)
        except PreconditionFailed as e:
            # One failed GET answers every READ waiting on it: each gets its own error.
            raise VersionChanged(str(e)) from e

    async def _read(
        self, store: ObjectStore, key: str, etag: str, size: int, offset: int, count: int
    ) -> tuple[bytes | memoryview, bool]:
        if offset < 0 or count < 0:
            raise ValueError("offset and count must be >= 0")
        end = min(offset + count, size)
        if offset >= end:
            return b"", offset >= size
        eof = end >= size
        for _ in range(2):  # a broken disk-tier mapping: fetched once more
            if size <= self.config.small_file_max:
                got = await self._read_small(store, key, etag, size, offset, count, end)
            else:
                got = await self._read_blocks(store, key, etag, size, offset, end)
            if got is not None:
                return got, eof
        raise IoError(f"{key}: the disk tier's entry broke under its mapping twice")

    async def _read_small(
        self, store: ObjectStore, key: str, etag: str, size: int, offset: int, count: int, end: int
    ) -> bytes | memoryview | None:
        """``_read`` of a small object; None when the bytes were a broken mapping (dropped)."""
        hit = self.read_cached(store.name, key, etag, size, offset, count)
        if hit is not None:
            return hit[0]
        if offset == 0 and self.opened.listening:
            self.opened.note_open(store.name, key, False)
        self.stats.misses += 1
        bkey = (store.name, key, etag, 0)
        fut = self._join(bkey)
        if fut is None:
            fut = self._start_fetch(store, key, etag, size, 0, 1, demand=True)[0]
        data = await asyncio.shield(fut)
        if is_mapping(data):
            return self._from_mapping(bkey, size, data, offset, end)
        if offset == 0 and end == len(data):
            return data
        return memoryview(data)[offset:end]

    def read_cached(
        self, store_name: str, key: str, etag: str, size: int, offset: int, count: int
    ) -> tuple[bytes | memoryview, bool] | None:
        """``read`` of a small object whose version is in memory, without awaiting (the fast
        path, ``gateway.fastpath``), counted as ``read`` counts a hit; None (and nothing
        counted or told) when it is not there. ``offset`` and ``count`` are >= 0 and
        ``offset`` < ``size`` <= ``small_file_max``."""
        bkey = (store_name, key, etag, 0)
        data = self.cache.lookup(bkey)
        if data is None:
            return None
        end = min(offset + count, size)
        if is_mapping(data):
            out = self._from_mapping(bkey, size, data, offset, end)
            if out is None:
                return None  # broken: dropped, the caller fetches again
        elif offset == 0 and end == len(data):
            out = data
        else:
            out = memoryview(data)[offset:end]
        if offset == 0 and self.opened.listening:
            self.opened.note_open(store_name, key, True)
        stats = self.stats
        stats.hits += 1
        stats.bytes_hit += end - offset
        return out, end >= size

    # -- mapped entries (module docstring, "Mapped entries") -------------------------------

    def _from_mapping(
        self, bkey: BlockKey, size: int, data: memoryview, lo: int, hi: int
    ) -> bytes | memoryview | None:
        """Bytes ``[lo, hi)`` of ``data``, a disk-tier mapping of block ``bkey`` (of an
        object of ``size`` bytes), safe to hand to the transport: the mapping itself when its
        pages can be read now and the transport sends buffers as they are (a kernel-side
        copy), else a copy made under the SIGBUS guard; None when it is broken (dropped)."""
        if self._copies_on_send():
            got = fastwire.copy_mapped(data, lo, hi)
            if got is not None:
                return got
        elif fastwire.mapped_readable(data, lo, hi):
            return data if lo == 0 and hi == len(data) else data[lo:hi]
        self._broken(bkey, size)
        return None

    def _copies_on_send(self) -> bool:
        """Whether the running loop's transports copy a reply's buffers in user space: the
        standard loop's ``writelines`` joins them before Python 3.12 (uvloop's, and the
        standard one's from 3.12, hand them to ``sendmsg``/``writev`` as they are)."""
        copies = self._send_copies
        if copies is None:
            loop = asyncio.get_running_loop()
            copies = sys.version_info < (3, 12) and not type(loop).__module__.startswith("uvloop")
            self._send_copies = copies
        return copies

    def _broken(self, bkey: BlockKey, size: int) -> None:
        """Block ``bkey``'s mapping is broken: drop its version's blocks from memory and a
        finished fetch of it still listed, and have the disk tier check and drop its entry
        (in the background)."""
        store_name, key, etag, block = bkey
        self.cache.invalidate(store_name, key, etag)
        p = self._inflight.get(bkey)
        if p is not None and p.future.done():
            del self._inflight[bkey]
        disk = self.disk
        if disk is None:
            return
        if size <= self.config.small_file_max:
            start, length = 0, size
        else:
            bs = self.config.block_size
            start = block * bs
            length = min(bs, size - start)
        t = asyncio.get_running_loop().create_task(
            disk.drop(disk_key(store_name, key, etag, start, length))
        )
        self._drops.add(t)
        t.add_done_callback(self._drops.discard)

    async def _read_blocks(
        self, store: ObjectStore, key: str, etag: str, size: int, offset: int, end: int
    ) -> bytes | memoryview | None:
        """``_read`` of a large object's blocks; None when one was a broken mapping."""
        bs = self.config.block_size
        first = offset // bs
        last = (end - 1) // bs
        name = store.name
        stats = self.stats
        cache = self.cache
        got: list[bytes | memoryview | asyncio.Future[bytes | memoryview] | None] = []
        missing: list[int] = []
        for b in range(first, last + 1):
            bkey = (name, key, etag, b)
            data = cache.lookup(bkey)
            if data is not None:
                stats.hits += 1
                stats.bytes_hit += min(end, (b + 1) * bs) - max(offset, b * bs)
                got.append(data)
                continue
            stats.misses += 1
            fut = self._join(bkey)
            if fut is None:
                missing.append(b)
            got.append(fut)
        for run_first, n in block_runs(missing, self.max_run):
            futs = self._start_fetch(store, key, etag, size, run_first, n, demand=True)
            got[run_first - first : run_first - first + n] = futs
        self._readahead(store, key, etag, size, offset, end)

        parts: list[bytes | memoryview] = []
        broken = False
        for i, item in enumerate(got):
            assert item is not None
            data = await asyncio.shield(item) if isinstance(item, asyncio.Future) else item
            b = first + i
            lo, hi = max(offset - b * bs, 0), min(end - b * bs, len(data))
            if not is_mapping(data):
                parts.append(memoryview(data)[lo:hi])
            elif len(got) == 1:  # sent as it is (or copied when the transport would)
                part = self._from_mapping((name, key, etag, b), size, data, lo, hi)
                broken = broken or part is None
                parts.append(part if part is not None else b"")
            else:  # joined below: copied here, under the guard
                copy = fastwire.copy_mapped(data, lo, hi)
                if copy is None:
                    self._broken((name, key, etag, b), size)
                    broken = True
                parts.append(copy if copy is not None else b"")
        if broken:
            return None
        if len(parts) == 1:
            return parts[0]
        return b"".join(parts)

    # -- data prefetch -------------------------------------------------------------------

    def prefetch(
        self, store: ObjectStore, key: str, etag: str, size: int, *, defer: bool = False
    ) -> asyncio.Future[bytes | memoryview] | None:
        """Start fetching small object version ``etag`` (``size`` bytes) ahead of any READ,
        as a read-ahead-class GET (demand fetches go first; a READ joining it promotes it);
        the bytes land in the cache's ahead segment if it has room then (``DataCache.insert``).
        None when it is cached, already being fetched, empty or not a small object.
        ``defer``: another fleet member owns it; missing from the shared tier, the fetch
        fails with ``NotFilledYet`` instead of asking the origin (unless a READ joins it)."""
        if not 0 < size <= self.config.small_file_max:
            return None
        bkey = (store.name, key, etag, 0)
        if bkey in self.cache or bkey in self._inflight:
            return None
        fut = self._start_fetch(store, key, etag, size, 0, 1, demand=False, ahead=True)[0]
        self._inflight[bkey].fetch.defer = defer and self.shared is not None
        return fut

    def deposit(
        self, store_name: str, key: str, etag: str, data: bytes | memoryview, memory: bool = True
    ) -> asyncio.Task[bool] | None:
        """Small object version ``etag`` arrived with another's fetch (a pack's group, ``data``
        a slice of its buffer, kept as it is: no copy). Kept in memory as prefetched data if
        ``memory`` (the memory tier had room for the group) and the cache has room
        (``DataCache.room_for``), never evicting anything a READ may still want; published to
        the disk tier when it is shared by several workers (they read it from there instead of
        fetching its group again; the memory copy is then swapped for the entry's mapping, as
        for a fetched object) or when it is not kept in memory. Returns the publishing task
        (None: nothing written). A version being fetched, or in memory already, is left alone.

        One worker that keeps it in memory does not write it to disk: a write costs more
        than the rest of a member's cold path in CPU here (``entries.write_bundle``:
        ~0.2-0.35 ms per 110 kB entry in bundles on this VM's ext4, against ~0.1 ms), and a
        shuffled epoch reads it from memory anyway."""
        if not 0 < len(data) <= self.config.small_file_max:
            return None
        bkey = (store_name, key, etag, 0)
        if bkey in self._inflight or bkey in self.cache:
            return None
        disk = self.disk
        shared = disk is not None and disk.shared
        dkey = disk_key(store_name, key, etag, 0, len(data)) if shared else None
        on_disk = disk is not None and dkey is not None and disk.admit(dkey)
        kept = memory and self.cache.insert(bkey, data, whole=True, ahead=True, on_disk=on_disk)
        if disk is None or (kept and not shared):
            return None
        if dkey is None:  # one worker, not kept in memory: the disk tier keeps it
            dkey = disk_key(store_name, key, etag, 0, len(data))
            on_disk = disk.admit(dkey)
        if not on_disk:
            return None
        swap = None
        if kept:

            def swap(view: memoryview) -> None:
                self.cache.swap(bkey, data, view)

        return disk.publish(dkey, data, swap)

    def cached(self, store_name: str, key: str, etag: str) -> bool:
        """Whether small object version ``etag`` is in memory or being fetched."""
        bkey = (store_name, key, etag, 0)
        return bkey in self.cache or bkey in self._inflight

    # -- single-flight fetches -----------------------------------------------------------

    def _join(self, bkey: BlockKey) -> asyncio.Future[bytes | memoryview] | None:
        """The in-flight fetch of ``bkey`` a READ can wait on, if any."""
        p = self._inflight.get(bkey)
        if p is None:
            return None
        self.stats.joined += 1
        if p.fetch.ahead:
            self.stats.ahead_joined += 1
        if not p.demanded:
            p.demanded = True
            self.cache.note_miss(bkey)
            self.slots.promote(p.fetch)
        return p.future

    def _start_fetch(
        self,
        store: ObjectStore,
        key: str,
        etag: str,
        size: int,
        first: int,
        n: int,
        *,
        demand: bool,
        ahead: bool = False,
    ) -> list[asyncio.Future[bytes | memoryview]]:
        loop = asyncio.get_running_loop()
        if size <= self.config.small_file_max:
            f = Fetch(store, key, etag, size, 0, None)
            spans = [(0, size)]
        else:
            bs = self.config.block_size
            start = first * bs
            stop = min((first + n) * bs, size)
            f = Fetch(store, key, etag, size, start, stop)
            spans = [
                (b * bs - start, min((b + 1) * bs, size) - start) for b in range(first, first + n)
            ]
        f.demand = demand
        f.ahead = ahead
        futs: list[asyncio.Future[bytes | memoryview]] = []
        for i, (lo, hi) in enumerate(spans):
            bkey = (store.name, key, etag, first + i)
            fut: asyncio.Future[bytes | memoryview] = loop.create_future()
            fut.add_done_callback(mark_retrieved)
            p = Pending(fut, f, demand)
            self._inflight[bkey] = p
            f.blocks.append((bkey, p, lo, hi))
            futs.append(fut)
            if demand:
                self.cache.note_miss(bkey)
        if not demand and not ahead:
            f.ra_bytes = f.nbytes
            self._ra_inflight_bytes += f.ra_bytes
            self.stats.readahead_blocks += n
        self._fetches.add(f)
        self.stats.pending_fetch_bytes += f.nbytes
        f.task = loop.create_task(self._run_fetch(f), name=f"datafetch:{key}")
        return futs

    async def _run_fetch(self, f: Fetch) -> None:
        stats = self.stats
        disk = self.disk
        claim = None
        try:
            if disk is not None:
                if not await self._look_on_disk(disk, f):
                    return
                if disk.shared:
                    # Another worker may be fetching it: wait for its entry, not a 2nd GET.
                    claim = await disk.claim(f.dkeys[first_missing(f)])
                    if claim.present and await self._from_disk(disk, f):
                        return
            piece = self._shared_piece(f)
            body = None if piece is None else await self._from_shared(piece)
            if body is None:
                if f.defer and not f.demand:
                    raise NotFilledYet(f"{f.key}: not in the shared tier yet")
                body = await self._from_origin(f)
                if piece is not None:
                    self._fill_shared(piece, body)
            writes = self._deliver(f, keepable(body))
            if claim is not None and claim.fd >= 0 and writes:
                # The claim holds until the entries are in place: a waiting worker then
                # reads them instead of fetching (the READs were answered already).
                await asyncio.shield(asyncio.gather(*writes))
        except PreconditionFailed as exc:
            stats.precondition_failed += 1
            self._forget_version(f.store.name, f.key, f.etag)
            self._fail(f, exc)
        except NotFilledYet as exc:  # a deferred prefetch (the prefetcher counts it)
            self._fail(f, exc)
        except Exception as exc:
            stats.fetch_errors += 1
            self._fail(f, exc)
        except BaseException:  # cancelled (close()): waiters must not hang
            self._fail(f, None)
            raise
        finally:
            if claim is not None:
                claim.release()
            self._finish(f)

    async def _from_origin(self, f: Fetch) -> bytes | memoryview:
        """``f``'s bytes from its store: a GET in one of the slots, checked against the
        version and range asked for."""
        stats = self.stats
        await self.slots.acquire(f)
        stats.inflight_fetches += 1
        stats.gets += 1
        try:
            async with asyncio.timeout(self.config.fetch_timeout_s):
                res = await f.store.get(f.key, f.start, f.end, if_match=f.etag)
        except TimeoutError as exc:
            raise BackendUnavailable(f"{f.key}: GET timed out") from exc
        finally:
            stats.inflight_fetches -= 1
            self.slots.release(f)
        if (res.etag and not same_etag(res.etag, f.etag)) or res.size != f.size:
            raise PreconditionFailed(f"{f.key}: now {res.etag!r} ({res.size} B)")
        want = (f.size if f.end is None else f.end) - f.start
        if len(res.data) != want:
            raise BackendError(f"{f.key}: got {len(res.data)} B for a {want} B range")
        stats.bytes_fetched += want
        return res.data

    def _shared_piece(self, f: Fetch) -> Piece | None:
        """The shared-tier piece ``f`` is, when the shared tier keeps it: a whole object of a
        plain store (a pack member's bytes come from its group: ``fetch_group``)."""
        if self.shared is None or f.start != 0 or f.end is not None or not f.cacheable:
            return None
        if getattr(f.store, "fetch_group", None) is not None:
            return None
        return Piece(f.store.name, f.key, f.etag, 0, f.size)

    async def _from_shared(self, piece: Piece) -> bytes | memoryview | None:
        assert self.shared is not None
        got = await self.shared.lookup(piece, False)
        if got is not None and len(got) != piece.length:  # the tier verifies; belt and braces
            return None
        return got

    def _fill_shared(self, piece: Piece, body: bytes | memoryview) -> None:
        """Put what the origin sent in the shared tier, in the background, if it takes it."""
        assert self.shared is not None
        if self.shared.admit(piece):
            self.shared.put(piece, body)

    async def _look_on_disk(self, disk: DiskStore, f: Fetch) -> bool:
        """Serve what the disk tier has of ``f`` (``_from_disk``); True when something is
        left to fetch. Not asked, with an unshared tier, for a pack member whose bytes come
        with another request's (the store's optional ``covered`` and ``fetch_group``, see
        ``ObjectStore``): its group is being fetched already, or another member of its group
        is being looked for and was not there (the group's fetch follows). A look-up is a
        round trip to the tier's threads; the data prefetcher starts members of one group
        together (each one's group is not "covered" until the first reaches the store), and
        in a cold epoch every one of those look-ups missed (~1,100 an epoch of 10,000 packed
        files, ~3 % of the gateway's busy CPU). With a shared tier every fetch looks (the member may
        be another worker's, and its claim is taken as for any fetch)."""
        store = f.store
        group = None
        if not disk.shared and f.end is None:
            covered = getattr(store, "covered", None)
            if covered is not None and covered(f.key):
                return True
            fetch_group = getattr(store, "fetch_group", None)
            if fetch_group is not None and (g := fetch_group(f.key)) is not None:
                group = (store.name, g)
                first = self._looking.get(group)
                if first is not None:
                    if await asyncio.shield(first):
                        return True  # it was not there: the group's fetch brings this one
                    group = None  # it was: this one may be too
        if group is None:
            return not await self._from_disk(disk, f)
        lead: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._looking[group] = lead
        missed = False
        try:
            missed = not await self._from_disk(disk, f)
        finally:
            del self._looking[group]
            lead.set_result(missed)
        return missed

    async def _from_disk(self, disk: DiskStore, f: Fetch) -> bool:
        """Serve the blocks of ``f`` the disk tier holds (those not served yet); True when
        that was all of them, else ``f`` is narrowed to the span from the first to the last
        missing block."""
        base = f.origin
        if not f.dkeys:
            f.dkeys = [
                disk_key(f.store.name, f.key, f.etag, base + lo, hi - lo) for *_, lo, hi in f.blocks
            ]
        todo = [i for i, (_, p, _, _) in enumerate(f.blocks) if not p.future.done()]
        mapped = self.cache.mappings + len(todo) <= self.cache.max_mappings
        if len(todo) == 1:  # a small object: no gather (a Task and futures per GET that
            # outlive young collections; benchmarks/gc_scale.py)
            found = [await disk.read(f.dkeys[todo[0]], mapped)]
        else:
            found = await asyncio.gather(*(disk.read(f.dkeys[i], mapped) for i in todo))
        missing: list[tuple[int, int]] = []
        for i, data in zip(todo, found, strict=True):
            bkey, p, lo, hi = f.blocks[i]
            if data is None:
                missing.append((lo, hi))
                continue
            if f.cacheable and self._inflight.get(bkey) is p:
                self._insert(f, bkey, p, data, on_disk=True)
            if not p.future.done():
                p.future.set_result(data)
        if not missing:
            return True
        if f.end is not None:
            f.skip = missing[0][0]
            f.start, f.end = base + missing[0][0], base + missing[-1][1]
        return False

    def _deliver(self, f: Fetch, data: bytes | memoryview) -> list[asyncio.Task[bool]]:
        """Answer the waiters of ``f``, cache the blocks and publish them to the disk tier;
        the publishing tasks (a shared tier then swaps each cached copy for a mapping)."""
        disk = self.disk if f.cacheable and f.dkeys else None
        whole = len(f.blocks) == 1
        mv = memoryview(data)
        writes: list[asyncio.Task[bool]] = []
        for i, (bkey, p, lo, hi) in enumerate(f.blocks):
            if p.future.done():
                continue  # served from the disk tier
            # A multi-block GET is split by copying (~0.1 ms/MiB): a cached block must not pin
            # the whole GET buffer, or evicting it would free nothing.
            chunk = data if whole else bytes(mv[lo - f.skip : hi - f.skip])
            on_disk = is_mapping(chunk)  # the disk tier's own entry (a pack's shared group)
            # A pack member (a view of its group's buffer) that one worker keeps in memory is
            # not written to its disk tier, as ``deposit`` does for the member's neighbours.
            unless_kept = disk is not None and not disk.shared and is_group_slice(chunk)
            if disk is not None and not on_disk and not unless_kept and disk.admit(f.dkeys[i]):
                swap = None
                if disk.shared:

                    def swap(
                        view: memoryview, bkey: BlockKey = bkey, old: bytes | memoryview = chunk
                    ) -> None:
                        self.cache.swap(bkey, old, view)

                writes.append(disk.publish(f.dkeys[i], chunk, swap))
                on_disk = True
            kept = f.cacheable and self._inflight.get(bkey) is p
            if kept:
                kept = self._insert(f, bkey, p, chunk, on_disk=on_disk)
            if unless_kept and not kept and disk is not None and disk.admit(f.dkeys[i]):
                writes.append(disk.publish(f.dkeys[i], chunk))
            p.future.set_result(chunk)
        return writes

    def _insert(
        self, f: Fetch, bkey: BlockKey, p: Pending, data: bytes | memoryview, on_disk: bool
    ) -> bool:
        """Whether the memory tier kept it."""
        unread = not p.demanded
        kept = self.cache.insert(
            bkey,
            data,
            prefetched=unread and not f.ahead,
            on_disk=on_disk,
            whole=f.end is None,
            ahead=unread and f.ahead,
        )
        if not kept and unread and f.ahead:
            self.stats.ahead_dropped += 1
        return kept

    def _fail(self, f: Fetch, exc: BaseException | None) -> None:
        for _, p, _, _ in f.blocks:
            if p.future.done():
                continue
            if exc is None:
                p.future.cancel()
            else:
                p.future.set_exception(exc)

    def _finish(self, f: Fetch) -> None:
        for bkey, p, _, _ in f.blocks:
            if self._inflight.get(bkey) is p:
                del self._inflight[bkey]
        # Each Pending points back at its fetch: break that cycle now, or the blocks (private
        # copies, or mappings of disk-tier files) would stay alive, past the cache's budget,
        # until the garbage collector's next full pass.
        f.blocks.clear()
        self._ra_inflight_bytes -= f.ra_bytes
        self.stats.pending_fetch_bytes -= f.nbytes
        self._fetches.discard(f)

    # -- read-ahead ----------------------------------------------------------------------

    def _readahead(
        self, store: ObjectStore, key: str, etag: str, size: int, offset: int, end: int
    ) -> None:
        if self._ra_max == 0:
            return
        cfg = self.config
        bs = cfg.block_size
        okey = (store.name, key)
        objs = self._streams.get(okey)
        if objs is None or objs.etag != etag:
            objs = ObjectStreams(etag)
            self._streams[okey] = objs
            if len(self._streams) > cfg.max_streams:
                self._streams.popitem(last=False)
        self._streams.move_to_end(okey)
        streams = objs.streams
        aligned_end = min(-(-end // bs) * bs, size)
        s: Stream | None = None
        for i, cand in enumerate(streams):
            # A stream not yet sequential needs an exact continuation; an established one
            # tolerates the small reordering and skips of parallel client READs.
            slack = max(cand.window, bs) if cand.window else 0
            if cand.next_offset - slack <= offset <= cand.next_offset + min(slack, bs):
                s = cand
                if i:
                    del streams[i]
                    streams.insert(0, s)
                break
        if s is None:
            s = Stream(end, cfg.initial_readahead if offset == 0 else 0, aligned_end)
            streams.insert(0, s)
            del streams[cfg.max_streams_per_object :]
        else:
            s.next_offset = max(s.next_offset, end)
            s.ra_end = max(s.ra_end, aligned_end)
            if s.window == 0:
                s.window = cfg.initial_readahead
        if s.window == 0 or s.ra_end >= size or end + max(s.window // 2, bs) <= s.ra_end:
            return
        target = min(-(-(end + s.window) // bs) * bs, size)
        cache = self.cache
        name = store.name
        budget = cfg.max_readahead_inflight_bytes - self._ra_inflight_bytes
        want: list[int] = []
        b = s.ra_end // bs
        stop = -(-target // bs)
        while b < stop:
            nbytes = min((b + 1) * bs, size) - b * bs
            if nbytes > budget:
                break  # throttled: the next READ of this stream tries again
            bkey = (name, key, etag, b)
            if bkey not in cache and bkey not in self._inflight:
                want.append(b)
                budget -= nbytes
            b += 1
        s.ra_end = min(b * bs, size)
        s.window = min(2 * s.window, self._ra_max)
        for run_first, n in block_runs(want, self.max_run):
            self._start_fetch(store, key, etag, size, run_first, n, demand=False)

    # -- invalidation and shutdown -------------------------------------------------------

    def _forget_version(self, store_name: str, key: str, etag: str | None) -> None:
        self.cache.invalidate(store_name, key, etag)
        objs = self._streams.get((store_name, key))
        if objs is not None and (etag is None or objs.etag == etag):
            del self._streams[(store_name, key)]
        for f in self._fetches:
            if f.key == key and f.store.name == store_name and (etag is None or f.etag == etag):
                f.cacheable = False

    def invalidate(self, store_name: str, key: str) -> None:
        """Drop everything known about ``key`` (all versions); fetches in flight for it still
        answer their waiters but cache nothing."""
        self._forget_version(store_name, key, None)

    def clear(self) -> None:
        self.cache.clear()
        self._streams.clear()
        for f in self._fetches:
            f.cacheable = False

    async def close(self) -> None:
        """Cancel fetches in flight (their waiters get ``CancelledError``) and wait for them."""
        tasks: list[asyncio.Future[Any]] = [f.task for f in self._fetches if f.task is not None]
        tasks += self.warming.values()
        tasks += self._drops
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
