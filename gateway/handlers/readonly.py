"""LINK (RFC 1813 §3.3.15) and MKNOD (§3.3.11): never supported, since an object store has no
hard links and no device or socket files: NFS3ERR_NOTSUPP on writable exports, NFS3ERR_ROFS
on read-only ones, with the wcc_data of the directory that was not changed.

The other mutating procedures have their own modules (create, write, setattr, remove,
rename); each answers NFS3ERR_ROFS on a read-only export.
"""

from __future__ import annotations

from gateway.attrs import fattr
from gateway.dispatch import CallContext
from gateway.errors import GatewayError
from gateway.handlers.mutate import wcc_unchanged
from gateway.registry import Gateway
from nfsproto.nfs3 import Fattr3, Link3Args, Link3Res, Mknod3Args, Mknod3Res, NfsStat3


async def mknod3(gw: Gateway, ctx: CallContext, args: Mknod3Args) -> Mknod3Res:
    export, e = await gw.resolve(ctx, args.where.dir)
    status = NfsStat3.NFS3ERR_ROFS if export.cfg.read_only else NfsStat3.NFS3ERR_NOTSUPP
    return Mknod3Res(status, dir_wcc=wcc_unchanged(export, e))


async def link3(gw: Gateway, ctx: CallContext, args: Link3Args) -> Link3Res:
    export, d = await gw.resolve(ctx, args.link.dir)
    status = NfsStat3.NFS3ERR_ROFS if export.cfg.read_only else NfsStat3.NFS3ERR_NOTSUPP
    attrs: Fattr3 | None = None
    try:  # the file's attributes are optional in the reply; a stale handle does not matter
        fexport, f = await gw.resolve(ctx, args.file)
        attrs = fattr(fexport, f)
    except GatewayError:
        pass
    return Link3Res(status, attrs, wcc_unchanged(export, d))


def mknod3_fail(e: GatewayError, args: Mknod3Args) -> Mknod3Res:
    return Mknod3Res(e.status)


def link3_fail(e: GatewayError, args: Link3Args) -> Link3Res:
    return Link3Res(e.status)
