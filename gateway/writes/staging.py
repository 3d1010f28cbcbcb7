"""The gateway's staged files: WRITE data and size or metadata changes not yet committed, and
when they are committed (DESIGN §3 "Writes").

Owns: one ``StagedFile`` per object with uncommitted changes, the spool bytes it holds, the
commit that installs its new version in the index, background write-back (idle files, budget
pressure), and the write path's start-up and shutdown. Must not: build or upload objects
(``upload`` does), encode NFS replies or check permissions (handlers do), or block the event
loop (spool I/O runs in the spool's thread pool); backend errors pass through (``WriteManager``
translates them at the write path's boundary).

- **Durability**: UNSTABLE WRITEs are acknowledged once in the spool; COMMIT, FILE_SYNC and
  DATA_SYNC WRITEs and every metadata operation reply after the backend has the object. The
  write verifier (``Gateway.write_verf``) changes at every start; the spool is wiped then and
  multipart uploads the previous run left are aborted (on first use of each export).
- **Bounds**: staged bytes are capped by the spool budget and staged files by
  ``max_staged_files``; past either, WRITE raises ``Busy`` (NFS3ERR_JUKEBOX, the client
  retries) and the largest staged file is committed in the background to make room. Files
  not written for ``flush_idle_s`` are committed in the background (clients that never send
  COMMIT still get their data stored).
- A staged file is opened on the object version the index shows *after* the path's lock is
  taken: a commit may have replaced it meanwhile, and a REMOVE or RENAME that removed it makes
  the handle stale (the file is never recreated).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Mapping
from typing import TYPE_CHECKING

import structlog

from gateway.backend.base import BackendError
from gateway.clock import Clock
from gateway.data import ObjectReader
from gateway.errors import Busy, FileTooBig, GatewayError, NotFound, StaleHandle
from gateway.namespace import META_CREATEVERF, META_CTIME, META_MTIME, Entry
from gateway.writes.config import WriteConfig
from gateway.writes.locks import PathLocks
from gateway.writes.metadata import MetadataCache
from gateway.writes.spool import BudgetExceeded, Spool
from gateway.writes.stats import WriteStats
from gateway.writes.upload import StagedFile, Uploader

if TYPE_CHECKING:
    from gateway.exports import Export

log = structlog.get_logger(__name__)


class Staging:
    def __init__(
        self,
        cfg: WriteConfig,
        reader: ObjectReader,
        locks: PathLocks,
        meta: MetadataCache,
        stats: WriteStats,
        *,
        clock: Clock,
    ) -> None:
        self.cfg = cfg
        self.clock = clock  # monotonic: when a staged file was last written (``flush_idle``)
        self.reader = reader
        self.locks = locks
        self.meta = meta
        self.stats = stats
        self.spool = Spool(cfg.spool_dir, cfg.spool_bytes, cfg.io_threads)
        self.uploader = Uploader(cfg, reader, self.spool, meta, stats, self._spawn)
        self._files: dict[tuple[int, str], StagedFile] = {}
        self._recovered: set[int] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._flusher: asyncio.Task[None] | None = None
        self._pressure: asyncio.Task[None] | None = None
        self._closing = False
        self._start_lock = asyncio.Lock()

    # -- life cycle -----------------------------------------------------------------------

    async def start(self, export: Export) -> None:
        """First use (per export): wipe the spool, abort the uploads a previous run left,
        start the idle flusher."""
        if not self.spool.started:
            async with self._start_lock:
                if not self.spool.started:
                    await self.spool.run(self.spool.start)
        if export.id not in self._recovered:
            self._recovered.add(export.id)
            mine = [r for r in self.spool.orphan_uploads if r.get("export") == export.cfg.path]
            if mine:
                self._spawn(self.uploader.abort_orphans(export, mine))
        if self._flusher is None and self.cfg.flush_idle_s > 0 and not self._closing:
            self._flusher = asyncio.get_running_loop().create_task(self._flush_loop())

    def _spawn(self, coro: Coroutine[object, object, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self, commit_timeout_s: float) -> None:
        """Commit what is staged (within the timeout), stop background work, close the pool.
        Whatever is not committed is lost here; clients resend it (the verifier changes)."""
        self._closing = True
        if self._flusher is not None:
            self._flusher.cancel()
        staged = list(self._files.values())
        if staged:
            try:
                async with asyncio.timeout(commit_timeout_s):
                    for sf in staged:
                        try:
                            await self.commit(sf.export, sf.path)
                        except (GatewayError, BackendError) as e:
                            log.warning("commit_at_close_failed", key=sf.key, error=repr(e))
            except TimeoutError:
                log.warning(
                    "commit_at_close_timed_out", timeout_s=commit_timeout_s, left=len(self._files)
                )
        for t in list(self._tasks):
            t.cancel()
        for sf in list(self._files.values()):
            for t in sf.streams:
                t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for sf in list(self._files.values()):
            await self._drop(sf)
        self.spool.close()

    # -- staged files ---------------------------------------------------------------------

    def staged(self, export: Export, path: str) -> StagedFile | None:
        return self._files.get((export.id, path))

    def staged_id(self, export_id: int, path: str) -> StagedFile | None:
        """``staged`` by the export's id (``Export.id``)."""
        return self._files.get((export_id, path))

    def staged_under(self, export: Export, dir_path: str) -> list[StagedFile]:
        lead = f"{dir_path}/" if dir_path else ""
        return [
            sf for (eid, p), sf in self._files.items() if eid == export.id and p.startswith(lead)
        ]

    async def _open(self, export: Export, entry: Entry) -> StagedFile:
        k = (export.id, entry.path)
        sf = self._files.get(k)
        if sf is not None:
            return sf
        if len(self._files) >= self.cfg.max_staged_files:
            self._relieve_pressure()
            self.stats.jukebox += 1
            raise Busy(f"{len(self._files)} files staged (max_staged_files)")
        await self.start(export)
        # The caller resolved ``entry`` before taking the lock: see the module docstring.
        try:
            entry = await export.ns.getattr(entry.path)
        except NotFound:
            raise StaleHandle(entry.path) from None
        sf = StagedFile(export, entry.path, entry, self.clock.monotonic())
        self._files[k] = sf
        self.stats.staged_files = len(self._files)
        return sf

    async def write(
        self,
        export: Export,
        entry: Entry,
        offset: int,
        data: bytes | bytearray | memoryview,
        sync: bool,
    ) -> Entry:
        """Stage ``data`` at ``offset``; with ``sync`` commit before returning. Returns the
        entry readers see (the committed version)."""
        n = len(data)
        end = offset + n
        if end > self.cfg.max_file_size:
            raise FileTooBig(f"{entry.path}: {end} B > {self.cfg.max_file_size} B")
        async with self.locks.hold((export.id, entry.path)):
            if n == 0:  # nothing to stage; a sync WRITE still commits what is
                if sync:
                    got = await self.commit_locked(export, entry.path)
                    return got if got is not None else entry
                return entry
            sf = await self._open(export, entry)
            fresh = n - sum(hi - lo for lo, hi in sf.extents.overlapping(offset, end))
            try:
                self.spool.reserve(fresh)
            except BudgetExceeded as e:
                self._relieve_pressure()
                self.stats.jukebox += 1
                raise Busy(str(e)) from None
            sf.reserved += fresh
            self.stats.spool_bytes = self.spool.used_bytes
            try:
                if sf.file is None:
                    sf.file = await self.spool.open_file()
                await sf.file.pwrite(data, offset)
            except BaseException:
                self.spool.release(fresh)
                sf.reserved -= fresh
                raise
            sf.extents.add(offset, end)
            self.stats.bytes_staged += n
            old_size = sf.size
            if end > sf.size:
                sf.size = end
            # Bumped after the bytes are in the spool: a part upload that read them while
            # the pwrite ran sees its version change and is not used.
            part = self.cfg.part_size
            sf.touch(offset, end, part)
            if end > old_size and old_size % part:
                sf.touch(old_size - 1, old_size, part)  # the old last part grows
            sf.meta_changes[META_MTIME] = None
            sf.meta_changes[META_CTIME] = None  # both are the commit's LastModified
            sf.meta_changes[META_CREATEVERF] = None
            sf.last_write = self.clock.monotonic()
            self.stats.writes += 1
            if sync:
                return await self._commit_locked(sf)
            self.uploader.stream_full_parts(sf, offset, end)
            return entry

    async def set_size(self, export: Export, entry: Entry, size: int) -> None:
        """Stage a truncation or extension (committed by the caller, under the lock)."""
        if size > self.cfg.max_file_size:
            raise FileTooBig(f"{entry.path}: {size} B")
        sf = await self._open(export, entry)
        old = sf.size
        if size < old:
            dropped = sf.extents.truncate(size)
            self.spool.release(dropped)
            sf.reserved -= dropped
            sf.keep = min(sf.keep, size)
        sf.size = size
        sf.truncated = True
        part = self.cfg.part_size
        lo, hi = min(old, size), max(old, size)
        sf.touch(max(0, lo - 1), hi, part)
        sf.meta_changes[META_MTIME] = None
        sf.meta_changes[META_CTIME] = None

    async def stage_metadata(
        self, export: Export, entry: Entry, changes: Mapping[str, str | None]
    ) -> None:
        sf = await self._open(export, entry)
        sf.meta_changes.update(changes)

    async def discard(self, export: Export, path: str) -> None:
        """Forget ``path``'s staged changes (the object is being removed or replaced)."""
        sf = self._files.get((export.id, path))
        if sf is not None:
            await self._drop(sf)

    async def _drop(self, sf: StagedFile) -> None:
        if sf.closed:
            return
        sf.closed = True
        k = (sf.export.id, sf.path)
        if self._files.get(k) is sf:
            del self._files[k]
        self.stats.staged_files = len(self._files)
        for t in sf.streams:
            t.cancel()
        if sf.streams:
            await asyncio.gather(*sf.streams, return_exceptions=True)
        self.spool.release(sf.reserved)
        sf.reserved = 0
        self.stats.spool_bytes = self.spool.used_bytes
        up = sf.upload
        sf.upload = None
        if up is not None:
            self._spawn(self.uploader.abort(sf, up))
        if sf.file is not None:
            await sf.file.close()

    # -- commit ---------------------------------------------------------------------------

    async def commit(self, export: Export, path: str) -> Entry | None:
        """Commit ``path``'s staged changes; the new entry, or None if nothing was staged."""
        async with self.locks.hold((export.id, path)):
            return await self.commit_locked(export, path)

    async def commit_locked(self, export: Export, path: str) -> Entry | None:
        """``commit`` for a caller that already holds the path's lock."""
        sf = self._files.get((export.id, path))
        if sf is None:
            return None
        return await self._commit_locked(sf)

    async def _commit_locked(self, sf: StagedFile) -> Entry:
        export = sf.export
        if sf.streams:
            await asyncio.gather(*list(sf.streams), return_exceptions=True)
        self.stats.commits += 1
        try:
            info, meta = await self.uploader.new_version(sf)
        except BaseException:
            self.stats.commit_errors += 1
            raise
        info.metadata = meta
        up, sf.upload = sf.upload, None  # completed: nothing to abort
        if up is not None:
            await self.spool.forget_upload(up.journal)
        self.reader.invalidate(export.store.name, sf.key)
        self.meta.remember(export.store, info, meta)
        entry = export.ns.upsert(info)
        await self._drop(sf)
        log.debug("file_committed", key=sf.key, size=info.size)
        return entry

    # -- background write-back -------------------------------------------------------------

    def _relieve_pressure(self) -> None:
        if self._pressure is not None and not self._pressure.done():
            return
        if not self._files:
            return
        sf = max(self._files.values(), key=lambda s: (s.reserved, -s.last_write))
        self._pressure = asyncio.get_running_loop().create_task(self._background_commit(sf))

    async def _background_commit(self, sf: StagedFile) -> None:
        self.stats.background_commits += 1
        try:
            await self.commit(sf.export, sf.path)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            log.warning("background_commit_failed", key=sf.key, error=repr(e))

    async def flush_idle(self, now: float | None = None) -> int:
        """Commit every staged file not written for ``flush_idle_s``; how many were."""
        t = self.clock.monotonic() if now is None else now
        idle = [sf for sf in self._files.values() if t - sf.last_write >= self.cfg.flush_idle_s]
        for sf in idle:
            await self._background_commit(sf)
        return len(idle)

    async def _flush_loop(self) -> None:
        period = max(0.5, self.cfg.flush_idle_s / 4)
        while True:
            await asyncio.sleep(period)
            try:
                await self.flush_idle()
            except Exception as e:  # never let write-back die
                log.warning("idle_flush_failed", error=repr(e))
