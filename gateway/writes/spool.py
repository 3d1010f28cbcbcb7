"""Spool files on local disk for data written but not yet uploaded, under one byte budget.

Owns: the spool directory (created at start, emptied of a previous run's files), one sparse
file per staged object, the budget of staged bytes, the bounded thread pool every spool file
operation runs in (the event loop never touches the disk), and the journal of multipart
uploads in flight (``<id>.upload``), so uploads orphaned by a crash are aborted after the
restart. Must not: know about NFS, objects or the backend (``staging`` and ``upload`` do).

The spool holds no data worth recovering: after a crash the write verifier changes and the
clients resend everything they had not seen committed (RFC 1813 §3.3.7), so start-up deletes
every spool file.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import structlog

log = structlog.get_logger(__name__)

T = TypeVar("T")

_UPLOAD_SUFFIX = ".upload"
_SPOOL_SUFFIX = ".spool"


class BudgetExceeded(Exception):
    """Staging ``n`` more bytes would pass the budget."""


class Spool:
    def __init__(self, directory: Path, budget_bytes: int, threads: int) -> None:
        self.dir = directory
        self.budget_bytes = budget_bytes
        self.used_bytes = 0
        self.files = 0
        self._threads = threads
        self._pool: ThreadPoolExecutor | None = None
        self.orphan_uploads: list[dict[str, str]] = []
        self.started = False

    # -- life cycle -----------------------------------------------------------------------

    def start(self) -> None:
        """Create the directory, collect the previous run's upload journal, delete its spool
        files (blocking; called once, before the first staged write)."""
        if self.started:
            return
        self.started = True
        self.dir.mkdir(parents=True, exist_ok=True)
        for p in self.dir.iterdir():
            if p.name.endswith(_UPLOAD_SUFFIX):
                try:
                    rec = json.loads(p.read_text())
                except (OSError, ValueError) as e:
                    # Its upload, if any, stays in the bucket until a lifecycle rule ends it.
                    log.warning("spool_journal_read_failed", file=str(p), error=repr(e))
                else:
                    if isinstance(rec, dict):
                        self.orphan_uploads.append({str(k): str(v) for k, v in rec.items()})
            if p.name.endswith((_UPLOAD_SUFFIX, _SPOOL_SUFFIX)) or p.name.startswith(".tmp-"):
                try:
                    p.unlink()
                except OSError as e:
                    log.warning("spool_file_unlink_failed", file=str(p), error=repr(e))
        if self.orphan_uploads:
            log.info("spool_orphans_found", uploads=len(self.orphan_uploads))

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="nfsgw-spool")
        return self._pool.submit(fn)

    async def run(self, fn: Callable[[], T]) -> T:
        """Run blocking ``fn`` in the spool's thread pool."""
        return await asyncio.wrap_future(self.submit(fn))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=False)  # never block the loop
            self._pool = None

    # -- budget ---------------------------------------------------------------------------

    def reserve(self, n: int) -> None:
        if n > 0 and self.used_bytes + n > self.budget_bytes:
            raise BudgetExceeded(f"{n} B over the spool budget ({self.used_bytes} B used)")
        self.used_bytes += n

    def release(self, n: int) -> None:
        self.used_bytes = max(0, self.used_bytes - n)

    # -- files ----------------------------------------------------------------------------

    async def open_file(self) -> SpoolFile:
        name = uuid.uuid4().hex
        path = self.dir / (name + _SPOOL_SUFFIX)
        fd = await self.run(
            functools.partial(os.open, path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        )
        self.files += 1
        return SpoolFile(self, name, path, fd)

    async def journal_upload(self, name: str, record: dict[str, str]) -> None:
        """Record a multipart upload in flight under ``name`` (unique per upload)."""
        path = self.dir / (name + _UPLOAD_SUFFIX)

        def write() -> None:
            tmp = self.dir / f".tmp-{name}"
            tmp.write_text(json.dumps(record))
            os.replace(tmp, path)

        await self.run(write)

    async def forget_upload(self, name: str) -> None:
        path = self.dir / (name + _UPLOAD_SUFFIX)
        await self.run(functools.partial(_unlink, path))


def _unlink(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


class SpoolFile:
    """One sparse file. Reads of never-written ranges return zeros (the caller overlays).

    Every operation on the descriptor goes through ``io``, which counts it until its thread
    is done, even when the awaiting call was cancelled meanwhile; ``close`` waits for that
    count to reach zero, so the descriptor is never closed (and its number reused by another
    file) under a thread still writing to it."""

    __slots__ = ("_busy", "_idle", "closed", "fd", "name", "path", "spool")

    def __init__(self, spool: Spool, name: str, path: Path, fd: int) -> None:
        self.spool = spool
        self.name = name
        self.path = path
        self.fd = fd
        self.closed = False
        self._busy = 0
        self._idle: asyncio.Event | None = None

    async def io(self, fn: Callable[[int], T]) -> T:
        """Run ``fn(fd)`` in the spool's thread pool."""
        if self.closed:
            raise ValueError(f"spool file {self.name} is closed")
        loop = asyncio.get_running_loop()
        self._busy += 1
        fut = self.spool.submit(functools.partial(fn, self.fd))

        def done(_: object) -> None:  # in the worker thread
            loop.call_soon_threadsafe(self._io_done)

        fut.add_done_callback(done)
        return await asyncio.wrap_future(fut)

    def _io_done(self) -> None:
        self._busy -= 1
        if self._busy == 0 and self._idle is not None:
            self._idle.set()

    async def pwrite(self, data: bytes | bytearray | memoryview, offset: int) -> None:
        def write(fd: int) -> None:
            view = memoryview(data)
            off = offset
            while view:  # pwrite may write less than asked
                n = os.pwrite(fd, view, off)
                view = view[n:]
                off += n

        await self.io(write)

    async def close(self) -> None:
        """Close and delete (idempotent), once no thread uses the descriptor."""
        if self.closed:
            return
        self.closed = True
        while self._busy:
            self._idle = asyncio.Event()
            await self._idle.wait()
        fd, path = self.fd, self.path

        def drop() -> None:
            try:
                os.close(fd)
            except OSError as e:
                log.debug("spool_file_close_failed", file=str(path), error=repr(e))
            _unlink(path)

        self.spool.files -= 1
        await self.spool.run(drop)
