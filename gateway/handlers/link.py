"""LINK (RFC 1813 §3.3.15): never supported, since an object store has no hard links (one
object has one key; MKNOD makes special files: ``create``): NFS3ERR_NOTSUPP on writable
exports, NFS3ERR_ROFS on read-only ones, with the wcc_data of the directory that was not
changed.

The other mutating procedures have their own modules (create, write, set_attributes, remove,
rename); each answers NFS3ERR_ROFS on a read-only export.
"""

from __future__ import annotations

from gateway.attrs import fattr
from gateway.dispatch import CallContext
from gateway.errors import NotSupported
from gateway.handlers.common import on_failure, resolve_opt
from gateway.handlers.mutate import check_writable, wcc_unchanged
from gateway.registry import Gateway
from nfsproto.nfs3 import Fattr3, Link3Args, Link3Res


async def link3(gw: Gateway, ctx: CallContext, args: Link3Args) -> Link3Res:
    export, d = await gw.resolve(ctx, args.link.dir)
    # The file's attributes are optional in the reply: a stale handle (or one of another
    # export) does not change the answer.
    found = await resolve_opt(gw, ctx, args.file)
    attrs: Fattr3 | None = fattr(*found) if found is not None else None
    async with on_failure(lambda s: Link3Res(s, attrs, wcc_unchanged(export, d))):
        check_writable(export)
        raise NotSupported("LINK: an object store has no hard links")
