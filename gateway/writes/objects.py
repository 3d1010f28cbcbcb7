"""Whole-object mutations behind CREATE, MKDIR, SYMLINK, SETATTR (metadata only), REMOVE, RMDIR
and RENAME, each followed by the index update that makes it visible at once (DESIGN §3
"Writes": MKDIR writes a ``dir/`` marker, REMOVE/RMDIR delete, RENAME is copy + delete).

Owns: ``ObjectOps``: the PUT/COPY/DELETE/LIST requests of those operations, dropping the data
cache's copies of what they replace, and the ``Namespace`` hooks (``upsert``, ``remove``) after
them. Must not: hold path locks (handlers take them through ``WriteManager.lock``), check names
or permissions, or stage data (``staging``); backend errors pass through (``WriteManager``
translates them at the write path's boundary).

- **Directories stay** when their last entry goes: before a removal that may leave a parent
  empty and without a marker, the marker is written (``keep_parent``; POSIX: removing a file
  leaves its directory).
- **RENAME of a file** is one server-side copy (metadata kept) over the target, then a delete;
  **of a directory**, a copy of every key under it (at most ``rename_max_entries``, checked by
  the caller through ``list_tree``, ``copy_concurrency`` at a time) and then their deletes.
- **Metadata-only SETATTR** of an unchanged object is one COPY onto itself with the new
  metadata (``copy_in_place``); the object's mtime is kept unless the change sets it.
- **Directory attributes** live on the directory's marker (``namespace.dirattrs``):
  ``set_dir_attrs`` PUTs the marker with its metadata merged with the change (one HEAD first
  when the index does not know the marker), which makes an implicit directory explicit. Every
  marker written later (``keep_parent``, a directory RENAME) carries the metadata the index
  knows, so a directory keeps its mode, owner and times.
- **Renamed files** are recorded in the index's ``moved`` map, so the handle of the old name
  still reaches the file (an open file survives a rename; the Linux client's silly rename).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog

from gateway.backend.base import ObjectInfo, ObjectNotFound
from gateway.data import ObjectReader
from gateway.errors import GatewayError
from gateway.namespace import (
    META_CTIME,
    META_INO,
    META_MTIME,
    Entry,
    fileid,
    mtime_value,
    split_path,
)
from gateway.writes.config import WriteConfig
from gateway.writes.metadata import MetadataCache, merge
from gateway.writes.staging import Staging
from gateway.writes.stats import WriteStats
from gateway.writes.upload import gather_all

if TYPE_CHECKING:
    from gateway.exports import Export

log = structlog.get_logger(__name__)


@dataclass(eq=False, repr=False)
class ObjectOps:
    cfg: WriteConfig
    reader: ObjectReader
    meta: MetadataCache
    staging: Staging
    stats: WriteStats

    async def put_object(
        self, export: Export, path: str, data: bytes, metadata: Mapping[str, str]
    ) -> Entry:
        """PUT a whole object (CREATE, SYMLINK; ``path`` ending in '/' for a MKDIR marker)
        and record it in the index. Any staged state of ``path`` is dropped."""
        await self.staging.start(export)
        await self.staging.discard(export, path)
        key = export.prefix + path
        info = await export.store.put(key, data, dict(metadata))
        info.metadata = dict(metadata)
        self.stats.puts += 1
        self.reader.invalidate(export.store.name, key)
        if not path.endswith("/"):
            self.meta.remember(export.store, info, metadata)
        return export.ns.upsert(info)

    async def copy_in_place(
        self, export: Export, entry: Entry, changes: Mapping[str, str | None]
    ) -> Entry:
        """Replace the metadata of an unchanged object (one COPY onto itself, plus a HEAD
        when this gateway does not know the object's full metadata)."""
        store = export.store
        key = export.prefix + entry.path
        _, _, base = await self.meta.current(store, key, entry.etag, entry.size)
        meta = merge(base, changes)
        if META_MTIME not in meta:  # the copy's LastModified is now: keep the file's mtime
            meta[META_MTIME] = mtime_value(entry.mtime_ns)
        info = await store.copy(key, key, meta)
        info.metadata = meta
        self.reader.invalidate(store.name, key)
        self.meta.remember(store, info, meta)
        return export.ns.upsert(info)

    async def set_dir_attrs(
        self, export: Export, entry: Entry, changes: Mapping[str, str | None]
    ) -> Entry:
        """Store a directory's new attributes on its marker (written if it had none)."""
        meta = merge(await self._marker_metadata(export, entry.path), changes)
        if META_MTIME not in changes:
            meta.pop(META_MTIME, None)  # a directory's mtime moves with its entries
        info = await export.store.put(export.prefix + entry.path + "/", b"", meta)
        info.metadata = meta
        self.stats.puts += 1
        return export.ns.upsert(info)

    async def _marker_metadata(self, export: Export, path: str) -> dict[str, str]:
        """The metadata of ``path``'s marker: as the index knows it, else one HEAD ({} when
        the directory has no marker)."""
        known = export.ns.dir_attrs.get(path)
        if known is not None:
            return dict(known.metadata)
        try:
            info = await export.store.head(export.prefix + path + "/")
        except ObjectNotFound:
            return {}
        return dict(info.metadata)

    # -- removal --------------------------------------------------------------------------

    async def keep_parent(self, export: Export, path: str) -> None:
        """Before removing ``path``: if its parent would be left with no entry and may have
        no marker object, write the marker."""
        parent = split_path(path)[0]
        if not parent:
            return
        try:
            page = await export.ns.readdir(parent, 0, 2)
        except GatewayError as e:  # the parent is gone, or unreadable: no marker written
            log.debug("parent_marker_skipped", dir=parent, error=repr(e))
            return
        names = [e.name for _, e in page.entries]
        if names and names != [split_path(path)[1]]:
            return
        key = export.prefix + parent + "/"
        known = export.ns.dir_attrs.get(parent)
        if known is None:
            try:
                await export.store.head(key)
                return  # the marker is there
            except ObjectNotFound:
                pass
        await export.store.put(key, b"", {} if known is None else dict(known.metadata))
        self.stats.puts += 1

    async def delete_object(self, export: Export, path: str, *, is_dir: bool) -> None:
        await self.staging.discard(export, path)
        key = export.prefix + path + ("/" if is_dir else "")
        await export.store.delete(key)
        self.reader.invalidate(export.store.name, key)
        self.meta.forget(export.store, key)
        export.ns.remove(path)

    # -- rename ---------------------------------------------------------------------------

    async def rename_object(self, export: Export, entry: Entry, dst: str) -> Entry:
        """A file or symlink: server-side copy, then delete the source. The copy keeps the
        metadata, the mtime and the fileid (``ino``) and moves ctime (one HEAD first when
        this gateway does not know the object's full metadata)."""
        store = export.store
        src = entry.path
        src_key, dst_key = export.prefix + src, export.prefix + dst
        await self.staging.discard(export, dst)
        _, _, meta = await self.meta.current(store, src_key, entry.etag, entry.size)
        meta.setdefault(META_INO, str(fileid(export.id, src)))
        meta.setdefault(META_MTIME, mtime_value(entry.mtime_ns))
        meta[META_CTIME] = mtime_value(time.time_ns())
        info = await store.copy(src_key, dst_key, meta)
        info.metadata = meta
        self.reader.invalidate(store.name, dst_key)
        self.meta.remember(store, info, meta)
        await self.keep_parent(export, src)
        await store.delete(src_key)
        self.reader.invalidate(store.name, src_key)
        self.meta.forget(store, src_key)
        entry = export.ns.upsert(info)
        export.ns.remove(src)
        export.ns.moved.add(src, dst)
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

        ns = export.ns
        now = mtime_value(time.time_ns())

        def marker_meta(path: str) -> dict[str, str]:
            """What the index knows of ``path``'s marker, with the fileid it keeps."""
            known = ns.dir_attrs.get(path)
            meta = {} if known is None else dict(known.metadata)
            meta.setdefault(META_INO, str(fileid(export.id, path)))
            meta[META_CTIME] = now
            return meta

        markers = {
            k: marker_meta(k[len(export.prefix) : -1])
            for k in keys
            if k.endswith("/") and k != src_prefix
        }
        markers[src_prefix] = top_meta = marker_meta(src)

        async def copy(k: str) -> None:
            async with sem:
                if k.endswith("/"):  # a marker: some stores (SeaweedFS) cannot copy those
                    meta = dict(markers.get(k, {}))
                    await store.put(dst_prefix + k[len(src_prefix) :], b"", meta)
                    return
                info = await store.copy(k, dst_prefix + k[len(src_prefix) :])
                self.meta.remember(store, info, info.metadata)

        async def delete(k: str) -> None:
            async with sem:
                await store.delete(k)
                self.reader.invalidate(store.name, k)
                self.meta.forget(store, k)

        if keys:
            await gather_all(*(copy(k) for k in keys))
            if src_prefix not in keys:  # an implicit directory: its marker keeps its fileid
                await store.put(dst_prefix, b"", top_meta)
        else:  # only in the index (an implicit directory emptied here): make it real
            await store.put(dst_prefix, b"", top_meta)
        await self.keep_parent(export, src)
        await gather_all(*(delete(k) for k in keys))
        sub = {k[len(src_prefix) :]: meta for k, meta in markers.items() if k != src_prefix}
        ns.remove(src)
        ns.remove(dst)  # an empty directory it replaced: its cached listing goes
        ns.upsert(ObjectInfo(dst_prefix, 0, "", 0, top_meta))
        for rel, meta in sub.items():  # what the index knew of the markers below
            ns.upsert(ObjectInfo(dst_prefix + rel, 0, "", 0, dict(meta)))
        ns.moved.add(src, dst)  # handles under the old path follow it
