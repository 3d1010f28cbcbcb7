"""The write path's state: files with uncommitted writes, their uploads, and the object-level
mutations (create, mkdir, symlink, set attributes, remove, rename) with the index updates
that make them visible at once (DESIGN §3 "Writes").

Owns: one ``StagedFile`` per object with uncommitted data or a size change, the spool bytes
it holds, the multipart upload its full parts are streamed into, the commit that turns it into
a new object version, background write-back (idle files, budget pressure), per-path locks,
and a bounded memory of the full metadata of objects this gateway wrote or read with a HEAD.
Must not: encode NFS replies or check permissions (handlers do), or block the event loop
(spool I/O runs in the spool's thread pool; uploads are async).

Model
-----
* A staged file overlays its **base** (the object version it was opened on: ``base_etag``,
  ``base_size``) with written extents kept in a sparse spool file. Bytes ``[0, keep)`` not
  written come from the base, bytes past ``keep`` not written are zeros (``keep`` shrinks on
  truncation), and the file is ``size`` bytes long. Readers keep seeing the base (the
  index's entry) until the commit installs the new version: never a mix.
* **Commit** builds the new object: at most ``part_size`` bytes -> one PUT; larger -> a
  multipart upload of ``part_size`` parts (S3 allows 10,000, hence ``max_file_size``). Full
  parts whose bytes are all written are uploaded in the background as soon as they are
  (``stream``), so a COMMIT after a large sequential write only uploads the last part and
  completes. A write into an uploaded part bumps that part's version and the commit uploads
  it again. Parts that need base bytes fetch them with ``If-Match`` (the data cache serves
  small bases); if the base changed meanwhile, the staged writes are rebased on the current
  object once.
* **Metadata** (``mode``, ``uid``, ``gid``, ``mtime``, ``symlink-target``, ``createverf``)
  rides with the object. The index's entry does not carry every key, so the full set is
  remembered for objects this gateway wrote, and fetched with one HEAD otherwise, before an
  upload or a copy-in-place replaces it. A data write drops ``mtime`` (the object's
  LastModified is the new mtime) and ``createverf``.
* **Durability**: UNSTABLE WRITEs are acknowledged once in the spool; COMMIT, FILE_SYNC and
  DATA_SYNC WRITEs and every metadata operation reply after the backend has the object. The
  write verifier (``Gateway.write_verf``) changes at every start; the spool is wiped then and
  multipart uploads the previous run left are aborted.
* **Bounds**: staged bytes are capped by the spool budget and staged files by
  ``max_staged_files``; past either, WRITE raises ``Busy`` (NFS3ERR_JUKEBOX, the client
  retries) and the largest staged file is committed in the background to make room. Files
  not written for ``flush_idle_s`` are committed in the background (clients that never send
  COMMIT still get their data stored). Part uploads share ``upload_concurrency`` slots, so
  upload buffers are bounded by ``upload_concurrency x part_size``.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

import structlog

from gateway.backend.base import (
    BackendError,
    BackendUnavailable,
    ObjectInfo,
    ObjectNotFound,
    PreconditionFailed,
)
from gateway.data import ObjectReader
from gateway.errors import Busy, GatewayError, NotFound, StaleHandle
from gateway.namespace import Entry, split_path
from gateway.writes.config import MiB, WriteConfig
from gateway.writes.extents import Extents
from gateway.writes.spool import BudgetExceeded, Spool, SpoolFile
from nfsproto.nfs3 import NfsStat3
from nfsproto.xdr import Buffer

if TYPE_CHECKING:
    from gateway.exports import Export

log = structlog.get_logger(__name__)


# Metadata keys (gateway.namespace.index.parse_metadata reads the first five).
META_MODE: Final = "mode"
META_UID: Final = "uid"
META_GID: Final = "gid"
META_MTIME: Final = "mtime"
META_SYMLINK: Final = "symlink-target"
META_CREATEVERF: Final = "createverf"


class FileTooBig(GatewayError):
    status = NfsStat3.NFS3ERR_FBIG


@dataclass(slots=True)
class WriteStats:
    """Counters (monotonic) and gauges for ``gateway.metrics``."""

    writes: int = 0
    bytes_staged: int = 0
    commits: int = 0
    puts: int = 0
    multipart_uploads: int = 0
    parts_streamed: int = 0
    parts_uploaded: int = 0
    parts_reuploaded: int = 0
    base_fetches: int = 0
    metadata_heads: int = 0
    rebases: int = 0
    jukebox: int = 0
    background_commits: int = 0
    commit_errors: int = 0
    orphan_uploads_aborted: int = 0
    staged_files: int = 0  # gauge
    spool_bytes: int = 0  # gauge


@dataclass(slots=True)
class _Upload:
    upload_id: str
    metadata: dict[str, str]
    journal: str  # the spool journal entry that lets a restart abort it
    # part index -> (etag, part version, length) of the uploaded part
    parts: dict[int, tuple[str, int, int]] = field(default_factory=dict)


class StagedFile:
    """Uncommitted changes to one object (see the module docstring)."""

    __slots__ = (
        "base_etag",
        "base_size",
        "closed",
        "creating_upload",
        "export",
        "extents",
        "file",
        "keep",
        "key",
        "last_write",
        "meta_changes",
        "part_versions",
        "path",
        "reserved",
        "size",
        "streaming",
        "streams",
        "truncated",
        "upload",
    )

    def __init__(self, export: Export, path: str, base: Entry | None, now: float) -> None:
        self.export = export
        self.path = path
        self.key = export.prefix + path
        self.base_etag = base.etag if base is not None else ""
        self.base_size = base.size if base is not None else 0
        self.keep = self.base_size
        self.size = self.base_size
        self.truncated = False  # a SETATTR size: the size no longer follows the base
        self.extents = Extents()
        self.file: SpoolFile | None = None
        self.reserved = 0
        self.meta_changes: dict[str, str | None] = {}
        self.part_versions: dict[int, int] = {}
        self.upload: _Upload | None = None
        self.creating_upload: asyncio.Future[_Upload] | None = None
        self.streams: set[asyncio.Task[None]] = set()
        self.streaming: set[int] = set()  # parts with an upload task
        self.last_write = now
        self.closed = False

    def touch(self, lo: int, hi: int, part: int) -> None:
        """Bytes ``[lo, hi)`` changed: every part they fall in must be uploaded again."""
        if hi <= lo:
            return
        for i in range(lo // part, (hi - 1) // part + 1):
            self.part_versions[i] = self.part_versions.get(i, 0) + 1


def _merge_meta(base: Mapping[str, str], changes: Mapping[str, str | None]) -> dict[str, str]:
    out = dict(base)
    for k, v in changes.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = v
    return out


def mtime_value(ns: int) -> str:
    """``mtime`` metadata as ``parse_metadata`` reads it: integer nanoseconds when that is
    unambiguous (>= 10**12), else seconds with a fraction."""
    if ns >= 10**12:
        return str(ns)
    s, n = divmod(ns, 10**9)
    return f"{s}.{n:09d}"


class _KeyedLocks:
    """One ``asyncio.Lock`` per key while anyone holds or waits for it."""

    def __init__(self) -> None:
        self._locks: dict[tuple[int, str], tuple[asyncio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def hold(self, *keys: tuple[int, str]) -> AsyncIterator[None]:
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


async def _all(*coros: Coroutine[object, object, object]) -> None:
    """Run ``coros`` concurrently; once all are done, raise the first failure (a plain
    exception, not an ExceptionGroup: dispatch maps BackendErrors one by one)."""
    results = await asyncio.gather(*coros, return_exceptions=True)
    for r in results:
        if isinstance(r, BaseException):
            raise r


class WriteManager:
    def __init__(self, cfg: WriteConfig, reader: ObjectReader) -> None:
        self.cfg = cfg
        self.reader = reader
        self.stats = WriteStats()
        self.spool = Spool(cfg.spool_dir, cfg.spool_bytes, cfg.io_threads)
        self._files: dict[tuple[int, str], StagedFile] = {}
        self._locks = _KeyedLocks()
        self._upload_slots: asyncio.Semaphore | None = None
        self._meta: OrderedDict[tuple[str, str], tuple[str, dict[str, str]]] = OrderedDict()
        self._recovered: set[int] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._flusher: asyncio.Task[None] | None = None
        self._pressure: asyncio.Task[None] | None = None
        self._closing = False
        self._start_lock = asyncio.Lock()

    # -- life cycle -----------------------------------------------------------------------

    async def _start(self, export: Export) -> None:
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
                self._spawn(self._abort_orphans(export, mine))
        if self._flusher is None and self.cfg.flush_idle_s > 0 and not self._closing:
            self._flusher = asyncio.get_running_loop().create_task(self._flush_loop())

    def _spawn(self, coro: Coroutine[object, object, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _abort_orphans(self, export: Export, records: list[dict[str, str]]) -> None:
        for r in records:
            try:
                await export.store.abort_multipart(r["key"], r["upload_id"])
                self.stats.orphan_uploads_aborted += 1
            except (BackendError, KeyError) as e:
                log.warning("orphan_upload_abort_failed", key=r.get("key"), error=str(e))

    async def close(self, commit_timeout_s: float = 10.0) -> None:
        """Commit what is staged (within the timeout), stop background work, close the pool.
        Whatever is not committed is lost here; clients resend it (the verifier changes)."""
        self._closing = True
        if self._flusher is not None:
            self._flusher.cancel()
        staged = list(self._files.values())
        if staged:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(commit_timeout_s):
                    for sf in staged:
                        with contextlib.suppress(GatewayError, BackendError):
                            await self.commit(sf.export, sf.path)
        for t in list(self._tasks):
            t.cancel()
        for sf in list(self._files.values()):
            for t in sf.streams:
                t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for sf in list(self._files.values()):
            await self._drop(sf)
        self.spool.close()

    def _slots(self) -> asyncio.Semaphore:
        if self._upload_slots is None:
            self._upload_slots = asyncio.Semaphore(self.cfg.upload_concurrency)
        return self._upload_slots

    # -- locks and lookups ----------------------------------------------------------------

    def lock(self, export: Export, *paths: str) -> contextlib.AbstractAsyncContextManager[None]:
        """Serialise mutations of ``paths`` (sorted, so two paths never deadlock)."""
        return self._locks.hold(*((export.id, p) for p in paths))

    def staged(self, export: Export, path: str) -> StagedFile | None:
        return self._files.get((export.id, path))

    def staged_under(self, export: Export, dir_path: str) -> list[StagedFile]:
        lead = f"{dir_path}/" if dir_path else ""
        return [
            sf for (eid, p), sf in self._files.items() if eid == export.id and p.startswith(lead)
        ]

    # -- metadata memory ------------------------------------------------------------------

    def remember(self, export: Export, info: ObjectInfo, metadata: Mapping[str, str]) -> None:
        k = (export.store.name, info.key)
        self._meta[k] = (info.etag, dict(metadata))
        self._meta.move_to_end(k)
        while len(self._meta) > self.cfg.metadata_memory_entries:
            self._meta.popitem(last=False)

    def forget(self, export: Export, key: str) -> None:
        self._meta.pop((export.store.name, key), None)

    async def metadata(self, export: Export, entry: Entry) -> tuple[str, int, dict[str, str]]:
        """(etag, size, full metadata) of ``entry``'s object: from memory when this gateway
        wrote or saw that version, else one HEAD (which may find a newer version)."""
        key = export.prefix + entry.path
        got = self._meta.get((export.store.name, key))
        if got is not None and got[0] == entry.etag:
            return entry.etag, entry.size, dict(got[1])
        self.stats.metadata_heads += 1
        info = await export.store.head(key)
        self.remember(export, info, info.metadata)
        return info.etag, info.size, dict(info.metadata)

    # -- object creation ------------------------------------------------------------------

    async def put_object(
        self, export: Export, path: str, data: bytes, metadata: Mapping[str, str]
    ) -> Entry:
        """PUT a whole object (CREATE, SYMLINK; ``path`` ending in '/' for a MKDIR marker)
        and record it in the index. Any staged state of ``path`` is dropped."""
        await self._start(export)
        sf = self._files.get((export.id, path))
        if sf is not None:
            await self._drop(sf)
        key = export.prefix + path
        info = await export.store.put(key, data, dict(metadata))
        info.metadata = dict(metadata)
        self.stats.puts += 1
        self.reader.invalidate(export.store.name, key)
        if not path.endswith("/"):
            self.remember(export, info, metadata)
        return export.ns.upsert(info)

    # -- staging --------------------------------------------------------------------------

    async def _open(self, export: Export, entry: Entry) -> StagedFile:
        k = (export.id, entry.path)
        sf = self._files.get(k)
        if sf is not None:
            return sf
        if len(self._files) >= self.cfg.max_staged_files:
            self._relieve_pressure()
            self.stats.jukebox += 1
            raise Busy(f"{len(self._files)} files staged (max_staged_files)")
        await self._start(export)
        # The caller resolved ``entry`` before taking the lock: a commit may have replaced
        # it, a REMOVE or RENAME removed it (then the handle is stale: never recreate it).
        try:
            entry = await export.ns.getattr(entry.path)
        except NotFound:
            raise StaleHandle(entry.path) from None
        sf = StagedFile(export, entry.path, entry, time.monotonic())
        self._files[k] = sf
        self.stats.staged_files = len(self._files)
        return sf

    async def write(
        self, export: Export, entry: Entry, offset: int, data: Buffer, sync: bool
    ) -> Entry:
        """Stage ``data`` at ``offset``; with ``sync`` commit before returning. Returns the
        entry readers see (the committed version)."""
        n = len(data)
        end = offset + n
        if end > self.cfg.max_file_size:
            raise FileTooBig(f"{entry.path}: {end} B > {self.cfg.max_file_size} B")
        async with self.lock(export, entry.path):
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
            # the pwrite ran sees its version change and is not used (see _stream_part).
            part = self.cfg.part_size
            sf.touch(offset, end, part)
            if end > old_size and old_size % part:
                sf.touch(old_size - 1, old_size, part)  # the old last part grows
            sf.meta_changes[META_MTIME] = None
            sf.meta_changes[META_CREATEVERF] = None
            sf.last_write = time.monotonic()
            self.stats.writes += 1
            if sync:
                return await self._commit_locked(sf)
            self._stream_full_parts(sf, offset, end)
            return entry

    async def commit(self, export: Export, path: str) -> Entry | None:
        """Commit ``path``'s staged changes; the new entry, or None if nothing was staged."""
        async with self.lock(export, path):
            sf = self._files.get((export.id, path))
            if sf is None:
                return None
            return await self._commit_locked(sf)

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

    async def stage_metadata(
        self, export: Export, entry: Entry, changes: Mapping[str, str | None]
    ) -> None:
        sf = await self._open(export, entry)
        sf.meta_changes.update(changes)

    async def commit_locked(self, export: Export, path: str) -> Entry | None:
        """``commit`` for a caller that already holds the path's lock."""
        sf = self._files.get((export.id, path))
        if sf is None:
            return None
        return await self._commit_locked(sf)

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
            self._spawn(self._abort(sf, up))
        if sf.file is not None:
            await sf.file.close()

    async def _abort(self, sf: StagedFile, up: _Upload) -> None:
        try:
            await sf.export.store.abort_multipart(sf.key, up.upload_id)
        except BackendError as e:
            log.warning("upload_abort_failed", key=sf.key, error=str(e))
            return
        await self.spool.forget_upload(up.journal)

    # -- commit ---------------------------------------------------------------------------

    async def _commit_locked(self, sf: StagedFile) -> Entry:
        export = sf.export
        if sf.streams:
            await asyncio.gather(*list(sf.streams), return_exceptions=True)
        self.stats.commits += 1
        try:
            for attempt in (0, 1):
                try:
                    meta = await self._target_metadata(sf)
                    info = await self._upload(sf, meta)
                    break
                except (PreconditionFailed, ObjectNotFound):
                    if attempt:
                        raise
                    await self._rebase(sf)
        except BaseException:
            self.stats.commit_errors += 1
            raise
        info.metadata = meta
        up, sf.upload = sf.upload, None  # completed: nothing to abort
        if up is not None:
            await self.spool.forget_upload(up.journal)
        self.reader.invalidate(export.store.name, sf.key)
        self.remember(export, info, meta)
        entry = export.ns.upsert(info)
        await self._drop(sf)
        log.debug("file_committed", key=sf.key, size=info.size)
        return entry

    async def _target_metadata(self, sf: StagedFile) -> dict[str, str]:
        base: dict[str, str] = {}
        if sf.base_etag:
            got = self._meta.get((sf.export.store.name, sf.key))
            if got is not None and got[0] == sf.base_etag:
                base = dict(got[1])
            else:
                self.stats.metadata_heads += 1
                info = await sf.export.store.head(sf.key)
                self.remember(sf.export, info, info.metadata)
                if info.etag != sf.base_etag:
                    raise PreconditionFailed(sf.key)
                base = dict(info.metadata)
        return _merge_meta(base, sf.meta_changes)

    async def _rebase(self, sf: StagedFile) -> None:
        """The base object changed (or vanished) under staged writes: apply them to the
        object as it is now."""
        self.stats.rebases += 1
        try:
            e = await sf.export.ns.refresh(sf.path)
            etag, size = e.etag, e.size
        except NotFound:
            etag, size = "", 0
        log.info("staged_file_rebased", key=sf.key, old=sf.base_etag, new=etag)
        sf.base_etag, sf.base_size = etag, size
        if sf.truncated:
            sf.keep = min(sf.keep, size)
        else:  # the writes land on the object as it is now, at its current length
            sf.keep = size
            ends = [hi for _, hi in sf.extents]
            sf.size = max([size, *ends[-1:]])
        up, sf.upload = sf.upload, None
        if up is not None:
            self._spawn(self._abort(sf, up))
        sf.part_versions = {i: v + 1 for i, v in sf.part_versions.items()}

    async def _upload(self, sf: StagedFile, meta: dict[str, str]) -> ObjectInfo:
        store = sf.export.store
        part = self.cfg.part_size
        up = sf.upload
        if up is not None and (sf.size <= part or up.metadata != meta):
            # Metadata is fixed when an upload starts; a small result is one PUT.
            sf.upload = None
            self._spawn(self._abort(sf, up))
        if sf.size <= part:
            data = await self._build(sf, 0, sf.size)
            self.stats.puts += 1
            return await store.put(sf.key, data, meta)
        up = await self._ensure_upload(sf, meta)
        nparts = max(1, math.ceil(sf.size / part))

        async def one(i: int) -> None:
            async with self._slots():
                await self._upload_part(sf, up, i, streamed=False)

        await _all(*(one(i) for i in range(nparts) if not self._part_valid(sf, up, i)))
        parts = [(i + 1, up.parts[i][0]) for i in range(nparts)]
        try:
            info = await store.complete_multipart(sf.key, up.upload_id, parts)
        except BackendUnavailable:
            raise  # retry later with the same parts
        except BackendError:
            # The upload is unusable (e.g. the store lost it): start over next time.
            if sf.upload is up:
                sf.upload = None
                self._spawn(self._abort(sf, up))
            raise
        self.stats.multipart_uploads += 1
        return info

    def _part_range(self, sf: StagedFile, i: int) -> tuple[int, int]:
        part = self.cfg.part_size
        return i * part, min((i + 1) * part, sf.size)

    def _part_valid(self, sf: StagedFile, up: _Upload, i: int) -> bool:
        got = up.parts.get(i)
        if got is None:
            return False
        lo, hi = self._part_range(sf, i)
        return got[1] == sf.part_versions.get(i, 0) and got[2] == hi - lo

    async def _ensure_upload(self, sf: StagedFile, meta: dict[str, str]) -> _Upload:
        if sf.upload is not None:
            return sf.upload
        if sf.creating_upload is not None:
            return await asyncio.shield(sf.creating_upload)
        fut: asyncio.Future[_Upload] = asyncio.get_running_loop().create_future()
        sf.creating_upload = fut
        try:
            upload_id = await sf.export.store.create_multipart(sf.key, meta)
            up = _Upload(upload_id, dict(meta), uuid.uuid4().hex)
            await self.spool.journal_upload(
                up.journal,
                {"export": sf.export.cfg.path, "key": sf.key, "upload_id": upload_id},
            )
            if sf.closed:
                self._spawn(self._abort(sf, up))
            else:
                sf.upload = up
            fut.set_result(up)
            return up
        except BaseException as e:
            if isinstance(e, asyncio.CancelledError):
                fut.cancel()
            else:
                fut.set_exception(e)
                fut.exception()  # retrieved: waiters re-raise it through their shield
            raise
        finally:
            sf.creating_upload = None

    async def _upload_part(self, sf: StagedFile, up: _Upload, i: int, *, streamed: bool) -> None:
        lo, hi = self._part_range(sf, i)
        version = sf.part_versions.get(i, 0)
        data = await self._build(sf, lo, hi)
        etag = await sf.export.store.upload_part(sf.key, up.upload_id, i + 1, data)
        if i in up.parts:
            self.stats.parts_reuploaded += 1
        if streamed:
            self.stats.parts_streamed += 1
        else:
            self.stats.parts_uploaded += 1
        # A write that landed meanwhile bumped the version: this upload is then stale.
        if sf.part_versions.get(i, 0) == version and self._part_range(sf, i) == (lo, hi):
            up.parts[i] = (etag, version, hi - lo)
        elif not streamed:
            raise RuntimeError(f"part {i} of {sf.key} changed during its upload (lock broken)")

    async def _build(self, sf: StagedFile, lo: int, hi: int) -> bytes:
        """Bytes ``[lo, hi)`` of the staged file: base, then written extents over it."""
        base_hi = min(hi, sf.keep)
        base: bytes | memoryview = b""
        if base_hi > lo and not sf.extents.covers(lo, base_hi):
            base = await self._read_base(sf, lo, base_hi)
        ranges = sf.extents.overlapping(lo, hi)
        n = hi - lo
        if len(base) == n and not ranges:
            return bytes(base)

        def assemble(fd: int = -1) -> bytes:
            buf = bytearray(n)
            buf[: len(base)] = base
            mv = memoryview(buf)
            for a, b in ranges if fd >= 0 else ():
                off = a
                while off < b:
                    got = os.preadv(fd, [mv[off - lo : b - lo]], off)
                    if got <= 0:  # past the end of the sparse file: zeros
                        break
                    off += got
            return bytes(buf)

        if ranges:
            assert sf.file is not None  # written extents live in the spool file
            return await sf.file.io(assemble)
        if n <= MiB:
            return assemble()
        return await self.spool.run(assemble)

    async def _read_base(self, sf: StagedFile, lo: int, hi: int) -> bytes | memoryview:
        self.stats.base_fetches += 1
        store = sf.export.store
        if sf.base_size <= self.reader.config.small_file_max:
            data, _ = await self.reader.read(store, sf.key, sf.base_etag, sf.base_size, lo, hi - lo)
        else:
            data = (await store.get(sf.key, lo, hi, if_match=sf.base_etag)).data
        if len(data) != hi - lo:
            raise PreconditionFailed(f"{sf.key}: base is shorter than {hi} B")
        return data

    # -- streaming ------------------------------------------------------------------------

    def _stream_full_parts(self, sf: StagedFile, lo: int, hi: int) -> None:
        part = self.cfg.part_size
        # The parts this write fills, and the one before it (full once data follows it).
        for i in range(max(0, lo // part - 1), (hi - 1) // part + 1):
            plo, phi = i * part, (i + 1) * part
            # Only a part with data after it: a file that ends up one part long is one PUT.
            if phi >= sf.size or not sf.extents.covers(plo, phi):
                continue
            up = sf.upload
            if i in sf.streaming or (up is not None and self._part_valid(sf, up, i)):
                continue
            sf.streaming.add(i)
            task = asyncio.get_running_loop().create_task(self._stream_part(sf, i))
            sf.streams.add(task)

            def done(t: asyncio.Task[None], i: int = i) -> None:
                sf.streams.discard(t)
                sf.streaming.discard(i)

            task.add_done_callback(done)

    async def _stream_part(self, sf: StagedFile, i: int) -> None:
        try:
            async with self._slots():
                if sf.closed:
                    return
                lo, hi = self._part_range(sf, i)
                if hi - lo != self.cfg.part_size or not sf.extents.covers(lo, hi):
                    return
                up = sf.upload
                if up is not None and self._part_valid(sf, up, i):
                    return
                meta = await self._target_metadata(sf)
                up = await self._ensure_upload(sf, meta)
                await self._upload_part(sf, up, i, streamed=True)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # the commit uploads the part again
            log.info("part_stream_failed", key=sf.key, part=i + 1, error=repr(e))

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
        t = time.monotonic() if now is None else now
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

    # -- removal and rename ---------------------------------------------------------------

    async def keep_parent(self, export: Export, path: str) -> None:
        """Before removing ``path``: if its parent would be left with no entry and may have
        no marker object, write the marker (POSIX: removing a file leaves its directory)."""
        parent = split_path(path)[0]
        if not parent:
            return
        try:
            page = await export.ns.readdir(parent, 0, b"\0" * 8, 2)
        except GatewayError:
            return
        names = [e.name for _, e in page.entries]
        if names and names != [split_path(path)[1]]:
            return
        key = export.prefix + parent + "/"
        await export.store.put(key, b"", {})
        self.stats.puts += 1

    async def delete_object(self, export: Export, path: str, *, is_dir: bool) -> None:
        await self.discard(export, path)
        key = export.prefix + path + ("/" if is_dir else "")
        await export.store.delete(key)
        self.reader.invalidate(export.store.name, key)
        self.forget(export, key)
        export.ns.remove(path)

    async def rename_object(self, export: Export, src: str, dst: str) -> Entry:
        """A file or symlink: server-side copy (metadata kept), then delete the source."""
        store = export.store
        src_key, dst_key = export.prefix + src, export.prefix + dst
        await self.discard(export, dst)
        info = await store.copy(src_key, dst_key)
        self.reader.invalidate(store.name, dst_key)
        self.remember(export, info, info.metadata)
        await self.keep_parent(export, src)
        await store.delete(src_key)
        self.reader.invalidate(store.name, src_key)
        self.forget(export, src_key)
        entry = export.ns.upsert(info)
        export.ns.remove(src)
        return entry

    async def list_tree(self, export: Export, dir_path: str, limit: int) -> list[str] | None:
        """Every key under ``dir_path/`` (its marker included), or None if more than
        ``limit``."""
        prefix = export.prefix + dir_path + "/"
        keys: list[str] = []
        token: str | None = None
        while True:
            page = await export.store.list_page(
                prefix, delimiter=None, token=token, max_keys=min(1000, limit + 1)
            )
            keys += [o.key for o in page.objects]
            if len(keys) > limit:
                return None
            if page.next_token is None:
                return keys
            token = page.next_token

    async def dir_has_entries(self, export: Export, dir_path: str) -> bool:
        """Whether the backend holds anything under ``dir_path/`` but its marker."""
        prefix = export.prefix + dir_path + "/"
        page = await export.store.list_page(prefix, delimiter="/", max_keys=2)
        return bool(page.prefixes) or any(o.key != prefix for o in page.objects)

    async def rename_tree(self, export: Export, src: str, dst: str, keys: list[str]) -> None:
        """Copy every key under ``src/`` to ``dst/``, then delete the sources."""
        store = export.store
        src_prefix = export.prefix + src + "/"
        dst_prefix = export.prefix + dst + "/"
        sem = asyncio.Semaphore(self.cfg.copy_concurrency)

        async def copy(k: str) -> None:
            async with sem:
                if k.endswith("/"):  # a marker: some stores (SeaweedFS) cannot copy those
                    await store.put(dst_prefix + k[len(src_prefix) :], b"", {})
                    return
                info = await store.copy(k, dst_prefix + k[len(src_prefix) :])
                self.remember(export, info, info.metadata)

        async def delete(k: str) -> None:
            async with sem:
                await store.delete(k)
                self.reader.invalidate(store.name, k)
                self.forget(export, k)

        if keys:
            await _all(*(copy(k) for k in keys))
        else:  # only in the index (an implicit directory emptied here): make it real
            await store.put(dst_prefix, b"", {})
        await self.keep_parent(export, src)
        await _all(*(delete(k) for k in keys))
        export.ns.remove(src)
        export.ns.remove(dst)  # an empty directory it replaced: its cached listing goes
        export.ns.upsert(ObjectInfo(dst_prefix, 0, "", 0))

    # -- set attributes -------------------------------------------------------------------

    async def copy_in_place(
        self, export: Export, entry: Entry, changes: Mapping[str, str | None]
    ) -> Entry:
        """Replace the metadata of an unchanged object (one COPY onto itself, plus a HEAD
        when this gateway does not know the object's full metadata)."""
        key = export.prefix + entry.path
        _, _, base = await self.metadata(export, entry)
        meta = _merge_meta(base, changes)
        if META_MTIME not in meta:  # the copy's LastModified is now: keep the file's mtime
            meta[META_MTIME] = mtime_value(entry.mtime_ns)
        info = await export.store.copy(key, key, meta)
        info.metadata = meta
        self.reader.invalidate(export.store.name, key)
        self.remember(export, info, meta)
        return export.ns.upsert(info)


__all__ = [
    "META_CREATEVERF",
    "META_GID",
    "META_MODE",
    "META_MTIME",
    "META_SYMLINK",
    "META_UID",
    "FileTooBig",
    "StagedFile",
    "WriteConfig",
    "WriteManager",
    "WriteStats",
    "mtime_value",
]
