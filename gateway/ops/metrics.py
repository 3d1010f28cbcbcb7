"""Prometheus metrics, all prefixed ``nfsgw_`` with units in the name (STYLE §6).

Owns: every metric the gateway exports, in one registry per server instance (tests run several
servers in one process), and their names (``docs/operations.md`` lists them). Labels never hold
keys, paths or client addresses. Backend requests are counted per operation and READs at offset
0 as files opened, so "backend requests per file opened" reads off directly.

The hot path pays plain integer increments, never a lock: RPC and backend latencies go into
``_Hist`` (a list of bucket counts per label set, found with one ``bisect``); the layers below
keep plain stats objects (``ConnectionStats``, ``GatewayStats``, ``DataStats``,
``NamespaceStats``); a collector turns all of them into metric families at scrape time.
Stats fields without an explicit name below are still exported, as ``nfsgw_<layer>_<field>``
(names ending in ``bytes``/``entries``/``inflight``... are gauges), so a new counter in a layer
shows up without touching this file.
"""

from __future__ import annotations

import bisect
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import fields, is_dataclass
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from gateway.dispatch import CallObserver

# 50 µs .. 5 s: cached GETATTRs are tens of µs, cold backend fetches tens of ms.
LATENCY_BUCKETS = (
    50e-6,
    100e-6,
    250e-6,
    500e-6,
    1e-3,
    2.5e-3,
    5e-3,
    10e-3,
    25e-3,
    50e-3,
    100e-3,
    250e-3,
    500e-3,
    1.0,
    2.5,
    5.0,
)
_LE = [repr(b) for b in LATENCY_BUCKETS] + ["+Inf"]


class _Hist:
    """Bucket counts of one label set (not cumulative; the collector sums them)."""

    __slots__ = ("buckets", "count", "sum")

    def __init__(self) -> None:
        self.buckets = [0] * (len(LATENCY_BUCKETS) + 1)
        self.count = 0
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        self.buckets[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1
        self.count += 1
        self.sum += seconds

    def cumulative(self) -> list[tuple[str, float]]:
        out: list[tuple[str, float]] = []
        acc = 0
        for le, n in zip(_LE, self.buckets, strict=True):
            acc += n
            out.append((le, acc))
        return out


# Explicit names: (layer, field) -> (metric name, help, kind); kind "counter" or "gauge".
_NAMED: dict[tuple[str, str], tuple[str, str, str]] = {
    ("conn", "open"): ("nfsgw_connections", "Client TCP connections open", "gauge"),
    ("conn", "opened"): ("nfsgw_connections_opened", "Client TCP connections accepted", "counter"),
    ("conn", "closed"): ("nfsgw_connections_closed", "Client TCP connections closed", "counter"),
    ("conn", "inflight"): ("nfsgw_rpc_inflight", "RPC calls being served", "gauge"),
    ("conn", "bytes_in"): ("nfsgw_received_bytes", "Bytes received from NFS clients", "counter"),
    ("conn", "bytes_out"): ("nfsgw_sent_bytes", "Bytes sent to NFS clients", "counter"),
    ("conn", "oversized"): (
        "nfsgw_records_rejected",
        "RPC records over max_record (their connection was closed)",
        "counter",
    ),
    ("gateway", "files_opened"): (
        "nfsgw_files_opened",
        "READs at offset 0: files opened and read (NFSv3 has no OPEN)",
        "counter",
    ),
    ("gateway", "clients_denied"): (
        "nfsgw_clients_denied",
        "NFS calls refused by an export's clients or secure_port rule (NFS3ERR_ACCES)",
        "counter",
    ),
    ("gateway", "mounts_denied"): (
        "nfsgw_mounts_denied",
        "MNT calls refused by an export's clients or secure_port rule (MNT3ERR_ACCES)",
        "counter",
    ),
    ("gateway", "permission_denied"): (
        "nfsgw_permission_denied",
        "LOOKUP/READDIR/READ refused by mode bits for the squashed identity",
        "counter",
    ),
    ("data", "hits"): ("nfsgw_data_cache_hits", "READ block lookups served from memory", "counter"),
    ("data", "misses"): (
        "nfsgw_data_cache_misses",
        "READ block lookups that waited for a backend fetch",
        "counter",
    ),
    ("data", "joined"): (
        "nfsgw_data_cache_joined",
        "Misses that joined a fetch already in flight",
        "counter",
    ),
    ("data", "evictions"): (
        "nfsgw_data_cache_evictions",
        "Blocks dropped for space (including admission refusals)",
        "counter",
    ),
    ("data", "cache_bytes"): ("nfsgw_data_cache_bytes", "Bytes charged to the data cache", "gauge"),
    ("data", "entries"): ("nfsgw_data_cache_entries", "Blocks in the data cache", "gauge"),
    ("data", "bytes_hit"): (
        "nfsgw_data_cache_hit_bytes",
        "READ payload bytes served from memory",
        "counter",
    ),
    ("data", "bytes_fetched"): (
        "nfsgw_backend_received_bytes",
        "Object bytes received from the backend",
        "counter",
    ),
    ("data", "readahead_blocks"): (
        "nfsgw_data_readahead_blocks",
        "Blocks requested by read-ahead (data prefetch)",
        "counter",
    ),
    ("data", "readahead_unused"): (
        "nfsgw_data_readahead_unused_blocks",
        "Read-ahead blocks dropped before any READ used them",
        "counter",
    ),
    ("data", "inflight_fetches"): (
        "nfsgw_data_fetches_inflight",
        "Backend GETs running",
        "gauge",
    ),
    ("namespace", "lookups"): ("nfsgw_metadata_lookups", "Name lookups in the index", "counter"),
    ("namespace", "hits"): (
        "nfsgw_metadata_cache_hits",
        "Lookups and getattrs answered with an entry from the index",
        "counter",
    ),
    ("namespace", "negative_hits"): (
        "nfsgw_metadata_cache_negative_hits",
        "Lookups answered 'absent' from a complete listing, without a request",
        "counter",
    ),
    ("namespace", "evictions"): (
        "nfsgw_metadata_cache_evictions",
        "Directories dropped from the index for space",
        "counter",
    ),
    ("namespace", "bytes"): (
        "nfsgw_metadata_cache_bytes",
        "Estimated bytes of the directory index",
        "gauge",
    ),
    ("namespace", "entries"): ("nfsgw_metadata_cache_entries", "Entries in the index", "gauge"),
    ("namespace", "dirs"): ("nfsgw_metadata_cache_dirs", "Directories in the index", "gauge"),
    ("namespace", "list_pages"): (
        "nfsgw_metadata_list_pages",
        "LIST pages ingested",
        "counter",
    ),
    ("namespace", "targeted_lookups"): (
        "nfsgw_metadata_targeted_lookups",
        "Lookups in huge or partial directories answered with a targeted LIST",
        "counter",
    ),
    ("namespace", "heads"): ("nfsgw_metadata_heads", "HEADs issued by the index", "counter"),
    ("namespace", "list_errors"): (
        "nfsgw_metadata_list_errors",
        "Directory listings that failed",
        "counter",
    ),
}
# Fields folded into other families (prefetches, misses): not exported generically.
_FOLDED = {("namespace", "prefetches"), ("namespace", "relists")}
_GAUGE_SUFFIXES = ("bytes", "entries", "inflight", "open", "inflight_fetches")


def _numeric_fields(stats: Any) -> Iterator[tuple[str, float]]:
    if is_dataclass(stats):
        names: Iterable[str] = (f.name for f in fields(stats))
    else:
        names = getattr(stats, "__slots__", ())
    for name in names:
        v = getattr(stats, name, None)
        if isinstance(v, int | float) and not isinstance(v, bool):
            yield name, v


class _Collector(Collector):
    def __init__(self, m: Metrics) -> None:
        self.m = m

    def collect(self) -> Iterator[Metric]:
        m = self.m
        yield from m._rpc_families()
        yield from m._s3_families()
        yield from m._stats_families()
        for extra in m.extra_collectors:
            yield from extra()


class Metrics(CallObserver):
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        # (proc, status) -> histogram; (op, outcome) -> histogram
        self.rpc: dict[tuple[str, str], _Hist] = {}
        self.s3: dict[tuple[str, str], _Hist] = {}
        self.rpc_errors: Counter[str] = Counter()
        # layer -> stats objects (several namespaces are summed)
        self.sources: dict[str, list[Any]] = {}
        # Extra metric families (warm-up jobs, config reloads, ...), called at scrape time.
        self.extra_collectors: list[Callable[[], Iterable[Metric]]] = []
        self.start_time = time.time()
        self.registry.register(_Collector(self))
        # Plain counters for in-process readers (tests, /v1/stats, loadgen).
        self.calls: Counter[str] = Counter()
        self.backend: Counter[str] = Counter()

    # -- start-up ---------------------------------------------------------------------------

    def prepare(self, procs: Sequence[str], ops: Sequence[str] = ()) -> None:
        """Create the ``ok`` series of every procedure and backend operation up front, so
        rates start from 0 on dashboards (STYLE §6: children resolved at start-up)."""
        for p in procs:
            self.rpc.setdefault((p, "ok"), _Hist())
        for op in ops:
            self.s3.setdefault((op, "ok"), _Hist())

    def add_stats(self, prefix: str, stats: Any) -> None:
        self.sources.setdefault(prefix, []).append(stats)

    def remove_stats(self, prefix: str, stats: Any) -> None:
        lst = self.sources.get(prefix, [])
        if any(s is stats for s in lst):
            lst[:] = [s for s in lst if s is not stats]

    # -- hot path ---------------------------------------------------------------------------

    # CallObserver
    def call(self, proc: str, status: str, seconds: float) -> None:
        h = self.rpc.get((proc, status))
        if h is None:
            h = self.rpc[(proc, status)] = _Hist()
        h.observe(seconds)
        self.calls[proc] += 1

    def rpc_error(self, kind: str) -> None:
        self.rpc_errors[kind] += 1
        self.calls[f"rpc_error.{kind}"] += 1

    # backend RequestObserver
    def backend_request(self, op: str, outcome: str, seconds: float) -> None:
        h = self.s3.get((op, outcome))
        if h is None:
            h = self.s3[(op, outcome)] = _Hist()
        h.observe(seconds)
        self.backend[op] += 1

    # -- scrape time ------------------------------------------------------------------------

    def _rpc_families(self) -> Iterator[Metric]:
        req = CounterMetricFamily(
            "nfsgw_rpc_requests", "RPC calls by procedure and status", labels=["proc", "status"]
        )
        dur = HistogramMetricFamily(
            "nfsgw_rpc_duration_seconds",
            "RPC call latency by procedure and status (decode to reply encoded)",
            labels=["proc", "status"],
        )
        for (proc, status), h in sorted(self.rpc.items()):
            req.add_metric([proc, status], h.count)
            dur.add_metric([proc, status], h.cumulative(), h.sum)
        err = CounterMetricFamily(
            "nfsgw_rpc_errors", "RPC-level errors (no NFS status) by kind", labels=["kind"]
        )
        for kind, n in sorted(self.rpc_errors.items()):
            err.add_metric([kind], n)
        yield from (req, dur, err)

    def _s3_families(self) -> Iterator[Metric]:
        req = CounterMetricFamily(
            "nfsgw_s3_requests",
            "Backend requests by operation and outcome",
            labels=["op", "outcome"],
        )
        dur = HistogramMetricFamily(
            "nfsgw_s3_request_duration_seconds",
            "Backend request latency by operation and outcome",
            labels=["op", "outcome"],
        )
        for (op, outcome), h in sorted(self.s3.items()):
            req.add_metric([op, outcome], h.count)
            dur.add_metric([op, outcome], h.cumulative(), h.sum)
        yield from (req, dur)

    def totals(self, layer: str) -> dict[str, float]:
        """Field -> value summed over the layer's stats objects."""
        out: dict[str, float] = {}
        for s in self.sources.get(layer, ()):
            for name, v in _numeric_fields(s):
                out[name] = out.get(name, 0) + v
        return out

    def _stats_families(self) -> Iterator[Metric]:
        for layer in sorted(self.sources):
            for name, v in sorted(self.totals(layer).items()):
                if (layer, name) in _FOLDED:
                    continue
                named = _NAMED.get((layer, name))
                if named is not None:
                    full, doc, kind = named
                else:
                    full, doc = f"nfsgw_{layer}_{name}", f"{layer} {name}"
                    kind = "gauge" if name.endswith(_GAUGE_SUFFIXES) else "counter"
                if kind == "gauge":
                    yield GaugeMetricFamily(full, doc, value=v)
                else:
                    yield CounterMetricFamily(full, doc, value=v)
        ns = self.totals("namespace")
        if ns:
            pf = CounterMetricFamily(
                "nfsgw_metadata_prefetches",
                "Whole-directory listings started (first touch, or a re-list after the TTL)",
                labels=["kind"],
            )
            pf.add_metric(["first"], ns.get("prefetches", 0))
            pf.add_metric(["relist"], ns.get("relists", 0))
            yield pf
            yield CounterMetricFamily(
                "nfsgw_metadata_cache_misses",
                "Index lookups that needed a backend request (a directory's first listing or a "
                "targeted LIST)",
                value=ns.get("prefetches", 0) + ns.get("targeted_lookups", 0),
            )
        yield GaugeMetricFamily(
            "nfsgw_start_time_seconds", "Start time of the process (Unix time)", self.start_time
        )
