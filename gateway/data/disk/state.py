"""The disk tier's per-process state: the fields every part of ``DiskStore`` reads and
writes, on the event loop only.

Owns: this process's accounting of the tier (bytes used, reserved by writes in flight, body
bytes waiting to be written, written since the last scan), the open batch (``Batch``), the
eviction candidates and the hits waiting for their mtime, the visit counts, the owner's name
filter and the guests' nonce it was built under, the tier's executor, and the gauges and the
rate-limited error log over them. Must not: decide anything or do I/O (``writes``, ``budget``
and ``store``, built on it in that order, do).
"""

from __future__ import annotations

import asyncio
import os
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Final

import structlog

from gateway.clock import Clock, SystemClock
from gateway.data.config import DiskConfig
from gateway.data.disk import sharing
from gateway.data.disk.directory import Victim
from gateway.data.disk.fileformat import DiskKey
from gateway.data.sketch import FrequencySketch
from gateway.data.stats import DiskStats

__all__ = ["Batch", "DiskState"]

log = structlog.get_logger(__name__)


class Batch:
    """Entries waiting to be written as one bundle, and their publishers' futures."""

    __slots__ = ("data", "futures", "keys", "nbytes", "table", "timer")

    def __init__(self) -> None:
        self.keys: list[DiskKey] = []
        self.data: list[bytes | memoryview] = []
        self.futures: list[asyncio.Future[tuple[int, memoryview | None]]] = []
        self.nbytes = 0
        self.table = 0  # the table's charge reserved for the bundle (settled once written)
        self.timer: asyncio.TimerHandle | None = None


class DiskState:
    """The fields of one process's disk tier (``DiskStore``), and the helpers over them."""

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
        presence: sharing.Presence | None = None,
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
        self._batch: Batch | None = None  # the open batch (entries join it: ``publish``)
        self._swept = False  # an older layout's directory is gone (``sweep_old_layouts``)
        self._errors_logged = 0
        self._broken = 0  # mappings found broken by readers (``drop``)
        self._broken_logged: set[str] = set()  # their entries, logged once each
        self._presence = presence  # unshared: the tier's owner or a guest (sharing.presence)
        self._names: sharing.NameFilter | None = None  # the owner's, while no guest came
        self._mark = b""  # the guests' nonce when ``_names`` was built
        self._scan_writes: list[int] | None = None  # names written while a scan runs
        stats.enabled = 1
        stats.budget_bytes = budget

    def path(self, k: DiskKey) -> str:
        return os.path.join(self.root, k.name[:2], k.name)

    def _remember(self, k: DiskKey) -> None:
        """``k``'s name is on disk now (written, or found there): the owner's filter holds it."""
        if self._names is not None:
            self._names.add(k.hash64)
        if self._scan_writes is not None:
            self._scan_writes.append(k.hash64)

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
