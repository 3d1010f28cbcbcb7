"""The disk tier's budget: what it admits when full, what it evicts, and the maintenance
that keeps this process's view of the directory fresh.

Owns: admission (the duel against the least recently used bundles), eviction (of whole
bundles, in the background), the shrink of an over-budget tier, the scans and what they give
(accounting, candidates, the owner's name filter), the batched mtime touches of hits, the
sweep of an older layout's directory, and the maintenance task that runs them. Must not: do
file I/O on the loop (``directory``'s functions run on the executor), fail a READ, or write
entries (``writes``).

Budget without a shared counter. Each process scans the directory (``os.scandir`` +
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

Shared access clock, eviction by bundle. A hit sets its name's mtime (``os.utime``), in
batches every ``touch_interval_s``: that is the bundle's mtime, shared by its names, so the
LRU order is the bundles'. A scan keeps the oldest bundles (by mtime, holding at most
``MAX_CANDIDATES`` names) as eviction candidates, each with every name it saw for it. A
victim is a whole bundle: its names are unlinked unless it was touched since the scan. Its
space returns with its last name (a name the scan did not see, a crashed writer's
temporary name or a mapping keeps it), and only what eviction really freed
(``st_nlink``) is taken off the accounting.

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
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections import deque
from typing import Final

import structlog

from gateway.data.disk import directory
from gateway.data.disk.directory import Victim
from gateway.data.disk.fileformat import DiskKey
from gateway.data.disk.writes import BatchWriter

__all__ = ["MAX_CANDIDATES", "Keeper"]

log = structlog.get_logger(__name__)

LOW_WATER: Final = 0.95  # an over-budget tier is shrunk to this share of the budget
RESCAN_WRITTEN_SHARE: Final = 0.02  # of the budget written by this process since the last scan
MAX_CANDIDATES: Final = 65_536  # oldest entries a scan keeps as eviction candidates
SWEEP_FILES: Final = 4096  # files of an older layout removed per maintenance round


class Keeper(BatchWriter):
    """The disk tier's budget (``DiskStore`` is one): ``admit``, ``rescan``,
    ``flush_touches``, ``sweep_old_layouts``, and the maintenance task."""

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

    def _evict_later(self, victims: list[Victim], expected: int) -> None:
        """Evict ``victims``, whose ``expected`` bytes were taken off the accounting already;
        what eviction did not free after all (a bundle touched since the scan, a name the
        scan did not see) is put back."""

        async def run() -> None:
            freed = 0
            try:
                names, freed = await asyncio.get_running_loop().run_in_executor(
                    self._ex, directory.evict, self.root, victims
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
            self._ex, directory.evict, self.root, victims
        )
        self._used -= freed
        self.stats.evictions += names
        self.stats.evicted_bytes += freed
        self.stats.entries -= names
        log.info("disk_cache_shrunk", evicted=names, used=self._used, budget=self.budget_bytes)
        self._gauges()

    def _apply_scan(self, sc: directory.Scan, mark: bytes, wanted: bool) -> None:
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
                directory.scan,
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
                self._ex, directory.touch, self.root, names
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
            self._ex, directory.sweep_old_layouts, os.path.dirname(self.root), SWEEP_FILES
        )
