"""Directory attributes (DESIGN §3 "Attributes"; docs/posix.md "Directories"): a directory's
mode, owner and times live in the metadata of its marker object (``dir/``, the ``objmeta``
schema), written by MKDIR and by SETATTR of a directory (which writes the marker of an
implicit directory). S3 listings carry no metadata, so the index remembers what it learnt of
each marker (from a write of this gateway, or a listing that carries metadata) in a bounded
map, and builds directory entries from it.

Owns: ``DirAttrs`` (path -> what the marker says, LRU, at most ``max_entries``) and building a
directory's ``Entry`` (``entry``): the marker's mode/uid/gid, its atime and ctime, the
synthetic mtime the index keeps, and the link count 2 + subdirectories when the directory's
view is complete. Must not: talk to the backend, read a clock or hold the index's state.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gateway.lru import Lru
from gateway.namespace.columns import KIND_DIR
from gateway.namespace.directory import Directory
from gateway.namespace.entries import DIR_SIZE, Entry, EntryKind
from gateway.namespace.objmeta import (
    META_ATIME,
    META_CTIME,
    parse_ino,
    parse_metadata,
    time_ns,
)


@dataclass(slots=True)
class DirMeta:
    """What a directory's marker says (None: the export's default, or the mtime for times)."""

    mode: int | None = None
    uid: int | None = None
    gid: int | None = None
    atime_ns: int | None = None
    ctime_ns: int | None = None
    ino: int | None = None  # the fileid a renamed directory keeps
    metadata: dict[str, str] = field(default_factory=dict)  # the marker's, all of it


class DirAttrs:
    def __init__(self, max_entries: int) -> None:
        self._meta: Lru[str, DirMeta] = Lru(max_entries)

    def __len__(self) -> int:
        return len(self._meta)

    def record(self, path: str, metadata: Mapping[str, str]) -> int | None:
        """The marker of ``path`` has ``metadata`` now; its explicit mtime (ns), if any."""
        mode, uid, gid, mtime_ns, _ = parse_metadata(metadata)
        m = DirMeta(
            mode,
            uid,
            gid,
            time_ns(metadata.get(META_ATIME)),
            time_ns(metadata.get(META_CTIME)),
            parse_ino(metadata),
            dict(metadata),
        )
        self._meta.put(path, m)
        return mtime_ns

    def get(self, path: str) -> DirMeta | None:
        return self._meta.get(path)

    def forget(self, path: str) -> None:
        """``path`` and every directory under it are gone."""
        self._meta.pop(path, None)
        lead = f"{path}/"
        if path and any(p.startswith(lead) for p in self._meta):
            for p in [p for p in self._meta if p.startswith(lead)]:
                del self._meta[p]

    def entry(self, name: str, path: str, t: int, d: Directory | None) -> Entry:
        """The entry of directory ``path`` whose synthetic mtime is ``t`` (ns) and whose cached
        view is ``d`` (None: not cached)."""
        e = Entry(name, path, EntryKind.DIR, DIR_SIZE, t, t, "", nlink=_links(d))
        m = self._meta.get(path)
        if m is not None:
            e.mode, e.uid, e.gid, e.atime_ns, e.ino = m.mode, m.uid, m.gid, m.atime_ns, m.ino
            if m.ctime_ns is not None and m.ctime_ns > t:
                e.ctime_ns = m.ctime_ns
        return e


def _links(d: Directory | None) -> int:
    """2 + the subdirectories of a completely listed view; 0 (the default, 2) otherwise."""
    if d is None or d.cols is None or d.partial:
        return 0
    cols = d.cols
    n = cols.ndirs
    for name, e in d.extra.items():
        r = cols.find(name)
        n += (e is not None and e.kind is EntryKind.DIR) - (r >= 0 and cols.kinds[r] == KIND_DIR)
    return 2 + n
