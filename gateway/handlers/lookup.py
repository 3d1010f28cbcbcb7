"""LOOKUP (RFC 1813 §3.3.3): answered from the parent directory's prefetched listing; a miss in
a completely listed directory costs no request. A name whose key would pass the object
store's limit (``mutate.MAX_KEY``) is NFS3ERR_NAMETOOLONG, as creating it is."""

from __future__ import annotations

from gateway.attrs import fattr
from gateway.dispatch import CallContext
from gateway.errors import AccessDenied, NameTooLong, NotDirectory
from gateway.handlers.common import check_name, on_failure
from gateway.handlers.mutate import MAX_KEY
from gateway.namespace import EntryKind, join_path
from gateway.policy import X_OK, permits
from gateway.registry import Gateway
from nfsproto.nfs3 import Lookup3Args, Lookup3Res, NfsStat3


async def lookup3(gw: Gateway, ctx: CallContext, args: Lookup3Args) -> Lookup3Res:
    export, d = await gw.resolve(ctx, args.what.dir)
    dir_attr = fattr(export, d)
    async with on_failure(lambda s: Lookup3Res(s, dir_attributes=dir_attr)):
        if d.kind != EntryKind.DIR:
            raise NotDirectory(d.path)
        if not permits(ctx, export, d, X_OK):
            gw.deny(ctx, d, "lookup needs x on the directory")
            raise AccessDenied(f"no search permission on {d.path!r}")
        raw = args.what.name
        name = raw.decode() if raw in (b".", b"..") else check_name(raw)
        if len((export.prefix + join_path(d.path, name)).encode()) > MAX_KEY:
            raise NameTooLong(f"{d.path!r}/{name[:64]!r}: past the object store's key limit")
        child = await export.ns.lookup(d.path, name)
    fh = gw.handle_for(export, child.path)
    return Lookup3Res(
        NfsStat3.NFS3_OK,
        object=fh,
        obj_attributes=fattr(export, child),
        dir_attributes=dir_attr,
    )
