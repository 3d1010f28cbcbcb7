"""The metrics table (``gateway.ops.metricdefs.METRICS``): every layer's stats match it field for
field, the exposition has exactly its families with their types and labels (and parses with
``promtool`` when installed), retired counters never go down, and docs/operations.md lists
every name."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gateway.data import DataStats, DiskStats
from gateway.data.prefetch import PrefetchStats
from gateway.data.shared import SharedStats
from gateway.drc import DrcStats
from gateway.fastpath import FastStats
from gateway.forward import RouteStats
from gateway.namespace import NamespaceStats
from gateway.namespace.resolve import HandleStats
from gateway.ops.gcwatch import GcStats
from gateway.ops.metricdefs import METRICS, SUPERVISOR_METRICS, Field, FieldSum, Kind, PerLabel
from gateway.ops.metrics import Metrics, ServerStats
from gateway.ops.warmup import WarmupStats
from gateway.pack.store import PackStats
from gateway.registry import GatewayStats
from gateway.transport import ConnectionStats
from gateway.writes import WriteStats

ROOT = Path(__file__).resolve().parents[3]
LAYERS: dict[str, type] = {
    "conn": ConnectionStats,
    "data": DataStats,
    "disk": DiskStats,
    "drc": DrcStats,
    "gateway": GatewayStats,
    "handles": HandleStats,
    "namespace": NamespaceStats,
    "writes": WriteStats,
    "server": ServerStats,
    "warmup": WarmupStats,
    "route": RouteStats,
    "prefetch": PrefetchStats,
    "fast": FastStats,
    "pack": PackStats,
    "gc": GcStats,
    "shared": SharedStats,
}


def full_metrics() -> Metrics:
    m = Metrics()
    for layer, cls in LAYERS.items():
        m.add_stats(layer, cls())
    m.prepare()
    return m


def exposition(m: Metrics) -> str:
    return generate_latest(m.registry).decode()


def test_every_layer_matches_the_table() -> None:
    layers = set()
    for d in METRICS:
        if isinstance(d.source, Field | FieldSum | PerLabel):
            layers.add(d.source.layer)
    assert layers == set(LAYERS)
    full_metrics()  # add_stats checks each object's fields against the table


def test_undeclared_fields_and_layers_are_refused() -> None:
    @dataclass(slots=True)
    class MoreWriteStats:
        writes: int = 0
        brand_new_counter: int = 0

    m = Metrics()
    with pytest.raises(ValueError, match="brand_new_counter"):
        m.add_stats("writes", MoreWriteStats())
    with pytest.raises(ValueError, match="no metric reads layer"):
        m.add_stats("elsewhere", WriteStats())


def test_exposition_is_the_table() -> None:
    m = full_metrics()
    m.call("NFS3.READ", "ok", 0.001)
    m.rpc_error("garbage_args")
    m.backend_request("get", "ok", 0.01)
    text = exposition(m)
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    want = {d.name.removesuffix("_total"): d for d in METRICS}
    assert set(fams) == set(want)
    for name, d in want.items():
        fam = fams[name]
        assert fam.type == d.kind.value, name
        assert fam.documentation == d.help
        assert fam.samples, name
        for s in fam.samples:
            assert set(s.labels) - {"le"} == set(d.labels), (name, s)
    # the gauge that was once exported as a counter
    assert "# TYPE nfsgw_writes_staged_files gauge" in text
    assert "nfsgw_writes_staged_files_total" not in text


def test_values_sum_over_sources_and_fold_labels() -> None:
    m = full_metrics()
    a, b = (
        NamespaceStats(prefetches=2, relists=1, targeted_lookups=3, entries=5),
        NamespaceStats(prefetches=1, entries=7),
    )
    m.add_stats("namespace", a)
    m.add_stats("namespace", b)
    m.add_stats("server", lambda: ServerStats(reloads_ok=4, reloads_error=1))
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(exposition(m))
        for s in f.samples
    }
    assert samples[("nfsgw_metadata_prefetches_total", (("kind", "first"),))] == 3
    assert samples[("nfsgw_metadata_prefetches_total", (("kind", "relist"),))] == 1
    assert samples[("nfsgw_metadata_cache_misses_total", ())] == 6
    assert samples[("nfsgw_metadata_cache_entries", ())] == 12
    assert samples[("nfsgw_config_reloads_total", (("outcome", "ok"),))] == 4
    assert samples[("nfsgw_config_reloads_total", (("outcome", "error"),))] == 1


def test_retired_counters_stay_and_gauges_leave() -> None:
    m = Metrics()
    ns = NamespaceStats(lookups=10, prefetches=2, entries=50, bytes=4096, dirs=3)
    m.add_stats("namespace", ns)
    m.retire_stats("namespace", ns)
    m.retire_stats("namespace", ns)  # once only
    t = m.totals("namespace")
    assert t["lookups"] == 10 and t["prefetches"] == 2
    assert t["entries"] == t["bytes"] == t["dirs"] == 0
    fresh = NamespaceStats(lookups=1, entries=5)
    m.add_stats("namespace", fresh)
    t = m.totals("namespace")
    assert t["lookups"] == 11 and t["entries"] == 5


def test_table_kinds_are_consistent() -> None:
    for d in METRICS:
        assert d.name.startswith("nfsgw_")
        assert d.name.endswith("_total") == (d.kind is Kind.COUNTER)
        assert not any(w in d.labels for w in ("path", "key", "client", "addr")), d.name


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_promtool_accepts_the_exposition() -> None:
    m = full_metrics()
    m.call("NFS3.READ", "ok", 0.001)
    m.backend_request("get", "ok", 0.01)
    r = subprocess.run(
        ["promtool", "check", "metrics"],
        input=exposition(m),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_operations_doc_lists_every_metric() -> None:
    doc = (ROOT / "docs" / "operations.md").read_text()
    section = doc[doc.index("\n## Metrics\n") :]
    section = section[: section.index("\n## ", 1)]
    documented = set(re.findall(r"`(nfsgw_[a-z0-9_]+)`", section))
    declared = {d.name for d in (*METRICS, *SUPERVISOR_METRICS)}
    assert declared - documented == set(), "undocumented metrics"
    assert documented - declared == set(), "documented metrics that do not exist"
