"""Namespace entries -> NFS attributes (``fattr3``): type, mode, owner from the entry or the
export's defaults, sizes, the stable ``fileid`` and times.
"""

from __future__ import annotations

from gateway.exports import Export
from gateway.namespace import Entry, EntryKind
from gateway.namespace.handles import fileid
from nfsproto.nfs3 import Fattr3, Ftype3, NfsTime3, Specdata3

_FTYPE = {
    EntryKind.FILE: Ftype3.NF3REG,
    EntryKind.DIR: Ftype3.NF3DIR,
    EntryKind.SYMLINK: Ftype3.NF3LNK,
}


def _ts(ns: int) -> NfsTime3:
    s, n = divmod(ns, 1_000_000_000)
    return NfsTime3(s & 0xFFFFFFFF, n)


_NO_DEV = Specdata3(0, 0)


def fattr(export: Export, e: Entry) -> Fattr3:
    cfg = export.cfg
    kind = e.kind
    if e.mode is not None:
        mode = e.mode & 0o7777
    elif kind == EntryKind.DIR:
        mode = cfg.dir_mode
    elif kind == EntryKind.SYMLINK:
        mode = 0o777
    else:
        mode = cfg.file_mode
    size = e.size if kind != EntryKind.DIR else 4096
    m = _ts(e.mtime_ns)
    return Fattr3(
        _FTYPE[kind],
        mode,
        2 if kind == EntryKind.DIR else 1,
        cfg.uid if e.uid is None else e.uid,
        cfg.gid if e.gid is None else e.gid,
        size,
        (size + 4095) & ~4095,
        _NO_DEV,
        export.fsid,
        fileid(export.id, e.path),
        m,
        m,
        _ts(e.ctime_ns) if e.ctime_ns else m,
    )
