"""The nfsgw Grafana dashboard, declared as rows of panels; ``python contrib/grafana/dashboard.py``
writes ``contrib/grafana/nfsgw.json`` (import it as it is: Dashboards > New > Import; it asks
for nothing, its ``datasource`` variable picks the Prometheus that scrapes the gateways).

Owns: which questions the dashboard answers and the PromQL that answers them. Every expression
selects ``instance=~"$instance"`` and takes rates over ``$__rate_interval``.
``tests/unit/test_dashboard.py`` checks that the JSON is this file's output, that every metric
named exists in ``gateway/ops/metricdefs.py``'s table, and that docs/operations.md describes
every panel; ``tests/integration/test_dashboard.py`` evaluates every expression in a real
Prometheus scraping a gateway under load (each must parse, each panel must return data).

To add a panel: append a ``Panel`` to its row in ``ROWS`` (or a new row), run this file, and
add the panel's title and a sentence to the "Dashboard" section of docs/operations.md.
Must not: name a metric the gateway does not export.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

OUT = Path(__file__).with_name("nfsgw.json")
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
SEL = 'instance=~"$instance"'
RATE = "$__rate_interval"


def rate(metric: str, matchers: str = "", by: str = "") -> str:
    """``sum [by (..)] (rate(metric{instance=~"$instance",matchers}[$__rate_interval]))``."""
    sel = SEL + ("," + matchers if matchers else "")
    group = f" by ({by}) " if by else ""
    return f"sum{group}(rate({metric}{{{sel}}}[{RATE}]))"


def gauge(metric: str, matchers: str = "", by: str = "") -> str:
    sel = SEL + ("," + matchers if matchers else "")
    group = f" by ({by}) " if by else ""
    return f"sum{group}({metric}{{{sel}}})"


def quantile(q: float, histogram: str, by: str) -> str:
    return f"histogram_quantile({q}, {rate(histogram + '_bucket', by='le, ' + by)})"


@dataclass(frozen=True, slots=True)
class Query:
    expr: str
    legend: str


@dataclass(frozen=True, slots=True)
class Panel:
    title: str
    description: str
    unit: str  # Grafana unit id: ops, percentunit, bytes, Bps, s, short
    queries: tuple[Query, ...]
    kind: str = "timeseries"  # or "stat"
    width: int = 12


Q = Query
ROWS: tuple[tuple[str, tuple[Panel, ...]], ...] = (
    ("Training throughput", (
        Panel("Files opened per second",
              "READs at offset 0 per second: the images/s the training jobs get (NFSv3 has no "
              "OPEN).", "ops",
              (Q(rate("nfsgw_files_opened_total", by="instance"), "{{instance}}"),)),
        Panel("Backend requests per file opened",
              "Backend requests by operation divided by files opened: about 1 GET per file in a "
              "cold epoch over small files (plus a LIST per directory spread over its files), 0 "
              "in a warm one.", "short",
              (Q(f"{rate('nfsgw_s3_requests_total', by='op')} / ignoring(op) group_left "
                 f"{rate('nfsgw_files_opened_total')}", "{{op}}"),
               Q(f"{rate('nfsgw_s3_requests_total')} / {rate('nfsgw_files_opened_total')}",
                 "total"))),
        Panel("Bytes served vs fetched",
              "Bytes sent to NFS clients, of them served from the memory cache, and object "
              "bytes fetched from the backend: fetched well below served means the caches work.",
              "Bps",
              (Q(rate("nfsgw_sent_bytes_total"), "served to clients"),
               Q(rate("nfsgw_data_cache_hit_bytes_total"), "served from memory"),
               Q(rate("nfsgw_backend_received_bytes_total"), "fetched from the backend"))),
        Panel("Calls per second by procedure", "NFS and MOUNT calls served, by procedure.",
              "ops", (Q(rate("nfsgw_rpc_requests_total", by="proc"), "{{proc}}"),)),
    )),
    ("Caches", (
        Panel("Hit ratio per cache tier",
              "Data: READ block lookups served from memory / all lookups. Metadata index: name "
              "resolutions answered from memory (an entry or 'absent') / all resolutions. In "
              "shuffled epochs over a dataset larger than the cache, expect about cache / "
              "dataset.", "percentunit",
              (Q(f"{rate('nfsgw_data_cache_hits_total')} / ({rate('nfsgw_data_cache_hits_total')}"
                 f" + {rate('nfsgw_data_cache_misses_total')})", "data (memory)"),
               Q(f"({rate('nfsgw_metadata_cache_hits_total')} + "
                 f"{rate('nfsgw_metadata_cache_negative_hits_total')}) / "
                 f"({rate('nfsgw_metadata_cache_hits_total')} + "
                 f"{rate('nfsgw_metadata_cache_negative_hits_total')} + "
                 f"{rate('nfsgw_metadata_cache_misses_total')})", "metadata index"),
               Q(f"{rate('nfsgw_disk_cache_hits_total')} / ({rate('nfsgw_disk_cache_hits_total')}"
                 f" + {rate('nfsgw_disk_cache_misses_total')})", "data (disk, of memory misses)"))),
        Panel("Memory against budgets",
              "Bytes charged to the data cache and the directory index next to their budgets "
              "([cache] data_memory, metadata_memory), and staged write data in the spool.",
              "bytes",
              (Q(gauge("nfsgw_data_cache_bytes"), "data cache"),
               Q(gauge("nfsgw_data_cache_budget_bytes"), "data cache budget"),
               Q(gauge("nfsgw_metadata_cache_bytes"), "metadata index"),
               Q(gauge("nfsgw_metadata_cache_budget_bytes"), "metadata index budget"),
               Q(gauge("nfsgw_writes_spool_bytes"), "write spool"),
               Q(gauge("nfsgw_disk_cache_bytes"), "disk tier"),
               Q(gauge("nfsgw_disk_cache_budget_bytes"), "disk tier budget"))),
        Panel("Evictions and admission refusals",
              "Data blocks dropped for space (and the part that were admission refusals: a new "
              "block lost to a more frequent one), directories dropped from the index.", "ops",
              (Q(rate("nfsgw_data_cache_evictions_total"), "data blocks evicted"),
               Q(rate("nfsgw_data_rejected_total"), "data blocks refused"),
               Q(rate("nfsgw_metadata_cache_evictions_total"), "directories evicted"))),
    )),
    ("Latency", (
        Panel("Call latency by procedure (p50, p99)",
              "From decoded call to encoded reply, per procedure; cached GETATTR/LOOKUP/READ "
              "take tens of microseconds, a cold READ one backend round trip.", "s",
              (Q(quantile(0.5, "nfsgw_rpc_duration_seconds", "proc"), "{{proc}} p50"),
               Q(quantile(0.99, "nfsgw_rpc_duration_seconds", "proc"), "{{proc}} p99"))),
        Panel("Backend latency by operation (p50, p99)",
              "Backend request latency per operation (list, get, head, ...): the store's "
              "time to first byte plus transfer.", "s",
              (Q(quantile(0.5, "nfsgw_s3_request_duration_seconds", "op"), "{{op}} p50"),
               Q(quantile(0.99, "nfsgw_s3_request_duration_seconds", "op"), "{{op}} p99"))),
    )),
    ("Errors", (
        Panel("Error replies by status",
              "Calls answered with an error status: NFS3ERR_JUKEBOX (backend unavailable or "
              "spool full; the client retries), NFS3ERR_STALE (the object is gone), "
              "NFS3ERR_IO (backend failure), NFS3ERR_NOENT (expected in normal use), ...; and "
              "RPC-level errors (garbage arguments, unknown programs, bad credentials).", "ops",
              (Q(rate("nfsgw_rpc_requests_total", 'status!="ok"', by="status"), "{{status}}"),
               Q(rate("nfsgw_rpc_errors_total", by="kind"), "rpc {{kind}}"))),
        Panel("Backend failures",
              "Backend requests that failed or were retried (not_found is a normal answer and "
              "left out), data fetches and directory listings that failed, commits that failed.",
              "ops",
              (Q(rate("nfsgw_s3_requests_total", 'outcome!~"ok|not_found"', by="op, outcome"),
                 "{{op}} {{outcome}}"),
               Q(rate("nfsgw_data_fetch_errors_total"), "data fetch errors"),
               Q(rate("nfsgw_metadata_list_errors_total"), "listing errors"),
               Q(rate("nfsgw_writes_commit_errors_total"), "commit errors"))),
        Panel("Refusals",
              "Connections refused at max_connections, calls and mounts refused by an export's "
              "clients or secure_port rule, READ/LOOKUP refused by mode bits, oversized records.",
              "ops",
              (Q(rate("nfsgw_connections_refused_total"), "connections refused"),
               Q(rate("nfsgw_clients_denied_total"), "calls denied"),
               Q(rate("nfsgw_mounts_denied_total"), "mounts denied"),
               Q(rate("nfsgw_permission_denied_total"), "permission denied"),
               Q(rate("nfsgw_records_rejected_total"), "records rejected"))),
    )),
    ("Connections and load", (
        Panel("Client connections", "Open client TCP connections, and connections accepted "
              "per second (a steady stream means clients reconnect).", "short",
              (Q(gauge("nfsgw_connections", by="instance"), "{{instance}} open"),
               Q(rate("nfsgw_connections_opened_total"), "accepted/s"))),
        Panel("Work in flight",
              "Calls being served, backend GETs running, and fetches waiting for a slot "
              "([s3] max_connections): a queue that stays up means the backend is the limit.",
              "short",
              (Q(gauge("nfsgw_rpc_inflight"), "calls"),
               Q(gauge("nfsgw_data_fetches_inflight"), "backend GETs"),
               Q(gauge("nfsgw_data_queued_inflight"), "fetches queued"))),
    )),
    ("Prefetch and warm-up", (
        Panel("Directory listings",
              "Whole-directory listings (first touch, re-list after the TTL), LIST pages "
              "ingested, targeted LISTs (huge or partial directories) and HEADs of the index.",
              "ops",
              (Q(rate("nfsgw_metadata_prefetches_total", by="kind"), "listings {{kind}}"),
               Q(rate("nfsgw_metadata_list_pages_total"), "LIST pages"),
               Q(rate("nfsgw_metadata_targeted_lookups_total"), "targeted LISTs"),
               Q(rate("nfsgw_metadata_heads_total"), "HEADs"))),
        Panel("Data prefetch",
              "Small files fetched ahead of READs after their directory was listed: fetched, "
              "then read (useful), joined by a READ while in flight, and dropped unread "
              "(wasted: should stay near 0); blocks of large files fetched by read-ahead and "
              "those never used.", "ops",
              (Q(rate("nfsgw_prefetch_objects_total"), "files prefetched"),
               Q(rate("nfsgw_prefetch_useful_total"), "prefetched, then read"),
               Q(rate("nfsgw_prefetch_joined_total"), "READs joining a prefetch"),
               Q(rate("nfsgw_prefetch_wasted_total"), "prefetched, wasted"),
               Q(rate("nfsgw_data_readahead_blocks_total"), "read-ahead blocks"),
               Q(rate("nfsgw_data_readahead_unused_blocks_total"), "read-ahead unused"))),
        Panel("Data prefetcher state",
              "Files left to consider in listed directories this pass, files in flight, the "
              "concurrency limit (halved while the backend answers 503/SlowDown), 1 while "
              "the cache has no room for more, 1 while a client lists directories, and 1 while "
              "READs find their files in memory (nothing to hide).", "short",
              (Q(gauge("nfsgw_prefetch_queued_files"), "files queued"),
               Q(gauge("nfsgw_prefetch_inflight"), "in flight"),
               Q(gauge("nfsgw_prefetch_concurrency"), "concurrency limit"),
               Q(gauge("nfsgw_prefetch_waiting_room"), "waiting for room"),
               Q(gauge("nfsgw_prefetch_waiting_listing"), "waiting for a listing"),
               Q(gauge("nfsgw_prefetch_waiting_hits"), "READs hit memory"))),
        Panel("Warm-up jobs and progress",
              "Warm-up jobs by state (nfsgw warmup / POST /v1/warmup), and the files and "
              "directories they get through per second.", "short",
              (Q(gauge("nfsgw_warmup_jobs", by="state"), "jobs {{state}}"),
               Q(rate("nfsgw_warmup_files_total"), "files/s"),
               Q(rate("nfsgw_warmup_dirs_total"), "directories/s"))),
    )),
    ("Packs", (
        Panel("Pack members served",
              "GETs of packed files answered from a shard range, from a group fetched a moment "
              "before (no GET), and by the bucket instead (the object was replaced, is partial, "
              "large or damaged): fallbacks well above members mean the pack is not used.",
              "ops",
              (Q(rate("nfsgw_pack_members_total"), "from shards"),
               Q(rate("nfsgw_pack_recent_hits_total"), "from a recent group"),
               Q(rate("nfsgw_pack_fallbacks_total"), "by the bucket (fallback)")), width=8),
        Panel("Pack shard traffic",
              "Bytes of shard ranges fetched per second (a member with its neighbours).",
              "Bps",
              (Q(rate("nfsgw_pack_range_bytes_total"), "shard bytes"),), width=8),
        Panel("Pack indexes",
              "Exports serving from a loaded pack index, and pack indexes not used in the last "
              "hour (missing, damaged, another version or source, shards missing: the export "
              "serves from the bucket).", "short",
              (Q(gauge("nfsgw_pack_loaded"), "loaded"),
               Q(f"sum(increase(nfsgw_pack_load_errors_total{{{SEL}}}[1h]))", "not used (1h)")),
              kind="stat", width=8),
    )),
    ("Fleet", (
        Panel("Shared tier: where memory and disk misses were served",
              "Whole objects that missed memory and disk, per second: served from the fleet's "
              "shared tier, or fetched from the origin (the misses); fetched here though "
              "another gateway owns them (duplicates when it fetches them too).", "ops",
              (Q(rate("nfsgw_shared_cache_hits_total"), "shared tier"),
               Q(rate("nfsgw_shared_cache_misses_total"), "origin"),
               Q(rate("nfsgw_shared_cache_foreign_fetches_total"), "origin, owned elsewhere")),
              width=8),
        Panel("Shared tier fills",
              "Objects put in the shared tier per second, fills that failed and fills skipped "
              "(breaker open, too big, fills queued or their bytes at their bound).", "ops",
              (Q(rate("nfsgw_shared_cache_fills_total"), "filled"),
               Q(rate("nfsgw_shared_cache_fill_errors_total"), "failed"),
               Q(rate("nfsgw_shared_cache_fills_skipped_total", by="reason"),
                 "skipped {{reason}}")), width=8),
        Panel("Shared tier health",
              "1 while the breaker skips the shared tier after failures (every read is "
              "served from the origin); bodies refused in the last hour (wrong length, "
              "metadata or checksum: never served); the fleet's members as this gateway "
              "sees them.", "short",
              (Q(f"max(nfsgw_shared_cache_breaker_open{{{SEL}}})", "breaker open"),
               Q(f"sum(increase(nfsgw_shared_cache_refused_total{{{SEL}}}[1h]))",
                 "refused (1h)"),
               Q(f"max(nfsgw_fleet_members{{{SEL}}})", "members")),
              kind="stat", width=8),
    )),
    ("Workers", (
        Panel("Workers up and restarts",
              "With server.workers > 1: worker processes serving (1) or (re)starting (0), "
              "restarts by the supervisor in the last hour, and workers in a crash loop.",
              "short",
              (Q(gauge("nfsgw_worker_up", by="instance, worker"), "{{instance}} w{{worker}} up"),
               Q(f"sum by (instance, worker) (increase(nfsgw_worker_restarts_total{{{SEL}}}[1h]))",
                 "{{instance}} w{{worker}} restarts/h"),
               Q(gauge("nfsgw_worker_crash_loop", by="instance, worker"),
                 "{{instance}} w{{worker}} crash loop"))),
        Panel("Calls per worker",
              "RPC calls served by each worker: the balance of the clients' connections over "
              "the workers (mount with nconnect=), and calls for read-write exports passed to "
              "worker 0.", "ops",
              (Q(rate("nfsgw_worker_rpc_requests_total", by="worker"), "worker {{worker}}"),
               Q(rate("nfsgw_routed_calls_total"), "routed to worker 0"))),
        Panel("Duplicate-request cache",
              "Retransmitted non-idempotent calls answered with the original's reply (hits), "
              "or that waited for the original still running; replies kept.", "ops",
              (Q(rate("nfsgw_drc_hits_total"), "hits"),
               Q(rate("nfsgw_drc_waits_total"), "waits"),
               Q(rate("nfsgw_drc_stored_total"), "replies kept"))),
    )),
    ("Process", (
        Panel("Uptime", "Time since each gateway process started; a reset is a restart.", "s",
              (Q(f"time() - max by (instance) (nfsgw_start_time_seconds{{{SEL}}})",
                 "{{instance}}"),), kind="stat"),
        Panel("Configuration reloads", "Reloads (SIGHUP, nfsgw reload) in the last hour, by "
              "outcome.", "short",
              (Q(f"sum by (outcome) (increase(nfsgw_config_reloads_total{{{SEL}}}[1h]))",
                 "{{outcome}}"),), kind="stat"),
        Panel("Garbage collection",
              "Share of time the gateway spent in garbage collections (every call waits "
              "meanwhile), and the longest collection since it started.", "s",
              (Q(rate("nfsgw_gc_seconds_total"), "time in collections per second"),
               Q(f"max(nfsgw_gc_longest_pause_seconds{{{SEL}}})", "longest pause"))),
    )),
)  # fmt: skip


def _panel(p: Panel, pid: int, x: int, y: int) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": pid,
        "type": p.kind,
        "title": p.title,
        "description": p.description,
        "datasource": DATASOURCE,
        "gridPos": {"h": 8, "w": p.width, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": p.unit, "min": 0}, "overrides": []},
        "targets": [
            {
                "refId": chr(ord("A") + i),
                "datasource": DATASOURCE,
                "expr": q.expr,
                "legendFormat": q.legend,
                "range": True,
            }
            for i, q in enumerate(p.queries)
        ],
    }
    if p.kind == "timeseries":
        out["options"] = {
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "desc"},
        }
    else:
        out["options"] = {"reduceOptions": {"calcs": ["lastNotNull"], "values": False}}
    return out


def build() -> dict[str, Any]:
    panels: list[dict[str, Any]] = []
    pid, y = 1, 0
    for title, row in ROWS:
        panels.append(
            {
                "id": pid,
                "type": "row",
                "title": title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                "panels": [],
            }
        )
        pid, y, x = pid + 1, y + 1, 0
        for p in row:
            if x + p.width > 24:
                x, y = 0, y + 8
            panels.append(_panel(p, pid, x, y))
            pid, x = pid + 1, x + p.width
        y += 8
    instances = "label_values(nfsgw_start_time_seconds, instance)"
    return {
        "title": "nfsgw",
        "uid": "nfsgw",
        "description": "nfsgw, the NFSv3 gateway to S3 for training data (docs/operations.md)",
        "tags": ["nfsgw", "nfs", "s3"],
        "editable": True,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-3h", "to": "now"},
        "timezone": "",
        "graphTooltip": 1,
        "annotations": {"list": []},
        "links": [],
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Data source",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                    "hide": 0,
                    "refresh": 1,
                    "regex": "",
                },
                {
                    "name": "instance",
                    "label": "Gateway",
                    "type": "query",
                    "datasource": DATASOURCE,
                    "definition": instances,
                    "query": {"query": instances, "refId": "instances"},
                    "current": {},
                    "hide": 0,
                    "includeAll": True,
                    "multi": True,
                    "allValue": ".*",
                    "refresh": 2,
                    "sort": 1,
                },
            ]
        },
        "panels": panels,
    }


def render() -> str:
    return json.dumps(build(), indent=2) + "\n"


def main(argv: list[str]) -> int:
    if argv[1:] == ["--check"]:
        if OUT.read_text() != render():
            print(f"{OUT} is out of date: python {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(render())
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
