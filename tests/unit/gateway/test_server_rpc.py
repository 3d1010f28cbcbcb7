"""The server's RPC surface over real TCP on 127.0.0.1, with the in-memory backend: RPC-level
errors (RFC 5531), MOUNT, PORTMAP, many calls in flight with out-of-order replies, the
in-flight bound, oversized records, bad handles and read-only exports."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.backend.base import ObjectStore, RequestObserver
from gateway.backend.memory import MemoryStore
from gateway.exports import ExportConfig
from gateway.ops.config import ServerConfig
from gateway.ops.server import Server
from gateway.rpcclient import RpcClient
from nfsproto import mount3, nfs3, portmap, rpc
from nfsproto.nfs3 import Nfs3Proc, NfsStat3
from nfsproto.rpc import AcceptStat, AuthStat, ReplyStat
from nfsproto.xdr import Writer

P = nfs3.PROCS


class Env:
    def __init__(self, server: Server, store: MemoryStore) -> None:
        self.server = server
        self.store = store

    async def client(self) -> RpcClient:
        return await RpcClient.connect("127.0.0.1", self.server.port)

    async def mount(self, c: RpcClient, path: bytes = b"/data") -> bytes:
        res = await c.call(
            mount3.PROGRAM,
            3,
            mount3.MountProc.MNT,
            mount3.pack_mnt3args,
            mount3.Mnt3Args(path),
            mount3.unpack_mnt3res,
        )
        assert res.status == mount3.MountStat3.MNT3_OK
        return res.fhandle

    async def nfs(self, c: RpcClient, proc: Nfs3Proc, args: object) -> object:
        codec = P[proc]
        return await c.call(nfs3.PROGRAM, 3, proc, codec.pack_args, args, codec.unpack_res)  # type: ignore[arg-type]


@contextlib.asynccontextmanager
async def _env(tmp_path: Path, store: MemoryStore, **kw: object) -> AsyncIterator[Env]:
    exports = (
        ExportConfig("/data", "s3://bucket/ds/", read_only=True),
        ExportConfig("/other", "s3://bucket/other/"),
    )
    cfg = ServerConfig.of(
        exports,
        server_listen="127.0.0.1",
        server_port=0,
        server_state_dir=tmp_path / "state",
        cache_memory=64 << 20,
        **kw,
    )

    def factory(ec: ExportConfig, obs: RequestObserver) -> ObjectStore:
        store.observer = obs
        return store

    server = Server(cfg, store_factory=factory)
    await server.start()
    try:
        yield Env(server, store)
    finally:
        await server.stop(drain_timeout_s=2)


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    store = MemoryStore("mem")
    for i in range(5):
        store.seed(f"ds/class0/img{i}.jpg", bytes([i]) * (1000 + i))
    store.seed("ds/readme.txt", b"hello\n")
    async with _env(tmp_path, store) as e:
        yield e


def _args(pack: object, v: object) -> bytes:
    w = Writer()
    pack(w, v)  # type: ignore[operator]
    return w.getvalue()


async def test_null_on_every_program(env: Env) -> None:
    c = await env.client()
    for prog, vers in ((nfs3.PROGRAM, 3), (mount3.PROGRAM, 3), (portmap.PROGRAM, 2)):
        h, r = await c.call_raw(prog, vers, 0, b"")
        assert h.accept_stat == AcceptStat.SUCCESS and r.remaining() == 0
    await c.close()


async def test_rpc_level_errors(env: Env) -> None:
    c = await env.client()
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
    assert env.server.metrics.calls["rpc_error.rpc_mismatch"] == 1
    await c.close()


async def test_mount_and_portmap(env: Env) -> None:
    c = await env.client()
    root = await env.mount(c)
    res = await c.call(
        mount3.PROGRAM,
        3,
        mount3.MountProc.MNT,
        mount3.pack_mnt3args,
        mount3.Mnt3Args(b"/nope"),
        mount3.unpack_mnt3res,
    )
    assert res.status == mount3.MountStat3.MNT3ERR_NOENT
    sub = await c.call(
        mount3.PROGRAM,
        3,
        mount3.MountProc.MNT,
        mount3.pack_mnt3args,
        mount3.Mnt3Args(b"/data/class0"),
        mount3.unpack_mnt3res,
    )
    assert sub.status == mount3.MountStat3.MNT3_OK and sub.fhandle != root
    exports = await c.call(
        mount3.PROGRAM, 3, mount3.MountProc.EXPORT, lambda w, v: None, None, mount3.unpack_exports
    )
    assert [e.dir for e in exports] == [b"/data", b"/other"]
    dump = await c.call(
        mount3.PROGRAM, 3, mount3.MountProc.DUMP, lambda w, v: None, None, mount3.unpack_mountlist
    )
    assert {m.directory for m in dump} == {b"/data", b"/data/class0"}
    for prog in (nfs3.PROGRAM, mount3.PROGRAM):
        port = await c.call(
            portmap.PROGRAM,
            2,
            portmap.PmapProc.GETPORT,
            portmap.pack_mapping,
            portmap.Mapping(prog, 3, portmap.IPPROTO_TCP, 0),
            portmap.unpack_port,
        )
        assert port == env.server.port
    assert (
        await c.call(
            portmap.PROGRAM,
            2,
            portmap.PmapProc.GETPORT,
            portmap.pack_mapping,
            portmap.Mapping(100227, 3, portmap.IPPROTO_TCP, 0),
            portmap.unpack_port,
        )
        == 0
    )
    assert not await c.call(
        portmap.PROGRAM,
        2,
        portmap.PmapProc.SET,
        portmap.pack_mapping,
        portmap.Mapping(1234, 1, 6, 99),
        portmap.unpack_bool,
    )
    await c.close()


async def test_lookup_read_readdirplus(env: Env) -> None:
    c = await env.client()
    root = await env.mount(c)
    res = await env.nfs(c, Nfs3Proc.LOOKUP, nfs3.Lookup3Args(nfs3.Diropargs3(root, b"class0")))
    assert isinstance(res, nfs3.Lookup3Res) and res.status == NfsStat3.NFS3_OK
    d = res.object
    names = []
    cookie, verf = 0, bytes(8)
    while True:
        rp = await env.nfs(
            c, Nfs3Proc.READDIRPLUS, nfs3.Readdirplus3Args(d, cookie, verf, 512, 1024)
        )
        assert isinstance(rp, nfs3.Readdirplus3Res) and rp.status == NfsStat3.NFS3_OK
        names += [e.name for e in rp.entries]
        if rp.eof:
            break
        cookie, verf = rp.entries[-1].cookie, rp.cookieverf
    assert names == [b".", b".."] + [b"img%d.jpg" % i for i in range(5)]
    lk = await env.nfs(c, Nfs3Proc.LOOKUP, nfs3.Lookup3Args(nfs3.Diropargs3(d, b"img3.jpg")))
    assert isinstance(lk, nfs3.Lookup3Res)
    rd = await env.nfs(c, Nfs3Proc.READ, nfs3.Read3Args(lk.object, 1000, 100))
    assert isinstance(rd, nfs3.Read3Res) and rd.status == NfsStat3.NFS3_OK
    assert bytes(rd.data) == b"\x03" * 3 and rd.eof
    missing = await env.nfs(c, Nfs3Proc.LOOKUP, nfs3.Lookup3Args(nfs3.Diropargs3(d, b"zz")))
    assert isinstance(missing, nfs3.Lookup3Res)
    assert missing.status == NfsStat3.NFS3ERR_NOENT and missing.dir_attributes is not None
    # one listing for the root, one for class0, one GET: nothing else
    assert env.store.requests == {"list": 2, "get": 1}
    await c.close()


async def test_bad_handles_and_read_only(env: Env) -> None:
    c = await env.client()
    root = await env.mount(c)
    forged = bytearray(root)
    forged[-1] ^= 1
    for fh in (bytes(forged), b"", b"\x01" * 64, root[:5]):
        res = await env.nfs(c, Nfs3Proc.GETATTR, nfs3.Getattr3Args(fh))
        assert isinstance(res, nfs3.Getattr3Res)
        assert res.status == NfsStat3.NFS3ERR_BADHANDLE, fh
    lk = await env.nfs(c, Nfs3Proc.LOOKUP, nfs3.Lookup3Args(nfs3.Diropargs3(root, b"readme.txt")))
    assert isinstance(lk, nfs3.Lookup3Res)
    wr = await env.nfs(
        c, Nfs3Proc.WRITE, nfs3.Write3Args(lk.object, 0, 3, nfs3.StableHow.FILE_SYNC, b"abc")
    )
    assert isinstance(wr, nfs3.Write3Res) and wr.status == NfsStat3.NFS3ERR_ROFS
    assert wr.file_wcc.after is not None and wr.file_wcc.after.size == 6
    assert wr.file_wcc.before is not None and wr.file_wcc.before.size == 6
    rm = await env.nfs(c, Nfs3Proc.REMOVE, nfs3.Remove3Args(nfs3.Diropargs3(root, b"readme.txt")))
    assert isinstance(rm, nfs3.Remove3Res) and rm.status == NfsStat3.NFS3ERR_ROFS
    assert rm.dir_wcc.after is not None
    acc = await env.nfs(c, Nfs3Proc.ACCESS, nfs3.Access3Args(lk.object, 0x3F))
    assert isinstance(acc, nfs3.Access3Res)
    assert acc.access == nfs3.ACCESS3_READ  # root squashed to nobody; 0644; read-only
    # the object vanished from the bucket: after a re-list the handle is STALE
    env.store.unseed("ds/readme.txt")
    env.server.gateway.exports[next(iter(env.server.gateway.exports))].ns.invalidate("")  # type: ignore[union-attr]
    ga = await env.nfs(c, Nfs3Proc.GETATTR, nfs3.Getattr3Args(lk.object))
    assert isinstance(ga, nfs3.Getattr3Res) and ga.status == NfsStat3.NFS3ERR_STALE
    await c.close()


async def test_replies_out_of_order_and_inflight_bound(tmp_path: Path) -> None:
    store = MemoryStore("mem", latency_s={"get": 0.3})
    store.seed("ds/slow.bin", b"s" * 100)
    for i in range(40):
        store.seed(f"ds/f{i}", b"x")
    async with _env(tmp_path, store, server_max_inflight_per_conn=4) as env:
        c = await env.client()
        root = await env.mount(c)
        lk = await env.nfs(c, Nfs3Proc.LOOKUP, nfs3.Lookup3Args(nfs3.Diropargs3(root, b"slow.bin")))
        assert isinstance(lk, nfs3.Lookup3Res)
        order: list[str] = []

        async def read() -> None:
            await env.nfs(c, Nfs3Proc.READ, nfs3.Read3Args(lk.object, 0, 100))
            order.append("read")

        async def getattr_() -> None:
            await env.nfs(c, Nfs3Proc.GETATTR, nfs3.Getattr3Args(root))
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
            r = await env.nfs(
                c, Nfs3Proc.LOOKUP, nfs3.Lookup3Args(nfs3.Diropargs3(root, b"f%d" % i))
            )
            assert isinstance(r, nfs3.Lookup3Res)
            handles.append(r.object)
        peak = 0
        orig_begin = store._begin

        async def counting_begin(op: str, key: str) -> None:
            nonlocal peak
            peak = max(peak, env.server.conn_stats.inflight)
            await orig_begin(op, key)

        store._begin = counting_begin  # type: ignore[method-assign]
        res = await asyncio.gather(
            *(env.nfs(c, Nfs3Proc.READ, nfs3.Read3Args(h, 0, 10)) for h in handles)
        )
        assert all(isinstance(x, nfs3.Read3Res) and bytes(x.data) == b"x" for x in res)
        assert 1 <= peak <= 4
        await c.close()


async def test_oversized_record_closes_only_that_connection(env: Env) -> None:
    good = await env.client()
    bad = await env.client()
    bad.send_raw(rpc.record_header(env.server.config.server.transport.max_record + 1))
    for _ in range(50):
        if bad.closed:
            break
        await asyncio.sleep(0.02)
    assert bad.closed
    h, _ = await good.call_raw(nfs3.PROGRAM, 3, 0, b"")
    assert h.accept_stat == AcceptStat.SUCCESS
    assert env.server.conn_stats.oversized == 1
    await good.close()
    await bad.close()
