"""Read-only lookups in the long-handle map older gateways kept (``handles.sqlite3`` in the
state directory), so ``FORM_MAPPED`` handles a mounted client got before an upgrade keep
resolving after it.

Owns: opening that SQLite file read-only (if it exists) on one thread and reading one row per
lookup. Must not: write to it or create it (nothing issues ``FORM_MAPPED`` handles any more),
or run SQLite on the event loop.

Several processes (``nfsgw serve --workers N``) may read it at once: it is opened with
``mode=ro`` and a busy timeout, so a reader only waits (bounded) while an old gateway that
shares the state directory during a rolling upgrade checkpoints its WAL.

TODO: remove this module (and ``FORM_MAPPED`` decoding) once no supported upgrade path starts
from a gateway that issued ``FORM_MAPPED`` handles (the release after the one that stopped
issuing them); until then a missing file costs nothing (no thread, no lookups).
"""

from __future__ import annotations

import asyncio
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Final

LEGACY_FILE: Final = "handles.sqlite3"
BUSY_TIMEOUT_S: Final = 5.0


class LegacyMap:
    """``hash -> (export id, path)`` from an old gateway's map, read-only."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._executor: ThreadPoolExecutor | None = None
        self._conn: sqlite3.Connection | None = None  # used only on the executor's thread
        self.lookups = 0

    @classmethod
    def open_if_present(cls, state_dir: Path) -> LegacyMap | None:
        """The map in ``state_dir`` if an older gateway left one there (checked once, at start,
        off the loop by the caller or before it runs)."""
        path = state_dir / LEGACY_FILE
        return cls(path) if path.is_file() else None

    async def lookup(self, digest: bytes) -> tuple[int, str] | None:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nfsgw-fhmap")
        self.lookups += 1
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._read, digest)

    def _read(self, digest: bytes) -> tuple[int, str] | None:
        if self._conn is None:
            self._conn = sqlite3.connect(
                self.path.resolve().as_uri() + "?mode=ro", uri=True, timeout=BUSY_TIMEOUT_S
            )
        row = self._conn.execute(
            "SELECT export_id, path FROM handle_paths WHERE hash = ?", (digest,)
        ).fetchone()
        return None if row is None else (int(row[0]), str(row[1]))

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    async def close(self) -> None:
        if self._executor is not None:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(self._executor, self._close)
            self._executor.shutdown(wait=False)
            self._executor = None
