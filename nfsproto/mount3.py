"""MOUNT protocol version 3 (RFC 1813 Appendix I): NULL, MNT, DUMP, UMNT, UMNTALL, EXPORT.

Owns: the wire form of program 100005 version 3, both directions. Must not: do I/O or import
anything outside nfsproto.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Final

from nfsproto import limits
from nfsproto.xdr import Reader, Writer, XdrError

PROGRAM: Final = 100005
VERSION: Final = 3
MNTPATHLEN: Final = limits.MNTPATHLEN
MNTNAMLEN: Final = limits.MNTNAMLEN
FHSIZE3: Final = limits.NFS3_FHSIZE
MAX_FLAVORS: Final = 64


class MountProc(IntEnum):
    NULL = 0
    MNT = 1
    DUMP = 2
    UMNT = 3
    UMNTALL = 4
    EXPORT = 5


class MountStat3(IntEnum):
    MNT3_OK = 0
    MNT3ERR_PERM = 1
    MNT3ERR_NOENT = 2
    MNT3ERR_IO = 5
    MNT3ERR_ACCES = 13
    MNT3ERR_NOTDIR = 20
    MNT3ERR_INVAL = 22
    MNT3ERR_NAMETOOLONG = 63
    MNT3ERR_NOTSUPP = 10004
    MNT3ERR_SERVERFAULT = 10006


_MOUNT_STATS: Final = frozenset(int(s) for s in MountStat3)


@dataclass(slots=True)
class Mnt3Args:
    dirpath: bytes


@dataclass(slots=True)
class Mnt3Res:
    status: MountStat3
    fhandle: bytes = b""
    auth_flavors: list[int] = field(default_factory=list)


@dataclass(slots=True)
class MountBody:
    hostname: bytes
    directory: bytes


@dataclass(slots=True)
class ExportNode:
    dir: bytes
    groups: list[bytes] = field(default_factory=list)


def pack_dirpath(w: Writer, v: bytes) -> None:
    w.string(v, MNTPATHLEN)


def unpack_dirpath(r: Reader) -> bytes:
    return r.string(MNTPATHLEN)


def pack_mnt3args(w: Writer, v: Mnt3Args) -> None:
    pack_dirpath(w, v.dirpath)


def unpack_mnt3args(r: Reader) -> Mnt3Args:
    return Mnt3Args(unpack_dirpath(r))


def pack_mnt3res(w: Writer, v: Mnt3Res) -> None:
    w.u32(v.status)
    if v.status == MountStat3.MNT3_OK:
        w.opaque(v.fhandle, FHSIZE3)
        if len(v.auth_flavors) > MAX_FLAVORS:
            raise XdrError("too many auth flavors")
        w.u32(len(v.auth_flavors))
        for f in v.auth_flavors:
            w.u32(f)


def unpack_mnt3res(r: Reader) -> Mnt3Res:
    s = r.u32()
    if s not in _MOUNT_STATS:
        raise XdrError(f"unknown mountstat3 {s}")
    status = MountStat3(s)
    if status != MountStat3.MNT3_OK:
        return Mnt3Res(status)
    fh = r.opaque_bytes(FHSIZE3)
    n = r.count(MAX_FLAVORS)
    return Mnt3Res(status, fh, [r.u32() for _ in range(n)])


def pack_mountlist(w: Writer, v: list[MountBody]) -> None:
    for m in v:
        w.boolean(True)
        w.string(m.hostname, MNTNAMLEN)
        pack_dirpath(w, m.directory)
    w.boolean(False)


def unpack_mountlist(r: Reader) -> list[MountBody]:
    out: list[MountBody] = []
    while r.optional():
        host = r.string(MNTNAMLEN)
        out.append(MountBody(host, unpack_dirpath(r)))
    return out


def pack_exports(w: Writer, v: list[ExportNode]) -> None:
    for e in v:
        w.boolean(True)
        pack_dirpath(w, e.dir)
        for g in e.groups:
            w.boolean(True)
            w.string(g, MNTNAMLEN)
        w.boolean(False)
    w.boolean(False)


def unpack_exports(r: Reader) -> list[ExportNode]:
    out: list[ExportNode] = []
    while r.optional():
        node = ExportNode(unpack_dirpath(r))
        while r.optional():
            node.groups.append(r.string(MNTNAMLEN))
        out.append(node)
    return out
