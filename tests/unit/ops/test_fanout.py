"""The supervisor's admin API (``gateway.ops.fanout``): how the workers' answers combine.

- ``/metrics``: series summed across workers; ``Merge.MAX`` gauges taken once; a worker that
  restarts (new pid, counters from 0) or does not answer keeps the service's counters from going
  down; the per-worker series.
- ``/v1/stats``: numbers summed, ratios recomputed from the sums, exports merged by path with
  their configuration taken once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from gateway.ops.adminhttp import AdminHttp
from gateway.ops.fanout import FleetAdmin, merge_snapshots


@dataclass
class _Role:
    index: int
    owner: bool = False
    admin_socket: Path = Path("/nonexistent")


@dataclass
class _Worker:
    role: _Role
    pid: int | None
    ready: bool = True
    restarts: int = 0
    crashes_in_a_row: int = 0
    crash_looping: bool = False
    last_exit: int | None = None


@dataclass
class _Fleet:
    workers: list[_Worker]
    config: object = None  # not read by what these tests call
    count: int = 2
    port: int = 2049
    started: bool = True
    stopping: bool = False
    last_reload_error: list[str] = field(default_factory=list)

    async def reload(self) -> bool:
        return True


def _text(calls: float, hits: float, exports: int = 1, buckets: tuple[float, ...] = (1, 2)) -> str:
    return f"""# HELP nfsgw_rpc_requests_total RPC calls
# TYPE nfsgw_rpc_requests_total counter
nfsgw_rpc_requests_total{{proc="NFS3.READ",status="ok"}} {calls}
# HELP nfsgw_data_cache_hits_total hits
# TYPE nfsgw_data_cache_hits_total counter
nfsgw_data_cache_hits_total {hits}
# HELP nfsgw_exports exports
# TYPE nfsgw_exports gauge
nfsgw_exports {exports}
# HELP nfsgw_data_cache_bytes bytes
# TYPE nfsgw_data_cache_bytes gauge
nfsgw_data_cache_bytes 100
# HELP nfsgw_rpc_duration_seconds latency
# TYPE nfsgw_rpc_duration_seconds histogram
nfsgw_rpc_duration_seconds_bucket{{proc="NFS3.READ",status="ok",le="0.001"}} {buckets[0]}
nfsgw_rpc_duration_seconds_bucket{{proc="NFS3.READ",status="ok",le="+Inf"}} {buckets[1]}
nfsgw_rpc_duration_seconds_count{{proc="NFS3.READ",status="ok"}} {buckets[1]}
nfsgw_rpc_duration_seconds_sum{{proc="NFS3.READ",status="ok"}} 0.5
"""


def _values(api: FleetAdmin, texts: list[tuple[_Worker, str]]) -> dict[str, float]:
    fams, counted = api.merge(texts)  # type: ignore[arg-type]
    calls = counted.get("nfsgw_worker_rpc_requests_total", {})
    out = {}
    for f in fams:
        for s in f.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    for i, v in calls.items():
        out[f"calls{i}"] = v
    return out


def test_series_are_summed_and_shared_gauges_taken_once() -> None:
    w0, w1 = _Worker(_Role(0, True), 100), _Worker(_Role(1), 101)
    api = FleetAdmin(_Fleet([w0, w1]))  # type: ignore[arg-type]
    v = _values(api, [(w0, _text(10, 4)), (w1, _text(5, 1))])
    assert v["nfsgw_rpc_requests_total{proc=NFS3.READ,status=ok}"] == 15
    assert v["nfsgw_data_cache_hits_total"] == 5
    assert v["nfsgw_exports"] == 1  # the same in every worker
    assert v["nfsgw_data_cache_bytes"] == 200  # per-process amounts add up
    assert v["nfsgw_rpc_duration_seconds_bucket{le=+Inf,proc=NFS3.READ,status=ok}"] == 4
    assert v["calls0"] == 10 and v["calls1"] == 5
    assert "nfsgw_start_time_seconds" in v


def test_counters_never_go_down_across_a_restart_or_a_missing_answer() -> None:
    w0, w1 = _Worker(_Role(0, True), 100), _Worker(_Role(1), 101)
    api = FleetAdmin(_Fleet([w0, w1]))  # type: ignore[arg-type]
    first = _values(api, [(w0, _text(10, 4)), (w1, _text(5, 1, buckets=(3, 5)))])
    # worker 1 restarting: it does not answer; what it last said still counts
    w1.ready = False
    gone = _values(api, [(w0, _text(12, 4))])
    assert gone["nfsgw_rpc_requests_total{proc=NFS3.READ,status=ok}"] == 17
    assert gone["nfsgw_rpc_duration_seconds_bucket{le=+Inf,proc=NFS3.READ,status=ok}"] == 5 + 2
    # back with a new pid and fresh counters: the old process's counts are carried
    w1.ready, w1.pid = True, 202
    back = _values(api, [(w0, _text(12, 4)), (w1, _text(1, 0, buckets=(1, 1)))])
    assert back["nfsgw_rpc_requests_total{proc=NFS3.READ,status=ok}"] == 12 + 5 + 1
    assert back["nfsgw_data_cache_hits_total"] == 4 + 1 + 0
    assert back["nfsgw_rpc_duration_seconds_bucket{le=0.001,proc=NFS3.READ,status=ok}"] == 1 + 3 + 1
    assert back["calls1"] == 6
    for key, val in first.items():
        if key.endswith("_total") or "_bucket" in key or key.endswith("_count"):
            assert back[key] >= val, key


def test_merged_metrics_parse_as_prometheus_text() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from gateway.ops.fanout import _Families

    w0, w1 = _Worker(_Role(0, True), 100), _Worker(_Role(1), 101)
    api = FleetAdmin(_Fleet([w0, w1]))  # type: ignore[arg-type]
    fams, counted = api.merge([(w0, _text(10, 4)), (w1, _text(5, 1))])
    reg = CollectorRegistry(auto_describe=False)
    reg.register(_Families([*fams, *api._own(counted)]))
    text = generate_latest(reg).decode()
    names = {f.name for f in text_string_to_metric_families(text)}
    assert {"nfsgw_rpc_requests", "nfsgw_workers", "nfsgw_worker_up"} <= names
    assert 'nfsgw_worker_rpc_requests_total{worker="1"} 5.0' in text


def test_stats_snapshots_merge() -> None:
    def snap(opened: int, requests: int, hits: int, misses: int, lookups: int) -> dict[str, Any]:
        return {
            "version": "1",
            "files_opened": opened,
            "backend": {"requests": {"get": {"ok": requests}}, "requests_total": requests},
            "backend_requests_per_file_opened": requests / opened,
            "data_cache": {"hits": hits, "misses": misses, "hit_ratio": 0.123},
            "exports": [
                {"path": "/d", "attr_ttl_s": 60, "metadata": {"lookups": lookups}},
            ],
            "reloads": {"ok": 1, "error": 0},
            "warmups": [{"id": 1, "path": "/d"}],
        }

    m = merge_snapshots([snap(10, 10, 30, 10, 5), snap(30, 10, 10, 50, 7)])
    assert m["files_opened"] == 40
    assert m["backend"]["requests"]["get"]["ok"] == 20
    assert m["backend_requests_per_file_opened"] == 0.5
    assert m["data_cache"]["hit_ratio"] == 0.4
    assert m["exports"] == [{"path": "/d", "attr_ttl_s": 60, "metadata": {"lookups": 12}}]
    assert m["reloads"] == {"ok": 1, "error": 0}
    assert m["warmups"] == [{"id": 1, "path": "/d"}]


async def test_fleet_routes_without_workers() -> None:
    """The supervisor's HTTP surface (``AdminHttp(FleetAdmin(...))``) while
    no worker answers: /healthz 200, /readyz 503 naming each, /v1/invalidate 502, an unknown
    warm-up 404; the token is the supervisor's."""
    w0, w1 = _Worker(_Role(0, True), 100, ready=False), _Worker(_Role(1), 101, ready=False)
    fleet = _Fleet([w0, w1], config=SimpleNamespace(admin=SimpleNamespace(token="tok")))
    api = AdminHttp(FleetAdmin(fleet))  # type: ignore[arg-type]
    port = await api.start("127.0.0.1:0")
    base, auth = f"http://127.0.0.1:{port}", {"Authorization": "Bearer tok"}
    try:
        async with aiohttp.ClientSession() as s:
            async with s.get(base + "/healthz") as r:
                assert r.status == 200 and await r.text() == "ok\n"
            async with s.get(base + "/readyz") as r:
                body = await r.json()
                assert r.status == 503 and body["reason"] == "restarting"
                assert [w["worker"] for w in body["workers"]] == [0, 1]
            async with s.get(base + "/v1/stats") as r:
                assert r.status == 401
            async with s.post(base + "/v1/invalidate", json={"path": "/d"}, headers=auth) as r:
                assert (r.status, await r.json()) == (502, {"error": "no worker answered"})
            async with s.get(base + "/v1/warmup/3", headers=auth) as r:
                assert (r.status, await r.json()) == (404, {"error": "no such warm-up"})
            async with s.get(base + "/v1/warmup", headers=auth) as r:
                assert (r.status, await r.json()) == (200, [])
    finally:
        await api.stop()


def test_every_per_worker_row_has_one_source() -> None:
    """A supervisor row labelled by worker is read from the worker's slot or counts a gateway
    counter (``per_worker_of``), never both or neither; the counter is one the gateway exports."""
    from gateway.ops.fanout import _FROM_SLOT
    from gateway.ops.metricdefs import METRICS, SUPERVISOR_METRICS, Kind

    counters = {m.name for m in METRICS if m.kind is Kind.COUNTER}
    rows = [d for d in SUPERVISOR_METRICS if d.labels]
    assert rows
    for d in rows:
        assert (d.name in _FROM_SLOT) != bool(d.per_worker_of), d.name
        if d.per_worker_of:
            assert d.per_worker_of in counters, d.name
    assert set(_FROM_SLOT) <= {d.name for d in rows}
