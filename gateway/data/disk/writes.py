"""The disk tier's writes: admitted entries gathered into batches, each written as one
bundle on the tier's executor, and the accounting settled once it is.

Owns: the open batch's life (joined by ``publish`` and ``store``, written when full, at the
end of its window, or at once), the write-side checks (floor, backlog, a recent error), the
reservations of the entries and their bundle's table, and the outcome of each write (counted,
handed to its publisher, a shared tier's mapping included). Must not: evict or choose what is
admitted (``budget``), do file I/O on the loop (``entries.write_bundle`` runs on the
executor), or raise to a publisher (failures are counted).

Bundles: one file, many names. The file behind a name is a *bundle* holding up to
``bundle_entries`` entries (``fileformat``: a table, then the entries), one hard link per
entry: creating, renaming and evicting files is what costs a filesystem CPU, not their
bytes (ext4 without a journal: 180-270 us per 110 kB entry file, ~47 us per entry in
bundles of 64, here). ``publish`` adds an admitted entry to the open batch, written as one
bundle once it holds ``bundle_entries`` entries or ``bundle_bytes``, or ``bundle_window_s``
after its first entry, whichever comes first; each publish task completes when its bundle
is written. ``store`` (warm-ups, which wait for each write) writes the open batch at once.
``drain`` and ``close`` write the open batch.

Atomic publish. A writer writes the bundle as ``.tmp.<pid>.<n>.<unix s>`` (one
``writev``), ``link``\\s it under each entry's name (a name that exists already: another
process published that entry, counted as a duplicate fetch), then unlinks the temporary
name. A reader sees a whole bundle or no name; never a half-written one. No ``fsync``: after
a power loss a file may hold zeros or garbage, which the checksums catch (``entries``), so
durability is not paid for on every write. A crashed writer leaves a temporary name (the
next scan removes it an hour after the time in its name) and maybe some of the entries'
names, each verified on its own.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections.abc import Callable
from typing import Final

from gateway.data.disk import entries, fileformat
from gateway.data.disk.fileformat import DiskKey
from gateway.data.disk.state import Batch, DiskState

__all__ = ["BatchWriter"]

# Temporary file names (``.tmp.PID.N.TIME``): one counter per process, not per store, so two
# stores over one directory in one process (tests; a reload) never pick the same name.
_TMP_SEQ: Final = itertools.count()
ERROR_BACKOFF_S: Final = 10.0
_FAILED: Final = -1  # a write that raised (counted and logged)
_STORED: Final = {entries.WRITTEN: "written", entries.PRESENT: "present", entries.FULL: "refused"}


class BatchWriter(DiskState):
    """The disk tier's writes (``DiskStore`` is one): ``publish``, ``store``, ``drain``."""

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
            return status == entries.WRITTEN

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
        return fileformat.table_charge(k.file_bytes, 1 if alone else self.config.bundle_entries)

    def _join(
        self, k: DiskKey, data: bytes | memoryview, alone: bool = False
    ) -> asyncio.Future[tuple[int, memoryview | None]]:
        """Add a reserved ``k`` to the open batch (opening one, its table reserved, when it
        does not fit; ``alone``: the caller writes the batch at once); the future of its
        outcome: (``entries.write_bundle``'s outcome or ``_FAILED``, the mapping of its body
        when the tier is shared and it was written)."""
        loop = asyncio.get_running_loop()
        cfg = self.config
        if self._opens_batch(k) and self._batch is not None:
            self._flush(self._batch)
        b = self._batch
        if b is None:
            b = self._batch = Batch()
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

    def _flush(self, b: Batch) -> None:
        """Start writing ``b`` (the open batch) as one bundle; no-op once it was started."""
        if self._batch is not b:
            return
        self._batch = None
        if b.timer is not None:
            b.timer.cancel()
        t = asyncio.get_running_loop().create_task(self._write(b))
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    async def _write(self, b: Batch) -> None:
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
                entries.write_bundle,
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
                if s == entries.WRITTEN or s == entries.PRESENT:
                    self._remember(k)
                if s == entries.WRITTEN:
                    written += k.charge
                    st.writes += 1
                    st.entries += 1
                    st.bytes_written += k.length
                    self._written_since_scan += k.charge
                else:
                    self._used -= k.charge
                    if s == entries.FULL:
                        st.refused_full += 1
                    elif s == entries.PRESENT:
                        st.duplicate_fetches += 1  # charged by its writer, seen at a scan
                if not fut.done():
                    fut.set_result((s, view))
            # The table's reservation becomes what the bundle really costs beyond the
            # entries written (its table, and entries found present while linking).
            self._reserved -= b.table
            self._used += charge - written - b.table
            self._written_since_scan += max(0, charge - written)
            if entries.FULL in status:
                self._refuse_until = self._clock.monotonic() + 1.0
            self._gauges()

    async def drain(self) -> None:
        """Write the open batch now and wait for the writes and evictions started so far
        (tests, warm-ups, shutdown)."""
        while self._tasks or self._batch is not None:
            if self._batch is not None:
                self._flush(self._batch)
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
