"""The local-disk tier of the data cache: verified entries under ``server.cache_dir``, shared
by every worker process of the host, surviving restarts (DESIGN §3 "Data cache: two levels").

Owns: the files under ``<cache_dir>/v2/``, their format and verification, the batches of
entries waiting to be written as one bundle, this process's view of their total size,
admission to and eviction from the tier, the free-space floor, the removal of an older
layout's directory, and the threads that do the file I/O. Must not: touch the event loop's
thread with file I/O (every ``open``/``pread``/``writev``/``link``/``stat`` runs on the tier's
own bounded executor), fail a READ (every error is counted and turns into a miss or a skipped
publish), know about NFS, or talk to the backend (``ObjectReader`` fetches; this module
stores).

The host's one data cache
-------------------------
Every configuration has the tier (``resolve_cache_dir``: ``server.cache_dir``, systemd's
``$CACHE_DIRECTORY``, else ``STATE_DIR/cache``; ``cache.disk = 0`` turns it off), so the
workers of ``--workers auto`` share it. With several workers it is *shared*
(``DiskStore(shared=True)``):

* **Held once.** A hit returns the body as a read-only mapping (of the pages it spans in its
  bundle: ``diskfile.map_entry``, verified once), and a publish hands the writer a
  mapping of what it wrote (the reader swaps its private copy for it: ``DataCache.swap``).
  The pages are the page cache's: N workers serving a file hold it once. The memory tier
  charges a mapping ``1 / workers`` of the pages it spans.
* **Fetched once.** Before a GET a worker ``claim``\\s the entry: an exclusive ``flock`` on one
  of 4,096 lock files (``v2/locks/<3 hex>``), taken without blocking on the executor, held
  until the entry is in place, dropped by the kernel if the process dies. A worker finding
  it held polls (1 ms, doubling to 20 ms) until it can take it or the entry appears (then it
  reads the entry), for at most ``claim_wait_s``, then fetches anyway (``claim_timeouts``;
  the later publish finds the entry and counts a ``duplicate_fetches``).

Sharing without a coordinator
-----------------------------
* **Names are identities.** An entry holds bytes ``[start, start + length)`` of one object
  version; its name is ``v2/<2 hex>/<32 hex>``, the BLAKE2b-128 of (store name, key, ETag,
  start, length). Any worker computes the same name, so what one wrote every other finds with
  one ``open``; a replaced object has a new ETag, hence a new name: an old version is never
  served (it ages out). A change of ``block_size`` changes the ranges, hence the names.
* **Bundles: one file, many names.** The file behind a name is a *bundle* holding up to
  ``bundle_entries`` entries (``diskfile``: a table, then the entries), one hard link per
  entry: creating, renaming and evicting files is what costs a filesystem CPU, not their
  bytes (ext4 without a journal: 180-270 us per 110 kB entry file, ~47 us per entry in
  bundles of 64, here). ``publish`` adds an admitted entry to the open batch, written as one
  bundle once it holds ``bundle_entries`` entries or ``bundle_bytes``, or ``bundle_window_s``
  after its first entry, whichever comes first; each publish task completes when its bundle
  is written. ``store`` (warm-ups, which wait for each write) writes the open batch at once.
  ``drain`` and ``close`` write the open batch.
* **Atomic publish.** A writer writes the bundle as ``.tmp.<pid>.<n>.<unix s>`` (one
  ``writev``), ``link``\\s it under each entry's name (a name that exists already: another
  process published that entry, counted as a duplicate fetch), then unlinks the temporary
  name. A reader sees a whole bundle or no name; never a half-written one. No ``fsync``: after
  a power loss a file may hold zeros or garbage, which the checksums catch (below), so
  durability is not paid for on every write. A crashed writer leaves a temporary name (the
  next scan removes it an hour after the time in its name) and maybe some of the entries'
  names, each verified on its own.
* **Verified on every read.** A read opens the name, finds the entry in its bundle's table
  (CRC-32 of the table), then checks the entry's 36-byte header (magic ``NFGC``, format
  version, identity length, start, length, CRC-32 of the body, CRC-32 of the header and
  identity), the identity (a hash collision cannot serve another object), the size, and the
  body's CRC-32 (``zlib.crc32``, 4 GB/s here: 27 us for a 110 kB image, on the executor's
  thread, which releases the GIL for it). A whole disk hit of a 110 kB entry in the page
  cache costs ~85 us of CPU (thread hop, open, fstat, preads, CRC, close). A bad entry (or a
  name its bundle does not list) has its name unlinked (if it is still the same inode): the
  bundle's other entries stay, each verified when read; it is counted
  (``nfsgw_disk_cache_corrupt_total``) and the READ fetches it again.
* **Budget without a shared counter.** Each process scans the directory (``os.scandir`` +
  ``stat`` per name, on the executor) at start and then at most every ``rescan_interval_s``
  (30 s; and never more often than 20x the last scan took, so scans cost <= 5 % of a thread),
  or sooner once it has itself written 2 % of the budget. A scan costs ~5 us of CPU per name
  (0.26 s for 50,000 here), partly under the GIL: ~6.5 s at 1.28 M names. Between scans it
  adds its own writes. A process therefore does not see the other workers' writes since its
  last scan: the directory can overshoot the budget by what the others wrote in that time;
  the next scan sees it and evicts back to 95 % of the budget. Each inode (``st_ino``: a
  bundle's names share one) is charged once, its size rounded up to 4 KiB; entries are
  reserved one by one when admitted (their bundle's table with the batch's first). The
  free-space floor (``disk_min_free``) is checked with ``statvfs`` before each bundle is
  written, so the filesystem is never filled, whoever else writes to it.
* **Shared access clock, eviction by bundle.** A hit sets its name's mtime (``os.utime``), in
  batches every ``touch_interval_s``: that is the bundle's mtime, shared by its names, so the
  LRU order is the bundles'. A scan keeps the oldest bundles (by mtime, holding at most
  ``MAX_CANDIDATES`` names) as eviction candidates, each with every name it saw for it. A
  victim is a whole bundle: its names are unlinked unless it was touched since the scan. Its
  space returns with its last name (a name the scan did not see, a crashed writer's
  temporary name or a mapping keeps it), and only what eviction really freed
  (``st_nlink``) is taken off the accounting.

One user, no look-ups
---------------------
A miss costs a round trip to the tier's threads and a failed ``open`` (in a cold epoch ~8 % of
the gateway's busy CPU: every prefetch and fetch looks first). An unshared tier skips it when
it can know the name is not there. Its first user takes ``v2/locks/owner`` (``flock``, for its
life); any other unshared user of the directory (a second gateway pointed at it, a second store
in one process) is a *guest*: it holds ``v2/locks/guests`` shared and writes a fresh nonce into
it before it writes anything (``diskfile.presence``). The owner keeps a Bloom filter of the
names it knows are there (``diskfile.NameFilter``: built by its first scan, plus every name it
writes or finds present, and built again by a scan only after a guest came or once it holds
more names than it was sized for; < 1 % false "present"; 128 KiB-16 MiB) and answers a look-up
"absent" from it while the nonce it maps (no system call) is the one it read before that scan;
a changed nonce drops the filter until a scan finds no guest. A false "absent" can only cost a
second GET of bytes that are on disk, never a wrong byte: a guest that came and left between
two of the owner's scans, or a cache directory shared across hosts (one page cache per host:
not supported). A shared tier (several workers) always looks.

Admission and eviction (scan- and shuffle-resistant, like the memory tier)
---------------------------------------------------------------------------
While the tier has room, every fetched block is published. When it is full, a new entry must
win the same duel as the memory tier's (``gateway.data.cache``): its visit count *before* this
visit must exceed the least recently used candidates' (``est(new) - 1 > est(victim)``, ties to
the incumbent). Visits are counted per process in a ``FrequencySketch`` keyed by the entry's
name (every lookup that reaches the tier). A victim is a bundle: its count is its most visited
name's (the max: evicting a bundle loses all its entries, so one hot entry protects it; the
first name alone would be a random sample of 64). It is computed once per candidate: a name's
count rises only when a lookup reaches the tier, and a hit on it makes the bundle no victim.
One win frees a whole bundle, whose room then takes the next entries without a duel. In
shuffled epochs over a dataset larger than the tier, every entry is visited once per epoch,
the duel is a tie, and the tier freezes on one subset: hit ratio ~ tier / dataset, where LRU
would evict exactly what the epoch has not read yet. A working set read repeatedly gains
counts and takes over. With several workers each sees a share of the visits; the comparison
stays fair on average (more noise, a little churn).

The memory tier in front of it is per process and stays small and hot; the OS page cache,
shared by all workers, is the host-wide memory tier for these files. To make the two tiers add
up instead of holding the same subset, the memory tier's admission prefers entries that are
*not* on disk: a block missing from disk beats main-memory victims that are on disk
(``DataCache.insert(..., on_disk=...)``).

Bad conditions (decided per case; tests/unit/gateway/test_disk_cache.py)
------------------------------------------------------------------------
* ``cache_dir`` missing: created (0700), with its parents.
* not creatable, not a directory, not writable, no hard links (EACCES, EROFS, ENOTDIR,
  EPERM...): the gateway starts with the memory tier only and logs ``disk_cache_disabled`` at
  error level with the reason; ``nfsgw_disk_cache_enabled`` is 0. A cache is an
  optimisation: the service stays up.
* the filesystem below ``disk_min_free`` (at start or later, e.g. another tenant filled it):
  the tier keeps serving what it holds and refuses new entries
  (``nfsgw_disk_cache_refused_total{reason="full"}``) until space returns; a write failing
  with ENOSPC/EIO refuses new entries for 10 s. A client READ never fails because of the tier.
* ``cache.disk = 0``: no disk tier.
* a directory of an older layout next to this one (``<cache_dir>/v1``: one file per entry,
  never read by this version): removed in the background, ``SWEEP_FILES`` files per
  maintenance round (4,096 every 10 s: 1.28 M files in under an hour), by every worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Final

import structlog

from gateway.clock import Clock, SystemClock
from gateway.data import diskfile as files
from gateway.data.config import DiskConfig
from gateway.data.diskfile import DiskKey, Victim, disk_key
from gateway.data.sketch import FrequencySketch
from gateway.data.stats import DiskStats

__all__ = [
    "Claim",
    "DiskKey",
    "DiskStore",
    "disk_key",
    "open_disk_tier",
    "resolve_cache_dir",
    "usable",
]

log = structlog.get_logger(__name__)

# Temporary file names (``.tmp.PID.N.TIME``): one counter per process, not per store, so two
# stores over one directory in one process (tests; a reload) never pick the same name.
_TMP_SEQ: Final = itertools.count()

AUTO_SHARE: Final = 0.5  # of (free space + what the cache holds - floor) at start
DEFAULT_FLOOR_SHARE: Final = 0.05  # of the filesystem's size
LOW_WATER: Final = 0.95  # an over-budget tier is shrunk to this share of the budget
RESCAN_WRITTEN_SHARE: Final = 0.02  # of the budget written by this process since the last scan
MAX_CANDIDATES: Final = 65_536  # oldest entries a scan keeps as eviction candidates
MAX_TOUCHED: Final = 65_536  # hits waiting for their mtime update
ERROR_BACKOFF_S: Final = 10.0
CLAIM_POLL_S: Final = (0.001, 0.02)  # first and longest pause between claim attempts
SWEEP_FILES: Final = 4096  # files of an older layout removed per maintenance round


def resolve_cache_dir(configured: Path | None, state_dir: Path) -> Path:
    """The disk tier's directory: ``server.cache_dir`` when set; else the directory systemd
    made for the unit (``CacheDirectory=nfsgw`` sets ``$CACHE_DIRECTORY``, /var/cache/nfsgw);
    else ``cache`` under the state directory. Every configuration has one: it is the host's
    one data cache, shared by the worker processes (``cache.disk = 0`` turns it off)."""
    if configured is not None:
        return configured
    env = os.environ.get("CACHE_DIRECTORY", "").split(":")[0]
    return Path(env) if env.startswith("/") else state_dir / "cache"


async def open_disk_tier(
    configured: Path | None,
    state_dir: Path,
    config: DiskConfig,
    stats: DiskStats,
    *,
    shared: bool = False,
    clock: Clock | None = None,
) -> DiskStore | None:
    """The composition root's call: the tier under ``resolve_cache_dir(...)``, or None
    (memory only, logged once with the reason). ``shared``: several worker processes use it
    (bodies served as mappings, fetches claimed: ``DiskStore``)."""
    cache_dir = resolve_cache_dir(configured, state_dir)
    return await DiskStore.open(cache_dir, config, stats, shared=shared, clock=clock)


def usable(cache_dir: Path, config: DiskConfig) -> str:
    """Why a tier under ``cache_dir`` could not be opened ("" when it can): the supervisor's
    check before it starts workers that would share it. Blocking: call it off the loop."""
    if config.budget == 0:
        return "cache.disk is 0"
    try:
        files.prepare(cache_dir)
    except OSError as e:
        return f"{cache_dir}: {type(e).__name__}: {e}"
    return ""


class Claim:
    """The right to fetch one entry among the processes sharing the tier (``claim``): held
    until ``release``; ``present`` when the entry turned up instead (read it)."""

    __slots__ = ("fd", "present")

    def __init__(self, fd: int, present: bool) -> None:
        self.fd = fd
        self.present = present

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # drops the flock; a lock file has no data to flush
            self.fd = -1


async def _start_threads(loop: asyncio.AbstractEventLoop, ex: ThreadPoolExecutor, n: int) -> None:
    """Start all ``n`` of the executor's threads now (it starts them one per submit while
    none is idle): the tier's threads are a fixed set from the start, whatever its work's
    pace later (a sole user's misses may never need them all at once)."""
    barrier = threading.Barrier(n)

    def meet() -> bool:
        try:
            barrier.wait(10.0)
        except threading.BrokenBarrierError:  # they did not all start within 10 s
            return False
        return True

    if not all(await asyncio.gather(*(loop.run_in_executor(ex, meet) for _ in range(n)))):
        log.warning("disk_cache_threads_started_late", threads=n)  # started when work comes


_NO_CLAIM: Final = Claim(-1, False)
_FAILED: Final = -1  # a write that raised (counted and logged)


class _Batch:
    """Entries waiting to be written as one bundle, and their publishers' futures."""

    __slots__ = ("data", "futures", "keys", "nbytes", "table", "timer")

    def __init__(self) -> None:
        self.keys: list[DiskKey] = []
        self.data: list[bytes | memoryview] = []
        self.futures: list[asyncio.Future[tuple[int, memoryview | None]]] = []
        self.nbytes = 0
        self.table = 0  # the table's charge reserved for the bundle (settled once written)
        self.timer: asyncio.TimerHandle | None = None


_STORED: Final = {files.WRITTEN: "written", files.PRESENT: "present", files.FULL: "refused"}


class DiskStore:
    """The disk tier of one process. Built with ``await DiskStore.open(...)``; its methods
    are called on the event loop only; file I/O runs on its executor."""

    def __init__(
        self,
        root: str,
        budget: int,
        min_free: int,
        config: DiskConfig,
        stats: DiskStats,
        executor: ThreadPoolExecutor,
        shared: bool = False,
        clock: Clock | None = None,
        presence: files.Presence | None = None,
    ) -> None:
        self.root = root
        self._clock = clock if clock is not None else SystemClock()
        self.shared = shared
        """Several processes use the tier: bodies are mappings, fetches are claimed."""
        self.config = config
        self.stats = stats
        self.budget_bytes: Final = budget
        self._min_free = min_free
        self._ex = executor
        self._used = 0
        self._reserved = 0  # charges of writes admitted and not finished
        self._pending = 0  # body bytes of those writes
        self._written_since_scan = 0
        self._oldest: deque[Victim] = deque()
        self._touched: set[str] = set()
        self._writing: set[str] = set()
        self._tasks: set[asyncio.Task[object]] = set()
        self._sketch = FrequencySketch(max(1024, budget // (128 * 1024)))
        self._refuse_until = 0.0
        self._fs_free = 0
        self._maint: asyncio.Task[None] | None = None
        self._closed = False
        self._batch: _Batch | None = None  # the open batch (entries join it: ``publish``)
        self._swept = False  # an older layout's directory is gone (``sweep_old_layouts``)
        self._errors_logged = 0
        self._broken = 0  # mappings found broken by readers (``drop``)
        self._broken_logged: set[str] = set()  # their entries, logged once each
        self._presence = presence  # unshared: the tier's owner or a guest (files.presence)
        self._names: files.NameFilter | None = None  # the owner's, while no guest came
        self._mark = b""  # the guests' nonce when ``_names`` was built
        self._scan_writes: list[int] | None = None  # names written while a scan runs
        stats.enabled = 1
        stats.budget_bytes = budget

    @classmethod
    async def open(
        cls,
        cache_dir: Path,
        config: DiskConfig,
        stats: DiskStats | None = None,
        *,
        shared: bool = False,
        clock: Clock | None = None,
    ) -> DiskStore | None:
        """The tier under ``cache_dir``, scanned and maintained; None (logged) when it is off
        or the directory cannot be used (see the module docstring for each case)."""
        stats = stats if stats is not None else DiskStats()
        if config.budget == 0:
            log.info("disk_cache_off", reason="cache.disk is 0")
            return None
        ex = ThreadPoolExecutor(config.threads, thread_name_prefix="nfsgw-disk")
        loop = asyncio.get_running_loop()
        pres: files.Presence | None = None
        try:
            await _start_threads(loop, ex, config.threads)
            root, fs_size, _ = await loop.run_in_executor(ex, files.prepare, cache_dir)
            if not shared:
                try:
                    pres = await loop.run_in_executor(ex, files.presence, root)
                except OSError as e:  # the tier works without: every miss looks
                    log.warning("disk_cache_presence_failed", error=f"{type(e).__name__}: {e}")
            mark = pres.mark() if pres is not None else b""
            guests_fd = pres.guests_fd if pres is not None and pres.owner else -1
            sc = await loop.run_in_executor(ex, files.scan, root, MAX_CANDIDATES, guests_fd)
        except OSError as e:
            if pres is not None:
                pres.close()
            ex.shutdown(wait=False)
            log.error(
                "disk_cache_disabled",
                cache_dir=str(cache_dir),
                error=f"{type(e).__name__}: {e}",
                fallback="memory tier only",
            )
            return None
        min_free = (
            config.min_free if config.min_free is not None else int(fs_size * DEFAULT_FLOOR_SHARE)
        )
        if config.budget is not None:
            budget = config.budget
        else:  # invariant under the tier's own writes: free space falls as the cache grows
            budget = max(0, int((sc.free + sc.used - min_free) * AUTO_SHARE))
        self = cls(root, budget, min_free, config, stats, ex, shared, clock, pres)
        self._apply_scan(sc, mark, wanted=guests_fd >= 0)
        if self._used > budget:
            await self._shrink()
        self._maint = loop.create_task(self._maintain(), name="disk-cache-maintenance")
        log_fn = log.warning if sc.free < min_free else log.info
        log_fn(
            "disk_cache_opened",
            cache_dir=str(cache_dir),
            budget=budget,
            used=sc.used,
            entries=sc.entries,
            fs_free=sc.free,
            min_free=min_free,
            shared=shared,
            sole_user=self._names is not None,
            refusing_new_entries=sc.free < min_free,
            scan_s=round(sc.seconds, 3),
        )
        return self

    # -- introspection ---------------------------------------------------------------------

    @property
    def used_bytes(self) -> int:
        return self._used

    @property
    def broken_mappings(self) -> int:
        """Mappings of this tier's entries that readers found broken (``drop``)."""
        return self._broken

    def has_room(self, charge: int) -> bool:
        """Whether ``charge`` more bytes fit in the budget without evicting anything."""
        return self._used + charge <= self.budget_bytes

    def takes(self, nbytes: int) -> bool:
        """Whether ``nbytes`` of new entries would be written now: room in the budget
        without evicting, in the filesystem's free space, and in the write backlog
        (``max_pending_write_bytes``), and no recent write error holding writes off."""
        return (
            not self._closed
            and self._used + nbytes <= self.budget_bytes
            and self._clock.monotonic() >= self._refuse_until
            and self._fs_free - nbytes >= self._min_free
            and self._pending + nbytes <= self.config.max_pending_write_bytes
        )

    def path(self, k: DiskKey) -> str:
        return os.path.join(self.root, k.name[:2], k.name)

    # -- reads -----------------------------------------------------------------------------

    async def read(self, k: DiskKey, mapped: bool = True) -> bytes | memoryview | None:
        """The verified body of ``k``, or None (absent, bad: dropped, or an I/O error): a
        mapping of the entry's pages (``diskfile`` "Mappings") when ``mapped`` (no copy, and
        no body allocated by the tier's threads), else a copy."""
        self._sketch.increment(k.hash64)
        st = self.stats
        if self._absent(k):
            st.lookups_skipped += 1
            st.misses += 1
            return None
        try:
            status, body, why, freed = await asyncio.get_running_loop().run_in_executor(
                self._ex, files.verify, self.path(k), k, mapped
            )
        except (OSError, ValueError) as e:  # ValueError: a mapping refused (a bug if seen)
            st.read_errors += 1
            st.misses += 1
            self._log_error("disk_cache_read_failed", e)
            return None
        if status == files.HIT:
            st.hits += 1
            st.bytes_hit += len(body)
            if len(self._touched) < MAX_TOUCHED:
                self._touched.add(k.name)
            return body
        if status == files.BAD:
            st.corrupt += 1
            st.entries -= 1
            self._used = max(0, self._used - freed)  # its bundle's, when it was the last name
            log.warning("disk_cache_entry_dropped", entry=k.name, reason=why)
        st.misses += 1
        return None

    async def drop(self, k: DiskKey) -> None:
        """A mapping of ``k``'s body was found broken by a reader (its file truncated or
        removed under it, or a page the kernel cannot read back: ``fastwire.mapped_readable``);
        the caller has dropped it from memory and fetches again. The entry is verified again
        from its file (no mapping) on the executor: a bad one is unlinked and counted as
        ``nfsgw_disk_cache_corrupt_total`` (its name already gone: nothing to do), a good
        copy another worker published since stays. Logged once per entry (a warning).
        Never raises (but cancellation)."""
        self._broken += 1
        if k.name not in self._broken_logged:
            if len(self._broken_logged) >= 4096:  # bounded: a name may be logged again
                self._broken_logged.clear()
            self._broken_logged.add(k.name)
            log.warning("disk_cache_mapping_broken", entry=k.name, broken_so_far=self._broken)
        st = self.stats
        try:
            status, why, freed = await asyncio.get_running_loop().run_in_executor(
                self._ex, files.drop, self.path(k), k
            )
        except (OSError, ValueError) as e:
            st.read_errors += 1
            self._log_error("disk_cache_read_failed", e)
            return
        except RuntimeError:  # the executor was shut down (closed meanwhile)
            return
        if status == files.BAD:
            st.corrupt += 1
            st.entries -= 1
            self._used = max(0, self._used - freed)
            log.warning("disk_cache_entry_dropped", entry=k.name, reason=why)
            self._gauges()

    async def contains(self, k: DiskKey) -> bool:
        """Whether the entry's name is present (not verified: a read verifies)."""
        if self._absent(k):
            return False
        return await asyncio.get_running_loop().run_in_executor(
            self._ex, files.exists, self.path(k)
        )

    def _absent(self, k: DiskKey) -> bool:
        """Whether the tier's sole user knows ``k`` is not there, with no file opened (module
        docstring, "One user, no look-ups"): its name filter says so and no guest came since
        the filter's scan (a guest's nonce changes ``mark``; then the filter is dropped until a
        scan finds no guest)."""
        names = self._names
        if names is None:
            return False
        assert self._presence is not None
        if self._presence.mark() != self._mark:
            self._names = None
            self.stats.name_filter_bytes = 0
            log.info("disk_cache_not_sole_user", cache_dir=os.path.dirname(self.root))
            return False
        return k.hash64 not in names

    def _remember(self, k: DiskKey) -> None:
        """``k``'s name is on disk now (written, or found there): the owner's filter holds it."""
        if self._names is not None:
            self._names.add(k.hash64)
        if self._scan_writes is not None:
            self._scan_writes.append(k.hash64)

    async def claim(self, k: DiskKey) -> Claim:
        """The right to fetch ``k`` from the backend, when the tier is shared: waits while
        another process holds it (its fetch is running), then either holds it (fetch, publish,
        then ``release``) or finds ``k`` published (``present``: read it). Gives up waiting
        after ``claim_wait_s`` and fetches anyway (counted). Unshared tier, closed tier, or
        a lock file that cannot be opened: an empty claim (fetch; nothing to release)."""
        if not self.shared or self._closed:
            return _NO_CLAIM
        loop = asyncio.get_running_loop()
        pause, longest = CLAIM_POLL_S
        deadline = 0.0
        while True:
            try:
                fd, present = await loop.run_in_executor(self._ex, files.claim, self.root, k)
            except OSError as e:
                self._log_error("disk_cache_claim_failed", e)
                return _NO_CLAIM
            if fd >= 0 or present:
                return Claim(fd, present)
            now = self._clock.monotonic()
            if not deadline:
                deadline = now + self.config.claim_wait_s
                self.stats.claim_waits += 1
            elif now >= deadline:
                self.stats.claim_timeouts += 1
                return _NO_CLAIM
            await asyncio.sleep(pause)
            pause = min(2 * pause, longest)

    # -- writes ----------------------------------------------------------------------------

    def admit(self, k: DiskKey) -> bool:
        """Whether ``k`` should be published now (the duel when the tier is full); reserves
        its room (and its bundle's table when it will open a batch). Synchronous, on the
        loop; call ``publish`` next when True."""
        if not self._writable(k):
            return False
        table = self._table_charge(k, alone=False) if self._opens_batch(k) else 0
        need = self._used + table + k.charge - self.budget_bytes
        if need > 0 and not self._make_room(k, need):
            return False
        self._reserve(k)
        return True

    def publish(
        self,
        k: DiskKey,
        data: bytes | memoryview,
        mapped: Callable[[memoryview], None] | None = None,
    ) -> asyncio.Task[bool]:
        """Write an admitted ``k`` in the background (failures are counted, never raised): it
        joins the open batch, written as one bundle once it holds ``bundle_entries`` entries
        or ``bundle_bytes``, or ``bundle_window_s`` after its first entry; the task says,
        once that bundle is written, whether ``k`` was. A shared tier then hands the written
        body, as a mapping of its pages in the bundle, to ``mapped`` (the caller drops its
        private copy for it)."""
        fut = self._join(k, data)

        async def run() -> bool:
            status, view = await fut
            if view is not None and mapped is not None:
                mapped(view)
            return status == files.WRITTEN

        t = asyncio.get_running_loop().create_task(run())
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)
        return t

    async def store(self, k: DiskKey, data: bytes) -> str:
        """Warm-up's write: never evicts. "written", "present" (another process published
        it meanwhile), "budget" (the tier is full: stop), "refused" (floor, backlog or a
        recent error) or "error". A warm-up waits for each write: ``k`` joins the open batch
        and the batch is written at once (no window)."""
        table = self._table_charge(k, alone=True) if self._opens_batch(k) else 0
        if self._used + table + k.charge > self.budget_bytes:
            self.stats.refused_budget += 1
            return "budget"
        if not self._writable(k):
            return "refused"
        self._reserve(k)
        fut = self._join(k, data, alone=True)
        if self._batch is not None:
            self._flush(self._batch)
        status, _ = await fut
        return _STORED.get(status, "error")

    def _writable(self, k: DiskKey) -> bool:
        st = self.stats
        if self._closed or k.name in self._writing:
            return False
        if (
            self._clock.monotonic() < self._refuse_until
            or self._fs_free - k.charge < self._min_free
        ):
            st.refused_full += 1
            return False
        if self._pending + k.length > self.config.max_pending_write_bytes:
            st.refused_backlog += 1
            return False
        return True

    def _reserve(self, k: DiskKey) -> None:
        self._writing.add(k.name)
        self._used += k.charge
        self._reserved += k.charge
        self._pending += k.length
        self._gauges()

    def _opens_batch(self, k: DiskKey) -> bool:
        """Whether ``k`` will not fit in the open batch (it opens a new one)."""
        b = self._batch
        cfg = self.config
        return b is None or (
            len(b.keys) >= cfg.bundle_entries or b.nbytes + k.file_bytes > cfg.bundle_bytes
        )

    def _table_charge(self, k: DiskKey, alone: bool) -> int:
        """What to reserve for the table of a bundle ``k`` opens (at most; settled when it is
        written): of a bundle of one when ``alone`` (written at once), else of a full one."""
        return files.table_charge(k.file_bytes, 1 if alone else self.config.bundle_entries)

    def _join(
        self, k: DiskKey, data: bytes | memoryview, alone: bool = False
    ) -> asyncio.Future[tuple[int, memoryview | None]]:
        """Add a reserved ``k`` to the open batch (opening one, its table reserved, when it
        does not fit; ``alone``: the caller writes the batch at once); the future of its
        outcome: (``diskfile`` outcome or ``_FAILED``, the mapping of its body when the tier
        is shared and it was written)."""
        loop = asyncio.get_running_loop()
        cfg = self.config
        if self._opens_batch(k) and self._batch is not None:
            self._flush(self._batch)
        b = self._batch
        if b is None:
            b = self._batch = _Batch()
            b.table = self._table_charge(k, alone)
            self._used += b.table
            self._reserved += b.table
            b.timer = loop.call_later(cfg.bundle_window_s, self._flush, b)
        fut: asyncio.Future[tuple[int, memoryview | None]] = loop.create_future()
        b.keys.append(k)
        b.data.append(data)
        b.futures.append(fut)
        b.nbytes += k.file_bytes
        if len(b.keys) >= cfg.bundle_entries or b.nbytes >= cfg.bundle_bytes:
            self._flush(b)
        return fut

    def _flush(self, b: _Batch) -> None:
        """Start writing ``b`` (the open batch) as one bundle; no-op once it was started."""
        if self._batch is not b:
            return
        self._batch = None
        if b.timer is not None:
            b.timer.cancel()
        t = asyncio.get_running_loop().create_task(self._write(b))
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    def _make_room(self, k: DiskKey, need: int) -> bool:
        """Pick LRU victims (whole bundles) worth ``need`` bytes and let ``k`` duel them
        (module docstring)."""
        victims: list[Victim] = []
        freed = 0
        oldest = self._oldest
        touched = self._touched
        while oldest and freed < need and len(victims) < 64:
            v = oldest.popleft()
            if not touched.isdisjoint(v.names) or k.name in v.names:
                continue
            victims.append(v)
            freed += v.charge
        if (
            freed < need
            or k.charge > self.budget_bytes
            or self._sketch.estimate(k.hash64) - 1 <= max(self._estimate(v) for v in victims)
        ):
            oldest.extendleft(reversed(victims))
            self.stats.rejected += 1
            return False
        self._used -= freed
        self._evict_later(victims, freed)
        return True

    def _estimate(self, v: Victim) -> int:
        """A victim bundle's visit count in the duel: its most visited name's. Cached: a
        name's count rises only when a lookup reaches the tier, and a hit on it makes the
        bundle no victim (touched); only a miss on a damaged name raises it unseen."""
        if v.estimate < 0:
            est = self._sketch.estimate
            v.estimate = max(est(int(name[:16], 16)) for name in v.names)
        return v.estimate

    async def _write(self, b: _Batch) -> None:
        """Write batch ``b`` as one bundle on the executor and resolve its entries' futures;
        the accounting stays per entry (the table's page: per bundle)."""
        st = self.stats
        loop = asyncio.get_running_loop()
        n = len(b.keys)
        tmp = f".tmp.{os.getpid()}.{next(_TMP_SEQ)}.{int(time.time())}"
        status: list[int] = [_FAILED] * n
        views: list[memoryview | None] = [None] * n
        charge = 0  # the bundle's, as written
        try:
            status, free, views, charge = await loop.run_in_executor(
                self._ex,
                files.write_bundle,
                self.root,
                b.keys,
                b.data,
                self._min_free,
                tmp,
                self.shared,
            )
            self._fs_free = free
        except OSError as e:
            st.write_errors += 1
            self._refuse_until = self._clock.monotonic() + ERROR_BACKOFF_S
            self._log_error("disk_cache_write_failed", e)
        finally:
            written = 0  # charges
            for k, s, fut, view in zip(b.keys, status, b.futures, views, strict=True):
                self._writing.discard(k.name)
                self._reserved -= k.charge
                self._pending -= k.length
                if s == files.WRITTEN or s == files.PRESENT:
                    self._remember(k)
                if s == files.WRITTEN:
                    written += k.charge
                    st.writes += 1
                    st.entries += 1
                    st.bytes_written += k.length
                    self._written_since_scan += k.charge
                else:
                    self._used -= k.charge
                    if s == files.FULL:
                        st.refused_full += 1
                    elif s == files.PRESENT:
                        st.duplicate_fetches += 1  # charged by its writer, seen at a scan
                if not fut.done():
                    fut.set_result((s, view))
            # The table's reservation becomes what the bundle really costs beyond the
            # entries written (its table, and entries found present while linking).
            self._reserved -= b.table
            self._used += charge - written - b.table
            self._written_since_scan += max(0, charge - written)
            if files.FULL in status:
                self._refuse_until = self._clock.monotonic() + 1.0
            self._gauges()

    # -- eviction and accounting -------------------------------------------------------------

    def _evict_later(self, victims: list[Victim], expected: int) -> None:
        """Evict ``victims``, whose ``expected`` bytes were taken off the accounting already;
        what eviction did not free after all (a bundle touched since the scan, a name the
        scan did not see) is put back."""

        async def run() -> None:
            freed = 0
            try:
                names, freed = await asyncio.get_running_loop().run_in_executor(
                    self._ex, files.evict, self.root, victims
                )
            except OSError as e:
                self._log_error("disk_cache_evict_failed", e)
                return
            finally:
                self._used += expected - freed
                self._gauges()
            self.stats.evictions += names
            self.stats.evicted_bytes += freed
            self.stats.entries -= names

        t = asyncio.get_running_loop().create_task(run())
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    async def _shrink(self) -> None:
        """Evict the oldest bundles until the tier is at ``LOW_WATER`` of its budget (the
        other workers wrote more than this process accounted for)."""
        target = int(self.budget_bytes * LOW_WATER)
        victims: list[Victim] = []
        freed = 0
        while self._oldest and self._used - freed > target:
            v = self._oldest.popleft()
            if self._touched.isdisjoint(v.names):
                victims.append(v)
                freed += v.charge
        if not victims:
            return
        names, freed = await asyncio.get_running_loop().run_in_executor(
            self._ex, files.evict, self.root, victims
        )
        self._used -= freed
        self.stats.evictions += names
        self.stats.evicted_bytes += freed
        self.stats.entries -= names
        log.info("disk_cache_shrunk", evicted=names, used=self._used, budget=self.budget_bytes)
        self._gauges()

    def _apply_scan(self, sc: files.Scan, mark: bytes, wanted: bool) -> None:
        """Take a scan's accounting and candidates; when it was ``wanted`` to build the
        owner's name filter, that too (plus the names written while it ran), unless a guest
        was there or came since ``mark`` was read (then no filter)."""
        pres = self._presence
        if not wanted:
            pass  # the filter, if any, stays: every name since its scan was added to it
        elif sc.names is not None and pres is not None and pres.mark() == mark:
            for h in self._scan_writes or ():
                sc.names.add(h)
            self._names, self._mark = sc.names, mark
        else:
            self._names = None
        self.stats.name_filter_bytes = self._names.nbytes if self._names is not None else 0
        self._used = sc.used + self._reserved
        self._fs_free = sc.free
        self._oldest = deque(sc.oldest)
        self._written_since_scan = 0
        self.stats.scans += 1
        self.stats.entries = sc.entries
        self._sketch.ensure_capacity(sc.entries)
        self._gauges()

    async def rescan(self) -> float:
        """Scan the directory now (accounting, candidates, the owner's name filter); the
        seconds it took."""
        pres = self._presence
        names = self._names
        # The owner's filter is built by a scan only when it has none (a guest came) or it
        # holds more names than it was sized for; otherwise it already has every name on disk
        # (it adds what it writes), and collecting 1.28M names again would cost the scan's
        # thread ~1 s of the interpreter's lock every rescan.
        wanted = pres is not None and pres.owner and (names is None or names.count > names.capacity)
        mark = pres.mark() if pres is not None else b""
        self._scan_writes = [] if wanted else None
        try:
            sc = await asyncio.get_running_loop().run_in_executor(
                self._ex,
                files.scan,
                self.root,
                MAX_CANDIDATES,
                pres.guests_fd if pres is not None and wanted else -1,
            )
            self._apply_scan(sc, mark, wanted)
        finally:
            self._scan_writes = None
        return sc.seconds

    async def flush_touches(self) -> None:
        if not self._touched:
            return
        names = list(self._touched)
        self._touched.clear()
        with contextlib.suppress(OSError):
            await asyncio.get_running_loop().run_in_executor(
                self._ex, files.touch, self.root, names
            )

    async def _maintain(self) -> None:
        cfg = self.config
        next_scan = self._clock.monotonic() + cfg.rescan_interval_s
        while True:
            await asyncio.sleep(min(cfg.touch_interval_s, cfg.rescan_interval_s))
            try:
                await self.flush_touches()
                now = self._clock.monotonic()
                written = self._written_since_scan > self.budget_bytes * RESCAN_WRITTEN_SHARE
                if now >= next_scan or written:
                    took = await self.rescan()
                    next_scan = now + max(cfg.rescan_interval_s, 20 * took)
                if self._used > self.budget_bytes:
                    await self._shrink()
                if not self._swept:
                    await self.sweep_old_layouts()
            except OSError as e:  # the directory went away, a disk error: keep trying
                self._log_error("disk_cache_maintenance_failed", e)
            except Exception:  # a bug must not end maintenance (and with it the budget)
                log.exception("disk_cache_maintenance_failed")

    async def sweep_old_layouts(self) -> None:
        """Remove a bounded share (``SWEEP_FILES``) of an older layout's directory next to
        the tier's (``<cache_dir>/v1``: this version never reads it), once per maintenance
        round until it is gone."""
        self._swept = await asyncio.get_running_loop().run_in_executor(
            self._ex, files.sweep_old_layouts, os.path.dirname(self.root), SWEEP_FILES
        )

    def _gauges(self) -> None:
        st = self.stats
        st.used_bytes = self._used
        st.pending_write_bytes = self._pending
        st.fs_free_bytes = self._fs_free

    def _log_error(self, event: str, e: OSError | ValueError) -> None:
        self._errors_logged += 1
        n = self._errors_logged
        if n <= 10 or n % 1000 == 0:
            log.warning(event, error=f"{type(e).__name__}: {e}", errors_so_far=n)

    async def drain(self) -> None:
        """Write the open batch now and wait for the writes and evictions started so far
        (tests, warm-ups, shutdown)."""
        while self._tasks or self._batch is not None:
            if self._batch is not None:
                self._flush(self._batch)
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def close(self) -> None:
        """Stop maintenance, write the open batch, let writes in flight finish, record the
        hits' access times."""
        if self._closed:
            return
        self._closed = True
        if self._maint is not None:
            self._maint.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._maint
        await self.drain()
        await self.flush_touches()
        self._ex.shutdown(wait=False)
        self._names = None
        if self._presence is not None:
            self._presence.close()
        self.stats.enabled = 0
