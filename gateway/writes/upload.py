"""A staged file and how it becomes a new object version (DESIGN §3 "Writes").

Owns: ``StagedFile`` (the model below), building its bytes, the PUT or multipart upload that
commits it, streaming full parts while the client is still writing, rebasing on a changed
base, and aborting uploads (also those a previous run left). Must not: decide when a file is
committed or dropped, hold path locks, or touch the index (``staging`` does); backend errors
pass through (``WriteManager`` translates them at the write path's boundary).

- A staged file overlays its **base** (the object version it was opened on: ``base_etag``,
  ``base_size``) with written extents kept in a sparse spool file. Bytes ``[0, keep)`` not
  written come from the base, bytes past ``keep`` not written are zeros (``keep`` shrinks on
  truncation), and the file is ``size`` bytes long. Readers keep seeing the base (the index's
  entry) until the commit installs the new version: never a mix.
- **Commit** builds the new object: at most ``part_size`` bytes -> one PUT; larger -> a
  multipart upload of ``part_size`` parts (S3 allows 10,000, hence ``max_file_size``). Full
  parts whose bytes are all written are uploaded in the background as soon as they are
  (``stream_full_parts``), so a COMMIT after a large sequential write only uploads the last
  part and completes. A write into an uploaded part bumps that part's version and the commit
  uploads it again. Parts that need base bytes fetch them with ``If-Match`` (the data cache
  serves small bases); if the base changed meanwhile, the staged writes are rebased on the
  current object once.
- The new version's metadata is the base's full metadata (``metadata.MetadataCache``) with the
  staged changes applied. Metadata is fixed when a multipart upload starts: if it changes, the
  upload is aborted and started again.
- Part uploads share ``upload_concurrency`` slots, so upload buffers are bounded by
  ``upload_concurrency x part_size``. Every multipart upload is journaled in the spool until it
  completes or is aborted, so a restart aborts the ones a crash left.
"""

from __future__ import annotations

import asyncio
import math
import os
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import structlog

from gateway.backend.base import (
    BackendError,
    BackendUnavailable,
    ObjectInfo,
    ObjectNotFound,
    PreconditionFailed,
)
from gateway.data import ObjectReader
from gateway.errors import NotFound, VersionChanged
from gateway.namespace import Entry
from gateway.writes.config import MiB, WriteConfig
from gateway.writes.extents import Extents
from gateway.writes.metadata import MetadataCache, merge
from gateway.writes.spool import Spool, SpoolFile
from gateway.writes.stats import WriteStats

if TYPE_CHECKING:
    from gateway.exports import Export

log = structlog.get_logger(__name__)


@dataclass(slots=True)
class Upload:
    """A multipart upload of one staged file."""

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
        self.upload: Upload | None = None
        self.creating_upload: asyncio.Future[Upload] | None = None
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


async def gather_all(*coros: Coroutine[object, object, object]) -> None:
    """Run ``coros`` concurrently; once all are done, raise the first failure (a plain
    exception, not an ExceptionGroup: the boundary translates backend errors one by one)."""
    results = await asyncio.gather(*coros, return_exceptions=True)
    for r in results:
        if isinstance(r, BaseException):
            raise r


@dataclass(eq=False, repr=False)
class Uploader:
    cfg: WriteConfig
    reader: ObjectReader
    spool: Spool
    meta: MetadataCache
    stats: WriteStats
    spawn: Callable[[Coroutine[object, object, None]], None]
    """Background work the write path cancels at close."""
    _upload_slots: asyncio.Semaphore | None = field(init=False, default=None)

    def _slots(self) -> asyncio.Semaphore:
        if self._upload_slots is None:
            self._upload_slots = asyncio.Semaphore(self.cfg.upload_concurrency)
        return self._upload_slots

    # -- commit ---------------------------------------------------------------------------

    async def new_version(self, sf: StagedFile) -> tuple[ObjectInfo, dict[str, str]]:
        """Upload ``sf`` as its object's new version (rebasing once if its base changed);
        the new object and its metadata."""
        try:
            return await self._attempt(sf)
        except (PreconditionFailed, ObjectNotFound, VersionChanged):
            # VersionChanged: the small-file base read through the data reader failed its
            # If-Match (the reader's domain form of PreconditionFailed).
            pass
        await self._rebase(sf)
        return await self._attempt(sf)

    async def _attempt(self, sf: StagedFile) -> tuple[ObjectInfo, dict[str, str]]:
        meta = await self._target_metadata(sf)
        return await self._upload(sf, meta), meta

    async def _target_metadata(self, sf: StagedFile) -> dict[str, str]:
        base: dict[str, str] = {}
        if sf.base_etag:
            base = await self.meta.of_version(sf.export.store, sf.key, sf.base_etag)
        return merge(base, sf.meta_changes)

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
            self.spawn(self.abort(sf, up))
        sf.part_versions = {i: v + 1 for i, v in sf.part_versions.items()}

    async def _upload(self, sf: StagedFile, meta: dict[str, str]) -> ObjectInfo:
        store = sf.export.store
        part = self.cfg.part_size
        up = sf.upload
        if up is not None and (sf.size <= part or up.metadata != meta):
            # Metadata is fixed when an upload starts; a small result is one PUT.
            sf.upload = None
            self.spawn(self.abort(sf, up))
        if sf.size <= part:
            data = await self._build(sf, 0, sf.size)
            self.stats.puts += 1
            return await store.put(sf.key, data, meta)
        up = await self._ensure_upload(sf, meta)
        nparts = max(1, math.ceil(sf.size / part))

        async def one(i: int) -> None:
            async with self._slots():
                await self._upload_part(sf, up, i, streamed=False)

        await gather_all(*(one(i) for i in range(nparts) if not self._part_valid(sf, up, i)))
        parts = [(i + 1, up.parts[i][0]) for i in range(nparts)]
        try:
            info = await store.complete_multipart(sf.key, up.upload_id, parts)
        except BackendUnavailable:
            raise  # retry later with the same parts
        except BackendError:
            # The upload is unusable (e.g. the store lost it): start over next time.
            if sf.upload is up:
                sf.upload = None
                self.spawn(self.abort(sf, up))
            raise
        self.stats.multipart_uploads += 1
        return info

    # -- parts ----------------------------------------------------------------------------

    def _part_range(self, sf: StagedFile, i: int) -> tuple[int, int]:
        part = self.cfg.part_size
        return i * part, min((i + 1) * part, sf.size)

    def _part_valid(self, sf: StagedFile, up: Upload, i: int) -> bool:
        got = up.parts.get(i)
        if got is None:
            return False
        lo, hi = self._part_range(sf, i)
        return got[1] == sf.part_versions.get(i, 0) and got[2] == hi - lo

    async def _ensure_upload(self, sf: StagedFile, meta: dict[str, str]) -> Upload:
        if sf.upload is not None:
            return sf.upload
        if sf.creating_upload is not None:
            return await asyncio.shield(sf.creating_upload)
        fut: asyncio.Future[Upload] = asyncio.get_running_loop().create_future()
        sf.creating_upload = fut
        try:
            upload_id = await sf.export.store.create_multipart(sf.key, meta)
            up = Upload(upload_id, dict(meta), uuid.uuid4().hex)
            await self.spool.journal_upload(
                up.journal,
                {"export": sf.export.cfg.path, "key": sf.key, "upload_id": upload_id},
            )
            if sf.closed:
                self.spawn(self.abort(sf, up))
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

    async def _upload_part(self, sf: StagedFile, up: Upload, i: int, *, streamed: bool) -> None:
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
        # Always from the store, pinned to the base's version, never from a cache tier: the
        # commit replaces the object, so this GET is what notices another writer replaced it
        # meanwhile (412: rebase). The disk tier would serve the old version, rightly for a
        # READ, but then the commit would overwrite the other writer's object.
        data = (await sf.export.store.get(sf.key, lo, hi, if_match=sf.base_etag)).data
        if len(data) != hi - lo:
            raise PreconditionFailed(f"{sf.key}: base is shorter than {hi} B")
        return data

    # -- streaming ------------------------------------------------------------------------

    def stream_full_parts(self, sf: StagedFile, lo: int, hi: int) -> None:
        """A write filled ``[lo, hi)``: start uploading the parts it completed."""
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

    # -- aborting -------------------------------------------------------------------------

    async def abort(self, sf: StagedFile, up: Upload) -> None:
        try:
            await sf.export.store.abort_multipart(sf.key, up.upload_id)
        except BackendError as e:
            log.warning("upload_abort_failed", key=sf.key, error=str(e))
            return
        await self.spool.forget_upload(up.journal)

    async def abort_orphans(self, export: Export, records: list[dict[str, str]]) -> None:
        """Abort the multipart uploads a previous run of the gateway left for ``export``."""
        for r in records:
            try:
                await export.store.abort_multipart(r["key"], r["upload_id"])
                self.stats.orphan_uploads_aborted += 1
            except (BackendError, KeyError) as e:
                log.warning("orphan_upload_abort_failed", key=r.get("key"), error=str(e))
