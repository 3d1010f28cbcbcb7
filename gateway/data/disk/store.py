"""The local-disk tier of the data cache: verified entries under ``server.cache_dir``, shared
by every worker process of the host, surviving restarts (DESIGN §3 "Data cache: two levels").

Owns: ``DiskStore``, the tier's one face to the event loop, and what it does itself: opening
the tier (the directory prepared, this process's place among its users taken, the first scan,
the budget and the free-space floor resolved, the threads that do the file I/O started), the
reads (verified, as mappings or copies; the sole user's misses answered without a file), the
broken mappings readers report, the fetch claims of a shared tier, and closing it. It is built
on ``budget`` (admission, eviction, scans), ``writes`` (batches, bundles) and ``state``; the
files are ``entries``, ``directory``, ``sharing`` and ``fileformat`` (the package docstring
maps them). Must not: touch the event loop's thread with file I/O (every
``open``/``pread``/``writev``/``link``/``stat`` runs on the tier's own bounded executor), fail
a READ (every error is counted and turns into a miss or a skipped publish), know about NFS, or
talk to the backend (``ObjectReader`` fetches; the tier stores).

The host's one data cache
-------------------------
Every configuration has the tier (``resolve_cache_dir``: ``server.cache_dir``, systemd's
``$CACHE_DIRECTORY``, else ``STATE_DIR/cache``; ``cache.disk = 0`` turns it off), so the
workers of ``--workers auto`` share it. With several workers it is *shared*
(``DiskStore(shared=True)``):

* **Held once.** A hit returns the body as a read-only mapping (of the pages it spans in its
  bundle: ``entries.map_entry``, verified once), and a publish hands the writer a
  mapping of what it wrote (the reader swaps its private copy for it: ``DataCache.swap``).
  The pages are the page cache's: N workers serving a file hold it once. The memory tier
  charges a mapping ``1 / workers`` of the pages it spans.
* **Fetched once.** Before a GET a worker ``claim``\\s the entry: an exclusive ``flock`` on one
  of 4,096 lock files (``v2/locks/<3 hex>``), taken without blocking on the executor, held
  until the entry is in place, dropped by the kernel if the process dies. A worker finding
  it held polls (1 ms, doubling to 20 ms) until it can take it or the entry appears (then it
  reads the entry), for at most ``claim_wait_s``, then fetches anyway (``claim_timeouts``;
  the later publish finds the entry and counts a ``duplicate_fetches``).

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
  never read by this version): removed in the background, ``budget.SWEEP_FILES`` files per
  maintenance round (4,096 every 10 s: 1.28 M files in under an hour), by every worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Final

import structlog

from gateway.clock import Clock
from gateway.data.config import DiskConfig
from gateway.data.disk import directory, entries, sharing
from gateway.data.disk.budget import MAX_CANDIDATES, Keeper
from gateway.data.disk.fileformat import DiskKey
from gateway.data.disk.sharing import NO_CLAIM, Claim
from gateway.data.stats import DiskStats

__all__ = ["DiskStore", "open_disk_tier", "resolve_cache_dir", "usable"]

log = structlog.get_logger(__name__)

AUTO_SHARE: Final = 0.5  # of (free space + what the cache holds - floor) at start
DEFAULT_FLOOR_SHARE: Final = 0.05  # of the filesystem's size
MAX_TOUCHED: Final = 65_536  # hits waiting for their mtime update
CLAIM_POLL_S: Final = (0.001, 0.02)  # first and longest pause between claim attempts


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
        directory.prepare(cache_dir)
    except OSError as e:
        return f"{cache_dir}: {type(e).__name__}: {e}"
    return ""


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


class DiskStore(Keeper):
    """The disk tier of one process. Built with ``await DiskStore.open(...)``; its methods
    are called on the event loop only; file I/O runs on its executor."""

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
        pres: sharing.Presence | None = None
        try:
            await _start_threads(loop, ex, config.threads)
            root, fs_size, _ = await loop.run_in_executor(ex, directory.prepare, cache_dir)
            if not shared:
                try:
                    pres = await loop.run_in_executor(ex, sharing.presence, root)
                except OSError as e:  # the tier works without: every miss looks
                    log.warning("disk_cache_presence_failed", error=f"{type(e).__name__}: {e}")
            mark = pres.mark() if pres is not None else b""
            guests_fd = pres.guests_fd if pres is not None and pres.owner else -1
            sc = await loop.run_in_executor(ex, directory.scan, root, MAX_CANDIDATES, guests_fd)
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

    # -- reads -----------------------------------------------------------------------------

    async def read(self, k: DiskKey, mapped: bool = True) -> bytes | memoryview | None:
        """The verified body of ``k``, or None (absent, bad: dropped, or an I/O error): a
        mapping of the entry's pages (``entries``, "Mappings") when ``mapped`` (no copy, and
        no body allocated by the tier's threads), else a copy."""
        self._sketch.increment(k.hash64)
        st = self.stats
        if self._absent(k):
            st.lookups_skipped += 1
            st.misses += 1
            return None
        try:
            status, body, why, freed = await asyncio.get_running_loop().run_in_executor(
                self._ex, entries.verify, self.path(k), k, mapped
            )
        except (OSError, ValueError) as e:  # ValueError: a mapping refused (a bug if seen)
            st.read_errors += 1
            st.misses += 1
            self._log_error("disk_cache_read_failed", e)
            return None
        if status == entries.HIT:
            st.hits += 1
            st.bytes_hit += len(body)
            if len(self._touched) < MAX_TOUCHED:
                self._touched.add(k.name)
            return body
        if status == entries.BAD:
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
                self._ex, entries.drop, self.path(k), k
            )
        except (OSError, ValueError) as e:
            st.read_errors += 1
            self._log_error("disk_cache_read_failed", e)
            return
        except RuntimeError:  # the executor was shut down (closed meanwhile)
            return
        if status == entries.BAD:
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
            self._ex, entries.exists, self.path(k)
        )

    def _absent(self, k: DiskKey) -> bool:
        """Whether the tier's sole user knows ``k`` is not there, with no file opened
        (``sharing``, "One user, no look-ups"): its name filter says so and no guest came since
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

    async def claim(self, k: DiskKey) -> Claim:
        """The right to fetch ``k`` from the backend, when the tier is shared: waits while
        another process holds it (its fetch is running), then either holds it (fetch, publish,
        then ``release``) or finds ``k`` published (``present``: read it). Gives up waiting
        after ``claim_wait_s`` and fetches anyway (counted). Unshared tier, closed tier, or
        a lock file that cannot be opened: an empty claim (fetch; nothing to release)."""
        if not self.shared or self._closed:
            return NO_CLAIM
        loop = asyncio.get_running_loop()
        pause, longest = CLAIM_POLL_S
        deadline = 0.0
        while True:
            try:
                fd, present = await loop.run_in_executor(self._ex, sharing.claim, self.root, k)
            except OSError as e:
                self._log_error("disk_cache_claim_failed", e)
                return NO_CLAIM
            if fd >= 0 or present:
                return Claim(fd, present)
            now = self._clock.monotonic()
            if not deadline:
                deadline = now + self.config.claim_wait_s
                self.stats.claim_waits += 1
            elif now >= deadline:
                self.stats.claim_timeouts += 1
                return NO_CLAIM
            await asyncio.sleep(pause)
            pause = min(2 * pause, longest)

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
