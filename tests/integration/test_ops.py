"""Operations end to end: ``nfsgw serve --config FILE`` as a child process under a fake
service manager (a notify socket this test opens), libnfs as an independent client, the admin
API over HTTP, and signals:

- READY=1 (and WATCHDOG=1) arrive on the socket; STOPPING=1 at SIGTERM, then exit 0;
- a libnfs read of N files moves ``/metrics`` by exactly the expected amounts (files opened,
  GETs, LISTs, READ calls) and ``/v1/stats`` shows backend requests per file opened;
- SIGHUP adds an export without dropping the client's connection (RELOADING=1, READY=1); a bad
  file is refused, logged, and the old configuration keeps serving;
- stdout is JSON lines: one per connection open/close, per directory listing, per reload; none
  per successful RPC.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from loadgen.gwmetrics import Samples
from loadgen.gwprocess import GatewayProcess
from tests.libnfs import LibNfs, libnfs_available

pytestmark = [
    pytest.mark.libnfs,
    pytest.mark.skipif(not libnfs_available(), reason="libnfs (libnfs.so.13) is not installed"),
]

REPO = Path(__file__).resolve().parents[2]
CLASSES, PER_CLASS = 3, 4
N = CLASSES * PER_CLASS
LOCAL = ["127.0.0.0/8"]


def export(path: str, src: Path, **kw: object) -> dict[str, object]:
    """A read-only export of a local directory to 127.0.0.0/8."""
    return {"path": path, "backend": f"file://{src}", "read_only": True, "clients": LOCAL, **kw}


class Manager:
    """The service manager's end of NOTIFY_SOCKET."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(60)
        self.seen: list[dict[str, str]] = []

    def wait_for(self, key: str) -> dict[str, str]:
        """The next message with ``key`` (watchdog pings in between are recorded)."""
        while True:
            data = self.sock.recv(4096)
            msg = dict(line.split("=", 1) for line in data.decode().splitlines())
            self.seen.append(msg)
            if key in msg:
                return msg


@pytest.fixture
def manager(tmp_path: Path) -> Iterator[Manager]:
    m = Manager(tmp_path / "notify.sock")
    try:
        yield m
    finally:
        m.sock.close()


@pytest.fixture
def gateway(tmp_path: Path, manager: Manager) -> Iterator[GatewayProcess]:
    for c in range(CLASSES):
        d = tmp_path / "src" / "train" / f"c{c}"
        d.mkdir(parents=True)
        for i in range(PER_CLASS):
            (d / f"img{i}.jpg").write_bytes(bytes([c, i]) * (500 + i))
    (tmp_path / "more").mkdir()
    (tmp_path / "more" / "readme").write_bytes(b"more\n")
    gw = GatewayProcess(
        tmp_path,
        [export("/data", tmp_path / "src", immutable=True)],
        sections={
            "server": {"cache_dir": str(tmp_path / "cache"), "drain_timeout_s": 5, "uvloop": False},
            "cache": {"memory": "64M"},
        },
        env={
            **os.environ,
            "NOTIFY_SOCKET": str(manager.path),
            "WATCHDOG_USEC": "2000000",
            "WATCHDOG_PID": "",
        },
    )
    try:
        yield gw.start()
    finally:
        gw.kill()


def _get(m: Samples, name: str, **lb: str) -> float:
    labels = ",".join(f"{k}={v}" for k, v in sorted(lb.items()))
    return m.get(f"{name}{{{labels}}}" if lb else name, 0.0)


def test_service_life_metrics_reload_and_logs(gateway: GatewayProcess, manager: Manager) -> None:
    ready = manager.wait_for("READY")
    assert ready["STATUS"] == f"serving 1 export on port {gateway.port}"
    assert ready["MAINPID"] == str(gateway.pid)
    manager.wait_for("WATCHDOG")
    assert json.loads(gateway.http("/readyz")) == {"ready": True, "backends": {"/data": "ok"}}

    before = gateway.metrics()
    with LibNfs(gateway.libnfs_url("/data")) as nfs:
        for c in range(CLASSES):
            for i in range(PER_CLASS):
                data = nfs.read_file(f"/train/c{c}/img{i}.jpg")
                assert data == bytes([c, i]) * (500 + i)
        after = gateway.metrics()

        def moved(name: str, **lb: str) -> float:
            return _get(after, name, **lb) - _get(before, name, **lb)

        # libnfs reads each file with one READ at 0 and one zero-byte READ at EOF
        assert moved("nfsgw_files_opened_total") == N
        assert moved("nfsgw_rpc_requests_total", proc="NFS3.READ", status="ok") == 2 * N
        assert moved("nfsgw_s3_requests_total", op="get", outcome="ok") == N
        assert moved("nfsgw_s3_requests_total", op="list", outcome="ok") == 2 + CLASSES
        assert moved("nfsgw_s3_requests_total", op="head", outcome="ok") == 0
        # data prefetch (on by default) may have fetched a file before its READ: then that
        # READ hit memory; either way one GET per file
        assert moved("nfsgw_data_cache_misses_total") + moved("nfsgw_prefetch_useful_total") == N
        assert moved("nfsgw_backend_received_bytes_total") == sum(
            2 * (500 + i) for _ in range(CLASSES) for i in range(PER_CLASS)
        )
        # libnfs: one connection for MOUNT (closed after MNT), one for NFS (kept)
        assert moved("nfsgw_connections_opened_total") == 2
        assert _get(after, "nfsgw_connections") == 1
        stats = json.loads(gateway.http("/v1/stats"))
        assert stats["files_opened"] == N
        # + the one-key LISTs of the start-up backend probe and of /readyz
        assert stats["backend_requests_per_file_opened"] == round((N + 2 + CLASSES + 2) / N, 4)

        # SIGHUP: a new export; the open connection keeps working
        gateway.exports.append(export("/more", gateway.work_dir / "more"))
        gateway.write_config()
        gateway.send_signal(signal.SIGHUP)
        manager.wait_for("RELOADING")
        assert manager.wait_for("READY")["STATUS"] == (f"serving 2 exports on port {gateway.port}")
        assert nfs.read_file("/train/c0/img0.jpg") == bytes([0, 0]) * 500
        with LibNfs(gateway.libnfs_url("/more")) as more:
            assert more.read_file("/readme") == b"more\n"
        # a bad file: refused, logged, the running configuration keeps serving
        gateway.config_path.write_text('[server]\nport = "2049"\n')
        gateway.send_signal(signal.SIGHUP)
        manager.wait_for("RELOADING")
        manager.wait_for("READY")
        assert nfs.read_file("/train/c1/img1.jpg") == bytes([1, 1]) * 501
        m = gateway.metrics()
        # only the /more client's connections are new (libnfs: MOUNT, NFS, and UMNT when the
        # context is destroyed): the first NFS connection was kept through both reloads
        opened = _get(m, "nfsgw_connections_opened_total")
        assert opened - _get(after, "nfsgw_connections_opened_total") == 3
        assert _get(m, "nfsgw_connections") == 1
        assert _get(m, "nfsgw_config_reloads_total", outcome="ok") == 1
        assert _get(m, "nfsgw_config_reloads_total", outcome="error") == 1
        calls = sum(v for k, v in m.items() if k.startswith("nfsgw_rpc_requests_total{"))

    # SIGTERM: STOPPING=1, drain, exit 0
    gateway.send_signal(signal.SIGTERM)
    stopping = manager.wait_for("STOPPING")
    assert int(stopping["EXTEND_TIMEOUT_USEC"]) >= 5_000_000
    assert gateway.wait(60) == 0

    lines = [json.loads(x) for x in gateway.log_path.read_text().splitlines() if x]
    events = [str(x["event"]) for x in lines]
    assert all({"event", "level", "timestamp"} <= set(x) for x in lines)
    assert events.count("connection_opened") == events.count("connection_closed") == 6
    (failed,) = [x for x in lines if x["event"] == "config_reload_failed"]
    assert failed["level"] == "error"
    assert any(":2: server.port: must be an integer" in e for e in failed["errors"])
    assert events.count("config_reloaded") == 1
    assert events[-1] == "gateway_stopped" and "gateway_drained" in events
    # never a line per successful RPC: directory listings (and the data prefetcher's end of
    # a pass, logged from the READ that ended it) are the only per-call lines here
    per_call = [x for x in lines if "xid" in x]
    assert {x["event"] for x in per_call} <= {"dir_prefetched", "prefetch_pass"}
    listed = [x for x in per_call if x["event"] == "dir_prefetched"]
    assert len(listed) == 2 + CLASSES + 1  # root, train, classes, /more's root
    assert calls > 4 * N and len(lines) < 30


def test_check_config_and_serve_refuse_a_bad_file(tmp_path: Path) -> None:
    cfg = tmp_path / "nfsgw.toml"
    cfg.write_text('[server]\nport = 2049\nbogus = 1\n[[export]]\npath = "/d"\n')
    env = {**os.environ}
    env.pop("NFSGW_CONFIG", None)
    for cmd in (["check-config"], ["serve"]):
        r = subprocess.run(
            [sys.executable, "-m", "gateway.ops.cli", *cmd, "--config", str(cfg)],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == (1 if cmd == ["check-config"] else 2)
        assert f"{cfg}:3: server.bogus: unknown key 'bogus'" in r.stderr
        assert f"{cfg}:4: export[0]: missing 'backend'" in r.stderr
