"""Reading a gateway's Prometheus ``/metrics`` (nfsgw's names) and the delay proxy's counts,
and turning two snapshots into per-epoch numbers.

Owns: which series mean what for the report: ``nfsgw_s3_requests_total{op}`` (backend
requests by operation), ``nfsgw_data_cache_{hits,misses}_total`` (data cache), and
``nfsgw_metadata_cache_{hits,negative_hits}_total``, ``nfsgw_metadata_{targeted_lookups,
heads}_total`` (metadata index) and ``nfsgw_prefetch_{objects,useful,wasted,joined,
bytes}_total`` (data prefetch), as ``gateway/ops/metricdefs.py`` declares them.
Must not: depend on being run against nfsgw (a target without metrics reports none).
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections import defaultdict
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

__all__ = [
    "Samples",
    "parse_metrics",
    "scrape",
    "fetch_json",
    "delta",
    "backend_ops",
    "rpc_ops",
    "cache_ratios",
    "prefetch_counts",
]

# sample name -> summed value (labels folded into the name: name{k=v,...} sorted)
Samples = dict[str, float]


def _key(name: str, labels: dict[str, str]) -> str:
    if not labels:
        return name
    inner = ",".join(f"{k}={labels[k]}" for k in sorted(labels))
    return f"{name}{{{inner}}}"


def parse_metrics(text: str) -> Samples:
    """Counters and gauges of a Prometheus text page (histogram buckets and ``_created``
    dropped); the same series appearing twice (several exports) is summed."""
    out: Samples = defaultdict(float)
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.endswith(("_bucket", "_created")):
                continue
            out[_key(s.name, dict(s.labels))] += float(s.value)
    return dict(out)


def _get(url: str, timeout_s: float) -> str:
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:
        body: bytes = resp.read()
    return body.decode("utf-8", "replace")


async def scrape(url: str, timeout_s: float = 10.0) -> Samples:
    """GET a /metrics URL (in a thread; the loop stays free)."""
    text = await asyncio.to_thread(_get, url, timeout_s)
    return parse_metrics(text)


async def fetch_json(url: str, timeout_s: float = 10.0) -> Any:
    return json.loads(await asyncio.to_thread(_get, url, timeout_s))


def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    keys = set(after) | set(before)
    return {k: after.get(k, 0.0) - before.get(k, 0.0) for k in sorted(keys)}


def _labels(key: str) -> dict[str, str]:
    if "{" not in key:
        return {}
    inner = key[key.index("{") + 1 : -1]
    return dict(p.split("=", 1) for p in inner.split(",") if "=" in p)


def backend_ops(d: Samples) -> dict[str, int]:
    """Backend requests by kind (LIST/HEAD/GET/...) from ``nfsgw_s3_requests_total``."""
    out: dict[str, int] = defaultdict(int)
    for k, v in d.items():
        if k.startswith("nfsgw_s3_requests_total{"):
            op = _labels(k).get("op", "?")
            out[op.upper()] += round(v)
    return {k: v for k, v in out.items() if v}


def rpc_ops(d: Samples) -> dict[str, int]:
    """RPC calls the gateway served, by procedure."""
    out: dict[str, int] = defaultdict(int)
    for k, v in d.items():
        if k.startswith("nfsgw_rpc_requests_total{"):
            out[_labels(k).get("proc", "?")] += round(v)
    return {k: v for k, v in out.items() if v}


def _ratio(num: float, den: float) -> float | None:
    return num / den if den > 0 else None


def cache_ratios(d: Samples) -> dict[str, float | None]:
    """``data``: READ block lookups served from memory / all lookups. ``metadata``: name
    resolutions answered from the index / all resolutions (those that needed a targeted
    LIST or a HEAD count as misses; a first touch that waited for a directory listing
    counts as a hit, since the listing answers the whole directory)."""
    hits = d.get("nfsgw_data_cache_hits_total", 0.0)
    misses = d.get("nfsgw_data_cache_misses_total", 0.0)
    ns_hit = d.get("nfsgw_metadata_cache_hits_total", 0.0) + d.get(
        "nfsgw_metadata_cache_negative_hits_total", 0.0
    )
    ns_miss = d.get("nfsgw_metadata_targeted_lookups_total", 0.0) + d.get(
        "nfsgw_metadata_heads_total", 0.0
    )
    return {"data": _ratio(hits, hits + misses), "metadata": _ratio(ns_hit, ns_hit + ns_miss)}


# report key -> the data prefetcher's counter (gateway/ops/metricdefs.py)
PREFETCH_SERIES = {
    "objects": "nfsgw_prefetch_objects_total",
    "useful": "nfsgw_prefetch_useful_total",
    "wasted": "nfsgw_prefetch_wasted_total",
    "joined": "nfsgw_prefetch_joined_total",
    "bytes": "nfsgw_prefetch_bytes_total",
}


def prefetch_counts(d: Samples) -> dict[str, int] | None:
    """The data prefetcher's counts: ``objects`` prefetched, ``useful`` (prefetched, then
    read), ``wasted`` (prefetched, then evicted unread), ``joined`` (READs that joined a
    prefetch in flight) and ``bytes``; None when the page has none of these series (a gateway
    without data prefetch metrics, or another server)."""
    if not any(name in d for name in PREFETCH_SERIES.values()):
        return None
    return {k: round(d.get(name, 0.0)) for k, name in PREFETCH_SERIES.items()}
