"""Prometheus metrics, all prefixed ``nfsgw_`` with units in the name (STYLE §6).

Owns: recording and exposing every metric of the table (``gateway.ops.metricdefs.METRICS``:
name, kind, help, labels, source, merge rule, initial series; re-exported here), one registry
per server instance (tests run several servers in one process), and the
series created at start-up. ``docs/operations.md`` lists the same names (a test checks it).
Labels never hold keys, paths or client addresses. Backend requests are counted per operation
and READs at offset 0 as files opened, so "backend requests per file opened" reads off directly.

The hot path pays plain integer increments, never a lock: RPC and backend latencies go into
``_Hist`` (a list of bucket counts per label set, found with one ``bisect``); the layers below
keep plain stats objects (``ConnectionStats``, ``GatewayStats``, ``DataStats``, ``DiskStats``,
``NamespaceStats``, ``WriteStats``, ``WarmupStats``, and ``ServerStats`` filled by the server),
registered here under a layer name with ``add_stats``; a collector turns them into metric
families at scrape time, from the table. A stats object whose fields do not match the table's
fields for its layer is refused at registration: a new field is exported only once it has a
row (and so a name, a kind and a help text).

Must not: import the server, the admin API or any layer's stats class (they are read by field
name), or put paths, keys or client addresses into labels.
"""

from __future__ import annotations

import bisect
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, fields, is_dataclass
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
from gateway.ops.metricdefs import (
    LATENCY_BUCKETS,
    METRICS,
    PREPARED_BACKEND_OPS,
    PREPARED_PROCS,
    SUPERVISOR_METRICS,
    Field,
    FieldSum,
    Hook,
    Kind,
    MetricDef,
    PerLabel,
    Source,
)

# The table's names are imported from gateway.ops.metricdefs; METRICS stays importable here.
__all__ = ["METRICS", "Metrics", "ServerStats"]

_LE = [repr(b) for b in LATENCY_BUCKETS] + ["+Inf"]


@dataclass(slots=True)
class ServerStats:
    """Readings of the process itself; the server builds one at scrape time."""

    exports: int = 0
    connections_refused: int = 0
    connections_evicted: int = 0
    connections_refused_peer: int = 0
    connections_idle_closed: int = 0
    reloads_ok: int = 0
    reloads_error: int = 0
    data_cache_budget_bytes: int = 0
    metadata_cache_budget_bytes: int = 0


def _field_refs(src: Source) -> Iterator[tuple[str, str]]:
    if isinstance(src, Field):
        yield src.layer, src.name
    elif isinstance(src, FieldSum):
        yield from ((src.layer, n) for n in src.names)
    elif isinstance(src, PerLabel):
        yield from ((src.layer, f) for _, f in src.series)


def _field_kinds(table: Sequence[MetricDef]) -> dict[str, dict[str, Kind]]:
    """layer -> field -> the kind of the families it feeds (checked: one kind per field, names
    unique, counters end in ``_total`` and nothing else does, labels match the source)."""
    out: dict[str, dict[str, Kind]] = {}
    names: set[str] = set()
    for m in table:
        if m.name in names:
            raise ValueError(f"{m.name}: declared twice")
        names.add(m.name)
        if m.name.endswith("_total") != (m.kind is Kind.COUNTER):
            raise ValueError(f"{m.name}: counters, and only they, end in _total")
        if isinstance(m.source, PerLabel) and len(m.labels) != 1:
            raise ValueError(f"{m.name}: a PerLabel source needs exactly one label")
        if isinstance(m.source, Field | FieldSum) and m.labels:
            raise ValueError(f"{m.name}: a field source has no labels")
        if m.initial and (
            m.source not in (Hook.RPC, Hook.RPC_ERRORS, Hook.BACKEND)
            or any(len(labels) != len(m.labels) for labels in m.initial)
        ):
            raise ValueError(f"{m.name}: initial label sets need an RPC/backend hook and labels")
        for layer, f in _field_refs(m.source):
            kind = out.setdefault(layer, {}).setdefault(f, m.kind)
            if kind is not m.kind:
                raise ValueError(f"{layer}.{f}: feeds a {kind.value} and a {m.kind.value}")
    return out


_FIELD_KINDS = _field_kinds(METRICS + SUPERVISOR_METRICS)


# ================================================================================ recording


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


def _numeric_fields(stats: Any) -> Iterator[tuple[str, float]]:
    if is_dataclass(stats):
        names: Sequence[str] = [f.name for f in fields(stats)]
    else:
        names = getattr(stats, "__slots__", ())
    for name in names:
        v = getattr(stats, name, None)
        if isinstance(v, int | float) and not isinstance(v, bool):
            yield name, v


_NONE = _Hist()  # the histogram of an ``initial`` label set nothing was recorded in yet

# A stats object, or a callable returning one at scrape time (a snapshot).
StatsSource = object | Callable[[], object]


def _read(source: StatsSource) -> object:
    return source() if callable(source) else source


class _Collector(Collector):
    def __init__(self, m: Metrics) -> None:
        self.m = m

    def collect(self) -> Iterator[Metric]:
        return self.m.families()


class Metrics(CallObserver):
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        # (proc, status) -> histogram; (op, outcome) -> histogram
        self.rpc: dict[tuple[str, str], _Hist] = {}
        self.s3: dict[tuple[str, str], _Hist] = {}
        self.rpc_errors: Counter[str] = Counter()
        # layer -> stats objects or snapshot callables (several namespaces are summed)
        self.sources: dict[str, list[StatsSource]] = {}
        # layer -> counter field -> what sources removed with ``retire_stats`` had counted
        self._retired: dict[str, dict[str, float]] = {}
        self.start_time = time.time()
        self.registry.register(_Collector(self))
        # Plain counters for in-process readers (tests, /v1/stats, loadgen).
        self.calls: Counter[str] = Counter()
        self.backend: Counter[str] = Counter()
        self.backend_retries = 0  # attempts that will be retried: 503, SlowDown, resets

    # -- start-up ---------------------------------------------------------------------------

    def prepare(
        self, procs: Sequence[str] = PREPARED_PROCS, ops: Sequence[str] = PREPARED_BACKEND_OPS
    ) -> None:
        """Create the ``ok`` series of every procedure and backend operation up front, so
        rates start from 0 on dashboards (STYLE §6: children resolved at start-up). The
        table's ``initial`` label sets (failures) are exposed at 0 until they happen, without
        an entry here (in-process readers of ``rpc``/``s3``/``rpc_errors`` see only these)."""
        for p in procs:
            self.rpc.setdefault((p, "ok"), _Hist())
        for op in ops:
            self.s3.setdefault((op, "ok"), _Hist())

    def add_stats(self, layer: str, stats: StatsSource) -> None:
        """Read ``stats`` (or what the callable returns) at every scrape under ``layer``.
        Its numeric fields must be exactly the fields ``METRICS`` declares for the layer."""
        declared = _FIELD_KINDS.get(layer)
        if declared is None:
            raise ValueError(f"no metric reads layer {layer!r}; declare it in METRICS")
        have = {name for name, _ in _numeric_fields(_read(stats))}
        if have != set(declared):
            raise ValueError(
                f"stats of layer {layer!r} do not match METRICS: undeclared "
                f"{sorted(have - set(declared))}, missing {sorted(set(declared) - have)}"
            )
        self.sources.setdefault(layer, []).append(stats)

    def remove_stats(self, layer: str, stats: StatsSource) -> None:
        lst = self.sources.get(layer, [])
        if any(s is stats for s in lst):
            lst[:] = [s for s in lst if s is not stats]

    def retire_stats(self, layer: str, stats: StatsSource) -> None:
        """Stop reading ``stats`` but keep what its counters counted in the totals (counters
        never go down when an export is replaced); its gauges leave with it."""
        if not any(s is stats for s in self.sources.get(layer, ())):
            return
        self.remove_stats(layer, stats)
        kinds = _FIELD_KINDS[layer]
        kept = self._retired.setdefault(layer, {})
        for name, v in _numeric_fields(_read(stats)):
            if kinds.get(name) is Kind.COUNTER:
                kept[name] = kept.get(name, 0) + v

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
        if outcome == "retry":
            self.backend_retries += 1

    # -- scrape time ------------------------------------------------------------------------

    def totals(self, layer: str) -> dict[str, float]:
        """Field -> value summed over the layer's stats objects (and retired counters); every
        field the table declares for the layer is present."""
        out: dict[str, float] = {}
        for s in self.sources.get(layer, ()):
            for name, v in _numeric_fields(_read(s)):
                out[name] = out.get(name, 0) + v
        for name, v in self._retired.get(layer, {}).items():
            out[name] = out.get(name, 0) + v
        for name in _FIELD_KINDS.get(layer, ()):
            out.setdefault(name, 0)
        return out

    def families(self) -> Iterator[Metric]:
        """Every family of ``METRICS``, in table order."""
        totals = {layer: self.totals(layer) for layer in _FIELD_KINDS}
        for m in METRICS:
            src = m.source
            if isinstance(src, Hook):
                yield self._hook_family(m, src)
                continue
            values = totals[src.layer]
            fam = self._family(m)
            if isinstance(src, Field):
                fam.add_metric([], values[src.name])
            elif isinstance(src, FieldSum):
                fam.add_metric([], sum(values[n] for n in src.names))
            else:
                for label, f in src.series:
                    fam.add_metric([label], values[f])
            yield fam

    @staticmethod
    def _family(m: MetricDef) -> CounterMetricFamily | GaugeMetricFamily:
        if m.kind is Kind.COUNTER:
            return CounterMetricFamily(m.name, m.help, labels=m.labels)
        if m.kind is Kind.GAUGE:
            return GaugeMetricFamily(m.name, m.help, labels=m.labels)
        raise ValueError(f"{m.name}: a histogram needs a Hook source")

    def _hook_family(self, m: MetricDef, hook: Hook) -> Metric:
        if hook is Hook.START_TIME:
            g = self._family(m)
            g.add_metric([], self.start_time)
            return g
        if hook is Hook.RPC_ERRORS:
            c = self._family(m)
            errors = {**{labels[0]: 0 for labels in m.initial}, **self.rpc_errors}
            for kind, n in sorted(errors.items()):
                c.add_metric([kind], n)
            return c
        hists = self.rpc if hook is Hook.RPC else self.s3
        if m.initial:
            hists = {**{(labels[0], labels[1]): _NONE for labels in m.initial}, **hists}
        if m.kind is Kind.HISTOGRAM:
            h = HistogramMetricFamily(m.name, m.help, labels=m.labels)
            for labels, hist in sorted(hists.items()):
                h.add_metric(list(labels), hist.cumulative(), hist.sum)
            return h
        fam = self._family(m)
        for labels, hist in sorted(hists.items()):
            fam.add_metric(list(labels), hist.count)
        return fam
