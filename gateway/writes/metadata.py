"""The full object metadata the write path must carry over when it replaces an object.

Metadata (``gateway.namespace.objmeta``: mode, owner, mtime, symlink target, CREATE verifier)
rides with the object, and every upload or copy in place replaces all of it. The index's entry
does not carry every key (a listing carries none), so the full set is remembered for object
versions this gateway wrote or HEAD-ed, and fetched with one HEAD otherwise.

Owns: ``MetadataCache``, a bounded LRU (``metadata_memory_entries``) of (store, key) -> (ETag,
metadata), and ``merge``. Must not: write objects or touch the index; backend errors pass
through (the write path translates them at its boundary).
"""

from __future__ import annotations

from collections.abc import Mapping

from gateway.backend.base import ObjectInfo, ObjectStore, PreconditionFailed
from gateway.lru import Lru
from gateway.writes.stats import WriteStats


def merge(base: Mapping[str, str], changes: Mapping[str, str | None]) -> dict[str, str]:
    """``base`` with ``changes`` applied (None removes a key)."""
    out = dict(base)
    for k, v in changes.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = v
    return out


class MetadataCache:
    def __init__(self, max_entries: int, stats: WriteStats) -> None:
        self.stats = stats
        self._meta: Lru[tuple[str, str], tuple[str, dict[str, str]]] = Lru(max_entries)

    def remember(self, store: ObjectStore, info: ObjectInfo, metadata: Mapping[str, str]) -> None:
        """``info``'s version of its object has ``metadata``."""
        self._meta.put((store.name, info.key), (info.etag, dict(metadata)))

    def forget(self, store: ObjectStore, key: str) -> None:
        self._meta.pop((store.name, key), None)

    async def current(
        self, store: ObjectStore, key: str, etag: str, size: int
    ) -> tuple[str, int, dict[str, str]]:
        """(etag, size, full metadata) of ``key``, whose version the caller knows as
        (``etag``, ``size``): from memory when that version is known, else one HEAD (which
        may find a newer version)."""
        got = self._meta.get((store.name, key))
        if got is not None and got[0] == etag:
            return etag, size, dict(got[1])
        self.stats.metadata_heads += 1
        info = await store.head(key)
        self.remember(store, info, info.metadata)
        return info.etag, info.size, dict(info.metadata)

    async def of_version(self, store: ObjectStore, key: str, etag: str) -> dict[str, str]:
        """The full metadata of version ``etag`` of ``key`` (from memory, else one HEAD);
        ``PreconditionFailed`` if the object is no longer that version."""
        got = self._meta.get((store.name, key))
        if got is not None and got[0] == etag:
            return dict(got[1])
        self.stats.metadata_heads += 1
        info = await store.head(key)
        self.remember(store, info, info.metadata)
        if info.etag != etag:
            raise PreconditionFailed(key)
        return dict(info.metadata)
