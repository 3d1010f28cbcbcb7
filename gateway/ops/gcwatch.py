"""How long the garbage collector stops the process: collections, time in them, the longest.

Owns: one ``gc.callbacks`` entry per server (``install``/``remove``) and its ``GcStats``, read
by ``/metrics`` (``nfsgw_gc_*``). Why: a full collection walks every object the interpreter
tracks, and every call waits while it runs; at ImageNet scale a container of small objects
per cached file or per directory entry made that hundreds of milliseconds (the index's
columns and the data cache's tuples keep it to tens). These metrics show whether it holds.
``freeze_long_lived`` (called once by ``nfsgw serve`` when the server is up, not by tests
that start many servers in one process) moves everything built at start-up, the data cache's
200,000-entry tables among it, out of the collector's sight (``gc.freeze``): a full collection
in a warm ImageNet epoch walked them every few seconds (~160 ms each here).
Must not: log or allocate much in the callback (it runs inside the collector, on whatever
thread triggered it, possibly holding a logging lock).
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass
from typing import Any

__all__ = ["GcStats", "GcWatch", "freeze_long_lived"]


@dataclass(slots=True)
class GcStats:
    full: int = 0
    """Full (generation 2) collections."""
    seconds: float = 0.0
    """Time spent in collections of any generation."""
    longest_s: float = 0.0
    """The longest collection since the process started."""


class GcWatch:
    def __init__(self, stats: GcStats | None = None) -> None:
        self.stats = stats if stats is not None else GcStats()
        self._t0 = 0.0

    def install(self) -> None:
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)

    def remove(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
            return
        took = time.perf_counter() - self._t0
        s = self.stats
        s.seconds += took
        if took > s.longest_s:
            s.longest_s = took
        if info.get("generation") == 2:
            s.full += 1


def freeze_long_lived() -> None:
    """Collect, then freeze what is left: what the process built to serve (modules, the
    caches' tables, the configuration) lives as long as it does, and full collections no
    longer walk it. Objects frozen here are still freed by reference counting; only a cycle
    among them that dies later would stay (none is expected of start-up state)."""
    gc.collect()
    gc.freeze()
