"""Per-path locks of the write path: every mutation of a path (WRITE, COMMIT, SETATTR,
CREATE, REMOVE, RENAME, ...) holds its path's lock, so two of them never interleave.

Owns: ``PathLocks``. Must not: know what is locked or why (callers decide the paths).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator


class PathLocks:
    """One ``asyncio.Lock`` per key (export id, path) while anyone holds or waits for it:
    memory stays bounded by the calls in flight."""

    def __init__(self) -> None:
        # key -> (lock, holders and waiters)
        self._locks: dict[tuple[int, str], tuple[asyncio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def hold(self, *keys: tuple[int, str]) -> AsyncIterator[None]:
        """Hold every lock of ``keys``, taken in sorted order so two callers never deadlock."""
        ordered = sorted(set(keys))
        for k in ordered:
            lock, n = self._locks.get(k, (None, 0))
            self._locks[k] = (lock or asyncio.Lock(), n + 1)
        acquired: list[asyncio.Lock] = []
        try:
            for k in ordered:
                lock = self._locks[k][0]
                await lock.acquire()
                acquired.append(lock)
            yield
        finally:
            for lock in reversed(acquired):
                lock.release()
            for k in ordered:
                lock, n = self._locks[k]
                if n <= 1:
                    del self._locks[k]
                else:
                    self._locks[k] = (lock, n - 1)
