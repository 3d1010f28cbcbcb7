"""The admin API over real HTTP on 127.0.0.1: /metrics moves by exactly the expected amounts,
/healthz, /readyz (backend reachable, cached, stopping), the bearer token, /v1/stats,
/v1/invalidate, /v1/warmup (metadata and data, bounded concurrency, progress, cancel),
/v1/reload, and the ``nfsgw stats`` / ``nfsgw warmup`` commands."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from gateway.backend.base import BackendUnavailable
from gateway.clock import FakeClock
from gateway.exports import ExportConfig
from gateway.ops import cli
from gateway.ops.configfile import ConfigErrors, ConfigIssue
from nfsproto.nfs3 import NfsStat3
from tests.harness.memory import MemoryGateway
from tests.harness.stores import GatedStore
from tests.unit.ops.helpers import Http, admin_config, sample

OK = NfsStat3.NFS3_OK
N = 5


def data_export(**kw: Any) -> ExportConfig:
    # its clients connect over TCP from unprivileged ports: says insecure
    kw.setdefault("insecure", True)
    return ExportConfig("/data", "s3://b/ds/", read_only=True, immutable=True, **kw)


def files(n: int = N, dirs: int = 1) -> dict[str, bytes]:
    return {f"ds/d{j}/f{i}.jpg": bytes([i]) * (100 + i) for j in range(dirs) for i in range(n)}


def gateway(tmp_path: Path, export: ExportConfig | None = None, **kw: Any) -> MemoryGateway:
    """/data (or ``export``) with the admin API on a free port."""
    kw.setdefault("admin", admin_config())
    return MemoryGateway.of(tmp_path, [export or data_export()], **kw)


async def test_metrics_move_by_exactly_the_expected_amounts(tmp_path: Path) -> None:
    async with gateway(tmp_path, files=files()) as gw:
        http = Http(gw.server.metrics_port)
        c = await gw.connect()
        before = await http.metrics()
        root = await c.mount(b"/data")
        d = await c.lookup(root, b"d0")
        for i in range(N):
            f = await c.lookup(d.object, b"f%d.jpg" % i)
            r0 = await c.read(f.object, 0, 1 << 20)  # opens the file: one whole-object GET
            r1 = await c.read(f.object, 10, 20)  # served from memory
            assert r0.status == r1.status == OK and r0.eof and len(r0.data) == 100 + i
        after = await http.metrics()

        def moved(name: str, **labels: str) -> float:
            return sample(after, name, **labels) - sample(before, name, **labels)

        assert moved("nfsgw_files_opened_total") == N
        assert moved("nfsgw_s3_requests_total", op="get", outcome="ok") == N
        assert moved("nfsgw_s3_requests_total", op="list", outcome="ok") == 2  # root, d0
        assert moved("nfsgw_s3_requests_total", op="head", outcome="ok") == 0
        assert moved("nfsgw_s3_request_duration_seconds_count", op="get", outcome="ok") == N
        assert moved("nfsgw_rpc_requests_total", proc="NFS3.READ", status="ok") == 2 * N
        assert moved("nfsgw_rpc_requests_total", proc="NFS3.LOOKUP", status="ok") == N + 1
        assert moved("nfsgw_rpc_requests_total", proc="MOUNT3.MNT", status="ok") == 1
        assert moved("nfsgw_rpc_duration_seconds_count", proc="NFS3.READ", status="ok") == 2 * N
        assert moved("nfsgw_data_cache_misses_total") == N
        assert moved("nfsgw_data_cache_hits_total") == N
        assert moved("nfsgw_metadata_prefetches_total", kind="first") == 2
        assert moved("nfsgw_metadata_cache_misses_total") == 2
        assert moved("nfsgw_backend_received_bytes_total") == sum(100 + i for i in range(N))
        assert moved("nfsgw_received_bytes_total") > 0 and moved("nfsgw_sent_bytes_total") > 0
        assert sample(after, "nfsgw_connections") == 1 and sample(after, "nfsgw_rpc_inflight") == 0
        assert sample(after, "nfsgw_data_cache_bytes") > 0
        assert sample(after, "nfsgw_data_cache_budget_bytes") == 64 << 20
        # latency buckets fit sub-millisecond calls: 50 µs is the first bound
        assert (
            "nfsgw_rpc_duration_seconds_bucket",
            (("le", "5e-05"), ("proc", "NFS3.READ"), ("status", "ok")),
        ) in after
        # a failing call is counted by status
        bad = await c.lookup(d.object, b"missing")
        assert bad.status == NfsStat3.NFS3ERR_NOENT
        m = await http.metrics()
        assert (
            sample(m, "nfsgw_rpc_requests_total", proc="NFS3.LOOKUP", status="NFS3ERR_NOENT") == 1
        )
        # /v1/stats: backend requests per file opened reads off directly
        status, stats = await http.json("GET", "/v1/stats")
        assert status == 200
        assert stats["files_opened"] == N
        assert stats["backend"]["requests"] == {"get": {"ok": N}, "list": {"ok": 2}}
        assert stats["backend_requests_per_file_opened"] == (N + 2) / N
        assert stats["rpc"]["calls"]["NFS3.READ"] == {"ok": 2 * N}
        assert stats["data_cache"]["hits"] == N and stats["data_cache"]["hit_ratio"] == 0.5
        assert stats["exports"][0]["path"] == "/data" and stats["ready"]
        assert stats["connections"]["open"] == 1
        await c.close()
        await http.close()


async def test_healthz_readyz(tmp_path: Path) -> None:
    clock = FakeClock()
    failing = {"on": False}

    def fail(op: str, key: str) -> BaseException | None:
        return BackendUnavailable("connection refused") if failing["on"] and op == "list" else None

    async with gateway(tmp_path, files=files(), clock=clock) as gw:
        server = gw.server
        http = Http(server.metrics_port)
        gw.store.fail = fail
        assert await http.get("/healthz") == (200, "ok\n")
        status, body = await http.json("GET", "/readyz")
        assert status == 200 and body == {"ready": True, "backends": {"/data": "ok"}}
        lists = gw.store.requests["list"]
        failing["on"] = True
        status, body = await http.json("GET", "/readyz")
        assert status == 200  # cached: no new probe within READY_CACHE_S
        assert gw.store.requests["list"] == lists
        clock.advance(10)
        status, body = await http.json("GET", "/readyz")
        assert status == 503 and "connection refused" in body["backends"]["/data"]
        failing["on"] = False
        clock.advance(10)
        assert (await http.json("GET", "/readyz"))[0] == 200
        server.stopping = True
        status, body = await http.json("GET", "/readyz")
        assert status == 503 and body["reason"] == "stopping"
        assert (await http.get("/healthz"))[0] == 200
        server.stopping = False
        await http.close()


async def test_bearer_token(tmp_path: Path) -> None:
    async with gateway(tmp_path, files=files(), admin=admin_config(token="s3cret")) as gw:
        port = gw.server.metrics_port
        anon, wrong = Http(port, token=None), Http(port, token="guess")
        good = Http(port, token="s3cret")
        for path in ("/metrics", "/v1/stats", "/v1/warmup"):
            assert (await anon.get(path))[0] == 401
            assert (await wrong.get(path))[0] == 401
            assert (await good.get(path))[0] == 200
        assert (await anon.json("POST", "/v1/invalidate", {"path": "/data"}))[0] == 401
        assert (await anon.get("/healthz"))[0] == 200
        assert (await anon.get("/readyz"))[0] == 200
        for h in (anon, wrong, good):
            await h.close()


@pytest.mark.parametrize(
    "immutable",
    [
        False,
        True,
    ],
)
async def test_invalidate(tmp_path: Path, immutable: bool) -> None:
    export = dataclasses.replace(data_export(), immutable=immutable, attr_ttl_s=3600)
    async with gateway(tmp_path, export, files=files()) as c:
        http = Http(c.server.metrics_port)
        store = c.store
        root = await c.mount(b"/data")
        d = (await c.lookup(root, b"d0")).object
        assert (await c.lookup(d, b"new.jpg")).status == NfsStat3.NFS3ERR_NOENT
        store.seed("ds/d0/new.jpg", b"n")
        # within the TTL the negative answer stays cached
        assert (await c.lookup(d, b"new.jpg")).status == NfsStat3.NFS3ERR_NOENT
        lists = store.requests["list"]
        status, body = await http.json("POST", "/v1/invalidate", {"path": "/data/d0"})
        assert status == 200 and body == {"export": "/data", "path": "d0", "subtree": False}
        assert (await c.lookup(d, b"new.jpg")).status == OK
        assert store.requests["list"] == lists + 2  # d0 and its parent (d0's own entry)
        # subtree from the export root (query parameters work too)
        store.seed("ds/d0/newer.jpg", b"n")
        status, body = await http.json("POST", "/v1/invalidate?path=/data&subtree=true")
        assert status == 200 and body["subtree"] is True and body["path"] == ""
        assert (await c.lookup(d, b"newer.jpg")).status == OK
        assert (await http.json("POST", "/v1/invalidate", {"path": "/nope/x"}))[0] == 404
        assert (await http.json("POST", "/v1/invalidate", {"path": "rel"}))[0] == 400
        await http.close()


async def test_warmup_metadata_then_data(tmp_path: Path) -> None:
    async with gateway(tmp_path, files=files(4, dirs=3)) as c:
        http = Http(c.server.metrics_port)
        store = c.store
        status, job = await http.json("POST", "/v1/warmup", {"path": "/data", "wait": True})
        assert status == 200, job
        assert job["state"] == "done" and job["dirs_listed"] == 4 and job["files_seen"] == 12
        assert job["files_read"] == 0 and store.requests == {"list": 4}
        # every lookup and getattr is now answered without a request
        root = await c.mount(b"/data")
        handles = []
        for j in range(3):
            d = (await c.lookup(root, b"d%d" % j)).object
            for i in range(4):
                handles.append((await c.lookup(d, b"f%d.jpg" % i)).object)
        assert store.requests == {"list": 4}
        # data warm-up of one directory, by its path inside the export
        status, job = await http.json(
            "POST", "/v1/warmup", {"path": "/data/d1", "data": True, "wait": True}
        )
        assert job["state"] == "done" and job["files_read"] == 4
        assert job["bytes_read"] == sum(100 + i for i in range(4))
        assert store.requests["get"] == 4
        for fh in handles[4:8]:
            assert (await c.read(fh)).status == OK
        assert store.requests["get"] == 4  # served from the warmed cache
        # progress is visible in /v1/stats and /metrics
        status, stats = await http.json("GET", "/v1/stats")
        assert [w["state"] for w in stats["warmups"]] == ["done", "done"]
        m = await http.metrics()
        assert sample(m, "nfsgw_warmup_jobs", state="done") == 2
        assert sample(m, "nfsgw_warmup_dirs_total") == 5
        assert sample(m, "nfsgw_warmup_files_total") == 16
        assert sample(m, "nfsgw_warmup_read_bytes_total") == job["bytes_read"]
        # a path that does not exist fails the job; one outside every export is a 404
        status, job = await http.json("POST", "/v1/warmup", {"path": "/data/nope", "wait": True})
        assert job["state"] == "failed" and "no such" in job["error"]
        assert (await http.json("POST", "/v1/warmup", {"path": "/elsewhere"}))[0] == 404
        bad = {"path": "/data", "concurrency": 0}
        assert (await http.json("POST", "/v1/warmup", bad))[0] == 400
        await http.close()


async def test_warmup_concurrency_is_bounded_and_cancellable(tmp_path: Path) -> None:
    # every LIST and GET takes a moment, so that the workers' requests overlap
    store = GatedStore("mem", latency_s={"list": 0.005, "get": 0.005})
    async with gateway(tmp_path, store=store, files=files(6, dirs=12)) as gw:
        http = Http(gw.server.metrics_port)
        body = {"path": "/data", "data": True, "concurrency": 3, "wait": True}
        status, job = await http.json("POST", "/v1/warmup", body)
        assert job["state"] == "done" and job["files_read"] == 72 and job["dirs_listed"] == 13
        assert store.peak == 3  # never more than asked, and the bound was reached
        # a job that cannot progress is cancelled with DELETE
        gate = store.hold(("list", "get"))
        try:
            await http.json("POST", "/v1/invalidate", {"path": "/data", "subtree": True})
            status, job = await http.json("POST", "/v1/warmup", {"path": "/data"})
            assert status == 202 and job["state"] == "running"
            status, listed = await http.json("GET", f"/v1/warmup/{job['id']}")
            assert listed["state"] == "running"
            status, job = await http.json("DELETE", f"/v1/warmup/{job['id']}")
            assert status == 200 and job["state"] == "cancelled"
        finally:
            gate.open()
        assert (await http.json("GET", "/v1/warmup/999"))[0] == 404
        await http.close()


async def test_reload_endpoint(tmp_path: Path) -> None:
    outcome: dict[str, Any] = {"config": None}

    def loader() -> Any:
        if outcome["config"] is None:
            raise ConfigErrors([ConfigIssue("nfsgw.toml:3", "server.port", "out of range")])
        return outcome["config"]

    async with gateway(tmp_path, files={**files(), "more/x": b"x"}, config_loader=loader) as c:
        cfg, server = c.server.config, c.server
        http = Http(server.metrics_port)
        status, body = await http.json("POST", "/v1/reload")
        assert status == 422 and body["ok"] is False
        assert body["errors"] == ["nfsgw.toml:3: server.port: out of range"]
        assert server.reloads == {"ok": 0, "error": 1}
        more = ExportConfig("/more", "s3://b/more/")
        outcome["config"] = dataclasses.replace(cfg, exports=(data_export(), more))
        status, body = await http.json("POST", "/v1/reload")
        assert status == 200 and body == {"ok": True, "errors": []}
        await c.mount(b"/more")
        m = await http.metrics()
        assert sample(m, "nfsgw_config_reloads_total", outcome="ok") == 1
        assert sample(m, "nfsgw_config_reloads_total", outcome="error") == 1
        assert sample(m, "nfsgw_exports") == 2
        await http.close()


async def test_stats_and_warmup_commands(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    token = tmp_path / "token"
    token.write_text("tok\n")
    admin = admin_config(token="tok")
    async with gateway(tmp_path, files=files(3, dirs=2), admin=admin) as gw:
        server = gw.server
        url = ["--admin-url", f"http://127.0.0.1:{server.metrics_port}", "--token-file", str(token)]
        rc = await asyncio.to_thread(cli.main, ["warmup", "/data", "--data", *url])
        out = capsys.readouterr().out
        assert rc == 0 and "warmup #1 /data: done, 3 dirs, 6 files" in out, out
        rc = await asyncio.to_thread(cli.main, ["stats", *url])
        out = capsys.readouterr().out
        assert rc == 0
        assert "backend requests: 9" in out and "export /data <- s3://b/ds/ (ro" in out
        rc = await asyncio.to_thread(cli.main, ["stats", "--json", *url])
        assert rc == 0 and '"files_opened": 0' in capsys.readouterr().out
        rc = await asyncio.to_thread(cli.main, ["invalidate", "/data/d0", *url])
        assert rc == 0 and '"path": "d0"' in capsys.readouterr().out
        rc = await asyncio.to_thread(
            cli.main, ["stats", "--admin-url", f"http://127.0.0.1:{server.metrics_port}"]
        )
        assert rc == 1 and "401" in capsys.readouterr().err


async def test_error_replies(tmp_path: Path) -> None:
    """The admin API's refusals: a body that is not a JSON object (400), an unknown or
    malformed warm-up id (404), a request without a body reads the query string."""
    async with gateway(tmp_path, files=files()) as gw:
        http = Http(gw.server.metrics_port)
        url = http.base + "/v1/invalidate"
        json_type = {**http.headers, "Content-Type": "application/json"}
        for body, error in ((b"{", "body is not JSON"), (b"[1]", "body must be a JSON object")):
            async with http.session.post(url, data=body, headers=json_type) as r:
                assert (r.status, await r.json(content_type=None)) == (400, {"error": error})
        async with http.session.post(url + "?path=/data/d0", headers=http.headers) as r:
            assert r.status == 200 and (await r.json())["path"] == "d0"
        for method, path in (
            ("GET", "/v1/warmup/x"),
            ("GET", "/v1/warmup/9"),
            ("DELETE", "/v1/warmup/9"),
            ("DELETE", "/v1/warmup/x"),
        ):
            async with http.session.request(method, http.base + path, headers=http.headers) as r:
                assert r.status == 404 and r.content_type == "application/json", (method, path)
                assert await r.json() == {"error": "no such warm-up"}
        status, body = await http.json("POST", "/v1/invalidate", {"path": "data"})
        assert (status, body) == (400, {"error": "give an absolute path: /export/dir"})
        status, body = await http.json("POST", "/v1/invalidate", {"path": "/nope"})
        assert (status, body) == (404, {"error": "/nope: no export contains it"})
        status, body = await http.json("POST", "/v1/warmup", {"path": "/data", "concurrency": "x"})
        assert (status, body) == (400, {"error": "concurrency must be an integer"})
        assert (await http.get("/nowhere"))[0] == 404
        await http.close()
