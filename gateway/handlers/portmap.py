"""A PORTMAP v2 responder (RFC 1833 §3) on the gateway's own port(s): GETPORT answers our port
for NFS v3 and MOUNT v3 over TCP. SET/UNSET are refused (we are not a general rpcbind);
CALLIT is not offered (PROC_UNAVAIL: indirect calls are an amplification vector)."""

from __future__ import annotations

from gateway.dispatch import CallContext
from gateway.registry import Gateway
from nfsproto import mount3, nfs3, portmap
from nfsproto.portmap import Mapping


def mappings(gw: Gateway) -> list[Mapping]:
    tcp = portmap.IPPROTO_TCP
    return [
        Mapping(portmap.PROGRAM, portmap.VERSION, tcp, gw.portmap_port or gw.port),
        Mapping(nfs3.PROGRAM, nfs3.VERSION, tcp, gw.port),
        Mapping(mount3.PROGRAM, mount3.VERSION, tcp, gw.port),
    ]


async def getport(gw: Gateway, ctx: CallContext, m: Mapping) -> int:
    for have in mappings(gw):
        if (have.prog, have.vers, have.prot) == (m.prog, m.vers, m.prot):
            return have.port
    return 0


async def set_(gw: Gateway, ctx: CallContext, m: Mapping) -> bool:
    return False


async def dump(gw: Gateway, ctx: CallContext, args: None) -> list[Mapping]:
    return mappings(gw)
