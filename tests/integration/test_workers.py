"""``nfsgw serve --workers 2``: two gateway processes behind one port, under a supervisor.

Real parts only: the ``nfsgw`` command line (``GatewayProcess``), SeaweedFS, libnfs clients.

- Read-only export: connections spread over both workers (SO_REUSEPORT; counted per worker by
  the supervisor's ``/metrics``), every byte right, 1 GET per file in a cold pass whichever
  worker serves it; ``/metrics`` and ``/v1/stats`` add the workers up.
- A worker killed with -9 is restarted (new pid, ``restarts`` 1, ``/readyz`` 503 then 200);
  clients' next calls succeed; the service's counters do not go down.
- Read-write export: one file written over several connections (so, several workers) and
  committed reads back byte-exact over any connection; kill -9 of either worker after the
  commit loses nothing.
- One data cache for both (defaults but the worker count: the disk tier under the state
  directory, data prefetch on in each worker): every file fetched once by the gateway,
  counted per key at the backend, whichever worker reads or prefetches it; none in a second
  epoch nor after a restart; no duplicate fetch; the bodies held as mappings of the tier.
- SIGHUP reaches every worker (a new export is served whichever worker answers);
  ``/v1/invalidate`` acts on all; SIGTERM stops everything.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from loadgen.gwprocess import GatewayProcess
from loadgen.seaweed import SeaweedServer
from tests.harness.buckets import MakeBucket
from tests.harness.proxy import ThreadProxy
from tests.integration.test_write_path import WNfs
from tests.libnfs import LibNfs, libnfs_available

pytestmark = [
    pytest.mark.s3,
    pytest.mark.skipif(not libnfs_available(), reason="libnfs not installed"),
]

FILES = 60
MAX_CONNECTIONS = 64  # until both workers have served one: 2**-63 odds of a false failure


def _body(i: int) -> bytes:
    return hashlib.sha256(str(i).encode()).digest() * (50 + i * 37 % 400)


@pytest.fixture
def bucket(seaweed: SeaweedServer, make_bucket: MakeBucket) -> str:
    name = make_bucket("wk")
    for i in range(FILES):  # plain signed PUTs (no S3Store)
        status, _ = seaweed.request("PUT", f"/{name}/ds/c{i % 3}/f{i:03d}.jpg", _body(i))
        assert status == 200
    return name


def _gateway(
    tmp_path: Path, seaweed: SeaweedServer, bucket: str, *, read_only: bool
) -> GatewayProcess:
    return GatewayProcess(
        tmp_path,
        [
            {
                "path": "/data",
                "backend": f"s3://{bucket}/ds/",
                "read_only": read_only,
                "squash": "none",
                "insecure": True,
            }
        ],
        admin_token=True,  # POST /v1/invalidate on TCP needs one
        s3=seaweed,
        workers=2,
    )


def _json(gw: GatewayProcess, path: str, body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{gw.admin_port}{path}",
        data=data,
        method="POST" if body is not None else "GET",
        headers={"Content-Type": "application/json", **gw.admin_headers()},
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _per_worker_calls(gw: GatewayProcess) -> dict[str, float]:
    m = gw.metrics()
    return {
        k.split("=")[1].rstrip("}"): v
        for k, v in m.items()
        if k.startswith("nfsgw_worker_rpc_requests_total{")
    }


def _metric(gw: GatewayProcess, name: str) -> float:
    return sum(v for k, v in gw.metrics().items() if k == name or k.startswith(name + "{"))


def _spread_connections(gw: GatewayProcess) -> list[LibNfs]:
    """Open connections until both workers have served calls."""
    clients: list[LibNfs] = []
    for _ in range(MAX_CONNECTIONS):
        c = LibNfs(gw.libnfs_url("/data"))
        c.stat("/c0")
        clients.append(c)
        calls = _per_worker_calls(gw)
        if len(calls) == 2 and all(v > 0 for v in calls.values()):
            return clients
    raise AssertionError(f"{MAX_CONNECTIONS} connections all went to one worker: {calls}")


def _wait(cond: Any, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_two_workers_share_the_port_and_the_admin_api(
    seaweed: SeaweedServer, bucket: str, tmp_path: Path
) -> None:
    with _gateway(tmp_path, seaweed, bucket, read_only=True) as gw:
        status, ready = _json(gw, "/readyz")
        assert status == 200 and [w["worker"] for w in ready["workers"]] == [0, 1]
        clients = _spread_connections(gw)
        try:
            for i in range(FILES):
                c = clients[i % len(clients)]
                assert c.read_file(f"/c{i % 3}/f{i:03d}.jpg") == _body(i)
            # Every file was read once, by one worker or the other: one GET each.
            assert _metric(gw, "nfsgw_data_gets_total") == FILES
            assert _metric(gw, "nfsgw_files_opened_total") == FILES
            # Each worker lists a directory once when first asked about it: at most one LIST
            # per directory (the export root and its three folders) per worker (the one-key
            # LISTs of the /readyz backend probes are not listings).
            lists = _metric(gw, "nfsgw_metadata_list_pages_total")
            assert 4 <= lists <= 2 * 4, lists
            status, stats = _json(gw, "/v1/stats")
            assert status == 200
            assert stats["files_opened"] == FILES
            assert len(stats["workers"]) == 2
            assert sum(w["calls_total"] for w in stats["workers"]) == stats["rpc"]["calls_total"]
            assert stats["exports"][0]["path"] == "/data"
            # Invalidate reaches both workers' indexes.
            status, inv = _json(gw, "/v1/invalidate", {"path": "/data/c1", "subtree": True})
            assert status == 200 and inv["path"] == "c1"
        finally:
            for c in clients:
                c.close()
        sup = gw.proc
        assert sup is not None
    assert sup.returncode == 0  # SIGTERM: every worker drained, the supervisor exited 0


def _epoch(clients: list[LibNfs], order: list[int]) -> None:
    """Every file once, over every connection at once (one thread per connection)."""

    def one(n: int) -> None:
        for i in order[n :: len(clients)]:
            assert clients[n].read_file(f"/c{i % 3}/f{i:03d}.jpg") == _body(i)

    with ThreadPoolExecutor(len(clients)) as ex:
        list(ex.map(one, range(len(clients))))


def test_the_workers_share_one_data_cache(
    seaweed: SeaweedServer, bucket: str, tmp_path: Path
) -> None:
    proxy = ThreadProxy(seaweed.endpoint_url, seed=7)

    def gateway() -> GatewayProcess:
        return GatewayProcess(
            tmp_path,
            [
                {
                    "path": "/data",
                    "backend": f"s3://{bucket}/ds/",
                    "read_only": True,
                    "insecure": True,
                }
            ],
            s3=seaweed,
            sections={"s3": {"endpoint_url": proxy.endpoint_url}},
            workers=2,
        )

    try:
        with gateway() as gw:
            clients = _spread_connections(gw)
            try:
                _epoch(clients, list(range(FILES)))
                gets = proxy.gets("ds/")
                assert len(gets) == FILES and set(gets.values()) == {1}, gets
                _epoch(clients[::-1], list(range(FILES))[::-1])  # other workers, other order
                assert proxy.gets("ds/") == gets
            finally:
                for c in clients:
                    c.close()
            assert _metric(gw, "nfsgw_disk_cache_duplicate_fetches_total") == 0
            assert (
                _metric(gw, "nfsgw_data_cache_mapped_bytes")
                >= sum(len(_body(i)) for i in range(FILES)) // 2
            )  # the larger view of the two: at least half the files in each
        with gateway() as gw:  # a restart: served from the shared tier
            c = LibNfs(gw.libnfs_url("/data"))
            try:
                for i in range(FILES):
                    assert c.read_file(f"/c{i % 3}/f{i:03d}.jpg") == _body(i)
            finally:
                c.close()
            assert proxy.gets("ds/") == gets
    finally:
        proxy.close()


def test_without_a_shared_cache_the_gateway_serves_with_one_worker(tmp_path: Path) -> None:
    """``--workers 2`` with the disk tier off: one clear line, and one process serving (not
    two fetching and holding every file each)."""
    tree = tmp_path / "tree"
    (tree / "c0").mkdir(parents=True)
    (tree / "c0" / "f.jpg").write_bytes(_body(1))
    gw = GatewayProcess(
        tmp_path,
        [{"path": "/data", "backend": f"file://{tree}", "read_only": True, "insecure": True}],
        sections={"server": {"workers": 2}, "cache": {"disk": 0}},
        workers=1,  # what it falls back to: wait for the one gateway's start line
    )
    with gw:
        c = LibNfs(gw.libnfs_url("/data"))
        try:
            assert c.read_file("/c0/f.jpg") == _body(1)
        finally:
            c.close()
        lines = [json.loads(x) for x in gw.log_path.read_text().splitlines() if x.startswith("{")]
        events = [x["event"] for x in lines]
        assert "supervisor_started" not in events and "gateway_started" in events
        (warn,) = [x for x in lines if x["event"] == "workers_need_a_shared_cache"]
        assert warn["reason"] == "cache.disk is 0" and warn["serving_with"] == "one worker"
        assert warn["workers"] == 2 and "--cache-dir" in warn["fix"]


def test_a_killed_worker_is_replaced_and_counters_keep_counting(
    seaweed: SeaweedServer, bucket: str, tmp_path: Path
) -> None:
    with _gateway(tmp_path, seaweed, bucket, read_only=True) as gw:
        clients = _spread_connections(gw)
        try:
            for i in range(FILES):
                assert clients[i % len(clients)].read_file(f"/c{i % 3}/f{i:03d}.jpg") == _body(i)
            before = _metric(gw, "nfsgw_rpc_requests_total")
            _, stats = _json(gw, "/v1/stats")
            victim = stats["workers"][1]["pid"]
            os.kill(victim, signal.SIGKILL)
            _wait(lambda: _json(gw, "/readyz")[1]["workers"][1]["pid"] != victim)
            _wait(lambda: _json(gw, "/readyz")[0] == 200)
            _, stats = _json(gw, "/v1/stats")
            assert stats["workers"][1]["restarts"] == 1
            assert stats["workers"][1]["last_exit"] == -signal.SIGKILL
            assert _metric(gw, "nfsgw_rpc_requests_total") >= before
            assert _metric(gw, "nfsgw_worker_restarts_total{worker=1}") == 1
            # Every client's next calls succeed (libnfs reconnects those the kill cut).
            for n, c in enumerate(clients):
                i = n % FILES
                assert c.read_file(f"/c{i % 3}/f{i:03d}.jpg") == _body(i)
        finally:
            for c in clients:
                c.close()


def test_a_worker_that_keeps_dying_is_a_crash_loop_until_it_lives(
    seaweed: SeaweedServer, bucket: str, tmp_path: Path
) -> None:
    """Killed young three times in a row, a worker is restarted after a doubling back-off
    (0.5, 1, 2 s), logged at error level as a crash loop, named by ``/readyz`` (503) and
    ``nfsgw_worker_crash_loop``; once it has lived ``CRASH_WINDOW_S`` the service is ready
    again. The other worker serves throughout."""
    from gateway.ops.workers import CRASH_LOOP_AFTER, CRASH_WINDOW_S

    with _gateway(tmp_path, seaweed, bucket, read_only=True) as gw:
        for _ in range(CRASH_LOOP_AFTER):
            victim = _json(gw, "/v1/stats")[1]["workers"][1]["pid"]
            os.kill(victim, signal.SIGKILL)
            _wait(lambda v=victim: _json(gw, "/readyz")[1]["workers"][1]["pid"] not in (v, None))
            _wait(lambda: _json(gw, "/readyz")[1]["workers"][1]["up"])
        status, ready = _json(gw, "/readyz")
        assert status == 503
        w1 = ready["workers"][1]
        assert w1["crash_loop"] and "crash loop: exited 3 times in a row" in w1["reason"]
        assert _metric(gw, "nfsgw_worker_crash_loop{worker=1}") == 1
        assert _metric(gw, "nfsgw_worker_crash_loop{worker=0}") == 0
        exits = [
            json.loads(line)
            for line in gw.log_path.read_text().splitlines()
            if '"worker_exited"' in line
        ]
        assert [e["restart_in_s"] for e in exits] == [0.5, 1.0, 2.0]
        assert [e["level"] for e in exits] == ["warning", "warning", "error"]
        assert exits[-1]["crash_loop"] is True
        # The other worker kept serving.
        with LibNfs(gw.libnfs_url("/data")) as c:
            assert c.read_file("/c0/f000.jpg") == _body(0)
        # Alive for the crash window: no longer a loop, the service ready again.
        _wait(lambda: _json(gw, "/readyz")[0] == 200, CRASH_WINDOW_S + 15)
        assert _metric(gw, "nfsgw_worker_crash_loop{worker=1}") == 0


def test_writes_over_several_connections_go_to_one_owner(
    seaweed: SeaweedServer, bucket: str, tmp_path: Path
) -> None:
    data = os.urandom(3 << 20) + b"tail"
    gw = _gateway(tmp_path, seaweed, bucket, read_only=False)
    with gw:
        writers: list[WNfs] = []
        try:
            # Connections until one lands on worker 1 (its NFS calls are then routed).
            for _ in range(MAX_CONNECTIONS):
                writers.append(WNfs(gw.libnfs_url("/data")))
                writers[-1].stat("/c0")
                if len(writers) >= 4 and _metric(gw, "nfsgw_routed_calls_total") > 0:
                    break
            assert _metric(gw, "nfsgw_routed_calls_total") > 0
            # One file, its ranges written over every connection, then committed over each.
            fh = writers[0].create("/c0/written.bin")
            writers[0].close_file(fh)
            chunk = len(data) // len(writers) + 1
            handles = []
            for k, w in enumerate(writers):
                h = w.open("/c0/written.bin", os.O_WRONLY)
                w.pwrite(h, k * chunk, data[k * chunk : (k + 1) * chunk])
                handles.append(h)
            for w, h in zip(writers, handles, strict=True):
                w.fsync(h)  # COMMIT
                w.close_file(h)
            for w in writers:
                assert w.read_file("/c0/written.bin") == data
            assert _metric(gw, "nfsgw_routed_link_down_total") == 0
            for pid_index in (1, 0):  # kill the router, then the owner: nothing committed lost
                _, stats = _json(gw, "/v1/stats")
                victim = stats["workers"][pid_index]["pid"]
                os.kill(victim, signal.SIGKILL)
                _wait(
                    lambda v=victim, i=pid_index: (
                        _json(gw, "/readyz")[1]["workers"][i]["pid"] not in (v, None)
                    )
                )
                _wait(lambda: _json(gw, "/readyz")[0] == 200)
                with LibNfs(gw.libnfs_url("/data")) as r:
                    assert r.read_file("/c0/written.bin") == data
        finally:
            for w in writers:
                w.close()
    status, body = seaweed.request("GET", f"/{bucket}/ds/c0/written.bin")
    assert status == 200 and body == data


def test_sighup_reaches_every_worker(seaweed: SeaweedServer, bucket: str, tmp_path: Path) -> None:
    with _gateway(tmp_path, seaweed, bucket, read_only=True) as gw:
        gw.exports.append(
            {
                "path": "/more",
                "backend": f"s3://{bucket}/ds/c2/",
                "read_only": True,
                "insecure": True,
            }
        )
        gw.write_config()
        gw.send_signal(signal.SIGHUP)
        _wait(lambda: gw.log_path.read_text().count("config_reloaded") >= 2)
        # Whichever worker a connection lands on serves the new export.
        for _ in range(8):
            with LibNfs(gw.libnfs_url("/more")) as c:
                assert c.read_file("/f002.jpg") == _body(2)
        assert _metric(gw, "nfsgw_exports") == 2


def test_a_wedged_worker_is_killed_and_replaced(
    seaweed: SeaweedServer, bucket: str, tmp_path: Path
) -> None:
    """A worker whose loop stops answering (here: SIGSTOP) is killed after ~30 s of missed
    health probes and restarted."""
    with _gateway(tmp_path, seaweed, bucket, read_only=True) as gw:
        _, stats = _json(gw, "/v1/stats")
        victim = stats["workers"][1]["pid"]
        os.kill(victim, signal.SIGSTOP)
        try:
            _wait(lambda: _json(gw, "/readyz")[1]["workers"][1]["pid"] != victim, 90.0)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGCONT)
        _wait(lambda: _json(gw, "/readyz")[0] == 200)
        assert "worker_wedged" in gw.log_path.read_text()
        with LibNfs(gw.libnfs_url("/data")) as c:
            assert c.read_file("/c1/f001.jpg") == _body(1)


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its reaper does not)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status


def test_workers_die_with_a_killed_supervisor(tmp_path: Path) -> None:
    """The supervisor SIGKILLed while a client is connected: within 5 s no worker is left
    and the NFS port can be bound again (issue 37: orphans served the port for 95 minutes).
    A ``file://`` export: nothing here needs S3."""
    import socket

    tree = tmp_path / "tree"
    (tree / "c0").mkdir(parents=True)
    (tree / "c0" / "f.jpg").write_bytes(_body(1))
    gw = GatewayProcess(
        tmp_path,
        [{"path": "/data", "backend": f"file://{tree}", "read_only": True}],
        sections={"server": {"drain_timeout_s": 60}},
        workers=2,
    )
    with gw:
        _, stats = _json(gw, "/v1/stats")
        pids = [w["pid"] for w in stats["workers"]]
        assert len(pids) == 2 and all(_alive(p) for p in pids)
        with LibNfs(gw.libnfs_url("/data")) as c:  # a client holds a connection
            assert c.read_file("/c0/f.jpg") == _body(1)
            gw.send_signal(signal.SIGKILL)
            gw.wait(10)
            t0 = time.monotonic()
            while any(_alive(p) for p in pids) and time.monotonic() - t0 < 5.0:
                time.sleep(0.05)
            left = [p for p in pids if _alive(p)]
            for p in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p, signal.SIGKILL)
        assert not left, f"workers {left} outlived their supervisor by 5 s"
        with socket.socket() as s:  # as a new gateway would bind it
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", gw.port))
            s.listen()


def test_a_worker_whose_supervisor_is_gone_at_start_exits(tmp_path: Path) -> None:
    """The race the parent-death signal cannot see: a supervisor that died before the worker
    set it. The worker compares its parent with the supervisor it was given and stops."""
    import subprocess
    import sys

    r, w = os.pipe()
    code = (
        "import os, signal, sys, time\n"
        "from gateway.ops import workers\n"
        "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\n"
        "assert workers.die_with_supervisor(0.5)\n"
        "time.sleep(30)\n"
        "sys.exit(3)\n"
    )
    env = {**os.environ, "NFSGW_SUPERVISOR": f"{os.getpid() + 99999}:{r}"}  # not its parent
    p = subprocess.Popen([sys.executable, "-c", code], env=env, pass_fds=(r,))
    try:
        assert p.wait(15) == 0  # the SIGTERM it sent itself, well before the 30 s
    finally:
        os.close(r)
        os.close(w)
        if p.poll() is None:
            p.kill()
