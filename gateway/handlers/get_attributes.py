"""GETATTR (RFC 1813 §3.3.1): attributes from the index, never a HEAD."""

from __future__ import annotations

from gateway.attrs import fattr
from gateway.dispatch import CallContext
from gateway.registry import Gateway
from nfsproto.nfs3 import Getattr3Args, Getattr3Res, NfsStat3


async def getattr3(gw: Gateway, ctx: CallContext, args: Getattr3Args) -> Getattr3Res:
    export, entry = await gw.resolve(ctx, args.object)
    return Getattr3Res(NfsStat3.NFS3_OK, fattr(export, entry))
