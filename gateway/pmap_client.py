"""A minimal one-shot ONC RPC client over TCP, used to register our programs with a system
rpcbind that already owns port 111 (PMAP SET/UNSET, AUTH_SYS uid 0 as rpcbind requires)."""

from __future__ import annotations

import asyncio
import os

from nfsproto import portmap, rpc
from nfsproto.xdr import Reader, Writer, XdrError

TIMEOUT_S = 5.0


async def call(host: str, port: int, prog: int, vers: int, proc: int, args: bytes) -> Reader:
    """One call; returns a Reader positioned at the results. Raises OSError/TimeoutError, or
    XdrError when the reply is not an accepted SUCCESS."""
    xid = int.from_bytes(os.urandom(4), "big")
    w = Writer()
    rpc.pack_call(w, xid, prog, vers, proc, rpc.auth_sys(0, 0, [], b"nfsgw"))
    w.raw(args)
    async with asyncio.timeout(TIMEOUT_S):
        reader, writer = await asyncio.open_connection(host, port)
        try:
            writer.writelines(rpc.frame(w.buffers()))
            await writer.drain()
            rr = rpc.RecordReader(1 << 20)
            while True:
                chunk = await reader.read(65536)
                if not chunk:
                    raise ConnectionError("connection closed before the reply")
                recs = rr.feed(chunk)
                if recs:
                    break
        finally:
            writer.close()
    r = Reader(recs[0])
    h = rpc.unpack_reply(r)
    if h.xid != xid or h.accept_stat != rpc.AcceptStat.SUCCESS:
        raise XdrError(f"rpc call failed: {h}")
    return r


async def _set(host: str, port: int, m: portmap.Mapping, proc: int) -> bool:
    w = Writer()
    portmap.pack_mapping(w, m)
    r = await call(host, port, portmap.PROGRAM, portmap.VERSION, proc, w.getvalue())
    return portmap.unpack_bool(r)


async def set_mapping(host: str, port: int, m: portmap.Mapping) -> bool:
    # Replace a stale registration of a previous run first.
    await _set(host, port, m, portmap.PmapProc.UNSET)
    return await _set(host, port, m, portmap.PmapProc.SET)


async def unset_mapping(host: str, port: int, m: portmap.Mapping) -> bool:
    return await _set(host, port, m, portmap.PmapProc.UNSET)


async def getport(host: str, port: int, prog: int, vers: int) -> int:
    w = Writer()
    portmap.pack_mapping(w, portmap.Mapping(prog, vers, portmap.IPPROTO_TCP, 0))
    r = await call(
        host, port, portmap.PROGRAM, portmap.VERSION, portmap.PmapProc.GETPORT, w.getvalue()
    )
    return portmap.unpack_port(r)
