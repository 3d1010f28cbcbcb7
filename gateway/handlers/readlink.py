"""READLINK (RFC 1813 §3.3.5): the target is object metadata (``symlink-target``); S3
listings carry no metadata, so the index refreshes the entry with one HEAD when needed."""

from __future__ import annotations

from gateway.attrs import fattr
from gateway.dispatch import CallContext
from gateway.errors import InvalidArgument
from gateway.namespace import EntryKind
from gateway.registry import Gateway
from nfsproto.nfs3 import NfsStat3, Readlink3Args, Readlink3Res


async def readlink3(gw: Gateway, ctx: CallContext, args: Readlink3Args) -> Readlink3Res:
    export, e = await gw.resolve(ctx, args.symlink)
    if e.kind == EntryKind.FILE and e.symlink_target is None:
        e = await export.ns.refresh(e.path)
    if e.kind != EntryKind.SYMLINK or e.symlink_target is None:
        err = InvalidArgument(f"READLINK of {e.kind.value} {e.path!r}")
        raise err.with_body(Readlink3Res(err.status, fattr(export, e)))
    return Readlink3Res(NfsStat3.NFS3_OK, fattr(export, e), e.symlink_target.encode())
