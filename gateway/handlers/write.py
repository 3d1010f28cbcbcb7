"""WRITE (RFC 1813 §3.3.7) and COMMIT (§3.3.21).

- UNSTABLE: the data is in the spool when the reply goes; ``committed`` = UNSTABLE.
- DATA_SYNC and FILE_SYNC: the whole file is committed (the object is in the backend, with
  its metadata) before the reply; ``committed`` = FILE_SYNC.
- COMMIT commits the whole file whatever ``offset``/``count`` say (the RFC allows more).
- Both return the write verifier, which changes at every start, so a client resends what it
  had not seen committed (§3.3.7, §3.3.21).
- wcc_data describes the object readers see: before and after an UNSTABLE WRITE it is the
  same committed version (the new bytes are not visible until the commit).
- Spool budget exhausted: NFS3ERR_JUKEBOX (the client retries; the gateway commits the
  largest staged file meanwhile).
- Permission: write permission by mode bits, or ownership (a file opened for writing before
  a chmod stays writable to its owner, as on a local file system).
"""

from __future__ import annotations

from gateway.attrs import fattr
from gateway.dispatch import CallContext
from gateway.errors import GatewayError
from gateway.handlers.mutate import may_write, pre_op, wcc_unchanged
from gateway.namespace import EntryKind
from gateway.registry import Gateway
from nfsproto.nfs3 import (
    Commit3Args,
    Commit3Res,
    NfsStat3,
    StableHow,
    WccData,
    Write3Args,
    Write3Res,
)


async def write3(gw: Gateway, ctx: CallContext, args: Write3Args) -> Write3Res:
    export, e = await gw.resolve(ctx, args.file)
    if export.cfg.read_only:
        return Write3Res(NfsStat3.NFS3ERR_ROFS, wcc_unchanged(export, e))
    if e.kind is EntryKind.DIR:
        return Write3Res(NfsStat3.NFS3ERR_ISDIR, wcc_unchanged(export, e))
    if e.kind is not EntryKind.FILE:
        return Write3Res(NfsStat3.NFS3ERR_INVAL, wcc_unchanged(export, e))
    if not may_write(gw, ctx, export, e):
        return Write3Res(NfsStat3.NFS3ERR_ACCES, wcc_unchanged(export, e))
    before = pre_op(export, e)
    data = args.data
    if args.count < len(data):
        data = memoryview(data)[: args.count]
    sync = args.stable is not StableHow.UNSTABLE
    try:
        after = await gw.writes.write(export, e, args.offset, data, sync)
    except GatewayError as err:
        return Write3Res(err.status, WccData(before, fattr(export, e)))
    return Write3Res(
        NfsStat3.NFS3_OK,
        WccData(before, fattr(export, after)),
        len(data),
        StableHow.FILE_SYNC if sync else StableHow.UNSTABLE,
        gw.write_verf,
    )


async def commit3(gw: Gateway, ctx: CallContext, args: Commit3Args) -> Commit3Res:
    export, e = await gw.resolve(ctx, args.file)
    if export.cfg.read_only:
        return Commit3Res(NfsStat3.NFS3ERR_ROFS, wcc_unchanged(export, e))
    before = pre_op(export, e)
    try:
        after = await gw.writes.commit(export, e.path)
    except GatewayError as err:
        return Commit3Res(err.status, WccData(before, fattr(export, e)))
    return Commit3Res(
        NfsStat3.NFS3_OK,
        WccData(before, fattr(export, after if after is not None else e)),
        gw.write_verf,
    )


def write3_fail(e: GatewayError, args: Write3Args) -> Write3Res:
    return Write3Res(e.status)


def commit3_fail(e: GatewayError, args: Commit3Args) -> Commit3Res:
    return Commit3Res(e.status)
