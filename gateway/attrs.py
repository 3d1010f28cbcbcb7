"""Namespace entries -> NFS attributes (``fattr3``): type (special files from their metadata),
mode, owner from the entry or the export's defaults, link count, sizes, device numbers, the
stable ``fileid`` and the three times.

Owns: what each attribute IS (one place: ``fattr``, ``ftype``, ``default_mode``); any faster
encoder of the same attributes (READDIRPLUS) must produce the same values. Must not: read the
backend or the index.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, fields
from operator import attrgetter
from typing import Final

from gateway.exports import Export, ExportConfig
from gateway.namespace import Entry, EntryKind
from gateway.namespace.handles import fileid
from nfsproto.nfs3 import Fattr3, Ftype3, NfsTime3, Specdata3

_FTYPE: Final = {
    EntryKind.FILE: Ftype3.NF3REG,
    EntryKind.DIR: Ftype3.NF3DIR,
    EntryKind.SYMLINK: Ftype3.NF3LNK,
}
# ``Entry.special`` (the ``type`` metadata, ``objmeta.SPECIAL_TYPES``) -> its NFS type
SPECIAL_FTYPE: Final = {
    "fifo": Ftype3.NF3FIFO,
    "sock": Ftype3.NF3SOCK,
    "chr": Ftype3.NF3CHR,
    "blk": Ftype3.NF3BLK,
}
FTYPE_SPECIAL: Final = {v: k for k, v in SPECIAL_FTYPE.items()}


def _ts(ns: int) -> NfsTime3:
    s, n = divmod(ns, 1_000_000_000)
    return NfsTime3(s & 0xFFFFFFFF, n)


_NO_DEV = Specdata3(0, 0)


def ftype(e: Entry) -> Ftype3:
    if e.special is not None:
        return SPECIAL_FTYPE[e.special]
    return _FTYPE[e.kind]


def default_mode(cfg: ExportConfig, e: Entry) -> int:
    """The permission bits of an entry whose metadata has none."""
    if e.kind is EntryKind.DIR:
        return cfg.dir_mode
    if e.kind is EntryKind.SYMLINK:
        return 0o777
    return cfg.file_mode


def fattr(export: Export, e: Entry) -> Fattr3:
    cfg = export.cfg
    kind = e.kind
    mode = e.mode & 0o7777 if e.mode is not None else default_mode(cfg, e)
    size = e.size if kind != EntryKind.DIR else 4096
    m = _ts(e.mtime_ns)
    nlink = e.nlink or (2 if kind == EntryKind.DIR else 1)
    return Fattr3(
        ftype(e),
        mode,
        nlink,
        cfg.uid if e.uid is None else e.uid,
        cfg.gid if e.gid is None else e.gid,
        size,
        (size + 4095) & ~4095,
        Specdata3(*e.rdev) if e.special is not None else _NO_DEV,
        export.fsid,
        fileid(export.id, e.path) if e.ino is None else e.ino,
        m if e.atime_ns is None else _ts(e.atime_ns),
        m,
        _ts(e.ctime_ns) if e.ctime_ns else m,
    )


# -- READDIRPLUS's fast path: fattr of listed files as flat fields ---------------------------
# Every Entry field with a default (mode, owner, times, symlink, special file, ... whatever
# Entry gains) and the values a listed file has in them.
_OPTIONAL: Final = attrgetter(
    *(f.name for f in fields(Entry) if f.default is not MISSING or f.default_factory is not MISSING)
)
_LISTED_FILE: Final = Entry("", "", EntryKind.FILE, 0, 0, 0, "")
_LISTED: Final = _OPTIONAL(_LISTED_FILE)


def is_listed_file(e: Entry) -> bool:
    """Whether ``e`` is a file as a listing shows it: ctime = mtime and every optional field
    at its default, so that its ``fattr`` depends only on its path, size and mtime
    (``listed_file_fields``)."""
    return e.kind is EntryKind.FILE and e.ctime_ns == e.mtime_ns and _OPTIONAL(e) == _LISTED


def listed_file_fields(export: Export) -> Callable[[str, int, int], tuple[int, ...]]:
    """``(path, size, mtime_ns) -> nfs3.fattr3_fields(fattr(export, e))`` for a listed file
    ``e`` (``is_listed_file``), without the Fattr3, NfsTime3 and Entry objects (READDIRPLUS
    sends ~1.3 M of them for ImageNet). What does not depend on path, size or mtime comes from
    ``fattr`` itself; the rest must follow ``fattr`` (tests/unit/gateway/test_readdir_fast.py
    compares the two byte for byte)."""
    by_id, eid = listed_file_fields_by_id(export), export.id

    def listed(path: str, size: int, mtime_ns: int) -> tuple[int, ...]:
        return by_id(fileid(eid, path), size, mtime_ns)

    return listed


def listed_file_fields_by_id(export: Export) -> Callable[[int, int, int], tuple[int, ...]]:
    """``listed_file_fields`` given the file's ``fileid`` instead of its path: ``(fileid,
    size, mtime_ns) -> fattr3's fields`` (READDIRPLUS hashes the path once for the fileid
    and the handle, ``HandleCodec.listed_ids``)."""
    a = fattr(export, _LISTED_FILE)
    t, mode, nlink, uid, gid = a.type, a.mode, a.nlink, a.uid, a.gid
    rd1, rd2, fsid = a.rdev.specdata1, a.rdev.specdata2, a.fsid

    def listed(fid: int, size: int, mtime_ns: int) -> tuple[int, ...]:
        s, ns = divmod(mtime_ns, 1_000_000_000)
        s &= 0xFFFFFFFF
        used = (size + 4095) & ~4095
        return (t, mode, nlink, uid, gid, size, used, rd1, rd2, fsid, fid, s, ns, s, ns, s, ns)

    return listed
