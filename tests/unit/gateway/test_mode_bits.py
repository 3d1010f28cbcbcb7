"""The one mode-bit rule (``policy.mode_bits``) and its two users, ``policy.permits`` and
``handlers.common.access_bits``, checked against the rules written out longhand (POSIX classes;
RFC 1813 §3.3.4 and §4.4 for root, READ by the owner and execute-allows-READ) on every mode,
caller class, entry kind and request."""

from __future__ import annotations

import itertools
from typing import cast

import pytest

from gateway.backend.base import ObjectStore
from gateway.dispatch import CallContext
from gateway.exports import Export, ExportConfig
from gateway.handlers.common import access_bits
from gateway.namespace import Entry, EntryKind, Namespace
from gateway.policy import R_OK, W_OK, X_OK, mode_bits, permits
from gateway.transport import Peer
from nfsproto.nfs3 import (
    ACCESS3_DELETE,
    ACCESS3_EXECUTE,
    ACCESS3_EXTEND,
    ACCESS3_LOOKUP,
    ACCESS3_MODIFY,
    ACCESS3_READ,
)

OWNER, GROUP = 100, 200
CALLERS = {  # (uid, gid, gids)
    "root": (0, 0, ()),
    "owner": (OWNER, 1, ()),
    "group": (300, GROUP, ()),
    "supplementary": (300, 1, (5, GROUP)),
    "other": (300, 1, (5,)),
}
ALL_ACCESS = (
    ACCESS3_READ
    | ACCESS3_LOOKUP
    | ACCESS3_MODIFY
    | ACCESS3_EXTEND
    | ACCESS3_DELETE
    | ACCESS3_EXECUTE
)


def longhand_bits(mode: int, uid: int, gid: int, gids: tuple[int, ...]) -> int:
    if uid == OWNER:
        return (mode >> 6) & 7
    if gid == GROUP or GROUP in gids:
        return (mode >> 3) & 7
    return mode & 7


def longhand_permits(e: Entry, mode: int, who: str, want: int, read: bool) -> bool:
    uid, gid, gids = CALLERS[who]
    if uid == 0 or (read and uid == OWNER):
        return True
    bits = longhand_bits(mode, uid, gid, gids)
    return bits & want == want or (read and e.kind is EntryKind.FILE and bool(bits & X_OK))


def longhand_access(e: Entry, mode: int, who: str, read_only: bool) -> int:
    uid, gid, gids = CALLERS[who]
    if uid == 0:
        r = w = True
        x = e.kind is EntryKind.DIR or bool(mode & 0o111)
    else:
        bits = longhand_bits(mode, uid, gid, gids)
        r, w, x = bool(bits & 4), bool(bits & 2), bool(bits & 1)
    got = ACCESS3_READ if r else 0
    if w and not read_only:
        got |= ACCESS3_MODIFY | ACCESS3_EXTEND
        if e.kind is EntryKind.DIR:
            got |= ACCESS3_DELETE
    if x:
        got |= ACCESS3_LOOKUP if e.kind is EntryKind.DIR else ACCESS3_EXECUTE
    return got


def export_of(read_only: bool) -> Export:
    cfg = ExportConfig(
        "/x", "s3://b/x/", read_only=read_only, uid=OWNER, gid=GROUP, file_mode=0o640
    )
    # Neither function reads the store or the index.
    return Export(1, cfg, cast(ObjectStore, None), cast(Namespace, None), "x/")


def ctx_of(who: str) -> CallContext:
    uid, gid, gids = CALLERS[who]
    return CallContext(0, 100003, 3, 0, Peer("127.0.0.1", 700, 2049), 1, uid, gid, gids)


def test_mode_bits_is_the_posix_class_rule() -> None:
    for mode in range(0o1000):
        for uid, gid, gids in CALLERS.values():
            assert mode_bits(mode, OWNER, GROUP, uid, gid, gids) == longhand_bits(
                mode, uid, gid, gids
            )


@pytest.mark.parametrize("kind", list(EntryKind))
@pytest.mark.parametrize("read_only", [False, True])
def test_permits_and_access_follow_the_longhand_rules(kind: EntryKind, read_only: bool) -> None:
    export = export_of(read_only)
    wants = [R_OK, W_OK, X_OK, W_OK | X_OK, R_OK | W_OK | X_OK]
    for mode, who in itertools.product([None, *range(0, 0o10000, 0o21)], CALLERS):
        e = Entry("f", "d/f", kind, 1, 0, 0, "", mode=mode)
        effective = (
            mode
            if mode is not None
            else {EntryKind.DIR: 0o755, EntryKind.SYMLINK: 0o777, EntryKind.FILE: 0o640}[kind]
        )
        ctx = ctx_of(who)
        for want, read in itertools.product(wants, [False, True]):
            assert permits(ctx, export, e, want, read=read) == longhand_permits(
                e, effective, who, want, read
            ), (oct(effective), who, want, read)
        uid, gid, gids = CALLERS[who]
        assert access_bits(export, e, uid, gid, gids, ALL_ACCESS) == longhand_access(
            e, effective & 0o7777, who, read_only
        ), (oct(effective), who)
