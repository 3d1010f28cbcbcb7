"""Report figures: percentiles, the CDF, the AU estimate, requests per image, the Markdown
table, JSON, plots; and reading the gateway's /metrics."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from loadgen import gwmetrics
from loadgen.report import (
    RunReport,
    TargetReport,
    au_estimate,
    build_epoch,
    build_setup,
    cdf_points,
    percentile,
    to_markdown,
)
from loadgen.workload import EpochPart, SetupPart


def test_percentile_and_cdf() -> None:
    v = [float(x) for x in range(1, 101)]
    assert percentile(v, 50) == pytest.approx(50.5)
    assert percentile(v, 99) == pytest.approx(99.01)
    assert percentile(v, 0) == 1.0 and percentile(v, 100) == 100.0
    assert percentile([3.0], 95) == 3.0 and math.isnan(percentile([], 50))
    pts = cdf_points(v, n=11)
    assert len(pts) == 11 and pts[0] == (1.0, 0.01) and pts[-1] == (100.0, 1.0)
    assert cdf_points([2.0, 1.0][::-1], n=10) == [(1.0, 0.5), (2.0, 1.0)]


def test_au_estimate() -> None:
    # Loading keeps ahead of the accelerator: no stall after the first batch.
    assert au_estimate([0.0, 0.0, 0.0, 0.0], 0.1) == pytest.approx(1.0)
    # Each batch is ready 0.2 s after the previous one; compute takes 0.1 s: AU = 1/2.
    ready = [0.2 * (i + 1) for i in range(100)]
    assert au_estimate(ready, 0.1) == pytest.approx(100 * 0.1 / (20.0 + 0.1))
    # MLPerf's sense: compute / (compute + stall).
    assert au_estimate([0.05], 0.1) == pytest.approx(0.1 / 0.15)
    assert au_estimate([], 0.1) is None


def part(rank: int, files: int, lat: float, ready: list[float]) -> EpochPart:
    return EpochPart(rank, 1, files, files * 1000, 1.0, [lat] * files, ready, {"READ": files})


def test_build_epoch_counts_and_setup_requests() -> None:
    setup = build_setup(
        [SetupPart(0, 0.5, 10, {"READDIRPLUS": 3})],
        0.5,
        backend={"LIST": 3, "bytes": 0, "errors": 0},
        gateway_backend={"LIST": 3},
    )
    assert setup.backend == {"LIST": 3}
    parts = [part(0, 5, 0.010, [0.3]), part(1, 5, 0.020, [0.05])]
    e = build_epoch(
        1,
        parts,
        2.0,
        compute_s=0.1,
        backend={"GET": 10, "bytes": 10_000, "errors": 0},
        gateway_backend={"GET": 10},
        cache={"data": 0.0, "metadata": 1.0},
        setup=setup,
    )
    assert e.files == 10 and e.bytes == 10_000 and e.images_per_s == 5.0 and e.mb_per_s == 0.005
    assert e.latency_ms["p50"] == pytest.approx(15.0) and e.latency_ms["max"] == pytest.approx(20)
    assert e.backend == {"GET": 10, "LIST": 3} and e.includes_setup_requests
    assert e.requests_per_image == {"GET": 1.0, "HEAD": 0.0, "LIST": 0.3, "total": 1.3}
    assert e.rpc == {"READ": 10}
    assert e.au_per_node == [pytest.approx(0.1 / 0.4), pytest.approx(0.1 / 0.15)]
    warm = build_epoch(2, parts, 1.0, backend={}, gateway_backend=None)
    assert warm.requests_per_image == {"GET": 0.0, "HEAD": 0.0, "LIST": 0.0, "total": 0.0}
    # No counters at all (an NFS server that is not nfsgw): no per-image figures.
    assert build_epoch(2, parts, 1.0).requests_per_image is None


def test_markdown_and_json(tmp_path: Path) -> None:
    parts = [part(0, 4, 0.01, [0.1])]
    run = RunReport(
        command="nfsgw-loadgen compare ...",
        workload={"pattern": "kernel", "nodes": 1, "workers": 2, "batch_size": 4},
        dataset={"files": 4, "bytes": 4000},
        compute_s=0.103,
        backend_latency_ms=10.0,
        backend_bandwidth_mbps=None,
    )
    t = TargetReport("nfsgw-both", "nfs://127.0.0.1:1/data", "nfsgw")
    t.setup = build_setup([SetupPart(0, 0.1, 4, {"FSINFO": 1})], 0.1, backend={"LIST": 1})
    pf = {"objects": 8, "useful": 4, "wasted": 1, "joined": 0, "bytes": 8000}
    t.epochs = [
        build_epoch(
            1, parts, 1.0, backend={"GET": 4}, setup=t.setup, cache={"data": 0.0}, prefetch=pf
        ),
        build_epoch(2, parts, 0.5, backend={}, cache={"data": 1.0, "metadata": 1.0}),
    ]
    run.targets = [t, TargetReport("other", "nfs://x/y", "nfs", error="NfsError: READ: boom")]
    md = to_markdown(run)
    rows = [line for line in md.splitlines() if line.startswith("| nfsgw-both")]
    assert len(rows) == 2
    assert "| nfsgw-both | 1* | 4 |" in rows[0] and "1.000" in rows[0] and "0.250" in rows[0]
    assert "| nfsgw-both | 2 | 8 |" in rows[1] and "100 %" in rows[1]
    # waste next to GET/img: 1 of 8 prefetched objects evicted unread; none in epoch 2
    head = md.splitlines()[0]
    assert "| GET/img | waste | data hit |" in head
    assert "| 1.000 | 12.5 % |" in rows[0] and "| 0.000 | - |" in rows[1]
    assert all(r.count("|") == head.count("|") for r in md.splitlines()[1:4])
    assert "Waste: prefetched objects" in md
    assert "| other | failed: NfsError: READ: boom |" in md
    assert "backend latency 10 ms" in md
    run.write_json(tmp_path / "r.json")
    back = json.loads((tmp_path / "r.json").read_text())
    assert back["targets"][0]["epochs"][0]["requests_per_image"]["LIST"] == 0.25
    assert back["targets"][1]["error"].startswith("NfsError")
    assert back["targets"][0]["epochs"][0]["waste"] == 0.125
    assert back["targets"][0]["epochs"][0]["prefetch"]["wasted"] == 1
    assert back["targets"][0]["epochs"][1]["waste"] is None


def test_plots_are_written(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from loadgen.plots import write_plots

    parts = [part(0, 4, 0.01, [0.1])]
    run = RunReport("c", {}, {"files": 4}, 0.103, None, None)
    for name in ("a", "b"):
        t = TargetReport(name, "nfs://x/y", "nfs")
        t.epochs = [build_epoch(e, parts, 1.0, backend={"GET": 4}) for e in (1, 2)]
        run.targets.append(t)
    paths = write_plots(run, tmp_path)
    assert [p.name for p in paths] == [
        "images_per_s.png",
        "latency_cdf.png",
        "requests_per_image.png",
    ]
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


METRICS = """\
# HELP nfsgw_s3_requests_total Backend requests by operation and outcome
# TYPE nfsgw_s3_requests_total counter
nfsgw_s3_requests_total{op="list",outcome="ok"} 3.0
nfsgw_s3_requests_total{op="get",outcome="ok"} 10.0
nfsgw_s3_requests_total{op="get",outcome="retry"} 1.0
# TYPE nfsgw_s3_requests_created gauge
nfsgw_s3_requests_created{op="get",outcome="ok"} 1.7e9
# TYPE nfsgw_rpc_requests_total counter
nfsgw_rpc_requests_total{proc="READ",status="NFS3_OK"} 10.0
nfsgw_rpc_requests_total{proc="WRITE",status="NFS3_OK"} 0.0
# TYPE nfsgw_rpc_duration_seconds histogram
nfsgw_rpc_duration_seconds_bucket{le="0.001",proc="READ"} 10.0
nfsgw_rpc_duration_seconds_bucket{le="+Inf",proc="READ"} 10.0
nfsgw_rpc_duration_seconds_count{proc="READ"} 10.0
nfsgw_rpc_duration_seconds_sum{proc="READ"} 0.005
# TYPE nfsgw_data_cache_hits_total counter
nfsgw_data_cache_hits_total 30.0
# TYPE nfsgw_data_cache_misses_total counter
nfsgw_data_cache_misses_total 10.0
# TYPE nfsgw_metadata_cache_hits_total counter
nfsgw_metadata_cache_hits_total 18.0
# TYPE nfsgw_metadata_targeted_lookups_total counter
nfsgw_metadata_targeted_lookups_total 2.0
"""

PREFETCH_METRICS = """\
# TYPE nfsgw_prefetch_objects_total counter
nfsgw_prefetch_objects_total 40.0
# TYPE nfsgw_prefetch_useful_total counter
nfsgw_prefetch_useful_total 30.0
# TYPE nfsgw_prefetch_wasted_total counter
nfsgw_prefetch_wasted_total 2.0
# TYPE nfsgw_prefetch_joined_total counter
nfsgw_prefetch_joined_total 5.0
# TYPE nfsgw_prefetch_bytes_total counter
nfsgw_prefetch_bytes_total 4.0e6
"""


def test_metrics_parsing_and_ratios() -> None:
    d = gwmetrics.parse_metrics(METRICS)
    assert not any(k.endswith("_created") or "_bucket" in k for k in d)
    assert gwmetrics.backend_ops(d) == {"LIST": 3, "GET": 11}
    assert gwmetrics.rpc_ops(d) == {"READ": 10}
    assert gwmetrics.cache_ratios(d) == {"data": 0.75, "metadata": 0.9}
    zero = gwmetrics.delta(d, d)
    assert set(zero.values()) == {0.0}
    assert gwmetrics.cache_ratios(zero) == {"data": None, "metadata": None}
    # Only today's names are read (gateway/ops/metricdefs.py); earlier ones are not.
    old = {"nfsgw_data_hits_total": 1.0, "nfsgw_data_misses_total": 3.0}
    assert gwmetrics.cache_ratios(old)["data"] is None


def test_prefetch_counts_from_metrics() -> None:
    # A page without the data prefetcher's series (another server, an older gateway): None.
    assert gwmetrics.prefetch_counts(gwmetrics.parse_metrics(METRICS)) is None
    d = gwmetrics.parse_metrics(METRICS + PREFETCH_METRICS)
    counts = {"objects": 40, "useful": 30, "wasted": 2, "joined": 5, "bytes": 4_000_000}
    assert gwmetrics.prefetch_counts(d) == counts
    # Deltas keep the series (at 0) when nothing was prefetched.
    assert gwmetrics.prefetch_counts(gwmetrics.delta(d, d)) == dict.fromkeys(counts, 0)


def test_waste_is_wasted_over_prefetched_and_carries_the_setup() -> None:
    parts = [part(0, 10, 0.01, [0.1])]
    # Listing the tree at set-up starts the prefetch: epoch 1 includes the set-up's counts.
    setup = build_setup(
        [SetupPart(0, 0.5, 10, {})],
        0.5,
        prefetch={"objects": 6, "useful": 0, "wasted": 0, "joined": 0, "bytes": 600},
    )
    assert setup.prefetch == {"objects": 6, "useful": 0, "wasted": 0, "joined": 0, "bytes": 600}
    e1 = build_epoch(
        1,
        parts,
        1.0,
        prefetch={"objects": 4, "useful": 9, "wasted": 1, "joined": 1, "bytes": 400},
        setup=setup,
    )
    assert e1.prefetch == {"objects": 10, "useful": 9, "wasted": 1, "joined": 1, "bytes": 1000}
    assert e1.waste == pytest.approx(0.1)
    assert setup.prefetch["objects"] == 6  # not changed by the sum
    # Nothing prefetched (data prefetch off): no ratio; no metrics at all: no counts.
    off = build_epoch(2, parts, 1.0, prefetch=dict.fromkeys(("objects", "wasted"), 0))
    assert off.prefetch == {"objects": 0, "wasted": 0} and off.waste is None
    none = build_epoch(2, parts, 1.0)
    assert none.prefetch is None and none.waste is None
