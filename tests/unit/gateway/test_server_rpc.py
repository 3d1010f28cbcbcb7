"""The server's RPC surface with the in-memory backend: RPC-level errors (RFC 5531), MOUNT,
PORTMAP, bad handles and read-only exports, called straight into the dispatcher
(``tests.harness.memory``); and over real TCP on 127.0.0.1 what only a connection shows: a
connection serving on after RPC-level errors, many calls in flight with out-of-order
replies, the in-flight bound, oversized records."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gateway.backend.memory import MemoryStore
from gateway.exports import ExportConfig
from nfsproto import mount3, nfs3, portmap, rpc
from nfsproto.nfs3 import Nfs3Proc, NfsStat3
from nfsproto.rpc import AcceptStat, AuthStat, ReplyStat
from nfsproto.xdr import Writer
from tests.harness.memory import MemoryGateway

EXPORTS = (  # reached over TCP from unprivileged ports too: they say insecure
    ExportConfig("/data", "s3://bucket/ds/", read_only=True, insecure=True),
    ExportConfig("/other", "s3://bucket/other/", insecure=True),
)


def _gateway(tmp_path: Path, store: MemoryStore, **settings: Any) -> MemoryGateway:
    return MemoryGateway.of(tmp_path, EXPORTS, store=store, **settings)


@pytest.fixture
async def gw(tmp_path: Path) -> AsyncIterator[MemoryGateway]:
    store = MemoryStore("mem")
    for i in range(5):
        store.seed(f"ds/class0/img{i}.jpg", bytes([i]) * (1000 + i))
    store.seed("ds/readme.txt", b"hello\n")
    async with _gateway(tmp_path, store) as g:
        yield g


async def test_null_on_every_program(gw: MemoryGateway) -> None:
    for prog, vers in ((nfs3.PROGRAM, 3), (mount3.PROGRAM, 3), (portmap.PROGRAM, 2)):
        h, r = await gw.call_raw(prog, vers, 0, b"")
        assert h.accept_stat == AcceptStat.SUCCESS and r.remaining() == 0


async def test_rpc_level_errors(gw: MemoryGateway) -> None:
    c = await gw.connect()
    h, _ = await c.call_raw(100227, 3, 0, b"")  # NFSACL: turns the client's GETACLs off
    assert h.accept_stat == AcceptStat.PROG_UNAVAIL
    h, _ = await c.call_raw(nfs3.PROGRAM, 2, 0, b"")
    assert h.accept_stat == AcceptStat.PROG_MISMATCH and (h.mismatch_low, h.mismatch_high) == (3, 3)
    h, _ = await c.call_raw(nfs3.PROGRAM, 3, 22, b"")
    assert h.accept_stat == AcceptStat.PROC_UNAVAIL
    h, _ = await c.call_raw(portmap.PROGRAM, 2, portmap.PmapProc.CALLIT, b"")
    assert h.accept_stat == AcceptStat.PROC_UNAVAIL
    h, _ = await c.call_raw(nfs3.PROGRAM, 3, Nfs3Proc.GETATTR, b"\x00\x00\x00\x40")  # truncated
    assert h.accept_stat == AcceptStat.GARBAGE_ARGS
    # 17 gids, an over-long machine name: AUTH_BADCRED; an unsupported flavour: AUTH_TOOWEAK
    w = Writer()
    w.u32(0)
    w.string(b"m")
    w.u32(0)
    w.u32(0)
    w.u32(17)
    for g in range(17):
        w.u32(g)
    bad = rpc.OpaqueAuth(rpc.AuthFlavor.AUTH_SYS, w.getvalue())
    h, _ = await c.call_raw(nfs3.PROGRAM, 3, 0, b"", cred=bad)
    assert h.stat == ReplyStat.MSG_DENIED and h.auth_stat == AuthStat.AUTH_BADCRED
    w = Writer()
    w.u32(0)
    w.string(b"m" * 256)
    w.raw(bytes(12))
    h, _ = await c.call_raw(
        nfs3.PROGRAM, 3, 1, b"", cred=rpc.OpaqueAuth(rpc.AuthFlavor.AUTH_SYS, w.getvalue())
    )
    assert h.auth_stat == AuthStat.AUTH_BADCRED
    h, _ = await c.call_raw(nfs3.PROGRAM, 3, 1, b"", cred=rpc.OpaqueAuth(6, b"gss"))
    assert h.auth_stat == AuthStat.AUTH_TOOWEAK
    # rpcvers 3: RPC_MISMATCH, answered with the xid
    c.send_raw(rpc.record_header(24) + bytes.fromhex("0000abcd0000000000000003") + bytes(12))
    await asyncio.sleep(0.05)
    # the connection still serves calls after all of the above
    h, _ = await c.call_raw(nfs3.PROGRAM, 3, 0, b"")
    assert h.accept_stat == AcceptStat.SUCCESS
    assert gw.server.metrics.calls["rpc_error.rpc_mismatch"] == 1
    await c.close()


async def test_mount_and_portmap(gw: MemoryGateway) -> None:
    root = await gw.mount(b"/data")
    res = await gw.mnt(b"/nope")
    assert res.status == mount3.MountStat3.MNT3ERR_ACCES  # no export: answered as a refused one
    sub = await gw.mnt(b"/data/class0")
    assert sub.status == mount3.MountStat3.MNT3_OK and sub.fhandle != root
    exports = await gw.call(
        mount3.PROGRAM, 3, mount3.MountProc.EXPORT, lambda w, v: None, None, mount3.unpack_exports
    )
    assert [e.dir for e in exports] == [b"/data", b"/other"]
    dump = await gw.call(
        mount3.PROGRAM, 3, mount3.MountProc.DUMP, lambda w, v: None, None, mount3.unpack_mountlist
    )
    assert {m.directory for m in dump} == {b"/data", b"/data/class0"}
    for prog in (nfs3.PROGRAM, mount3.PROGRAM):
        port = await gw.call(
            portmap.PROGRAM,
            2,
            portmap.PmapProc.GETPORT,
            portmap.pack_mapping,
            portmap.Mapping(prog, 3, portmap.IPPROTO_TCP, 0),
            portmap.unpack_port,
        )
        assert port == gw.port
    assert (
        await gw.call(
            portmap.PROGRAM,
            2,
            portmap.PmapProc.GETPORT,
            portmap.pack_mapping,
            portmap.Mapping(100227, 3, portmap.IPPROTO_TCP, 0),
            portmap.unpack_port,
        )
        == 0
    )
    assert not await gw.call(
        portmap.PROGRAM,
        2,
        portmap.PmapProc.SET,
        portmap.pack_mapping,
        portmap.Mapping(1234, 1, 6, 99),
        portmap.unpack_bool,
    )


async def test_lookup_read_readdirplus(gw: MemoryGateway) -> None:
    root = await gw.mount(b"/data")
    res = await gw.nfs(Nfs3Proc.LOOKUP, nfs3.Lookup3Args(nfs3.Diropargs3(root, b"class0")))
    assert isinstance(res, nfs3.Lookup3Res) and res.status == NfsStat3.NFS3_OK
    d = res.object
    names = []
    cookie, verf = 0, bytes(8)
    while True:
        rp = await gw.nfs(Nfs3Proc.READDIRPLUS, nfs3.Readdirplus3Args(d, cookie, verf, 512, 1024))
        assert isinstance(rp, nfs3.Readdirplus3Res) and rp.status == NfsStat3.NFS3_OK
        names += [e.name for e in rp.entries]
        if rp.eof:
            break
        cookie, verf = rp.entries[-1].cookie, rp.cookieverf
    assert names == [b".", b".."] + [b"img%d.jpg" % i for i in range(5)]
    lk = await gw.nfs(Nfs3Proc.LOOKUP, nfs3.Lookup3Args(nfs3.Diropargs3(d, b"img3.jpg")))
    assert isinstance(lk, nfs3.Lookup3Res)
    rd = await gw.nfs(Nfs3Proc.READ, nfs3.Read3Args(lk.object, 1000, 100))
    assert isinstance(rd, nfs3.Read3Res) and rd.status == NfsStat3.NFS3_OK
    assert bytes(rd.data) == b"\x03" * 3 and rd.eof
    missing = await gw.nfs(Nfs3Proc.LOOKUP, nfs3.Lookup3Args(nfs3.Diropargs3(d, b"zz")))
    assert isinstance(missing, nfs3.Lookup3Res)
    assert missing.status == NfsStat3.NFS3ERR_NOENT and missing.dir_attributes is not None
    # one listing for the root, one for class0, one GET: nothing else
    assert gw.store.requests == {"list": 2, "get": 1}


async def test_bad_handles_and_read_only(gw: MemoryGateway) -> None:
    root = await gw.mount(b"/data")
    forged = bytearray(root)
    forged[-1] ^= 1
    for fh in (bytes(forged), b"", b"\x01" * 64, root[:5]):
        res = await gw.nfs(Nfs3Proc.GETATTR, nfs3.Getattr3Args(fh))
        assert isinstance(res, nfs3.Getattr3Res)
        assert res.status == NfsStat3.NFS3ERR_BADHANDLE, fh
    lk = await gw.nfs(Nfs3Proc.LOOKUP, nfs3.Lookup3Args(nfs3.Diropargs3(root, b"readme.txt")))
    assert isinstance(lk, nfs3.Lookup3Res)
    wr = await gw.nfs(
        Nfs3Proc.WRITE, nfs3.Write3Args(lk.object, 0, 3, nfs3.StableHow.FILE_SYNC, b"abc")
    )
    assert isinstance(wr, nfs3.Write3Res) and wr.status == NfsStat3.NFS3ERR_ROFS
    assert wr.file_wcc.after is not None and wr.file_wcc.after.size == 6
    assert wr.file_wcc.before is not None and wr.file_wcc.before.size == 6
    rm = await gw.nfs(Nfs3Proc.REMOVE, nfs3.Remove3Args(nfs3.Diropargs3(root, b"readme.txt")))
    assert isinstance(rm, nfs3.Remove3Res) and rm.status == NfsStat3.NFS3ERR_ROFS
    assert rm.dir_wcc.after is not None
    acc = await gw.nfs(Nfs3Proc.ACCESS, nfs3.Access3Args(lk.object, 0x3F))
    assert isinstance(acc, nfs3.Access3Res)
    assert acc.access == nfs3.ACCESS3_READ  # root squashed to nobody; 0644; read-only
    # the object vanished from the bucket: after a re-list the handle is STALE
    gw.store.unseed("ds/readme.txt")
    gw.export("/data").ns.invalidate("")
    ga = await gw.nfs(Nfs3Proc.GETATTR, nfs3.Getattr3Args(lk.object))
    assert isinstance(ga, nfs3.Getattr3Res) and ga.status == NfsStat3.NFS3ERR_STALE


async def test_replies_out_of_order_and_inflight_bound(tmp_path: Path) -> None:
    store = MemoryStore("mem", latency_s={"get": 0.3})
    store.seed("ds/slow.bin", b"s" * 100)
    for i in range(40):
        store.seed(f"ds/f{i}", b"x")
    async with _gateway(tmp_path, store, server_max_inflight_per_conn=4) as gw:
        c = await gw.connect()
        root = await c.mount(b"/data")
        lk = await c.nfs(Nfs3Proc.LOOKUP, nfs3.Lookup3Args(nfs3.Diropargs3(root, b"slow.bin")))
        assert isinstance(lk, nfs3.Lookup3Res)
        order: list[str] = []

        async def read() -> None:
            await c.nfs(Nfs3Proc.READ, nfs3.Read3Args(lk.object, 0, 100))
            order.append("read")

        async def getattr_() -> None:
            await c.nfs(Nfs3Proc.GETATTR, nfs3.Getattr3Args(root))
            order.append("getattr")

        t = asyncio.create_task(read())
        await asyncio.sleep(0.02)
        await getattr_()
        await t
        assert order == ["getattr", "read"]  # the later call's reply overtook the slow one

        # 40 slow READs pipelined on one connection with max 4 in flight: the store never
        # sees more than 4 concurrent GETs, and every call is answered.
        handles = []
        for i in range(40):
            r = await c.nfs(Nfs3Proc.LOOKUP, nfs3.Lookup3Args(nfs3.Diropargs3(root, b"f%d" % i)))
            assert isinstance(r, nfs3.Lookup3Res)
            handles.append(r.object)
        peak = 0
        orig_begin = store._begin

        async def counting_begin(op: str, key: str) -> None:
            nonlocal peak
            peak = max(peak, gw.server.conn_stats.inflight)
            await orig_begin(op, key)

        store._begin = counting_begin  # type: ignore[method-assign]
        res = await asyncio.gather(
            *(c.nfs(Nfs3Proc.READ, nfs3.Read3Args(h, 0, 10)) for h in handles)
        )
        assert all(isinstance(x, nfs3.Read3Res) and bytes(x.data) == b"x" for x in res)
        assert 1 <= peak <= 4
        await c.close()


async def test_oversized_record_closes_only_that_connection(gw: MemoryGateway) -> None:
    good = await gw.connect()
    bad = await gw.connect()
    bad.send_raw(rpc.record_header(gw.server.config.server.transport.max_record + 1))
    for _ in range(50):
        if bad.closed:
            break
        await asyncio.sleep(0.02)
    assert bad.closed
    h, _ = await good.call_raw(nfs3.PROGRAM, 3, 0, b"")
    assert h.accept_stat == AcceptStat.SUCCESS
    assert gw.server.conn_stats.oversized == 1
    await good.close()
    await bad.close()
