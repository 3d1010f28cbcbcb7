"""Prometheus metrics, all prefixed ``nfsgw_`` with units in the name (STYLE §6).

Owns: every metric the gateway exports, in one registry per server instance (tests run several
servers in one process). Labels never hold keys, paths or client addresses. Backend requests
are counted per operation, so "backend requests per file opened" reads off directly. The
layers below keep plain integer stats objects; a collector reads them at scrape time so the
hot path pays one attribute increment, not a lock.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import fields, is_dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client import Counter as PCounter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
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


class _StatsCollector(Collector):
    """Exposes integer fields of stats objects; names ending in ``_bytes``/``entries``/
    ``inflight``/``open`` are gauges, the rest counters."""

    GAUGE_SUFFIXES = ("bytes", "entries", "inflight", "open", "inflight_fetches")

    def __init__(self) -> None:
        self.sources: list[tuple[str, Any]] = []

    def add(self, prefix: str, stats: Any) -> None:
        self.sources.append((prefix, stats))

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        for prefix, stats in self.sources:
            if is_dataclass(stats):
                names = [f.name for f in fields(stats)]
            else:
                names = list(getattr(stats, "__slots__", ()))
            for name in names:
                v = getattr(stats, name, None)
                if not isinstance(v, int | float) or isinstance(v, bool):
                    continue
                full = f"nfsgw_{prefix}_{name}"
                if name.endswith(self.GAUGE_SUFFIXES) or name in ("cache_bytes", "bytes"):
                    yield GaugeMetricFamily(full, f"{prefix} {name}", value=v)
                else:
                    yield CounterMetricFamily(full, f"{prefix} {name}", value=v)


class Metrics(CallObserver):
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.rpc_requests = PCounter(
            "nfsgw_rpc_requests",
            "RPC calls by procedure and status",
            ["proc", "status"],
            registry=self.registry,
        )
        self.rpc_duration = Histogram(
            "nfsgw_rpc_duration_seconds",
            "RPC call latency by procedure",
            ["proc"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.rpc_errors = PCounter(
            "nfsgw_rpc_errors", "RPC-level errors by kind", ["kind"], registry=self.registry
        )
        self.s3_requests = PCounter(
            "nfsgw_s3_requests",
            "Backend requests by operation and outcome",
            ["op", "outcome"],
            registry=self.registry,
        )
        self.s3_duration = Histogram(
            "nfsgw_s3_request_duration_seconds",
            "Backend request latency by operation",
            ["op"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.stats = _StatsCollector()
        self.registry.register(self.stats)
        # Plain counters for in-process readers (tests, /v1/stats, loadgen).
        self.calls: Counter[str] = Counter()
        self.backend: Counter[str] = Counter()
        self._children: dict[tuple[str, str], Any] = {}
        self._hist: dict[str, Any] = {}

    # CallObserver
    def call(self, proc: str, status: str, seconds: float) -> None:
        key = (proc, status)
        c = self._children.get(key)
        if c is None:
            c = self._children[key] = self.rpc_requests.labels(proc, status)
        c.inc()
        h = self._hist.get(proc)
        if h is None:
            h = self._hist[proc] = self.rpc_duration.labels(proc)
        h.observe(seconds)
        self.calls[proc] += 1

    def rpc_error(self, kind: str) -> None:
        self.rpc_errors.labels(kind).inc()
        self.calls[f"rpc_error.{kind}"] += 1

    # backend RequestObserver
    def backend_request(self, op: str, outcome: str, seconds: float) -> None:
        key = ("s3:" + op, outcome)
        c = self._children.get(key)
        if c is None:
            c = self._children[key] = self.s3_requests.labels(op, outcome)
        c.inc()
        h = self._hist.get("s3:" + op)
        if h is None:
            h = self._hist["s3:" + op] = self.s3_duration.labels(op)
        h.observe(seconds)
        self.backend[op] += 1

    def add_stats(self, prefix: str, stats: Any) -> None:
        self.stats.add(prefix, stats)
