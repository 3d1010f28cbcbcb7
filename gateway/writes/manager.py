"""``WriteManager``: the write path as handlers see it, and its error boundary.

Owns: wiring the write path's parts (``locks``, ``metadata``, ``staging``, ``upload``,
``objects``) and translating every backend failure that leaves them into a ``GatewayError``
(``gateway.errors.from_backend``). A missing object here is one a handle points to (the file
being written, committed or changed, or the directory entry being removed or renamed), so it
means STALE. Must not: hold logic of its own beyond delegating, encode NFS replies or check
permissions.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from gateway.backend.base import BackendError
from gateway.clock import Clock, SystemClock
from gateway.data import ObjectReader
from gateway.errors import StaleHandle, from_backend
from gateway.namespace import Entry
from gateway.writes.config import WriteConfig
from gateway.writes.locks import PathLocks
from gateway.writes.metadata import MetadataCache
from gateway.writes.objects import ObjectOps
from gateway.writes.spool import Spool
from gateway.writes.staging import Staging
from gateway.writes.stats import WriteStats
from gateway.writes.upload import StagedFile

if TYPE_CHECKING:
    from gateway.exports import Export


@contextlib.contextmanager
def _boundary() -> Iterator[None]:
    try:
        yield
    except BackendError as e:
        raise from_backend(e, StaleHandle) from e


class WriteManager:
    def __init__(
        self, cfg: WriteConfig, reader: ObjectReader, *, clock: Clock | None = None
    ) -> None:
        """``clock``: the server's (default: the system clock); staging reads its
        ``monotonic`` to find idle files."""
        self.cfg = cfg
        self.reader = reader
        self.stats = WriteStats()
        self._locks = PathLocks()
        self._meta = MetadataCache(cfg.metadata_memory_entries, self.stats)
        self._staging = Staging(
            cfg,
            reader,
            self._locks,
            self._meta,
            self.stats,
            clock=clock if clock is not None else SystemClock(),
        )
        self._objects = ObjectOps(cfg, reader, self._meta, self._staging, self.stats)

    @property
    def spool(self) -> Spool:
        return self._staging.spool

    async def close(self, commit_timeout_s: float = 10.0) -> None:
        """Commit what is staged (within the timeout), stop background work, close the pool.
        Whatever is not committed is lost here; clients resend it (the verifier changes)."""
        await self._staging.close(commit_timeout_s)

    # -- locks and lookups ----------------------------------------------------------------

    def lock(self, export: Export, *paths: str) -> contextlib.AbstractAsyncContextManager[None]:
        """Serialise mutations of ``paths`` (sorted, so two paths never deadlock)."""
        return self._locks.hold(*((export.id, p) for p in paths))

    def staged(self, export: Export, path: str) -> StagedFile | None:
        return self._staging.staged(export, path)

    def staged_id(self, export_id: int, path: str) -> StagedFile | None:
        """``staged`` by the export's id (``Export.id``): for a caller built before the
        ``Export`` (the data prefetcher's skip predicate)."""
        return self._staging.staged_id(export_id, path)

    def staged_under(self, export: Export, dir_path: str) -> list[StagedFile]:
        return self._staging.staged_under(export, dir_path)

    async def metadata(self, export: Export, entry: Entry) -> tuple[str, int, dict[str, str]]:
        """(etag, size, full metadata) of ``entry``'s object: from memory when this gateway
        wrote or saw that version, else one HEAD (which may find a newer version)."""
        with _boundary():
            key = export.prefix + entry.path
            return await self._meta.current(export.store, key, entry.etag, entry.size)

    # -- staged data ----------------------------------------------------------------------

    async def write(
        self,
        export: Export,
        entry: Entry,
        offset: int,
        data: bytes | bytearray | memoryview,
        sync: bool,
    ) -> Entry:
        """Stage ``data`` at ``offset`` (takes the path's lock); with ``sync`` commit before
        returning. Returns the entry readers see (the committed version)."""
        with _boundary():
            return await self._staging.write(export, entry, offset, data, sync)

    async def commit(self, export: Export, path: str) -> Entry | None:
        """Commit ``path``'s staged changes (takes the path's lock); the new entry, or None if
        nothing was staged."""
        with _boundary():
            return await self._staging.commit(export, path)

    async def commit_locked(self, export: Export, path: str) -> Entry | None:
        """``commit`` for a caller that already holds the path's lock."""
        with _boundary():
            return await self._staging.commit_locked(export, path)

    async def set_size(self, export: Export, entry: Entry, size: int) -> None:
        """Stage a truncation or extension (committed by the caller, under the lock)."""
        with _boundary():
            await self._staging.set_size(export, entry, size)

    async def stage_metadata(
        self, export: Export, entry: Entry, changes: Mapping[str, str | None]
    ) -> None:
        """Stage metadata changes (committed by the caller, under the lock)."""
        with _boundary():
            await self._staging.stage_metadata(export, entry, changes)

    async def flush_idle(self, now: float | None = None) -> int:
        """Commit every staged file not written for ``flush_idle_s``; how many were."""
        return await self._staging.flush_idle(now)

    # -- whole objects --------------------------------------------------------------------

    async def put_object(
        self, export: Export, path: str, data: bytes, metadata: Mapping[str, str]
    ) -> Entry:
        """PUT a whole object (CREATE, SYMLINK; ``path`` ending in '/' for a MKDIR marker)
        and record it in the index. Any staged state of ``path`` is dropped."""
        with _boundary():
            return await self._objects.put_object(export, path, data, metadata)

    async def copy_in_place(
        self, export: Export, entry: Entry, changes: Mapping[str, str | None]
    ) -> Entry:
        """Replace the metadata of an unchanged object (SETATTR with nothing staged)."""
        with _boundary():
            return await self._objects.copy_in_place(export, entry, changes)

    async def set_dir_attrs(
        self, export: Export, entry: Entry, changes: Mapping[str, str | None]
    ) -> Entry:
        """Store a directory's new attributes on its marker (written if it had none)."""
        with _boundary():
            return await self._objects.set_dir_attrs(export, entry, changes)

    async def keep_parent(self, export: Export, path: str) -> None:
        """Before removing ``path``: write its parent's marker if the parent would be left
        empty and may have none."""
        with _boundary():
            await self._objects.keep_parent(export, path)

    async def delete_object(self, export: Export, path: str, *, is_dir: bool) -> None:
        with _boundary():
            await self._objects.delete_object(export, path, is_dir=is_dir)

    async def rename_object(self, export: Export, entry: Entry, dst: str) -> Entry:
        """A file or symlink: server-side copy (metadata, mtime and fileid kept), then delete
        the source."""
        with _boundary():
            return await self._objects.rename_object(export, entry, dst)

    async def list_tree(self, export: Export, dir_path: str, limit: int) -> list[str] | None:
        """Every key under ``dir_path/`` (its marker included), or None if more than
        ``limit``."""
        with _boundary():
            return await self._objects.list_tree(export, dir_path, limit)

    async def dir_has_entries(self, export: Export, dir_path: str) -> bool:
        """Whether the backend holds anything under ``dir_path/`` but its marker."""
        with _boundary():
            return await self._objects.dir_has_entries(export, dir_path)

    async def rename_tree(self, export: Export, src: str, dst: str, keys: list[str]) -> None:
        """Copy every key under ``src/`` to ``dst/``, then delete the sources."""
        with _boundary():
            await self._objects.rename_tree(export, src, dst, keys)
