"""A portmapper (PMAP v2, RFC 1833) client over TCP, one connection per call: registering our
programs with a system rpcbind that already owns port 111 (SET/UNSET, AUTH_SYS uid 0 as
rpcbind requires), and asking one for a program's port (GETPORT, the load generator).

Owns: the PMAP calls and their bound in time. Must not: keep connections open.
Errors: ``OSError``/``TimeoutError`` from the connection, ``nfsproto.client.RpcError`` when
the portmapper refuses the call.
"""

from __future__ import annotations

from gateway.rpcclient import call_once
from nfsproto import portmap, rpc
from nfsproto.client import PMAP_GETPORT, PMAP_SET, PMAP_UNSET

__all__ = ["getport", "set_mapping", "unset_mapping"]

TIMEOUT_S = 5.0
CRED = rpc.auth_sys(0, 0, [], b"nfsgw")


async def set_mapping(host: str, port: int, m: portmap.Mapping) -> bool:
    # Replace a stale registration of a previous run first.
    await call_once(host, port, PMAP_UNSET, m, cred=CRED, timeout_s=TIMEOUT_S)
    return await call_once(host, port, PMAP_SET, m, cred=CRED, timeout_s=TIMEOUT_S)


async def unset_mapping(host: str, port: int, m: portmap.Mapping) -> bool:
    return await call_once(host, port, PMAP_UNSET, m, cred=CRED, timeout_s=TIMEOUT_S)


async def getport(host: str, port: int, prog: int, vers: int) -> int:
    """The TCP port of (prog, vers) registered with the portmapper at ``host:port`` (0: not
    registered)."""
    m = portmap.Mapping(prog, vers, portmap.IPPROTO_TCP, 0)
    return await call_once(host, port, PMAP_GETPORT, m, cred=CRED, timeout_s=TIMEOUT_S)
