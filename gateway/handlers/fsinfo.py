"""FSSTAT, FSINFO, PATHCONF (RFC 1813 §3.3.18-20). Object storage has no fixed capacity: FSSTAT
reports a large constant so `df` and tools that check free space work."""

from __future__ import annotations

from gateway.attrs import fattr
from gateway.dispatch import CallContext
from gateway.registry import Gateway
from nfsproto.limits import NAME_MAX
from nfsproto.nfs3 import (
    FSF3_CANSETTIME,
    FSF3_HOMOGENEOUS,
    FSF3_SYMLINK,
    Fsinfo3Args,
    Fsinfo3Res,
    Fsstat3Args,
    Fsstat3Res,
    NfsStat3,
    NfsTime3,
    Pathconf3Args,
    Pathconf3Res,
)

CAPACITY = 1 << 50  # 1 PiB
FILES = 1 << 32
MAX_FILE_SIZE = 5 << 40  # S3's object size limit


async def fsstat3(gw: Gateway, ctx: CallContext, args: Fsstat3Args) -> Fsstat3Res:
    export, entry = await gw.resolve(ctx, args.fsroot)
    return Fsstat3Res(
        NfsStat3.NFS3_OK, fattr(export, entry), CAPACITY, CAPACITY, CAPACITY, FILES, FILES, FILES, 0
    )


async def fsinfo3(gw: Gateway, ctx: CallContext, args: Fsinfo3Args) -> Fsinfo3Res:
    export, entry = await gw.resolve(ctx, args.fsroot)
    c = gw.config
    return Fsinfo3Res(
        NfsStat3.NFS3_OK,
        fattr(export, entry),
        rtmax=c.rsize,
        rtpref=c.rsize,
        rtmult=4096,
        wtmax=c.wsize,
        wtpref=c.wsize,
        wtmult=4096,
        dtpref=65536,
        maxfilesize=MAX_FILE_SIZE if export.cfg.read_only else gw.writes.cfg.max_file_size,
        time_delta=NfsTime3(0, 1),
        properties=FSF3_SYMLINK | FSF3_HOMOGENEOUS | FSF3_CANSETTIME,
    )


async def pathconf3(gw: Gateway, ctx: CallContext, args: Pathconf3Args) -> Pathconf3Res:
    export, entry = await gw.resolve(ctx, args.object)
    return Pathconf3Res(
        NfsStat3.NFS3_OK,
        fattr(export, entry),
        linkmax=1,
        name_max=NAME_MAX,
        no_trunc=True,
        chown_restricted=True,
        case_insensitive=False,
        case_preserving=True,
    )
