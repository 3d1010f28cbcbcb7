"""The glues of the RPC client core over real loopback sockets: the asyncio ``RpcClient``
(many calls in flight, replies out of order, cancellation, a server that goes away), the
portmapper client the gateway registers with, and the tests' blocking client."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from functools import partial

import pytest

from gateway import pmap_client
from gateway.rpcclient import RpcClient
from nfsproto import portmap, rpc
from nfsproto.client import CallSpec, RpcError
from nfsproto.xdr import Reader, Writer
from tests.harness.thread import LoopThread
from tests.rpcclient import BlockingRpcClient

PROG, VERS = 0x20000099, 1
ECHO, HOLD, RELEASE, SILENT = 1, 2, 3, 4


class FakeServer:
    """Answers PROG: ECHO returns its u32 argument; HOLD calls are answered, in reverse order,
    when RELEASE comes; SILENT is never answered; other procedures get PROC_UNAVAIL. With
    ``pmap``, serves PMAP SET/UNSET (recorded) and GETPORT (from what was SET)."""

    def __init__(self) -> None:
        self.held: list[tuple[int, int]] = []
        self.mappings: dict[tuple[int, int], int] = {}
        self.pmap_calls: list[tuple[int, rpc.OpaqueAuth]] = []
        self.writers: list[asyncio.StreamWriter] = []
        self.server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> FakeServer:
        self.server = await asyncio.start_server(self._conn, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        assert self.server is not None
        self.server.close()
        for w in self.writers:
            w.close()
        await self.server.wait_closed()

    def _answer(self, xid: int, pack: Callable[[Writer], None] | None) -> bytes:
        w = Writer()
        if pack is None:
            rpc.pack_accepted_reply(w, xid, rpc.AcceptStat.PROC_UNAVAIL)
        else:
            rpc.pack_success_header(w, xid)
            pack(w)
        return b"".join(bytes(b) for b in rpc.frame(w.buffers()))

    async def _conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.append(writer)
        records = rpc.RecordReader()
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                for rec in records.feed(data):
                    writer.write(self._handle(Reader(bytes(rec))))

    def _handle(self, r: Reader) -> bytes:
        h = rpc.unpack_call(r)
        if h.prog == portmap.PROGRAM:
            self.pmap_calls.append((h.proc, h.cred))
            if h.proc == portmap.PmapProc.GETPORT:
                m = portmap.unpack_mapping(r)
                port = self.mappings.get((m.prog, m.vers), 0)
                return self._answer(h.xid, lambda w: portmap.pack_port(w, port))
            m = portmap.unpack_mapping(r)
            if h.proc == portmap.PmapProc.SET:
                self.mappings[(m.prog, m.vers)] = m.port
            else:
                self.mappings.pop((m.prog, m.vers), None)
            return self._answer(h.xid, lambda w: portmap.pack_bool(w, True))
        if h.proc == ECHO:
            v = r.u32()
            return self._answer(h.xid, lambda w: w.u32(v))
        if h.proc == HOLD:
            self.held.append((h.xid, r.u32()))
            return b""
        if h.proc == RELEASE:
            out = b"".join(self._answer(x, partial(_u32, v=v)) for x, v in self.held[::-1])
            self.held.clear()
            return out + self._answer(h.xid, lambda w: None)
        if h.proc == SILENT:
            return b""
        return self._answer(h.xid, None)


def _u32(w: Writer, v: int) -> None:
    w.u32(v)


def _void(w: Writer, v: None) -> None:
    pass


def _unpack_u32(r: Reader) -> int:
    return r.u32()


def _unpack_void(r: Reader) -> None:
    return None


@pytest.fixture
async def server() -> AsyncIterator[FakeServer]:
    s = await FakeServer().start()
    try:
        yield s
    finally:
        await s.close()


async def test_many_calls_in_flight_answered_out_of_order(server: FakeServer) -> None:
    c = await RpcClient.connect("127.0.0.1", server.port)
    try:
        held = [
            asyncio.create_task(c.call(PROG, VERS, HOLD, _u32, i, _unpack_u32)) for i in range(50)
        ]
        await asyncio.sleep(0)  # the 50 calls are written, in order, before the next one
        assert await c.call(PROG, VERS, ECHO, _u32, 7, _unpack_u32) == 7
        assert len(server.held) == 50 and not any(t.done() for t in held)  # still waiting
        await c.call(PROG, VERS, RELEASE, _void, None, _unpack_void)
        assert await asyncio.gather(*held) == list(range(50))
    finally:
        await c.close()


async def test_refusals_raw_calls_and_a_cancelled_call(server: FakeServer) -> None:
    c = await RpcClient.connect("127.0.0.1", server.port, cred=rpc.NULL_AUTH)
    try:
        with pytest.raises(RpcError, match="PROC_UNAVAIL"):
            await c.call(PROG, VERS, 99, _void, None, _unpack_void)
        h, r = await c.call_raw(PROG, VERS, ECHO, b"\0\0\0\x05")
        assert h.accept_stat == rpc.AcceptStat.SUCCESS and r.u32() == 5
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.05):
                await c.call(PROG, VERS, SILENT, _void, None, _unpack_void)
        assert await c.call(PROG, VERS, ECHO, _u32, 8, _unpack_u32) == 8
        assert await c.invoke(CallSpec(PROG, VERS, ECHO, _u32, _unpack_u32), 9) == 9
    finally:
        await c.close()


async def test_a_lost_connection_fails_every_waiting_call(server: FakeServer) -> None:
    c = await RpcClient.connect("127.0.0.1", server.port)
    try:
        waiting = [
            asyncio.create_task(c.call(PROG, VERS, SILENT, _void, None, _unpack_void))
            for _ in range(3)
        ]
        await asyncio.sleep(0.05)
        await server.close()
        for t in waiting:
            with pytest.raises(ConnectionError):
                await t
        assert c.closed
        with pytest.raises(ConnectionError):
            await c.call(PROG, VERS, ECHO, _u32, 1, _unpack_u32)
    finally:
        await c.close()


async def test_registering_with_a_portmapper(server: FakeServer) -> None:
    m = portmap.Mapping(100003, 3, portmap.IPPROTO_TCP, 2049)
    assert await pmap_client.set_mapping("127.0.0.1", server.port, m)
    assert await pmap_client.getport("127.0.0.1", server.port, 100003, 3) == 2049
    assert await pmap_client.unset_mapping("127.0.0.1", server.port, m)
    assert await pmap_client.getport("127.0.0.1", server.port, 100003, 3) == 0
    procs = [p for p, _ in server.pmap_calls]
    assert procs == [portmap.PmapProc.UNSET, portmap.PmapProc.SET, 3, 2, 3]
    # rpcbind accepts SET/UNSET from root only
    sys_cred = rpc.unpack_auth_sys(server.pmap_calls[1][1].body)
    assert (sys_cred.uid, sys_cred.gid) == (0, 0)


def test_the_blocking_client() -> None:
    lt = LoopThread("fake-rpc").start()
    try:
        server = lt.run(FakeServer().start())
        with BlockingRpcClient("127.0.0.1", server.port, timeout_s=5) as c:
            assert c.call(PROG, VERS, ECHO, _u32, 9, _unpack_u32) == 9
            assert c.invoke(CallSpec(PROG, VERS, ECHO, _u32, _unpack_u32), 8) == 8
            h, _ = c.call_raw(PROG, VERS, 99)
            assert h.accept_stat == rpc.AcceptStat.PROC_UNAVAIL
            with pytest.raises(RpcError):
                c.call(PROG, VERS, 99, _void, None, _unpack_void)
            c.sock.settimeout(0.1)
            with pytest.raises(TimeoutError):
                c.call(PROG, VERS, SILENT, _void, None, _unpack_void)
            c.sock.settimeout(5)
            assert c.call(PROG, VERS, ECHO, _u32, 10, _unpack_u32) == 10
            lt.run(server.close())
            with pytest.raises(ConnectionError):
                c.call(PROG, VERS, ECHO, _u32, 11, _unpack_u32)
    finally:
        lt.close()
