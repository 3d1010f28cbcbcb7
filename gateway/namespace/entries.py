"""What the index hands out and counts: ``Entry`` (one name's attributes), ``DirPage`` (one
READDIR answer), ``NamespaceStats``, and the memory constants the index's budget is kept in.

Owns: turning a listed or HEAD-ed object into an ``Entry`` (``file_entry``). Must not: hold
state, talk to the backend or know about wire types (handlers turn entries into ``fattr3``).

The index does not keep an ``Entry`` per listed name (``columns``): it builds one when a caller
asks, and keeps ``Entry`` objects only for the few names with metadata or a recent mutation.

**File attributes** come from the listing: size, LastModified, ETag. Object metadata, when a
listing (e.g. the local backend) or a HEAD carries it, overrides them (``objmeta``): mode,
owner, mtime, atime, ctime, ``symlink-target``, which makes the entry a SYMLINK, and ``type``
(with ``rdev``), which makes it a special file (``special``: a FIFO, socket or device; the
kind stays FILE, the handlers turn it into its NFS type). S3 listings carry no user
metadata, so a listed symlink shows as a regular file until a HEAD (``Namespace.refresh``)
reveals it. Directories have size ``DIR_SIZE``, synthetic times (``Namespace``) and the
attributes of their marker object, if any (``dirattrs``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Final

from gateway.backend.base import ObjectInfo
from gateway.namespace.objmeta import (
    META_ATIME,
    META_CTIME,
    parse_ino,
    parse_metadata,
    parse_special,
    time_ns,
)

DIR_SIZE: Final = 4096
# The budget's constants (CPython 3.11, 64-bit; measured with tracemalloc, see
# tests/unit/gateway/test_namespace_index.py): a cached directory's own objects (the Directory,
# its path strings, empty dicts, the index's map slots) besides its columns, whose buffers are
# counted as allocated (``Columns.nbytes``).
DIR_OVERHEAD: Final = 1300
# An Entry kept whole (a mutation or metadata over the columns, a targeted lookup's answer):
# the slots object, its name, path and ETag strings, the dict slot holding it.
ENTRY_BYTES: Final = 360
# One entry of a listing being built (lists of names, ETags, sizes, mtimes, a name -> position
# dict), until it is packed into columns.
BUILD_ENTRY_BYTES: Final = 330


class EntryKind(Enum):
    FILE = "file"
    DIR = "dir"
    SYMLINK = "symlink"


@dataclass(slots=True)
class Entry:
    """One name in a directory. Shared with the cache: callers must treat it as read-only.
    ``mode``/``uid``/``gid`` None mean "the export's default"; ``mode`` holds permission bits
    only (the handler adds the file type). ``etag`` is "" for directories. ``atime_ns`` None:
    the mtime. ``special``: a FILE that is a special file (``objmeta.SPECIAL_TYPES``) with
    device numbers ``rdev`` (major, minor). ``nlink`` 0: the default (1; 2 for a directory
    whose subdirectories are not known). ``ino``: the fileid a renamed file keeps (None: the
    hash of ``path``)."""

    name: str
    path: str
    kind: EntryKind
    size: int
    mtime_ns: int
    ctime_ns: int
    etag: str
    mode: int | None = None
    uid: int | None = None
    gid: int | None = None
    symlink_target: str | None = None
    atime_ns: int | None = None
    special: str | None = None
    rdev: tuple[int, int] = (0, 0)
    nlink: int = 0
    ino: int | None = None


@dataclass(slots=True)
class NamespaceStats:
    """Counters (monotonic) and gauges (``entries``, ``bytes``, ``dirs``) for metrics."""

    lookups: int = 0
    hits: int = 0
    negative_hits: int = 0
    prefetches: int = 0
    relists: int = 0
    relists_avoided: int = 0  # TTL passed, but the store saw nothing change (inotify)
    listed_ahead: int = 0  # first listings started ahead of a client's READDIRs
    list_pages: int = 0
    targeted_lookups: int = 0
    heads: int = 0
    list_errors: int = 0
    entries: int = 0
    bytes: int = 0
    dirs: int = 0
    evictions: int = 0
    skipped_keys: int = 0
    truncated_dirs: int = 0


@dataclass(slots=True)
class DirPage:
    """One READDIR(PLUS) answer: ``entries`` are (cookie, Entry) in name order, at most
    ``max_entries``; ``eof`` is True when the last entry of the directory is included (a handler
    that sends fewer entries than it got must clear it). ``truncated``: the directory is in
    partial mode and entries past ``max_list_pages`` pages are not shown."""

    verifier: bytes
    entries: list[tuple[int, Entry]]
    eof: bool
    truncated: bool = False


def file_entry(name: str, path: str, info: ObjectInfo) -> Entry:
    """The entry of a listed or HEAD-ed object: its metadata, if any, overrides."""
    meta = info.metadata
    if not meta:
        return Entry(name, path, EntryKind.FILE, info.size, info.mtime_ns, info.mtime_ns, info.etag)
    mode, uid, gid, mtime_ns, target = parse_metadata(meta)
    mt = info.mtime_ns if mtime_ns is None else mtime_ns
    ct = time_ns(meta.get(META_CTIME))
    kind = EntryKind.FILE if target is None else EntryKind.SYMLINK
    special, major, minor = parse_special(meta) if target is None else (None, 0, 0)
    return Entry(
        name,
        path,
        kind,
        info.size,
        mt,
        mt if ct is None else ct,
        info.etag,
        mode,
        uid,
        gid,
        target,
        time_ns(meta.get(META_ATIME)),
        special,
        (major, minor),
        0,
        parse_ino(meta),
    )
