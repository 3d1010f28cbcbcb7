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
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import TYPE_CHECKING

from gateway.backend.base import ObjectInfo
from gateway.data import ObjectReader
from gateway.errors import GatewayError
from gateway.namespace import META_MTIME, Entry, mtime_value, split_path
from gateway.writes.config import WriteConfig
from gateway.writes.metadata import MetadataCache, merge
from gateway.writes.staging import Staging
from gateway.writes.stats import WriteStats
from gateway.writes.upload import gather_all

if TYPE_CHECKING:
    from gateway.exports import Export


class ObjectOps:
    def __init__(
        self,
        cfg: WriteConfig,
        reader: ObjectReader,
        meta: MetadataCache,
        staging: Staging,
        stats: WriteStats,
    ) -> None:
        self.cfg = cfg
        self.reader = reader
        self.meta = meta
        self.staging = staging
        self.stats = stats

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

    # -- removal --------------------------------------------------------------------------

    async def keep_parent(self, export: Export, path: str) -> None:
        """Before removing ``path``: if its parent would be left with no entry and may have
        no marker object, write the marker."""
        parent = split_path(path)[0]
        if not parent:
            return
        try:
            page = await export.ns.readdir(parent, 0, 2)
        except GatewayError:
            return
        names = [e.name for _, e in page.entries]
        if names and names != [split_path(path)[1]]:
            return
        key = export.prefix + parent + "/"
        await export.store.put(key, b"", {})
        self.stats.puts += 1

    async def delete_object(self, export: Export, path: str, *, is_dir: bool) -> None:
        await self.staging.discard(export, path)
        key = export.prefix + path + ("/" if is_dir else "")
        await export.store.delete(key)
        self.reader.invalidate(export.store.name, key)
        self.meta.forget(export.store, key)
        export.ns.remove(path)

    # -- rename ---------------------------------------------------------------------------

    async def rename_object(self, export: Export, src: str, dst: str) -> Entry:
        """A file or symlink: server-side copy (metadata kept), then delete the source."""
        store = export.store
        src_key, dst_key = export.prefix + src, export.prefix + dst
        await self.staging.discard(export, dst)
        info = await store.copy(src_key, dst_key)
        self.reader.invalidate(store.name, dst_key)
        self.meta.remember(store, info, info.metadata)
        await self.keep_parent(export, src)
        await store.delete(src_key)
        self.reader.invalidate(store.name, src_key)
        self.meta.forget(store, src_key)
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
                self.meta.remember(store, info, info.metadata)

        async def delete(k: str) -> None:
            async with sem:
                await store.delete(k)
                self.reader.invalidate(store.name, k)
                self.meta.forget(store, k)

        if keys:
            await gather_all(*(copy(k) for k in keys))
        else:  # only in the index (an implicit directory emptied here): make it real
            await store.put(dst_prefix, b"", {})
        await self.keep_parent(export, src)
        await gather_all(*(delete(k) for k in keys))
        export.ns.remove(src)
        export.ns.remove(dst)  # an empty directory it replaced: its cached listing goes
        export.ns.upsert(ObjectInfo(dst_prefix, 0, "", 0))
