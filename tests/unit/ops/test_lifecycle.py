"""Life cycle: SIGTERM-style stop drains in-flight calls (and gives up at the deadline),
SIGHUP reload from the file (good, bad and restart-only changes), signals in process, and the
connection limit."""

from __future__ import annotations

import asyncio
import ipaddress
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.exports import ExportConfig
from gateway.ops.configfile import load_config
from nfsproto import mount3
from nfsproto.nfs3 import NfsStat3
from tests.harness.memory import MemoryGateway
from tests.harness.stores import Gate, GatedStore

OK = NfsStat3.NFS3_OK


async def _until(cond: Any) -> None:
    async with asyncio.timeout(10):
        while not cond():  # noqa: ASYNC110 (polls server state the test cannot await)
            await asyncio.sleep(0.001)


async def _refused(port: int) -> bool:
    try:
        _, w = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return True
    w.close()
    return False


@pytest.fixture
def store() -> Iterator[GatedStore]:
    s = GatedStore()
    yield s
    s.release()


@pytest.fixture
def gate(store: GatedStore) -> Gate:
    """``store``'s GETs wait for it."""
    return store.hold("get")


async def test_stop_drains_in_flight_calls(tmp_path: Path, store: GatedStore, gate: Gate) -> None:
    exports = [ExportConfig("/data", "s3://b/d/", insecure=True)]  # TCP, unprivileged port
    files = {"d/f": b"payload"}
    async with MemoryGateway.of(tmp_path, exports, store=store, files=files) as gw:
        server = gw.server
        c = await gw.connect()
        root = await c.mount(b"/data")
        f = await c.lookup(root, b"f")
        read = asyncio.create_task(c.read(f.object))
        await _until(lambda: server.conn_stats.inflight == 1)
        stop = asyncio.create_task(server.stop(drain_timeout_s=60))
        await _until(lambda: server.stopping)
        await _until(lambda: stop.done() or all(not s.is_serving() for s in server._servers))
        assert await _refused(server.port)  # no new connections while draining
        assert not read.done() and not stop.done()
        gate.open()
        res = await read
        assert res.status == OK and bytes(res.data) == b"payload"
        await stop
        assert not server.connections and server.conn_stats.open == 0


async def test_stop_gives_up_at_the_deadline(tmp_path: Path, store: GatedStore, gate: Gate) -> None:
    exports = [ExportConfig("/data", "s3://b/d/", insecure=True)]  # TCP, unprivileged port
    files = {"d/f": b"payload"}
    async with MemoryGateway.of(tmp_path, exports, store=store, files=files) as gw:
        server = gw.server
        c = await gw.connect()
        root = await c.mount(b"/data")
        f = await c.lookup(root, b"f")
        read = asyncio.create_task(c.read(f.object))
        await _until(lambda: server.conn_stats.inflight == 1)
        await server.stop(drain_timeout_s=0.05)  # the gate never opens
        with pytest.raises((ConnectionError, OSError)):
            await read
        assert not server.connections


TOML = """\
[server]
listen = "127.0.0.1"
port = 0
state_dir = "{state}"
uvloop = false
drain_timeout_s = 0.5
[admin]
listen = ""
[cache]
memory = "64M"
[[export]]
path = "/data"
backend = "s3://b/d/"
clients = ["127.0.0.0/8"]
insecure = true  # the test's client connects from an unprivileged port
attr_ttl_s = 60
{extra}
"""
MORE = """\
[[export]]
path = "/more"
backend = "s3://b/more/"
clients = ["127.0.0.0/8"]
insecure = true
"""


async def test_reload_from_the_file(tmp_path: Path) -> None:
    path = tmp_path / "nfsgw.toml"
    path.write_text(TOML.format(state=tmp_path / "state", extra=""))
    cfg, _ = load_config(path)
    async with MemoryGateway(cfg, files={"d/f": b"1", "more/g": b"2"}) as gw:
        server = gw.server
        c = await gw.connect()
        root = await c.mount(b"/data")
        assert (
            await c.mnt(b"/more")
        ).status == mount3.MountStat3.MNT3ERR_ACCES  # no such export: as refused
        # add an export and change the TTL of another (a fresh index for it)
        path.write_text(TOML.format(state=tmp_path / "state", extra=MORE).replace("= 60", "= 5"))
        data_ns = server.gateway.by_path["/data"].ns  # type: ignore[union-attr]
        assert await server.reload()
        assert server.gateway is not None
        assert server.gateway.by_path["/data"].ns is not data_ns
        assert server.gateway.by_path["/data"].cfg.attr_ttl_s == 5
        more = await c.mount(b"/more")
        assert (await c.lookup(more, b"g")).status == OK
        assert (await c.lookup(root, b"f")).status == OK  # old handles, same connection
        # a bad file: every error logged, the running configuration kept
        path.write_text("[server]\nport = 'x'\n[[export]]\npath = 'rel'\n")
        assert not await server.reload()
        assert server.reloads == {"ok": 1, "error": 1}
        assert any(":2: server.port" in e for e in server.last_reload_error)
        assert any(":4: export[0].path" in e for e in server.last_reload_error)
        assert sorted(server.gateway.by_path) == ["/data", "/more"]
        # a restart-only setting is reported, not applied; removing an export makes its
        # handles stale
        path.write_text(
            TOML.format(state=tmp_path / "state", extra="").replace("port = 0", "port = 1")
        )
        port = server.port
        assert await server.reload()
        assert server.port == port and server.config.server.port == 0
        assert sorted(server.gateway.by_path) == ["/data"]
        assert (await c.getattr(more)).status == NfsStat3.NFS3ERR_STALE
        assert (await c.getattr(root)).status == OK
        assert server.conn_stats.opened == 1
        await c.close()


async def test_signals(tmp_path: Path) -> None:
    path = tmp_path / "nfsgw.toml"
    path.write_text(TOML.format(state=tmp_path / "state", extra=""))
    cfg, _ = load_config(path)
    async with MemoryGateway(cfg) as gw:
        server = gw.server
        task = asyncio.create_task(server.run_until_signalled())
        await asyncio.sleep(0)
        # the loop's handlers are in place (a default SIGHUP would end the test process)
        assert signal.getsignal(signal.SIGHUP) not in (signal.SIG_DFL, signal.SIG_IGN)
        path.write_text(TOML.format(state=tmp_path / "state", extra=MORE))
        os.kill(os.getpid(), signal.SIGHUP)
        await _until(lambda: server.reloads["ok"] == 1)
        assert server.gateway is not None and "/more" in server.gateway.by_path
        os.kill(os.getpid(), signal.SIGTERM)
        assert await task == 0
        assert server.stopping
    assert signal.getsignal(signal.SIGHUP) in (signal.SIG_DFL, signal.SIG_IGN)


Socket = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def _idle_socket(port: int) -> Socket:
    """A connection that never sends a byte."""
    return await asyncio.open_connection("127.0.0.1", port)


async def _closed_by_peer(sock: Socket, within_s: float = 5.0) -> bool:
    r, _ = sock
    try:
        async with asyncio.timeout(within_s):
            return await r.read(1) == b""
    except (ConnectionError, OSError):
        return True


async def test_connection_limit_closes_the_never_answered_first_then_the_longest_idle(
    tmp_path: Path,
) -> None:
    exports = [ExportConfig("/data", "s3://b/d/", insecure=True)]  # TCP, unprivileged port
    files = {"d/f": b"1"}
    async with MemoryGateway.of(tmp_path, exports, files=files, server_max_connections=3) as gw:
        server = gw.server
        a = await gw.connect()
        await a.mount(b"/data")
        silent = await _idle_socket(server.port)  # never sends a call
        b = await gw.connect()
        await b.mount(b"/data")
        await _until(lambda: len(server.connections) == 3)
        # full: a new client is served, and the silent connection (not a, older) made room
        c = await gw.connect()
        await c.mount(b"/data")
        assert await _closed_by_peer(silent)
        assert server.evicted_connections == 1 and server.refused_connections == 0
        await a.mount(b"/data")  # a was answered: kept
        await _until(lambda: len(server.connections) == 3)
        # full again, every one answered: the one idle longest (b) goes
        d = await gw.connect()
        await d.mount(b"/data")
        assert server.evicted_connections == 2
        with pytest.raises((ConnectionError, OSError, asyncio.IncompleteReadError)):
            await b.mount(b"/data")
        for cl in (a, c, d):
            await cl.mount(b"/data")
        for cl in (a, b, c, d):
            await cl.close()
        silent[1].close()


async def test_per_address_cap_and_idle_timeout(tmp_path: Path) -> None:
    exports = [ExportConfig("/data", "s3://b/d/", insecure=True)]
    files = {"d/f": b"1"}
    async with MemoryGateway.of(
        tmp_path,
        exports,
        files=files,
        server_max_connections_per_address=2,
        server_idle_timeout_s=0.4,
    ) as gw:
        server = gw.server
        silent = [await _idle_socket(server.port) for _ in range(5)]
        # two per address: the silent ones made room for each other, the client gets in
        a = await gw.connect()
        await a.mount(b"/data")
        await _until(lambda: len(server.connections) <= 2)
        assert server.evicted_connections >= 4
        closed = [await _closed_by_peer(w, 0.5) for w in silent[:-1]]
        assert all(closed)
        # idle past the timeout: the last silent one and the client's, both closed
        await _until(lambda: not server.connections)
        assert server.idle_closed_connections == 2
        assert await _closed_by_peer(silent[-1])
        with pytest.raises((ConnectionError, OSError, asyncio.IncompleteReadError)):
            await a.mount(b"/data")
        b = await gw.connect()  # a new one is served as ever
        await b.mount(b"/data")
        for _, w in silent:
            w.close()
        for cl in (a, b):
            await cl.close()


async def test_refuse_unknown_peers_closes_them_at_accept(tmp_path: Path) -> None:
    exports = [
        ExportConfig(
            "/data", "s3://b/d/", insecure=True, clients=(ipaddress.ip_network("127.0.0.1/32"),)
        )
    ]
    files = {"d/f": b"1"}
    async with MemoryGateway.of(
        tmp_path, exports, files=files, server_refuse_unknown_peers=True
    ) as gw:
        server = gw.server
        a = await gw.connect()  # from 127.0.0.1: listed
        await a.mount(b"/data")
        # from 127.0.0.2: in no export's clients, closed before a byte is read
        r, w = await asyncio.open_connection("127.0.0.1", server.port, local_addr=("127.0.0.2", 0))
        assert await _closed_by_peer((r, w))
        assert server.refused_peers == 1 and len(server.connections) == 1
        w.close()
        await a.mount(b"/data")
        await a.close()


async def test_stop_uploads_staged_writes(tmp_path: Path) -> None:
    from nfsproto import nfs3

    exports = [ExportConfig("/rw", "s3://b/rw/", squash="none", insecure=True)]
    async with MemoryGateway.of(tmp_path, exports, files={"rw/keep": b"k"}) as gw:
        c = await gw.connect()
        root = await c.mount(b"/rw")
        how = nfs3.CreateHow3(nfs3.CreateMode3.UNCHECKED, nfs3.Sattr3())
        cr = await c.nfs(
            nfs3.Nfs3Proc.CREATE, nfs3.Create3Args(nfs3.Diropargs3(root, b"staged"), how)
        )
        wr = await c.nfs(
            nfs3.Nfs3Proc.WRITE,
            nfs3.Write3Args(cr.obj, 0, 5, nfs3.StableHow.UNSTABLE, b"hello"),
        )
        assert wr.status == OK and wr.committed == nfs3.StableHow.UNSTABLE
        await gw.server.stop(drain_timeout_s=30)  # no COMMIT was sent
    assert (await gw.store.get("rw/staged")).data == b"hello"


def test_max_record_follows_the_largest_wsize(tmp_path: Path) -> None:
    """The default bound on a record is a full-size WRITE plus headers; a smaller one is
    warned about by ``check-config``."""
    from gateway.registry import MAX_IO, NfsConfig
    from gateway.transport import RECORD_HEADROOM, TransportLimits

    assert TransportLimits().max_record == max(NfsConfig().wsize, MAX_IO) + RECORD_HEADROOM
    path = tmp_path / "nfsgw.toml"
    path.write_text(
        '[server]\nmax_record = "1M"\n\n[[export]]\npath = "/d"\nbackend = "file:///tmp"\n'
    )
    _, warnings = load_config(path)
    warned = [str(w) for w in warnings]
    assert any("max_record" in w and "wsize" in w for w in warned), warned


def test_connection_table_picks_without_scanning_and_forgets_closing_ones() -> None:
    """The never-answered connection to close is the head of a list in opening order; a
    connection aborted (closing) no longer counts for its address nor is chosen again."""
    from dataclasses import dataclass
    from typing import cast

    from gateway.transport import ConnectionTable, Peer, RpcConnection

    @dataclass(eq=False)
    class Fake:
        peer: Peer
        answered: int = 0
        closing: bool = False
        idle: bool = True
        active_at: float = 0.0

    table = ConnectionTable()
    conns = [Fake(Peer(f"10.0.0.{i % 3}", 1000 + i, 2049), active_at=float(i)) for i in range(9)]
    for c in conns:
        table.add(cast(RpcConnection, c))
    assert len(table) == 9 and len(table.from_host("10.0.0.1")) == 3
    assert table.make_room() is conns[0]
    assert table.make_room("10.0.0.2") is conns[2]
    conns[0].answered = 1
    table.answered(cast(RpcConnection, conns[0]))
    assert table.make_room() is conns[1]
    conns[1].closing = True
    table.retire(cast(RpcConnection, conns[1]))  # what abort() does
    assert table.make_room() is conns[2] and len(table.from_host("10.0.0.1")) == 2
    assert cast(RpcConnection, conns[1]) in table  # counted until its transport is gone
    table.discard(cast(RpcConnection, conns[1]))
    assert len(table) == 8
    for c in conns[2:]:  # every one answered: the longest idle goes first
        c.answered = 1
        table.answered(cast(RpcConnection, c))
    assert table.make_room() is conns[0]
    conns[0].idle = False
    assert table.make_room() is conns[2] and table.make_room("10.0.0.0") is conns[3]


def test_connection_logs_are_bounded_per_second(monkeypatch: pytest.MonkeyPatch) -> None:
    """A peer opening connections at will cannot flood the journal: past ``per_s`` lines a
    second they are left out, and the next line says how many were."""
    import gateway.transport as transport

    now = [100.2]
    monkeypatch.setattr(transport.time, "monotonic", lambda: now[0])
    budget = transport.LogBudget(3)
    assert [budget.take() for _ in range(5)] == [0, 0, 0, None, None]
    now[0] = 101.0
    assert budget.take() == 2 and budget.take() == 0
