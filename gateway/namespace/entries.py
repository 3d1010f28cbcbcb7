"""What the index hands out and counts: ``Entry`` (one name's attributes), ``DirPage`` (one
READDIR answer), ``NamespaceStats``, and the memory estimate the index's budget is kept in.

Owns: turning a listed or HEAD-ed object into an ``Entry`` (``file_entry``). Must not: hold
state, talk to the backend or know about wire types (handlers turn entries into ``fattr3``).

**File attributes** come from the listing: size, LastModified, ETag. Object metadata, when a
listing (e.g. the local backend) or a HEAD carries it, overrides them (``objmeta``): mode,
owner, mtime, and ``symlink-target``, which makes the entry a SYMLINK. S3 listings carry no user
metadata, so a listed symlink shows as a regular file until a HEAD (``Namespace.refresh``)
reveals it. Directories have size ``DIR_SIZE`` and synthetic times (``Namespace``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Final

from gateway.backend.base import ObjectInfo
from gateway.namespace.objmeta import parse_metadata

DIR_SIZE: Final = 4096
# Estimated bytes per cached entry, on top of len(name) + len(path): measured with tracemalloc
# over a 100,000-entry directory with its cookie map built (CPython 3.11, 64-bit): 354 B for the
# Entry (slots) object, the name and path str headers, the SortedDict's dict slot and list
# reference and the cookie map's int key and dict slot; plus the etag str (~83 B) and the mtime
# int (32 B), which a real backend allocates per object (the fake store shares them): ~470 B.
ENTRY_OVERHEAD: Final = 480
DIR_OVERHEAD: Final = 1024


class EntryKind(Enum):
    FILE = "file"
    DIR = "dir"
    SYMLINK = "symlink"


@dataclass(slots=True)
class Entry:
    """One name in a directory. Shared with the cache: callers must treat it as read-only.
    ``mode``/``uid``/``gid`` None mean "the export's default"; ``mode`` holds permission bits
    only (the handler adds the file type). ``etag`` is "" for directories."""

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


@dataclass(slots=True)
class NamespaceStats:
    """Counters (monotonic) and gauges (``entries``, ``bytes``, ``dirs``) for metrics."""

    lookups: int = 0
    hits: int = 0
    negative_hits: int = 0
    prefetches: int = 0
    relists: int = 0
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


def entry_bytes(name: str, path: str) -> int:
    """The budget's estimate of one cached entry."""
    return ENTRY_OVERHEAD + len(name) + len(path)


def file_entry(name: str, path: str, info: ObjectInfo) -> Entry:
    """The entry of a listed or HEAD-ed object: its metadata, if any, overrides."""
    meta = info.metadata
    if not meta:
        return Entry(name, path, EntryKind.FILE, info.size, info.mtime_ns, info.mtime_ns, info.etag)
    mode, uid, gid, mtime_ns, target = parse_metadata(meta)
    mt = info.mtime_ns if mtime_ns is None else mtime_ns
    kind = EntryKind.FILE if target is None else EntryKind.SYMLINK
    return Entry(name, path, kind, info.size, mt, mt, info.etag, mode, uid, gid, target)
