"""The benchmark report: per-epoch numbers from the nodes' parts and the backend counters, the
accelerator-utilisation estimate, JSON and the Markdown table.

Owns: what every figure means.

- ``images_per_s``, ``mb_per_s``: files (bytes, 10^6) per second of the epoch's wall time
  (all nodes started together until the last finished). The tree scan of ``kernel``/``cv2``
  happens once before epoch 1 and is not in its time; its backend requests are added to
  epoch 1's ("what the first pass over the data cost").
- ``latency_ms``: per file, from its first RPC to its last byte (not the checksum).
- ``requests_per_image``: backend requests by kind (LIST/HEAD/GET/...) per file read, from
  the delay proxy when there is one (what the store saw), else from the gateway's
  ``nfsgw_s3_requests_total``; both are kept in the JSON.
- ``prefetch``, ``waste``: the gateway's data prefetcher over the epoch (its ``/metrics``
  deltas; epoch 1 includes the set-up's, since listing the tree starts the prefetch):
  ``prefetch`` holds the counts (objects, useful, wasted, joined, bytes), ``waste`` is
  wasted / objects, the share of prefetched objects evicted unread. None (``-`` in the
  table) for a target without these metrics or an epoch that prefetched nothing.
- ``vs local disk`` (``vs_local``): a target's images/s as a fraction of the local-disk
  target's (``local:DIR``, the first one) in the same epoch; the column is there when a run
  has a local target. The local tree is evicted from the page cache before its set-up, so
  its epoch 1 reads the disk and epoch 2 the page cache, as a gateway's cold and warm epochs.
- ``au``: accelerator utilisation in the MLPerf Storage sense, AU = compute / (compute +
  data stall), estimated per node from when each batch was complete: the node's accelerator
  takes batches in order, each needs ``compute_s`` (default DLIO's ResNet-50: 0.103 s per
  batch of 64), and waits when the next batch is not ready. Loading does not wait for the
  accelerator here, which changes nothing when loading is the bottleneck (the case AU is
  about) and makes AU 100 % when it is not. MLPerf Storage passes at AU >= 90 %.

Must not: run anything.
"""

from __future__ import annotations

import json
import math
import os
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from loadgen.workload import EpochPart, SetupPart

__all__ = [
    "EpochReport",
    "RunReport",
    "SetupReport",
    "TargetReport",
    "au_estimate",
    "build_epoch",
    "build_setup",
    "cdf_points",
    "local_reference",
    "percentile",
    "to_markdown",
    "vs_local",
]

DEFAULT_COMPUTE_S = 0.103
DEFAULT_BATCH = 64
AU_PASS = 0.90
KINDS = ("LIST", "HEAD", "GET")


def percentile(sorted_values: list[float], q: float) -> float:
    """Linear-interpolated percentile (``q`` in 0..100) of an already sorted list."""
    if not sorted_values:
        return math.nan
    if len(sorted_values) == 1:
        return sorted_values[0]
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    frac = pos - lo
    return sorted_values[lo] * (1 - frac) + sorted_values[hi] * frac


def cdf_points(sorted_values: list[float], n: int = 200) -> list[tuple[float, float]]:
    """At most ``n`` (value, cumulative fraction) points of the empirical CDF, for plots."""
    m = len(sorted_values)
    if m == 0:
        return []
    idx = list(range(m)) if m <= n else sorted({round(i * (m - 1) / (n - 1)) for i in range(n)})
    return [(sorted_values[i], (i + 1) / m) for i in idx]


def au_estimate(batch_ready: list[float], compute_s: float) -> float | None:
    """AU of one accelerator that consumes batches in order (see the module docstring)."""
    if not batch_ready or compute_s <= 0:
        return None
    t = 0.0
    for r in batch_ready:
        t = max(t, r) + compute_s
    return len(batch_ready) * compute_s / t


@dataclass(slots=True)
class SetupReport:
    seconds: float
    files: int
    rpc: dict[str, int] = field(default_factory=dict)
    backend: dict[str, int] | None = None
    gateway_backend: dict[str, int] | None = None
    prefetch: dict[str, int] | None = None


@dataclass(slots=True)
class EpochReport:
    epoch: int
    seconds: float
    files: int
    bytes: int
    images_per_s: float
    mb_per_s: float
    latency_ms: dict[str, float]
    au: float | None
    au_per_node: list[float | None]
    rpc: dict[str, int]
    backend: dict[str, int] | None = None
    gateway_backend: dict[str, int] | None = None
    gateway_rpc: dict[str, int] | None = None
    requests_per_image: dict[str, float] | None = None
    cache: dict[str, float | None] | None = None
    prefetch: dict[str, int] | None = None
    waste: float | None = None
    includes_setup_requests: bool = False
    cdf_ms: list[tuple[float, float]] = field(default_factory=list)


@dataclass(slots=True)
class TargetReport:
    name: str
    url: str
    # "nfsgw" (started by loadgen), "nfs" (any NFSv3 server), "local" (local:DIR), "peer"
    # (another S3-to-NFS server started by loadgen, e.g. rclone serve nfs)
    kind: str
    options: list[str] = field(default_factory=list)
    setup: SetupReport | None = None
    epochs: list[EpochReport] = field(default_factory=list)
    error: str | None = None


@dataclass(slots=True)
class RunReport:
    command: str
    workload: dict[str, Any]
    dataset: dict[str, Any]
    compute_s: float
    backend_latency_ms: float | None
    backend_bandwidth_mbps: float | None
    targets: list[TargetReport] = field(default_factory=list)
    created: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    host: dict[str, Any] = field(
        default_factory=lambda: {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(terse=True),
        }
    )
    version: int = 1

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def write_json(self, path: str | os.PathLike[str]) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1, sort_keys=False) + "\n")


def _kinds(counts: dict[str, int] | None) -> dict[str, int] | None:
    if counts is None:
        return None
    return {k: int(v) for k, v in counts.items() if k not in ("bytes", "errors") and v}


def build_setup(
    parts: list[SetupPart],
    seconds: float,
    *,
    backend: dict[str, int] | None = None,
    gateway_backend: dict[str, int] | None = None,
    prefetch: dict[str, int] | None = None,
) -> SetupReport:
    rpc: dict[str, int] = {}
    for p in parts:
        for k, v in p.rpc.items():
            rpc[k] = rpc.get(k, 0) + v
    files = parts[0].files if parts else 0
    return SetupReport(
        seconds, files, rpc, _kinds(backend), _kinds(gateway_backend), _copy(prefetch)
    )


def _copy(d: dict[str, int] | None) -> dict[str, int] | None:
    return None if d is None else dict(d)


def _add(a: dict[str, int] | None, b: dict[str, int] | None) -> dict[str, int] | None:
    if a is None or b is None:
        return a if b is None else b
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0) + v
    return out


def build_epoch(
    epoch: int,
    parts: list[EpochPart],
    seconds: float,
    *,
    compute_s: float = DEFAULT_COMPUTE_S,
    backend: dict[str, int] | None = None,
    gateway_backend: dict[str, int] | None = None,
    gateway_rpc: dict[str, int] | None = None,
    cache: dict[str, float | None] | None = None,
    prefetch: dict[str, int] | None = None,
    setup: SetupReport | None = None,
) -> EpochReport:
    """One epoch's report from the nodes' parts, the wall time, and the deltas of the backend
    counters over the epoch. With ``setup`` (epoch 1), its backend requests and prefetch
    counts are added."""
    lat = sorted(x for p in parts for x in p.latencies)
    files = sum(p.files for p in parts)
    nbytes = sum(p.bytes for p in parts)
    rpc: dict[str, int] = {}
    for p in parts:
        for k, v in p.rpc.items():
            rpc[k] = rpc.get(k, 0) + v
    backend = _kinds(backend)
    gateway_backend = _kinds(gateway_backend)
    carried = False  # the set-up made backend requests, counted in this epoch
    if setup is not None:
        carried = any((setup.backend or {}).values()) or any((setup.gateway_backend or {}).values())
        backend = _add(backend, setup.backend)
        gateway_backend = _add(gateway_backend, setup.gateway_backend)
        prefetch = _add(prefetch, setup.prefetch)
    prefetch = _copy(prefetch)
    waste = None
    if prefetch is not None and prefetch.get("objects", 0) > 0:
        waste = prefetch.get("wasted", 0) / prefetch["objects"]
    counts = backend if backend is not None else gateway_backend
    rpi = None
    if counts is not None and files:
        rpi = {k: counts.get(k, 0) / files for k in sorted(set(counts) | set(KINDS))}
        rpi["total"] = sum(counts.values()) / files
    aus = [au_estimate(p.batch_ready, compute_s) for p in sorted(parts, key=lambda p: p.rank)]
    known = [a for a in aus if a is not None]
    ms = [x * 1000 for x in lat]
    return EpochReport(
        epoch=epoch,
        seconds=seconds,
        files=files,
        bytes=nbytes,
        images_per_s=files / seconds if seconds > 0 else 0.0,
        mb_per_s=nbytes / 1e6 / seconds if seconds > 0 else 0.0,
        latency_ms={
            "p50": percentile(ms, 50),
            "p95": percentile(ms, 95),
            "p99": percentile(ms, 99),
            "mean": sum(ms) / len(ms) if ms else math.nan,
            "max": ms[-1] if ms else math.nan,
        },
        au=sum(known) / len(known) if known else None,
        au_per_node=aus,
        rpc=rpc,
        backend=backend,
        gateway_backend=gateway_backend,
        gateway_rpc=gateway_rpc,
        requests_per_image=rpi,
        cache=cache,
        prefetch=prefetch,
        waste=waste,
        includes_setup_requests=carried,
        cdf_ms=cdf_points(ms),
    )


# --------------------------------------------------------------------------- Markdown


def _f(v: float | None, fmt: str) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return format(v, fmt)


def _pct(v: float | None, digits: int = 0) -> str:
    return "-" if v is None else f"{v * 100:.{digits}f} %"


def local_reference(run: RunReport) -> TargetReport | None:
    """The run's local-disk target (the first ``local`` one with epochs), if any."""
    return next((t for t in run.targets if t.kind == "local" and t.epochs), None)


def vs_local(run: RunReport, epoch: EpochReport) -> float | None:
    """``epoch``'s images/s as a fraction of the local target's in the same epoch."""
    ref = local_reference(run)
    if ref is None:
        return None
    same = next((e for e in ref.epochs if e.epoch == epoch.epoch), None)
    if same is None or same.images_per_s <= 0:
        return None
    return epoch.images_per_s / same.images_per_s


def to_markdown(run: RunReport) -> str:
    """The side-by-side table (one row per target and epoch) plus a short legend."""
    local = local_reference(run) is not None
    lines = [
        "| target | epoch | images/s | "
        + ("vs local disk | " if local else "")
        + "MB/s | p50 ms | p95 ms | p99 ms "
        "| LIST/img | HEAD/img | GET/img | waste | data hit | meta hit | AU |",
        "| --- |" + " ---: |" * (13 + local),
    ]
    for t in run.targets:
        if t.error is not None and not t.epochs:
            fail = t.error.splitlines()[0][:80]
            lines.append(f"| {t.name} | failed: {fail} |" + " |" * (12 + local))
            continue
        for e in t.epochs:
            r = e.requests_per_image or {}
            c = e.cache or {}
            v = vs_local(run, e)
            ratio = ["-" if v is None else f"{v:.2f}x"] if local else []
            lines.append(
                "| "
                + " | ".join(
                    [
                        t.name,
                        str(e.epoch) + ("*" if e.includes_setup_requests else ""),
                        _f(e.images_per_s, ".0f"),
                        *ratio,
                        _f(e.mb_per_s, ".1f"),
                        _f(e.latency_ms.get("p50"), ".2f"),
                        _f(e.latency_ms.get("p95"), ".2f"),
                        _f(e.latency_ms.get("p99"), ".2f"),
                        _f(r.get("LIST"), ".3f") if r else "-",
                        _f(r.get("HEAD"), ".3f") if r else "-",
                        _f(r.get("GET"), ".3f") if r else "-",
                        _pct(e.waste, 1),
                        _pct(c.get("data")),
                        _pct(c.get("metadata")),
                        _pct(e.au),
                    ]
                )
                + " |"
            )
    w = run.workload
    legend = [
        "",
        f"Workload: pattern `{w.get('pattern')}`, {w.get('nodes')} node(s) x "
        f"{w.get('workers')} worker(s), batch {w.get('batch_size')}; dataset "
        f"{run.dataset.get('files')} files, {run.dataset.get('bytes', 0) / 1e6:.0f} MB"
        + (
            f"; backend latency {run.backend_latency_ms:g} ms"
            if run.backend_latency_ms is not None
            else ""
        )
        + (
            f", bandwidth cap {run.backend_bandwidth_mbps:g} MB/s"
            if run.backend_bandwidth_mbps
            else ""
        )
        + ".",
        "Requests per image are backend requests (LIST/HEAD/GET) per file read; `*` marks an "
        "epoch that also carries the set-up's requests (mount and tree scan). Waste: prefetched "
        "objects the gateway evicted unread / objects it prefetched (data prefetch; `-` when "
        "it prefetched nothing). Hit ratios are the "
        "gateway's data cache and metadata index. AU: accelerator utilisation estimate "
        f"(compute {run.compute_s:g} s per batch; MLPerf Storage passes at >= 90 %).",
    ]
    if local:
        legend.append(
            "vs local disk: images/s as a fraction of the local-disk row's in the same epoch "
            "(its epoch 1 reads the disk: the tree is evicted from the page cache first; "
            "epoch 2 reads the page cache)."
        )
    for t in run.targets:
        if t.setup is not None:
            s = t.setup
            lines_rpc = ", ".join(f"{k} {v}" for k, v in sorted(s.rpc.items()))
            legend.append(f"- {t.name}: set-up {s.seconds:.2f} s ({lines_rpc})")
        if t.error is not None:
            legend.append(f"- {t.name}: FAILED: {t.error.splitlines()[0]}")
    return "\n".join(lines + legend) + "\n"
