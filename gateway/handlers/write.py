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
from gateway.errors import InvalidArgument, IsDirectory
from gateway.handlers.common import on_failure
from gateway.handlers.mutate import (
    check_may_write,
    check_writable,
    clear_setid,
    pre_op,
    wcc_unchanged,
)
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
    # Any failure: the file as it was (an UNSTABLE write is not visible before its commit,
    # a failed commit changed nothing).
    async with on_failure(lambda s: Write3Res(s, wcc_unchanged(export, e))):
        check_writable(export)
        if e.kind is EntryKind.DIR:
            raise IsDirectory(e.path)
        if e.kind is not EntryKind.FILE:
            raise InvalidArgument(f"WRITE to {e.kind.value} {e.path!r}")
        check_may_write(gw, ctx, export, e)
        before = pre_op(export, e)
        e = await clear_setid(gw, ctx, export, e)
        data = args.data
        if args.count < len(data):
            data = memoryview(data)[: args.count]
        sync = args.stable is not StableHow.UNSTABLE
        after = await gw.writes.write(export, e, args.offset, data, sync)
    return Write3Res(
        NfsStat3.NFS3_OK,
        WccData(before, fattr(export, after)),
        len(data),
        StableHow.FILE_SYNC if sync else StableHow.UNSTABLE,
        gw.write_verf,
    )


async def commit3(gw: Gateway, ctx: CallContext, args: Commit3Args) -> Commit3Res:
    export, e = await gw.resolve(ctx, args.file)
    async with on_failure(lambda s: Commit3Res(s, wcc_unchanged(export, e))):
        check_writable(export)
        before = pre_op(export, e)
        after = await gw.writes.commit(export, e.path)
    return Commit3Res(
        NfsStat3.NFS3_OK,
        WccData(before, fattr(export, after if after is not None else e)),
        gw.write_verf,
    )
