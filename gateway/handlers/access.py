"""ACCESS (RFC 1813 §3.3.4): the allowed subset of the requested bits."""

from __future__ import annotations

from gateway.attrs import fattr
from gateway.dispatch import CallContext
from gateway.handlers.common import access_bits
from gateway.policy import creds
from gateway.registry import Gateway
from nfsproto.nfs3 import Access3Args, Access3Res, NfsStat3


async def access3(gw: Gateway, ctx: CallContext, args: Access3Args) -> Access3Res:
    export, entry = await gw.resolve(ctx, args.object)
    uid, gid, gids = creds(ctx, export)
    a = fattr(export, entry)
    return Access3Res(
        NfsStat3.NFS3_OK, a, access_bits(export, entry, uid, gid, gids, args.access, a)
    )
