"""Helpers shared by the NFS procedure handlers: name validation, ACCESS computation."""

from __future__ import annotations

from gateway.attrs import fattr
from gateway.errors import InvalidArgument, NameTooLong
from gateway.exports import Export
from gateway.namespace import Entry, EntryKind
from nfsproto.nfs3 import (
    ACCESS3_DELETE,
    ACCESS3_EXECUTE,
    ACCESS3_EXTEND,
    ACCESS3_LOOKUP,
    ACCESS3_MODIFY,
    ACCESS3_READ,
)

MAX_NAME = 255


def check_name(name: bytes) -> str:
    """A component name from the wire -> str. NUL and '/' are invalid in a component;
    names must be UTF-8 (object keys are)."""
    if len(name) > MAX_NAME:
        raise NameTooLong(f"name of {len(name)} bytes")
    if not name or b"/" in name or b"\0" in name:
        raise InvalidArgument(f"bad name {name!r}")
    try:
        return name.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidArgument(f"name {name!r} is not UTF-8") from None


def access_bits(
    export: Export, e: Entry, uid: int, gid: int, gids: tuple[int, ...], requested: int
) -> int:
    """RFC 1813 §3.3.4: the subset of ``requested`` the caller is allowed, from the mode bits
    (root may do anything but execute a file with no x bit). A read-only export never grants
    MODIFY, EXTEND or DELETE."""
    a = fattr(export, e)
    if uid == 0:
        r = w = True
        x = e.kind == EntryKind.DIR or bool(a.mode & 0o111)
    else:
        if uid == a.uid:
            bits = (a.mode >> 6) & 7
        elif a.gid == gid or a.gid in gids:
            bits = (a.mode >> 3) & 7
        else:
            bits = a.mode & 7
        r, w, x = bool(bits & 4), bool(bits & 2), bool(bits & 1)
    allowed = 0
    if r:
        allowed |= ACCESS3_READ
    if w and not export.cfg.read_only:
        allowed |= ACCESS3_MODIFY | ACCESS3_EXTEND
        if e.kind == EntryKind.DIR:
            allowed |= ACCESS3_DELETE
    if x:
        allowed |= ACCESS3_LOOKUP if e.kind == EntryKind.DIR else ACCESS3_EXECUTE
    return allowed & requested
