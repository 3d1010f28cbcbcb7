"""sd_notify messages on a socket the test opens (path and abstract), the watchdog, the
server's READY/RELOADING/STOPPING sequence, and the unit file (``systemd-analyze verify``
when available)."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.exports import ExportConfig
from gateway.ops.systemd import Notifier
from tests.harness.memory import MemoryGateway, gateway_config

REPO = Path(__file__).resolve().parents[3]


class NotifySocket:
    """An AF_UNIX datagram socket standing in for the service manager."""

    def __init__(self, address: str, bind_to: str | bytes) -> None:
        self.address = address
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(bind_to)
        self.sock.setblocking(False)

    async def recv(self) -> dict[str, str]:
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(10.0):
            data = await loop.sock_recv(self.sock, 4096)
        return dict(line.split("=", 1) for line in data.decode().splitlines())

    def pending(self) -> list[dict[str, str]]:
        out: list[dict[str, str]] = []
        while True:
            try:
                data = self.sock.recv(4096)
            except BlockingIOError:
                return out
            out.append(dict(line.split("=", 1) for line in data.decode().splitlines()))

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def notify_sock(tmp_path: Path) -> Iterator[NotifySocket]:
    path = str(tmp_path / "notify.sock")
    s = NotifySocket(path, path)
    yield s
    s.close()


async def test_messages_on_a_path_socket(notify_sock: NotifySocket) -> None:
    n = Notifier({"NOTIFY_SOCKET": notify_sock.address})
    assert n.enabled
    n.ready("serving 1 export on port 2049")
    m = await notify_sock.recv()
    assert m["READY"] == "1" and m["STATUS"] == "serving 1 export on port 2049"
    assert m["MAINPID"] == str(os.getpid())
    n.reloading()
    m = await notify_sock.recv()
    assert m["RELOADING"] == "1" and int(m["MONOTONIC_USEC"]) > 0
    n.stopping(10.0)
    m = await notify_sock.recv()
    assert m["STOPPING"] == "1" and int(m["EXTEND_TIMEOUT_USEC"]) >= 10_000_000
    await n.close()


async def test_abstract_socket() -> None:
    name = f"nfsgw-test-{uuid.uuid4().hex}"
    s = NotifySocket("@" + name, b"\0" + name.encode())
    try:
        n = Notifier({"NOTIFY_SOCKET": "@" + name})
        n.status("hello")
        assert (await s.recv()) == {"STATUS": "hello"}
        await n.close()
    finally:
        s.close()


async def test_watchdog_pings_from_the_loop(notify_sock: NotifySocket) -> None:
    env = {"NOTIFY_SOCKET": notify_sock.address, "WATCHDOG_USEC": "20000"}
    n = Notifier(env)
    assert n.watchdog_s == 0.02
    n.start_watchdog()
    for _ in range(3):
        assert (await notify_sock.recv()) == {"WATCHDOG": "1"}
    await n.close()
    notify_sock.pending()
    # not for us: another process's watchdog
    other = Notifier({**env, "WATCHDOG_PID": str(os.getpid() + 1)})
    assert other.watchdog_s is None
    other.start_watchdog()
    await asyncio.sleep(0)
    await other.close()
    assert notify_sock.pending() == []


async def test_without_notify_socket_nothing_is_sent() -> None:
    n = Notifier({})
    assert not n.enabled and not n.notify(READY=1)
    n.start_watchdog()
    await n.close()


async def test_a_dead_manager_socket_is_not_fatal(tmp_path: Path) -> None:
    n = Notifier({"NOTIFY_SOCKET": str(tmp_path / "nobody-listens")})
    assert not n.notify(READY=1) and not n.notify(STATUS="x")
    await n.close()


async def test_server_lifecycle_messages(tmp_path: Path, notify_sock: NotifySocket) -> None:
    cfg = gateway_config(tmp_path / "state", [ExportConfig("/data", "s3://b/d/")])
    n = Notifier({"NOTIFY_SOCKET": notify_sock.address})
    files = {"d/a": b"1"}
    async with MemoryGateway(cfg, files=files, notifier=n, config_loader=lambda: cfg) as gw:
        m = await notify_sock.recv()
        assert m["READY"] == "1" and m["STATUS"] == f"serving 1 export on port {gw.port}"
        assert await gw.server.reload()
        assert (await notify_sock.recv())["RELOADING"] == "1"
        assert (await notify_sock.recv())["READY"] == "1"
    m = await notify_sock.recv()
    assert m["STOPPING"] == "1" and m["STATUS"] == "draining"


def test_unit_file_directives() -> None:
    unit = (REPO / "systemd" / "nfsgw.service").read_text()
    lines = {ln.strip() for ln in unit.splitlines() if ln.strip() and not ln.startswith("#")}
    for want in (
        "Type=notify",
        "NotifyAccess=main",
        "ExecReload=/bin/kill -HUP $MAINPID",
        "StateDirectory=nfsgw",
        "CacheDirectory=nfsgw",
        "ProtectSystem=strict",
        "NoNewPrivileges=yes",
        "User=nfsgw",
        "CapabilityBoundingSet=CAP_NET_BIND_SERVICE",
        "AmbientCapabilities=CAP_NET_BIND_SERVICE",
        "WatchdogSec=30",
    ):
        assert want in lines, want
    caps = [ln for ln in lines if ln.startswith(("CapabilityBoundingSet", "AmbientCapabilities"))]
    assert all(ln.split("=", 1)[1] == "CAP_NET_BIND_SERVICE" for ln in caps)
    assert "u nfsgw" in (REPO / "systemd" / "nfsgw.sysusers").read_text()


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze missing")
def test_systemd_analyze_verify(tmp_path: Path) -> None:
    # verify checks that ExecStart's binary exists: point it at this checkout's nfsgw.
    nfsgw = shutil.which("nfsgw") or str(REPO / ".venv" / "bin" / "nfsgw")
    unit = (REPO / "systemd" / "nfsgw.service").read_text().replace("/usr/local/bin/nfsgw", nfsgw)
    (tmp_path / "nfsgw.service").write_text(unit)
    r = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", "nfsgw.service"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert "nfsgw.service" not in r.stderr, r.stderr  # no warnings about our unit
