"""Mutating procedures on a read-only export (RFC 1813: NFS3ERR_ROFS with wcc_data describing
the object or directory that was not changed). LINK and MKNOD are never supported
(NFS3ERR_NOTSUPP) on any export. Writable exports come with the write-path issue; until
then every mutating call answers ROFS on every export."""

from __future__ import annotations

from gateway.core import Export, Gateway, fattr
from gateway.dispatch import CallContext
from gateway.errors import GatewayError
from gateway.namespace.index import Entry
from nfsproto.nfs3 import (
    Commit3Args,
    Commit3Res,
    Create3Args,
    Create3Res,
    Link3Args,
    Link3Res,
    Mkdir3Args,
    Mkdir3Res,
    Mknod3Args,
    Mknod3Res,
    NfsStat3,
    Remove3Args,
    Remove3Res,
    Rename3Args,
    Rename3Res,
    Rmdir3Args,
    Rmdir3Res,
    Setattr3Args,
    Setattr3Res,
    Symlink3Args,
    Symlink3Res,
    WccAttr,
    WccData,
    Write3Args,
    Write3Res,
)

ROFS = NfsStat3.NFS3ERR_ROFS


def wcc_unchanged(export: Export, e: Entry) -> WccData:
    """wcc_data for an object that was not modified: before == after."""
    a = fattr(export, e)
    return WccData(WccAttr(a.size, a.mtime, a.ctime), a)


async def _wcc(gw: Gateway, ctx: CallContext, fh: bytes) -> WccData:
    export, e = await gw.resolve(ctx, fh)
    return wcc_unchanged(export, e)


async def setattr3(gw: Gateway, ctx: CallContext, args: Setattr3Args) -> Setattr3Res:
    return Setattr3Res(ROFS, await _wcc(gw, ctx, args.object))


async def write3(gw: Gateway, ctx: CallContext, args: Write3Args) -> Write3Res:
    return Write3Res(ROFS, await _wcc(gw, ctx, args.file))


async def create3(gw: Gateway, ctx: CallContext, args: Create3Args) -> Create3Res:
    return Create3Res(ROFS, dir_wcc=await _wcc(gw, ctx, args.where.dir))


async def mkdir3(gw: Gateway, ctx: CallContext, args: Mkdir3Args) -> Mkdir3Res:
    return Mkdir3Res(ROFS, dir_wcc=await _wcc(gw, ctx, args.where.dir))


async def symlink3(gw: Gateway, ctx: CallContext, args: Symlink3Args) -> Symlink3Res:
    return Symlink3Res(ROFS, dir_wcc=await _wcc(gw, ctx, args.where.dir))


async def mknod3(gw: Gateway, ctx: CallContext, args: Mknod3Args) -> Mknod3Res:
    export, e = await gw.resolve(ctx, args.where.dir)
    status = ROFS if export.cfg.read_only else NfsStat3.NFS3ERR_NOTSUPP
    return Mknod3Res(status, dir_wcc=wcc_unchanged(export, e))


async def remove3(gw: Gateway, ctx: CallContext, args: Remove3Args) -> Remove3Res:
    return Remove3Res(ROFS, await _wcc(gw, ctx, args.object.dir))


async def rmdir3(gw: Gateway, ctx: CallContext, args: Rmdir3Args) -> Rmdir3Res:
    return Rmdir3Res(ROFS, await _wcc(gw, ctx, args.object.dir))


async def rename3(gw: Gateway, ctx: CallContext, args: Rename3Args) -> Rename3Res:
    return Rename3Res(ROFS, await _wcc(gw, ctx, args.from_.dir), await _wcc(gw, ctx, args.to.dir))


async def link3(gw: Gateway, ctx: CallContext, args: Link3Args) -> Link3Res:
    export, f = await gw.resolve(ctx, args.file)
    _, d = await gw.resolve(ctx, args.link.dir)
    status = ROFS if export.cfg.read_only else NfsStat3.NFS3ERR_NOTSUPP
    return Link3Res(status, fattr(export, f), wcc_unchanged(export, d))


async def commit3(gw: Gateway, ctx: CallContext, args: Commit3Args) -> Commit3Res:
    return Commit3Res(ROFS, await _wcc(gw, ctx, args.file))


def setattr3_fail(e: GatewayError, args: Setattr3Args) -> Setattr3Res:
    return Setattr3Res(e.status)


def write3_fail(e: GatewayError, args: Write3Args) -> Write3Res:
    return Write3Res(e.status)


def create3_fail(e: GatewayError, args: Create3Args) -> Create3Res:
    return Create3Res(e.status)


def mkdir3_fail(e: GatewayError, args: Mkdir3Args) -> Mkdir3Res:
    return Mkdir3Res(e.status)


def symlink3_fail(e: GatewayError, args: Symlink3Args) -> Symlink3Res:
    return Symlink3Res(e.status)


def mknod3_fail(e: GatewayError, args: Mknod3Args) -> Mknod3Res:
    return Mknod3Res(e.status)


def remove3_fail(e: GatewayError, args: Remove3Args) -> Remove3Res:
    return Remove3Res(e.status)


def rmdir3_fail(e: GatewayError, args: Rmdir3Args) -> Rmdir3Res:
    return Rmdir3Res(e.status)


def rename3_fail(e: GatewayError, args: Rename3Args) -> Rename3Res:
    return Rename3Res(e.status)


def link3_fail(e: GatewayError, args: Link3Args) -> Link3Res:
    return Link3Res(e.status)


def commit3_fail(e: GatewayError, args: Commit3Args) -> Commit3Res:
    return Commit3Res(e.status)
