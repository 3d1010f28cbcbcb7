"""Data prefetch (DESIGN §3 "Data prefetch"): fetch a listed directory's small files before
any READ asks for them, so a cold epoch runs at backend bandwidth instead of client workers ÷
backend latency.

Owns: which object to fetch next, the bounds on prefetching, and the record of what the
current pass (epoch) has read. Must not: fetch itself (``ObjectReader.prefetch`` and
``warm.warm_object`` do, single-flight with READs), evict (``DataCache.room_for`` decides what
room there is), or know about NFS.

- **What.** Every finished listing (``Namespace.watcher``) registers the directory: a
  reference to its ``Columns`` (no copy) and a bitmap of one bit per entry. Directories are
  walked in the order they were listed, each in name order, for files of 1 byte to
  ``prefetch_max_size`` (default ``small_file_max``) that are not cached, not being fetched,
  not read in this pass, and not left alone for the export (``skip``: being written on a
  read-write export, coming with another member's range on a packed one).
- **Demand first.** A prefetch is a read-ahead-class GET: a freed GET slot goes to a demand
  fetch first; a READ of an object being prefetched joins that GET (no second request) and
  promotes it to demand.
- **Never evicts what will be read.** An object is fetched only when the memory tier has room
  for it and for everything already in flight, after dropping objects read in this pass
  (``DataCache.room_for``), leaving the window's share free for demand READs. Without room,
  it goes to the disk tier when that has room (``warm_object``: never evicts); else the
  prefetcher waits and looks again every ``idle_poll_s``. With several worker processes
  every worker prefetches: each fetch is claimed among them on the shared disk tier
  (``DiskStore.claim``), so two workers never GET the same file; the second maps the first's
  entry into its memory (a mapping costs a worker ``1 / workers`` of its size: the pages are
  the page cache's, held once), so a READ in either worker is then a memory hit; and worker I
  of N starts its walk of a directory I/N of the way in (``share``), so they fetch different
  files instead of waiting on each other's claims.
- **Epochs.** ``note_open`` (every READ at offset 0 of a small object) sets the file's bit.
  Within a pass the cache drops files read in it first (its "spent" segment), so with a
  dataset twice the cache the prefetcher keeps the cache full of files the epoch has not
  reached yet. A pass ends once ``pass_fraction`` (all) of the files of the directories read
  in this pass or the last have been read: bits clear, every directory is walked again, and
  what memory holds becomes "unread" again (``DataCache.new_pass``). It also ends once
  re-reads of files already read in it reach ``reread_fraction`` (1 %) of the files read
  (a re-read within the last ``RECENT_OPENS`` opens is the same read: a decoder seeking back
  to the header): the next epoch began while files it never reads kept the pass open, or
  this is no epoch at all (a hot set read over and over), whose files must not stay spent.
- **Only while READs miss.** The prefetcher exists to hide the backend's latency from READs.
  While at least ``hit_pause`` (97 %) of the last ``HIT_WINDOW`` first READs (offset 0) of the
  files it tracks found them in memory, it starts nothing new (``nfsgw_prefetch_waiting_hits``):
  the client is served, and fetching more only takes CPU from it. It resumes at the next
  miss that brings the share below, or once no such READ came for ``idle_open_s`` (spare time).
  In a shuffled epoch over what fits the cache, the share of hits is the share of the unread
  files already fetched, which reads alone do not change: the prefetcher fetches until that
  share reaches 97 % and then only to keep it there. Where it matters most is a dataset far
  larger than what an epoch reads (1.28M objects, a random 50,000 of them read twice): the
  warm re-read is no longer shared with fetches of files nobody reads (``docs/benchmarks.md``,
  "ImageNet scale over S3").
- **Listings first.** While a client lists directories (a client's READDIR page in the last
  ``browse_quiet_s``: ImageFolder's scan, ``ls -lR``; the gateway's own walks do not count),
  nothing new is started: the listing is metadata the client is waiting for, and fetching
  every file it names at the same time made the gateway list 1.28M entries about 7x slower
  (local backend). The directories it listed are queued and fetched once it is over, or as
  soon as a READ shows files being read (the training loop after ImageFolder's scan); a scan
  by LOOKUP alone does not pause it.
- **A fleet first fetches what it owns.** With a shared tier and a fleet (``owns``), every
  directory is walked for the files this gateway owns (rendezvous hashing,
  ``gateway.data.fleet``), fetched from the origin and put in the shared tier, before any
  directory is walked for the others (``_later``), which by then the shared tier mostly holds
  (the reader looks there first). One not there yet is not fetched from the origin at once:
  the shared tier's miss fails it (``NotFilledYet``, ``deferred``) and it is tried again after
  ``retry_after_s`` (the last of ``attempts`` goes to the origin), unless ``DEFER_GIVE_UP``
  retries in a row found nothing (its owners are not reading: a gateway alone, the others not
  started or dead): deferring then stops for ``DEFER_OFF_S``. While the shared tier's fills
  back up (``backlog``), nothing new starts. Gateways in a
  concurrent cold epoch so fetch different files from the origin instead of the same ones.
- **Polite.** At most ``prefetch_concurrency`` objects and ``prefetch_inflight`` bytes at
  once. A backend request retried anywhere in the gateway (503, SlowDown, a connection
  error: ``pressure``) halves the concurrency and pauses the prefetcher (0.5 s, doubling to
  ``max_backoff_s`` while they continue); successes add one back. A failed object is counted
  and retried later (``attempts`` per pass); a client READ never waits for a retry.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal

import structlog

from gateway.backend.base import (
    BackendError,
    BackendUnavailable,
    ObjectNotFound,
    ObjectStore,
    PreconditionFailed,
)
from gateway.clock import Clock, SystemClock
from gateway.data.cache import BLOCK_ENTRY_CHARGE_BYTES
from gateway.data.config import PrefetchConfig
from gateway.data.events import FileOpened
from gateway.data.reader import ObjectReader
from gateway.data.shared import NotFilledYet
from gateway.data.warm import warm_object
from gateway.errors import VersionChanged
from gateway.namespace.columns import KIND_FILE, Columns

__all__ = ["DataPrefetcher", "PrefetchStats"]

log = structlog.get_logger("nfsgw.prefetch")

SCAN_ROWS: Final = 4096
"""Rows looked at (cached, read or too large ones skipped) before yielding to the event
loop: a pass over 1.28M cached files must not hold the loop for seconds."""
GAUGES_EVERY_S: Final = 0.5
"""The queue gauges (a sum over the queued directories) are refreshed this often."""
REREAD_MIN: Final = 32
"""Re-reads (besides ``reread_fraction``) that end a pass."""
STALE_SLACK: Final = 1024
"""Stale queue entries allowed beyond the live ones before the queue is compacted."""
HIT_WINDOW: Final = 64
"""First READs whose outcome (memory hit or not) decides whether the prefetcher goes on
(``PrefetchConfig.hit_pause``)."""
RECENT_OPENS: Final = 32
"""Files opened last: a READ at offset 0 of one of them again is the same open (a
decoder seeking back to the header), not a second read in the pass."""

# Deferred retries that find nothing, in a row, before deferring stops (the owners are not
# reading), and for how long; then it is tried again.
DEFER_GIVE_UP: Final = 32
DEFER_OFF_S: Final = 30.0


@dataclass(slots=True)
class PrefetchStats:
    # Counters (monotonic).
    objects: int = 0
    """Objects fetched ahead of READs (into memory or the disk tier)."""
    bytes: int = 0
    disk_objects: int = 0
    """Of ``objects``, those written straight to the disk tier (memory had no room)."""
    errors: int = 0
    """Prefetches that failed (retried later, up to ``attempts`` per pass)."""
    deferred: int = 0
    """Prefetches of another fleet member's objects not yet in the shared tier: tried again
    later (the last attempt fetches from the origin)."""
    changed: int = 0
    """Prefetches of objects that had changed or gone since listed (skipped)."""
    backoffs: int = 0
    """Times the prefetcher halved its concurrency after retried backend requests."""
    passes: int = 0
    """Passes (epochs) that ended: most files of the directories being read were read."""
    # Gauges.
    dirs: int = 0
    """Directories tracked."""
    queued_dirs: int = 0
    """Directories with files left to consider in this pass."""
    queued_files: int = 0
    """Entries of queued directories not yet considered, plus objects waiting for a retry."""
    inflight: int = 0
    inflight_bytes: int = 0
    concurrency: int = 0
    """Current limit on objects in flight (``prefetch_concurrency`` unless backing off)."""
    waiting_room: int = 0
    """1 while the cache has no room (the prefetcher resumes when it has)."""
    waiting_listing: int = 0
    """1 while a client lists directories (the prefetcher resumes after it)."""
    waiting_hits: int = 0
    """1 while READs find their files in memory (the prefetcher resumes at a miss)."""
    pass_files: int = 0
    """Files of the directories read in this pass or the last."""
    pass_read: int = 0
    """Of those, files read in this pass."""


class _Dir:
    __slots__ = (
        "store", "prefix", "cols", "skip", "bits", "files", "cursor", "start", "queued",
        "read_in", "span",
    )  # fmt: skip

    def __init__(
        self,
        store: ObjectStore,
        prefix: str,
        cols: Columns,
        skip: Callable[[str], bool] | None,
        small: int,
        share: tuple[int, int] = (0, 1),
        phases: int = 1,
    ) -> None:
        self.store = store
        self.prefix = prefix
        self.cols = cols
        self.skip = skip
        self.bits = bytearray((cols.n + 7) // 8)
        # The files a READ marks (``note_open``: small, not empty): what a pass must read.
        self.files = sum(
            1
            for k, z in zip(cols.kinds, cols.sizes, strict=True)
            if k == KIND_FILE and 0 < z <= small
        )
        self.cursor = 0  # rows looked at, over all phases
        # With a fleet, two walks (phases): the files this gateway owns, then the others.
        self.span = cols.n * phases
        # The row the walk starts at (then wraps around): worker I of N starts I/N of the way
        # in, so the workers prefetching one directory begin on different files.
        self.start = cols.n * share[0] // share[1]
        self.queued = False
        self.read_in = -2  # the last pass with a read here (active: this one or the last)


class DataPrefetcher:
    """Fetches the small files of listed directories ahead of READs (module docstring)."""

    def __init__(
        self,
        reader: ObjectReader,
        config: PrefetchConfig | None = None,
        *,
        memory: bool = True,
        pressure: Callable[[], int] | None = None,
        stats: PrefetchStats | None = None,
        share: tuple[int, int] = (0, 1),
        opened: FileOpened | None = None,
        clock: Clock | None = None,
        owns: Callable[[str, str, str], bool] | None = None,
        backlog: Callable[[], bool] | None = None,
    ) -> None:
        self._reader = reader
        # (store name, key, ETag) -> whether this gateway fetches it for a fleet: walks take
        # the owned files first, then the others (found in the shared tier by then, mostly).
        self._owns = owns
        # True while the shared tier's fills back up: wait (a fill skipped for room is an
        # origin GET for every other gateway).
        self._backlog = backlog
        # Deferred objects whose retry found the shared tier still without them, in a row:
        # past DEFER_GIVE_UP their owners are not reading (a gateway alone, the others not
        # started or dead), so deferring stops for DEFER_OFF_S.
        self._defer_misses = 0
        self._defer_off_until = 0.0
        self._clock = clock if clock is not None else SystemClock()
        self._cache = reader.cache
        self._cfg = cfg = config if config is not None else PrefetchConfig()
        self._memory = memory
        self._share = share  # (this worker, workers): where its walks start
        self._pressure = pressure
        self._last_pressure = pressure() if pressure is not None else 0
        self.stats = stats if stats is not None else PrefetchStats()
        small = reader.config.small_file_max
        self._max_size = small if cfg.max_size is None else min(cfg.max_size, small)
        self._dirs: OrderedDict[tuple[str, str], _Dir] = OrderedDict()
        self._queue: deque[_Dir] = deque()  # may hold stale entries (``_unqueue``)
        # With a fleet: directories whose owned files are walked, waiting to walk the others.
        self._later: deque[_Dir] = deque()
        self._queued = 0  # directories queued
        self._retry: deque[tuple[float, _Dir, int, int]] = deque()  # (due, dir, row, tries)
        self._pass = 0
        self._pass_files = 0
        self._pass_read = 0
        self._rereads = 0
        self._recent: OrderedDict[str, None] = OrderedDict()
        # The outcomes (True: a memory hit) of the last HIT_WINDOW first READs, their misses,
        # when the last came, and the misses the window may hold while the prefetcher waits.
        self._outcomes: deque[bool] = deque(maxlen=HIT_WINDOW)
        self._misses = 0
        self._last_open = 0.0
        self._served_misses = int((1.0 - cfg.hit_pause) * HIT_WINDOW + 1e-9)
        self._missed = asyncio.Event()
        self._limit = cfg.concurrency
        self._successes = 0
        self._backoff = cfg.backoff_s
        self._pause_until = 0.0
        self._browse_until = 0.0
        self._resume = asyncio.Event()
        self._disk_full_until = 0.0
        self._inflight = 0
        self._inflight_bytes = 0
        self._inflight_charge = 0  # what the objects in flight will cost the cache
        self._gauges_at = 0.0
        self._wake = asyncio.Event()
        self._freed = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._runner: asyncio.Task[None] | None = None
        self._cache.epochs = memory
        self.stats.concurrency = self._limit
        if opened is not None:  # the READs it counts (``note_open``)
            opened.subscribe(self)

    # -- the namespace's side (DirWatcher) ------------------------------------------------

    def watch(self, skip: Callable[[str], bool] | None = None) -> _Watcher:
        """A ``Namespace.watcher`` for one export; ``skip(key)``: leave it for now (being
        written; coming with another object's fetch, as a pack's members do)."""
        return _Watcher(self, skip)

    def add_dir(
        self,
        store: ObjectStore,
        key_prefix: str,
        cols: Columns,
        skip: Callable[[str], bool] | None = None,
    ) -> None:
        """A directory was listed: (re)register it and queue its files for this pass."""
        k = (store.name, key_prefix)
        phases = 1 if self._owns is None else 2
        small = self._reader.config.small_file_max
        d = _Dir(store, key_prefix, cols, skip, small, self._share, phases)
        old = self._dirs.pop(k, None)
        if old is not None and old.cols is cols:  # an unchanged re-list: same rows
            self._unqueue(old)
            d.bits, d.read_in, d.cursor = old.bits, old.read_in, old.cursor
        elif old is not None:
            self._forget(old)
        self._dirs[k] = d
        if len(self._dirs) > self._cfg.max_dirs:
            _, gone = self._dirs.popitem(last=False)
            self._forget(gone)
        self._enqueue(d)
        self._update_gauges()

    def drop_dir(self, store: ObjectStore, key_prefix: str) -> None:
        d = self._dirs.pop((store.name, key_prefix), None)
        if d is not None:
            self._forget(d)
            self._update_gauges()

    def forget_store(self, store: ObjectStore) -> None:
        """An export was removed or rebuilt: drop its directories (its store is closing)."""
        for k in [k for k, d in self._dirs.items() if d.store is store]:
            self._forget(self._dirs.pop(k))
        self._retry = deque(r for r in self._retry if r[1].store is not store)
        self._update_gauges()

    def _forget(self, d: _Dir) -> None:
        self._unqueue(d)
        if d.read_in >= self._pass - 1:
            self._pass_files -= d.files
            if d.read_in == self._pass:
                self._pass_read -= _ones(d.bits)

    def _enqueue(self, d: _Dir) -> None:
        if not d.queued and d.cursor < d.span:
            d.queued = True
            self._queued += 1
            queue = self._queue
            if len(queue) >= 2 * self._queued + STALE_SLACK:
                # Stale entries (directories re-listed or dropped while queued) pile up
                # when the head does not move (no room for hours): drop them, amortised.
                self._queue = queue = deque(q for q in queue if q.queued)
            queue.append(d)
            self._wake.set()

    def _unqueue(self, d: _Dir) -> None:
        """Out of the queue: its entry stays in the deque and ``_next`` drops it when it
        comes first (no search of the queue per listing)."""
        if d.queued:
            d.queued = False
            self._queued -= 1

    # -- the READ side ----------------------------------------------------------------------

    def note_open(self, store_name: str, key: str, hit: bool) -> None:
        """A READ at offset 0 of small object ``key``, which found it in memory if ``hit``:
        mark it read in this pass, and count the outcome (``_served``). Files are being read:
        a listing going on is no longer what the client waits for."""
        if self._browse_until:
            self._browse_until = 0.0
            self._resume.set()
        name = key.rpartition("/")[2]
        d = self._dirs.get((store_name, key[: len(key) - len(name)]))
        if d is None:
            return
        r = d.cols.find(name)
        if r < 0:
            return
        if 0 < d.cols.sizes[r] <= self._max_size:  # one the prefetcher would fetch
            self._count(hit)
        i, bit = r >> 3, 1 << (r & 7)
        recent = self._recent
        if d.bits[i] & bit:
            if key not in recent:
                # Read again in this pass: not an epoch (a hot set, or the next epoch
                # while files the last one never read keep the pass open).
                self._rereads += 1
                recent[key] = None
                if len(recent) > RECENT_OPENS:
                    recent.popitem(last=False)
                if self._rereads >= max(REREAD_MIN, self._cfg.reread_fraction * self._pass_read):
                    self._new_pass()
            return
        recent[key] = None
        if len(recent) > RECENT_OPENS:
            recent.popitem(last=False)
        if d.read_in != self._pass:
            if d.read_in < self._pass - 1:  # not active yet: its files join the pass
                self._pass_files += d.files
            d.read_in = self._pass
        d.bits[i] |= bit
        self._pass_read += 1
        if self._pass_read >= self._cfg.pass_fraction * self._pass_files:
            self._new_pass()

    def _count(self, hit: bool) -> None:
        w = self._outcomes
        if len(w) == HIT_WINDOW and not w[0]:
            self._misses -= 1
        w.append(hit)
        if not hit:
            self._misses += 1
            if self._misses > self._served_misses:
                self._missed.set()
        self._last_open = self._clock.monotonic()

    def _served(self, now: float) -> bool:
        """READs find their files in memory (module docstring, "Only while READs miss")."""
        return (
            len(self._outcomes) == HIT_WINDOW
            and self._misses <= self._served_misses
            and now - self._last_open < self._cfg.idle_open_s
        )

    def browsing(self) -> None:
        """A client asked for a READDIR page: let listings go first for a while."""
        self._browse_until = self._clock.monotonic() + self._cfg.browse_quiet_s

    def _new_pass(self) -> None:
        self.stats.passes += 1
        self._pass += 1
        self._pass_files = self._pass_read = self._rereads = 0
        self._retry.clear()
        for d in self._dirs.values():
            d.bits = bytearray(len(d.bits))
            d.cursor = 0
            if d.read_in == self._pass - 1:  # read in the pass that ended: still active
                self._pass_files += d.files
            self._enqueue(d)
        moved = self._cache.new_pass() if self._memory else 0
        log.info("prefetch_pass", passes=self.stats.passes, dirs=len(self._dirs), unspent=moved)
        self._update_gauges()

    @property
    def idle(self) -> bool:
        """Nothing queued, waiting for a retry or in flight (or waiting for room)."""
        return not self._queued and not self._retry and not self._inflight

    def snapshot(self) -> dict[str, int]:
        """The stats with fresh gauges (the run loop refreshes them every 0.5 s)."""
        self._update_gauges()
        return {k: getattr(self.stats, k) for k in self.stats.__dataclass_fields__}

    # -- running --------------------------------------------------------------------------

    def start(self) -> None:
        if self._runner is None:
            self._runner = asyncio.get_running_loop().create_task(self._run(), name="data-prefetch")

    async def close(self) -> None:
        tasks = [t for t in (self._runner, *self._tasks) if t is not None]
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        self._runner = None
        self._cache.epochs = False

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()  # once: each call is a getpid() system call
        while True:
            if self._clock.monotonic() - self._gauges_at > GAUGES_EVERY_S:
                self._update_gauges()
            item = self._next()
            if item is False:
                await asyncio.sleep(0)
                continue
            if item is None:
                self._wake.clear()
                self._update_gauges()
                await self._wake.wait()
                continue
            d, r, tries = item
            size = d.cols.sizes[r]
            while self._inflight >= self._limit or (
                self._inflight and self._inflight_bytes + size > self._cfg.max_inflight_bytes
            ):
                self._freed.clear()
                await self._freed.wait()
            await self._quiet()
            where = await self._room(size)
            if not self._wanted(d, r):
                continue  # read, cached or dropped while waiting
            key = d.prefix + d.cols.name(r)
            self._inflight += 1
            self._inflight_bytes += size
            self._inflight_charge += size + BLOCK_ENTRY_CHARGE_BYTES
            self.stats.inflight, self.stats.inflight_bytes = self._inflight, self._inflight_bytes
            etag = d.cols.etag(r)
            if where == "memory":
                # A done callback, not a Task per object: a Task, its coroutine, context and
                # shield are ~20 objects per GET that outlive young collections and made a
                # full collection every ~2,000 GETs (benchmarks/gc_scale.py).
                # Another member's object, not the last attempt: from the shared tier only.
                defer = (
                    self._owns is not None
                    and tries + 1 < self._cfg.attempts
                    and self._clock.monotonic() >= self._defer_off_until
                    and not self._owns(d.store.name, key, etag)
                )
                fut = self._reader.prefetch(d.store, key, etag, size, defer=defer)
                if fut is None:
                    self._release(size)
                else:
                    fut.add_done_callback(functools.partial(self._landed, d, r, key, size, tries))
                continue
            t = loop.create_task(self._one(d, r, key, etag, size, tries), name="prefetch")
            self._tasks.add(t)
            t.add_done_callback(self._tasks.discard)

    async def _quiet(self) -> None:
        """Wait out a back-off pause, a client's listing (which may go on) and READs served
        from memory."""
        stats = self.stats
        while True:
            now = self._clock.monotonic()
            if now < self._pause_until:
                await asyncio.sleep(self._pause_until - now)
            elif now < self._browse_until:
                stats.waiting_listing = 1
                self._resume.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._resume.wait(), self._browse_until - now)
            elif self._served(now):
                stats.waiting_listing = 0
                stats.waiting_hits = 1
                self._missed.clear()
                idle_at = self._last_open + self._cfg.idle_open_s
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._missed.wait(), max(idle_at - now, 0.0))
            else:
                stats.waiting_listing = stats.waiting_hits = 0
                return

    def _next(self) -> tuple[_Dir, int, int] | Literal[False] | None:
        """The next object to fetch: a retry that is due, else the next candidate of the
        first queued directory; None when there is none, False when ``SCAN_ROWS`` rows were
        looked at without finding one (the caller yields to the event loop, then asks again)."""
        retry = self._retry
        while retry and retry[0][0] <= self._clock.monotonic():
            _, d, r, tries = retry.popleft()
            if self._dirs.get((d.store.name, d.prefix)) is d and self._wanted(d, r):
                return d, r, tries
        budget = SCAN_ROWS
        for queue in (self._queue, self._later):
            first = queue is self._queue
            while queue:
                d = queue[0]
                if not d.queued:  # unqueued (replaced, dropped) while waiting: a stale entry
                    queue.popleft()
                    continue
                cols = d.cols
                kinds, sizes, hi = cols.kinds, cols.sizes, self._max_size
                n, start, span = cols.n, d.start, d.span
                phased = span > n
                # With a fleet, the first queue walks only the owned files (rows [0, n)):
                # every directory's owned files come before any directory's others.
                end = n if phased and first else span
                c = d.cursor
                stop = min(end, c + budget)
                while c < stop:
                    r = c % n + start if phased else c + start
                    if r >= n:
                        r -= n
                    if (
                        kinds[r] == KIND_FILE
                        and 0 < sizes[r] <= hi
                        and (phased is False or self._in_walk(d, r, c < n))
                        and self._wanted(d, r)
                    ):
                        d.cursor = c + 1
                        return d, r, 0
                    c += 1
                budget -= c - d.cursor
                d.cursor = c
                if c < end:
                    return False
                queue.popleft()
                if c < span:
                    self._walk_later(d)
                else:
                    self._unqueue(d)
        if retry:  # only retries left, not due yet: look again then
            delay = retry[0][0] - self._clock.monotonic()
            asyncio.get_running_loop().call_later(max(delay, 0.0), self._wake.set)
        return None

    def _walk_later(self, d: _Dir) -> None:
        """``d``'s owned files are walked: its others wait for every directory's owned ones
        (``_later``, compacted like the queue)."""
        later = self._later
        if len(later) >= 2 * self._queued + STALE_SLACK:
            self._later = later = deque(q for q in later if q.queued)
        later.append(d)

    def _in_walk(self, d: _Dir, r: int, first: bool) -> bool:
        """With a fleet: whether row ``r`` is in the first walk (owned) or the second."""
        assert self._owns is not None
        return self._owns(d.store.name, d.prefix + d.cols.name(r), d.cols.etag(r)) == first

    def _wanted(self, d: _Dir, r: int) -> bool:
        if d.bits[r >> 3] & (1 << (r & 7)):
            return False
        key = d.prefix + d.cols.name(r)
        if self._memory and self._reader.cached(d.store.name, key, d.cols.etag(r)):
            return False
        return d.skip is None or not d.skip(key)

    async def _room(self, size: int) -> str:
        """Where the next object can go ("memory" or "disk"), waiting until one has room
        (and, with a shared tier, until its fills do not back up)."""
        charge = size + BLOCK_ENTRY_CHARGE_BYTES
        disk = self._reader.disk
        waited = False
        while True:
            backlog = self._backlog is not None and self._backlog()
            if backlog:
                pass  # the shared tier's fills back up: wait for them
            elif self._memory and self._cache.room_for(self._inflight_charge + charge):
                where = "memory"
                break
            if (
                not backlog
                and disk is not None
                and self._clock.monotonic() >= self._disk_full_until
            ):
                if disk.has_room(size + 4096):
                    where = "disk"
                    break
                self._disk_full_until = self._clock.monotonic() + 5.0
            if not waited:
                waited = True
                self.stats.waiting_room = 1
            await asyncio.sleep(self._cfg.idle_poll_s)
        self.stats.waiting_room = 0
        return where

    async def _one(self, d: _Dir, r: int, key: str, etag: str, size: int, tries: int) -> None:
        """A prefetch into the disk tier (memory had no room: ``warm_object``)."""
        stats = self.stats
        failed = False
        try:
            outcome, _ = await warm_object(self._reader, d.store, key, etag, size)
            if outcome == "budget":
                self._disk_full_until = self._clock.monotonic() + 5.0
            if outcome != "written":
                return
            stats.disk_objects += 1
            stats.objects += 1
            stats.bytes += size
        except (PreconditionFailed, VersionChanged, ObjectNotFound):
            stats.changed += 1
        except (BackendError, OSError) as exc:
            failed = True
            self._failed(d, r, key, tries, exc)
        finally:
            self._release(size)
        self._adapt(failed)

    def _landed(
        self, d: _Dir, r: int, key: str, size: int, tries: int, fut: asyncio.Future[object]
    ) -> None:
        """A prefetch into memory ended (``_one``'s outcomes, as a done callback)."""
        self._release(size)
        if fut.cancelled():
            return
        exc = fut.exception()
        failed = False
        if exc is None:
            self.stats.objects += 1
            self.stats.bytes += size
            if tries and self._defer_misses:  # a retry found its owner's fill
                self._defer_misses = 0
        elif isinstance(exc, PreconditionFailed | VersionChanged | ObjectNotFound):
            self.stats.changed += 1
        elif isinstance(exc, NotFilledYet):  # its owner has not filled it: later
            self.stats.deferred += 1
            if tries:
                self._defer_misses += 1
                if self._defer_misses >= DEFER_GIVE_UP:
                    self._defer_misses = 0
                    self._defer_off_until = self._clock.monotonic() + DEFER_OFF_S
                    log.info("prefetch_defer_off", seconds=DEFER_OFF_S, reason="owners not filling")
            self._retry_later(d, r, tries)
            return
        elif isinstance(exc, BackendError | OSError):
            failed = True
            self._failed(d, r, key, tries, exc)
        else:  # a bug: said, not adapted to
            log.error("prefetch_failed_unexpectedly", key=key, error=repr(exc))
            return
        self._adapt(failed)

    def _failed(self, d: _Dir, r: int, key: str, tries: int, exc: Exception) -> None:
        """A prefetch failed: counted, retried later (``attempts`` per pass)."""
        stats = self.stats
        stats.errors += 1
        self._retry_later(d, r, tries)
        if stats.errors == 1 or stats.errors % 1000 == 0:
            log.warning("prefetch_failed", key=key, error=str(exc), errors=stats.errors)
        if isinstance(exc, BackendUnavailable):
            self._back_off()

    def _retry_later(self, d: _Dir, r: int, tries: int) -> None:
        """Try row ``r`` again after ``retry_after_s`` x tries (``attempts`` per pass)."""
        if tries + 1 < self._cfg.attempts and self._cfg.max_retries:
            if len(self._retry) >= self._cfg.max_retries:
                self._retry.popleft()
            due = self._clock.monotonic() + self._cfg.retry_after_s * (tries + 1)
            self._retry.append((due, d, r, tries + 1))
            self._wake.set()

    def _release(self, size: int) -> None:
        self._inflight -= 1
        self._inflight_bytes -= size
        self._inflight_charge -= size + BLOCK_ENTRY_CHARGE_BYTES
        self.stats.inflight, self.stats.inflight_bytes = self._inflight, self._inflight_bytes
        self._freed.set()

    def _adapt(self, failed: bool) -> None:
        """AIMD on the backend's retries: halve and pause on new ones, else add one back."""
        p = self._pressure() if self._pressure is not None else 0
        if p > self._last_pressure:
            self._last_pressure = p
            self._back_off()
        elif not failed:
            self._successes += 1
            if self._successes >= self._limit:
                self._successes = 0
                self._limit = min(self._limit + 1, self._cfg.concurrency)
                self._backoff = self._cfg.backoff_s
                self.stats.concurrency = self._limit

    def _back_off(self) -> None:
        now = self._clock.monotonic()
        if now < self._pause_until:
            return  # one back-off per pause
        self.stats.backoffs += 1
        self._limit = max(1, self._limit // 2)
        self._successes = 0
        self._pause_until = now + self._backoff
        self._backoff = min(2 * self._backoff, self._cfg.max_backoff_s)
        self.stats.concurrency = self._limit

    def _update_gauges(self) -> None:
        self._gauges_at = self._clock.monotonic()
        s = self.stats
        s.dirs = len(self._dirs)
        s.queued_dirs = self._queued
        s.queued_files = sum(
            (d.span - d.cursor) * d.cols.n // d.span
            for d in (*self._queue, *self._later)
            if d.queued and d.span
        )
        s.queued_files += len(self._retry)
        s.inflight = self._inflight
        s.inflight_bytes = self._inflight_bytes
        s.pass_files = self._pass_files
        s.pass_read = self._pass_read


class _Watcher:
    """One export's ``Namespace.watcher``."""

    __slots__ = ("_p", "_skip")

    def __init__(self, p: DataPrefetcher, skip: Callable[[str], bool] | None) -> None:
        self._p = p
        self._skip = skip

    def listed(self, store: ObjectStore, key_prefix: str, cols: Columns) -> None:
        self._p.add_dir(store, key_prefix, cols, self._skip)

    def dropped(self, store: ObjectStore, key_prefix: str) -> None:
        self._p.drop_dir(store, key_prefix)

    def browsing(self) -> None:
        self._p.browsing()


def _ones(bits: bytearray) -> int:
    return sum(b.bit_count() for b in bits)
