"""The metric table: every family the gateway exports, declared once (one row each).

Owns: ``METRICS`` (a gateway process's families) and ``SUPERVISOR_METRICS`` (the worker
supervisor's own), each row a ``MetricDef``: name (units in it, counters ending in ``_total``),
kind, help, labels, where the value comes from (a stats field of a layer, a sum of fields, one
field per label value, or a ``Hook`` the ``Metrics`` object records itself), how the supervisor
combines the workers' values (``Merge``), and the label sets that exist from the start
(``initial``: every series a dashboard panel or an alert names is there at 0, so rates and
alerts start from a value instead of "no data"). ``gateway.ops.metrics`` reads the table;
``docs/operations.md`` lists the same names (a test checks it).

One declarative table: it is long by design (exempt from the module-size rule).

Must not: import anything of the project, or put paths, keys or client addresses into labels.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = [
    "LATENCY_BUCKETS",
    "METRICS",
    "PREPARED_BACKEND_OPS",
    "PREPARED_PROCS",
    "RPC_ERROR_KINDS",
    "SUPERVISOR_METRICS",
    "Field",
    "FieldSum",
    "Hook",
    "Kind",
    "Merge",
    "MetricDef",
    "PerLabel",
    "Source",
    "merge_of",
]

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

# Series created at start-up (rates start from 0 on dashboards): the read path.
PREPARED_PROCS = (
    "MOUNT3.MNT",
    *(
        f"NFS3.{p}"
        for p in (
            "GETATTR",
            "LOOKUP",
            "ACCESS",
            "READLINK",
            "READ",
            "READDIR",
            "READDIRPLUS",
            "FSSTAT",
            "FSINFO",
            "PATHCONF",
        )
    ),
)
PREPARED_BACKEND_OPS = ("list", "get", "head")


# ================================================================================ the table


class Kind(enum.Enum):
    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"


@dataclass(frozen=True, slots=True)
class Field:
    """One field of a layer's stats objects, summed over them (several namespaces)."""

    layer: str
    name: str


@dataclass(frozen=True, slots=True)
class FieldSum:
    """The sum of several fields of one layer."""

    layer: str
    names: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class PerLabel:
    """One series per value of the metric's single label, each from one field of one layer."""

    layer: str
    series: tuple[tuple[str, str], ...]  # (label value, field)


class Hook(enum.Enum):
    """Values ``Metrics`` records itself, from the dispatcher and the stores."""

    RPC = "CallObserver.call: (proc, status) -> latency histogram"
    RPC_ERRORS = "CallObserver.rpc_error: kind -> count"
    BACKEND = "backend RequestObserver: (op, outcome) -> latency histogram"
    START_TIME = "the Metrics object's creation time"
    SUPERVISOR = "the worker supervisor (gateway.ops.fanout), not a gateway process"


Source = Field | FieldSum | PerLabel | Hook


class Merge(enum.Enum):
    """How the supervisor (``gateway.ops.fanout``) combines a family its workers report."""

    SUM = "summed: per-process amounts (counters, histogram buckets, cache bytes)"
    MAX = "the largest: one host-wide amount every worker reports alike"
    SUPERVISOR = "the workers' values dropped: the supervisor reports its own"


@dataclass(frozen=True, slots=True)
class MetricDef:
    """One exported family. Counters are named with their ``_total`` suffix. ``initial``:
    label sets of a ``Hook`` family exposed at 0 before anything is recorded in them.
    ``per_worker_of``: on a supervisor row labelled by worker, the gateway sample (a
    counter's ``_total``) whose values it gives for each worker, summed over labels."""

    name: str
    kind: Kind
    help: str
    labels: tuple[str, ...]
    source: Source
    merge: Merge = Merge.SUM
    initial: tuple[tuple[str, ...], ...] = ()
    per_worker_of: str = ""


COUNTER, GAUGE, HISTOGRAM = Kind.COUNTER, Kind.GAUGE, Kind.HISTOGRAM
MAX, SUPERVISOR = Merge.MAX, Merge.SUPERVISOR

# The kinds of ``nfsgw_rpc_errors_total`` (gateway.dispatch: calls without an NFS status).
RPC_ERROR_KINDS = (
    "prog_unavail",
    "prog_mismatch",
    "proc_unavail",
    "garbage_args",
    "auth_error",
    "dropped",
    "rpc_mismatch",
)
# Failure series the dashboard and the alerts select, there from the start: the statuses
# NfsgwJukebox / NfsgwServerFaults count, and the backend outcomes NfsgwBackendErrors counts.
_RPC_INITIAL = tuple(
    ("NFS3.READ", s) for s in ("NFS3ERR_JUKEBOX", "NFS3ERR_IO", "NFS3ERR_SERVERFAULT")
)
_BACKEND_INITIAL = (("get", "error"), ("list", "error"), ("get", "retry"))
_M = MetricDef
_F = Field

METRICS: tuple[MetricDef, ...] = (
    # -- RPC: the dispatcher ------------------------------------------------------------------
    _M("nfsgw_rpc_requests_total", COUNTER, "RPC calls by procedure and status",
       ("proc", "status"), Hook.RPC, initial=_RPC_INITIAL),
    _M("nfsgw_rpc_duration_seconds", HISTOGRAM,
       "RPC call latency by procedure and status (decode to reply encoded)",
       ("proc", "status"), Hook.RPC, initial=_RPC_INITIAL),
    _M("nfsgw_rpc_errors_total", COUNTER, "RPC-level errors (no NFS status) by kind",
       ("kind",), Hook.RPC_ERRORS, initial=tuple((k,) for k in RPC_ERROR_KINDS)),
    # -- backend requests: every store's observer ---------------------------------------------
    _M("nfsgw_s3_requests_total", COUNTER, "Backend requests by operation and outcome",
       ("op", "outcome"), Hook.BACKEND, initial=_BACKEND_INITIAL),
    _M("nfsgw_s3_request_duration_seconds", HISTOGRAM,
       "Backend request latency by operation and outcome", ("op", "outcome"), Hook.BACKEND,
       initial=_BACKEND_INITIAL),
    # -- connections: transport.ConnectionStats ----------------------------------------------
    _M("nfsgw_connections", GAUGE, "Client TCP connections open", (), _F("conn", "open")),
    _M("nfsgw_connections_opened_total", COUNTER, "Client TCP connections accepted", (),
       _F("conn", "opened")),
    _M("nfsgw_connections_closed_total", COUNTER, "Client TCP connections closed", (),
       _F("conn", "closed")),
    _M("nfsgw_rpc_inflight", GAUGE, "RPC calls being served", (), _F("conn", "inflight")),
    _M("nfsgw_received_bytes_total", COUNTER, "Bytes received from NFS clients", (),
       _F("conn", "bytes_in")),
    _M("nfsgw_sent_bytes_total", COUNTER, "Bytes sent to NFS clients", (),
       _F("conn", "bytes_out")),
    _M("nfsgw_records_rejected_total", COUNTER,
       "RPC records over max_record (their connection was closed)", (),
       _F("conn", "oversized")),
    _M("nfsgw_partial_record_bytes", GAUGE,
       "Bytes held by partial RPC records (bounded by partial_record_budget)", (),
       _F("conn", "partial_bytes")),
    _M("nfsgw_records_over_budget_total", COUNTER,
       "Connections closed: their partial record was the oldest past partial_record_budget", (),
       _F("conn", "over_budget")),
    _M("nfsgw_records_too_slow_total", COUNTER,
       "Connections closed: a record took longer than record_deadline_s", (),
       _F("conn", "over_deadline")),
    # -- duplicate-request cache: drc.DrcStats -------------------------------------------------
    _M("nfsgw_drc_hits_total", COUNTER,
       "Retransmitted non-idempotent calls answered with the original's kept reply", (),
       _F("drc", "hits")),
    _M("nfsgw_drc_waits_total", COUNTER,
       "Retransmitted calls that waited for the original still running, then got its reply",
       (), _F("drc", "waits")),
    _M("nfsgw_drc_stored_total", COUNTER, "Replies of non-idempotent calls kept", (),
       _F("drc", "stored")),
    _M("nfsgw_drc_bypassed_total", COUNTER,
       "Non-idempotent calls run uncached (every cache slot held a running call)", (),
       _F("drc", "bypassed")),
    _M("nfsgw_drc_evictions_total", COUNTER,
       "Kept replies dropped, for space (drc_max_entries, drc_memory) or age (drc_max_age_s)",
       ("reason",), PerLabel("drc", (("space", "evicted_space"), ("age", "evicted_age")))),
    _M("nfsgw_drc_entries", GAUGE, "Entries in the duplicate-request cache (running included)",
       (), _F("drc", "entries")),
    _M("nfsgw_drc_running", GAUGE, "Non-idempotent calls running in the cache", (),
       _F("drc", "running")),
    _M("nfsgw_drc_bytes", GAUGE, "Bytes charged to the duplicate-request cache", (),
       _F("drc", "bytes")),
    # -- the fast path: fastpath.FastStats (its calls are in nfsgw_rpc_* like any other) --------
    _M("nfsgw_fast_path_calls_total", COUNTER,
       "NFS calls answered in the receive callback from memory (gateway.fastpath), or handed "
       "to the ordinary path", ("outcome",),
       PerLabel("fast", (("answered", "answered"), ("declined", "declined")))),
    _M("nfsgw_fast_path_fills_total", COUNTER,
       "Entries the fast path's tables took from the index", (), _F("fast", "fills")),
    # -- exports and access: registry.GatewayStats --------------------------------------------
    _M("nfsgw_files_opened_total", COUNTER,
       "READs at offset 0: files opened and read (NFSv3 has no OPEN)", (),
       _F("gateway", "files_opened")),
    _M("nfsgw_clients_denied_total", COUNTER,
       "NFS calls refused by an export's clients or secure_port rule (NFS3ERR_ACCES)", (),
       _F("gateway", "clients_denied")),
    _M("nfsgw_mounts_denied_total", COUNTER,
       "MNT calls refused by an export's clients or secure_port rule (MNT3ERR_ACCES)", (),
       _F("gateway", "mounts_denied")),
    _M("nfsgw_permission_denied_total", COUNTER,
       "LOOKUP/READDIR/READ refused by mode bits for the squashed identity", (),
       _F("gateway", "permission_denied")),
    # -- data cache and reads: data.DataStats -------------------------------------------------
    _M("nfsgw_data_cache_hits_total", COUNTER, "READ block lookups served from memory", (),
       _F("data", "hits")),
    _M("nfsgw_data_cache_misses_total", COUNTER,
       "READ block lookups that missed memory (served from the disk tier or a backend fetch)",
       (), _F("data", "misses")),
    _M("nfsgw_data_cache_joined_total", COUNTER, "Misses that joined a fetch already in flight",
       (), _F("data", "joined")),
    _M("nfsgw_data_cache_hit_bytes_total", COUNTER, "READ payload bytes served from memory", (),
       _F("data", "bytes_hit")),
    _M("nfsgw_backend_received_bytes_total", COUNTER, "Object bytes received from the backend",
       (), _F("data", "bytes_fetched")),
    _M("nfsgw_data_gets_total", COUNTER, "Backend GETs issued by the data layer (demand and "
       "read-ahead)", (), _F("data", "gets")),
    _M("nfsgw_data_readahead_blocks_total", COUNTER,
       "Blocks requested by read-ahead (data prefetch)", (), _F("data", "readahead_blocks")),
    _M("nfsgw_data_readahead_unused_blocks_total", COUNTER,
       "Read-ahead blocks dropped before any READ used them", (),
       _F("data", "readahead_unused")),
    _M("nfsgw_data_cache_evictions_total", COUNTER,
       "Blocks dropped for space (including admission refusals)", (), _F("data", "evictions")),
    _M("nfsgw_data_cache_slices_copied_total", COUNTER,
       "Cached pack members copied out of their group's buffer so that buffer, mostly "
       "evicted, could be freed", (), _F("data", "slices_copied")),
    _M("nfsgw_data_rejected_total", COUNTER,
       "Evictions that were admission refusals (a new block lost to a more frequent one)", (),
       _F("data", "rejected")),
    _M("nfsgw_data_uncacheable_total", COUNTER,
       "Fetched blocks larger than the whole cache budget (served, not kept)", (),
       _F("data", "uncacheable")),
    _M("nfsgw_data_fetch_errors_total", COUNTER,
       "Backend fetches that failed (every waiting READ got the error)", (),
       _F("data", "fetch_errors")),
    _M("nfsgw_data_precondition_failed_total", COUNTER,
       "Fetches refused because the object changed (its cached blocks were dropped)", (),
       _F("data", "precondition_failed")),
    _M("nfsgw_data_cache_bytes", GAUGE, "Bytes charged to the data cache", (),
       _F("data", "cache_bytes")),
    _M("nfsgw_data_cache_entries", GAUGE, "Blocks in the data cache", (), _F("data", "entries")),
    # the workers map mostly the same entries: the largest view, not their sum
    _M("nfsgw_data_cache_mapped_bytes", GAUGE,
       "Cached bytes that are mappings of the shared disk tier's entries (page cache pages, "
       "held once by the host however many workers map them)", (),
       _F("data", "mapped_bytes"), merge=MAX),
    _M("nfsgw_data_fetches_inflight", GAUGE, "Backend GETs running", (),
       _F("data", "inflight_fetches")),
    _M("nfsgw_data_queued_inflight", GAUGE, "Fetches waiting for a fetch slot", (),
       _F("data", "queued_inflight")),
    _M("nfsgw_data_pending_fetch_bytes", GAUGE, "Bytes requested by fetches running or queued",
       (), _F("data", "pending_fetch_bytes")),
    # -- data prefetch: data.PrefetchStats (and the ahead_* fields of data.DataStats) ------------
    _M("nfsgw_prefetch_objects_total", COUNTER,
       "Objects the data prefetcher fetched ahead of READs (into memory or the disk tier)", (),
       _F("prefetch", "objects")),
    _M("nfsgw_prefetch_bytes_total", COUNTER, "Bytes the data prefetcher fetched", (),
       _F("prefetch", "bytes")),
    _M("nfsgw_prefetch_disk_objects_total", COUNTER,
       "Prefetched objects written straight to the disk tier (memory had no room)", (),
       _F("prefetch", "disk_objects")),
    _M("nfsgw_prefetch_useful_total", COUNTER,
       "Prefetched objects a READ then found in memory (useful prefetches)", (),
       _F("data", "ahead_used")),
    _M("nfsgw_prefetch_joined_total", COUNTER,
       "READs that joined a prefetch in flight (no second GET)", (), _F("data", "ahead_joined")),
    _M("nfsgw_prefetch_wasted_total", COUNTER,
       "Prefetched objects evicted or invalidated before any READ used them", (),
       _F("data", "ahead_wasted")),
    _M("nfsgw_prefetch_dropped_total", COUNTER,
       "Prefetched objects not kept: no room left in memory when they landed", (),
       _F("data", "ahead_dropped")),
    _M("nfsgw_prefetch_errors_total", COUNTER,
       "Prefetches that failed (retried later; no client READ fails for them)", (),
       _F("prefetch", "errors")),
    _M("nfsgw_prefetch_deferred_total", COUNTER,
       "Prefetches of another fleet member's objects not in the shared tier yet (tried again "
       "later; the last attempt fetches from the origin)", (), _F("prefetch", "deferred")),
    _M("nfsgw_prefetch_changed_total", COUNTER,
       "Prefetches of objects changed or deleted since they were listed (skipped)", (),
       _F("prefetch", "changed")),
    _M("nfsgw_prefetch_backoffs_total", COUNTER,
       "Times the prefetcher halved its concurrency after retried backend requests", (),
       _F("prefetch", "backoffs")),
    _M("nfsgw_prefetch_passes_total", COUNTER,
       "Passes (epochs) that ended: most files of the directories being read were read", (),
       _F("prefetch", "passes")),
    _M("nfsgw_prefetch_dirs", GAUGE, "Directories the data prefetcher tracks", (),
       _F("prefetch", "dirs")),
    _M("nfsgw_prefetch_queued_dirs", GAUGE, "Directories with files left to prefetch this pass",
       (), _F("prefetch", "queued_dirs")),
    _M("nfsgw_prefetch_queued_files", GAUGE,
       "Entries of queued directories not yet considered, plus objects waiting for a retry", (),
       _F("prefetch", "queued_files")),
    _M("nfsgw_prefetch_inflight", GAUGE, "Objects being prefetched", (),
       _F("prefetch", "inflight")),
    _M("nfsgw_prefetch_inflight_bytes", GAUGE, "Bytes being prefetched", (),
       _F("prefetch", "inflight_bytes")),
    _M("nfsgw_prefetch_concurrency", GAUGE,
       "Current limit on objects being prefetched (lower while backing off)", (),
       _F("prefetch", "concurrency")),
    _M("nfsgw_prefetch_waiting_room", GAUGE,
       "1 while the cache has no room for more prefetched data", (),
       _F("prefetch", "waiting_room")),
    _M("nfsgw_prefetch_waiting_listing", GAUGE,
       "1 while the data prefetcher waits for a client listing directories (READDIR)", (),
       _F("prefetch", "waiting_listing")),
    _M("nfsgw_prefetch_waiting_hits", GAUGE,
       "1 while READs find their files in memory and the data prefetcher waits for a miss", (),
       _F("prefetch", "waiting_hits")),
    _M("nfsgw_prefetch_pass_files", GAUGE,
       "Files of the directories read in this pass or the last", (),
       _F("prefetch", "pass_files")),
    _M("nfsgw_prefetch_pass_read_files", GAUGE, "Of those, files read in this pass", (),
       _F("prefetch", "pass_read")),
    # -- packs: pack.PackStats (one per export with a pack) --------------------------------------
    _M("nfsgw_pack_members_total", COUNTER, "GETs of packed objects answered from a shard", (),
       _F("pack", "members")),
    _M("nfsgw_pack_ranges_total", COUNTER,
       "Shard range GETs (a member with its neighbours, or a member alone)", (),
       _F("pack", "ranges")),
    _M("nfsgw_pack_range_bytes_total", COUNTER, "Bytes of shard ranges fetched", (),
       _F("pack", "range_bytes")),
    _M("nfsgw_pack_deposited_total", COUNTER,
       "Neighbouring members handed to the data cache with a shard range", (),
       _F("pack", "deposited")),
    _M("nfsgw_pack_recent_hits_total", COUNTER,
       "Members answered from a group fetched a moment before, without a GET", (),
       _F("pack", "recent_hits")),
    _M("nfsgw_pack_fallbacks_total", COUNTER,
       "GETs of packed keys answered by the bucket (replaced, partial, large or damaged)", (),
       _F("pack", "fallbacks")),
    _M("nfsgw_pack_corrupt_total", COUNTER,
       "Packed members whose bytes failed their CRC-32 (served from their own object)", (),
       _F("pack", "corrupt")),
    _M("nfsgw_pack_load_errors_total", COUNTER,
       "Pack indexes not used (missing, damaged, another version or source, shards missing)",
       (), _F("pack", "load_errors")),
    _M("nfsgw_pack_loaded", GAUGE, "Exports serving from a loaded pack index", (),
       _F("pack", "loaded")),
    _M("nfsgw_pack_entries", GAUGE, "Members in the loaded pack indexes", (),
       _F("pack", "entries")),
    _M("nfsgw_pack_index_bytes", GAUGE, "Memory held by the loaded pack indexes", (),
       _F("pack", "index_bytes")),
    # -- disk tier: data.DiskStats (per worker; gauges are each worker's view of the shared
    #    directory: aggregate them with max) ---------------------------------------------------
    _M("nfsgw_disk_cache_hits_total", COUNTER,
       "Block lookups that missed memory and were served from a verified disk entry", (),
       _F("disk", "hits")),
    _M("nfsgw_disk_cache_misses_total", COUNTER,
       "Block lookups that missed memory and disk (a backend GET follows)", (),
       _F("disk", "misses")),
    _M("nfsgw_disk_cache_hit_bytes_total", COUNTER, "Bytes read from disk entries", (),
       _F("disk", "bytes_hit")),
    _M("nfsgw_disk_cache_writes_total", COUNTER, "Entries published to the disk tier", (),
       _F("disk", "writes")),
    _M("nfsgw_disk_cache_written_bytes_total", COUNTER, "Body bytes published to the disk tier",
       (), _F("disk", "bytes_written")),
    _M("nfsgw_disk_cache_corrupt_total", COUNTER,
       "Disk entries that failed verification (size, header, identity or checksum): dropped "
       "and fetched again", (), _F("disk", "corrupt")),
    _M("nfsgw_disk_cache_errors_total", COUNTER,
       "Cache-file I/O errors by operation (the READ was served from the backend)", ("op",),
       PerLabel("disk", (("read", "read_errors"), ("write", "write_errors")))),
    _M("nfsgw_disk_cache_evictions_total", COUNTER, "Disk entries deleted for space", (),
       _F("disk", "evictions")),
    _M("nfsgw_disk_cache_evicted_bytes_total", COUNTER, "Bytes of disk entries deleted for space",
       (), _F("disk", "evicted_bytes")),
    _M("nfsgw_disk_cache_rejected_total", COUNTER,
       "Publishes refused by the admission filter (the tier is full of more frequent entries)",
       (), _F("disk", "rejected")),
    _M("nfsgw_disk_cache_refused_total", COUNTER,
       "Publishes refused: full (filesystem below disk_min_free, or a write just failed), "
       "backlog (too many bytes waiting to be written), budget (warm-ups never evict)",
       ("reason",), PerLabel("disk", (("full", "refused_full"), ("backlog", "refused_backlog"),
                                     ("budget", "refused_budget")))),
    _M("nfsgw_disk_cache_scans_total", COUNTER, "Scans of the cache directory", (),
       _F("disk", "scans")),
    _M("nfsgw_disk_cache_duplicate_fetches_total", COUNTER,
       "Backend fetches of an entry another worker had already published (the same bytes "
       "fetched twice; 0 unless a claim wait timed out)", (), _F("disk", "duplicate_fetches")),
    _M("nfsgw_disk_cache_claim_waits_total", COUNTER,
       "Fetches that waited for another worker's fetch of the same entry, then read it", (),
       _F("disk", "claim_waits")),
    _M("nfsgw_disk_cache_lookups_skipped_total", COUNTER,
       "Block lookups the tier's sole user answered from its name filter (not on disk) "
       "without opening a file; counted as misses too", (), _F("disk", "lookups_skipped")),
    _M("nfsgw_disk_cache_claim_timeouts_total", COUNTER,
       "Claim waits that gave up (claim_wait_s) and fetched anyway", (),
       _F("disk", "claim_timeouts")),
    # the one disk tier of the host, as each worker last saw it: MAX, not summed
    _M("nfsgw_disk_cache_enabled", GAUGE, "1 when the disk tier is on", (),
       _F("disk", "enabled"), merge=MAX),
    _M("nfsgw_disk_cache_bytes", GAUGE,
       "Bytes of disk entries (4 KiB rounded), as this worker last saw the directory", (),
       _F("disk", "used_bytes"), merge=MAX),
    _M("nfsgw_disk_cache_budget_bytes", GAUGE, "Disk tier budget", (),
       _F("disk", "budget_bytes"), merge=MAX),
    _M("nfsgw_disk_cache_entries", GAUGE, "Disk entries, as this worker last saw the directory",
       (), _F("disk", "entries"), merge=MAX),
    _M("nfsgw_disk_cache_fs_free_bytes", GAUGE,
       "Free bytes of the cache filesystem at the last check", (), _F("disk", "fs_free_bytes"),
       merge=MAX),
    _M("nfsgw_disk_cache_name_filter_bytes", GAUGE,
       "Memory of the name filter kept by the tier's sole user (0: the tier is shared, or "
       "another process uses its directory)", (), _F("disk", "name_filter_bytes")),
    _M("nfsgw_disk_cache_pending_write_bytes", GAUGE, "Bytes waiting to be written to disk", (),
       _F("disk", "pending_write_bytes")),
    # -- the shared tier: data.shared.SharedStats (a fleet's bucket) ----------------------------
    _M("nfsgw_shared_cache_hits_total", COUNTER,
       "Whole objects that missed memory and disk and were served from the shared tier", (),
       _F("shared", "hits")),
    _M("nfsgw_shared_cache_hit_bytes_total", COUNTER, "Bytes served from the shared tier", (),
       _F("shared", "hit_bytes")),
    _M("nfsgw_shared_cache_misses_total", COUNTER,
       "Shared-tier lookups that found nothing usable (the origin was asked)", (),
       _F("shared", "misses")),
    _M("nfsgw_shared_cache_fills_total", COUNTER, "Objects put in the shared tier", (),
       _F("shared", "fills")),
    _M("nfsgw_shared_cache_fill_bytes_total", COUNTER, "Bytes put in the shared tier", (),
       _F("shared", "fill_bytes")),
    _M("nfsgw_shared_cache_fill_errors_total", COUNTER,
       "Fills that failed (the READ was served all the same)", (), _F("shared", "fill_errors")),
    _M("nfsgw_shared_cache_foreign_fetches_total", COUNTER,
       "Objects fetched from the origin here though another fleet member owns them, filled "
       "or not (a duplicate when the owner fetches them too)", (), _F("shared", "foreign_fills")),
    _M("nfsgw_shared_cache_refused_total", COUNTER,
       "Shared-tier bodies refused: wrong length, metadata (another origin, object or version) "
       "or checksum; never served", ("cause",),
       PerLabel("shared", (("length", "bad_length"), ("metadata", "bad_metadata"),
                           ("checksum", "bad_checksum")))),
    _M("nfsgw_shared_cache_fills_skipped_total", COUNTER,
       "Fills not made: breaker open, piece over shared_max_piece, fills queued or their bytes "
       "at their bound", ("reason",),
       PerLabel("shared", (("breaker", "skip_breaker"), ("too_big", "skip_too_big"),
                           ("queue", "skip_queue"), ("bytes", "skip_bytes")))),
    _M("nfsgw_shared_cache_errors_total", COUNTER,
       "Shared-tier requests that failed (unreachable, slow, refused, full)", (),
       _F("shared", "errors")),
    _M("nfsgw_shared_cache_skipped_total", COUNTER,
       "Lookups not sent because the breaker was open (served from the origin)", (),
       _F("shared", "skipped")),
    _M("nfsgw_shared_cache_breaker_trips_total", COUNTER,
       "Times the shared tier's breaker opened", (), _F("shared", "breaker_trips")),
    _M("nfsgw_shared_cache_breaker_open", GAUGE,
       "1 while the shared tier is skipped after failures", (), _F("shared", "breaker_open"),
       merge=MAX),
    _M("nfsgw_shared_cache_queued_fills", GAUGE, "Fills waiting or being sent", (),
       _F("shared", "queued_fills")),
    _M("nfsgw_shared_cache_inflight_puts", GAUGE, "Fills being sent (PUTs)", (),
       _F("shared", "inflight_puts")),
    _M("nfsgw_shared_cache_inflight_bytes", GAUGE, "Bytes held for fills in flight", (),
       _F("shared", "inflight_bytes")),
    _M("nfsgw_fleet_members", GAUGE, "Gateways in the fleet, this one included", (),
       _F("shared", "fleet_members"), merge=MAX),
    _M("nfsgw_fleet_member_changes_total", COUNTER,
       "Changes of the fleet's member list (the first list included)", (),
       _F("shared", "fleet_changes"), merge=MAX),
    # -- directory index: namespace.NamespaceStats, summed over exports -----------------------
    _M("nfsgw_metadata_lookups_total", COUNTER, "Name lookups in the index", (),
       _F("namespace", "lookups")),
    _M("nfsgw_metadata_cache_hits_total", COUNTER,
       "Lookups and getattrs answered with an entry from the index", (),
       _F("namespace", "hits")),
    _M("nfsgw_metadata_cache_negative_hits_total", COUNTER,
       "Lookups answered 'absent' from a complete listing, without a request", (),
       _F("namespace", "negative_hits")),
    _M("nfsgw_metadata_cache_misses_total", COUNTER,
       "Index lookups that needed a backend request (a directory's first listing or a "
       "targeted LIST)", (), FieldSum("namespace", ("prefetches", "targeted_lookups"))),
    _M("nfsgw_metadata_prefetches_total", COUNTER,
       "Whole-directory listings started (first touch, or a re-list after the TTL)", ("kind",),
       PerLabel("namespace", (("first", "prefetches"), ("relist", "relists")))),
    _M("nfsgw_metadata_relists_avoided_total", COUNTER,
       "Re-lists not sent because the store saw nothing change in the directory since its "
       "last listing (a local export's inotify watch)", (),
       _F("namespace", "relists_avoided")),
    _M("nfsgw_metadata_listed_ahead_total", COUNTER,
       "First listings started ahead of a client reading sibling directories in order "
       "(included in nfsgw_metadata_prefetches_total{kind=\"first\"})", (),
       _F("namespace", "listed_ahead")),
    _M("nfsgw_metadata_list_pages_total", COUNTER, "LIST pages ingested", (),
       _F("namespace", "list_pages")),
    _M("nfsgw_metadata_targeted_lookups_total", COUNTER,
       "Lookups in huge or partial directories answered with a targeted LIST", (),
       _F("namespace", "targeted_lookups")),
    _M("nfsgw_metadata_heads_total", COUNTER, "HEADs issued by the index", (),
       _F("namespace", "heads")),
    _M("nfsgw_metadata_list_errors_total", COUNTER, "Directory listings that failed", (),
       _F("namespace", "list_errors")),
    _M("nfsgw_metadata_cache_evictions_total", COUNTER,
       "Directories dropped from the index for space", (), _F("namespace", "evictions")),
    _M("nfsgw_namespace_skipped_keys_total", COUNTER,
       "Object keys that cannot be a path (skipped in listings)", (),
       _F("namespace", "skipped_keys")),
    _M("nfsgw_namespace_truncated_dirs_total", COUNTER,
       "Directory listings cut at max_list_pages (the directory is served partially)", (),
       _F("namespace", "truncated_dirs")),
    _M("nfsgw_metadata_cache_bytes", GAUGE, "Estimated bytes of the directory index", (),
       _F("namespace", "bytes")),
    _M("nfsgw_metadata_cache_entries", GAUGE, "Entries in the index", (),
       _F("namespace", "entries")),
    _M("nfsgw_metadata_cache_dirs", GAUGE, "Directories in the index", (),
       _F("namespace", "dirs")),
    # -- file handles: namespace.resolve.HandleStats ------------------------------------------
    _M("nfsgw_handle_walks_total", COUNTER,
       "Walks from an export's root for a directory hash this gateway did not know (a handle "
       "issued by another gateway or before a restart)", (), _F("handles", "walks")),
    _M("nfsgw_handle_walk_dirs_total", COUNTER, "Directories listed by handle walks", (),
       _F("handles", "walk_dirs")),
    _M("nfsgw_handle_walks_truncated_total", COUNTER, "Handle walks stopped at their bound", (),
       _F("handles", "walks_truncated")),
    _M("nfsgw_handle_walk_misses_total", COUNTER,
       "Directory hashes a walk did not find (the handle is STALE)", (),
       _F("handles", "walk_misses")),
    _M("nfsgw_handle_dir_scans_total", COUNTER,
       "Directories whose long names were hashed to resolve a hashed handle", (),
       _F("handles", "dir_scans")),
    _M("nfsgw_handle_collisions_total", COUNTER,
       "Hash collisions seen (two paths, one hash) and handles refused as ambiguous", (),
       _F("handles", "collisions")),
    _M("nfsgw_handle_legacy_lookups_total", COUNTER,
       "Handles of the old mapped form read from an old gateway's map", (),
       _F("handles", "legacy_lookups")),
    _M("nfsgw_handle_dir_hashes", GAUGE, "Directories known by hash (bounded map)", (),
       _F("handles", "dir_hashes")),
    _M("nfsgw_handle_hashed_cached", GAUGE, "Hashed handles whose path is cached (bounded)", (),
       _F("handles", "hashed_cached")),
    # -- writes: writes.WriteStats ------------------------------------------------------------
    _M("nfsgw_writes_writes_total", COUNTER, "WRITE calls staged in the spool", (),
       _F("writes", "writes")),
    _M("nfsgw_writes_bytes_staged_total", COUNTER, "Bytes written into the spool", (),
       _F("writes", "bytes_staged")),
    _M("nfsgw_writes_commits_total", COUNTER,
       "Staged files committed (uploaded) by COMMIT, a FILE_SYNC WRITE or the gateway itself",
       (), _F("writes", "commits")),
    _M("nfsgw_writes_commit_errors_total", COUNTER, "Commits that failed", (),
       _F("writes", "commit_errors")),
    _M("nfsgw_writes_background_commits_total", COUNTER,
       "Commits started by the gateway to relieve spool pressure", (),
       _F("writes", "background_commits")),
    _M("nfsgw_writes_puts_total", COUNTER,
       "Single-request uploads: small files at commit, CREATE/SYMLINK/MKDIR, directory markers", (),
       _F("writes", "puts")),
    _M("nfsgw_writes_multipart_uploads_total", COUNTER, "Multipart uploads completed", (),
       _F("writes", "multipart_uploads")),
    _M("nfsgw_writes_parts_uploaded_total", COUNTER, "Multipart parts uploaded at commit time", (),
       _F("writes", "parts_uploaded")),
    _M("nfsgw_writes_parts_streamed_total", COUNTER,
       "Multipart parts uploaded as soon as they were full, before the commit", (),
       _F("writes", "parts_streamed")),
    _M("nfsgw_writes_parts_reuploaded_total", COUNTER,
       "Multipart parts uploaded again (a later write changed them)", (),
       _F("writes", "parts_reuploaded")),
    _M("nfsgw_writes_base_fetches_total", COUNTER,
       "Reads of the existing object to fill the unwritten ranges of a partial rewrite", (),
       _F("writes", "base_fetches")),
    _M("nfsgw_writes_metadata_heads_total", COUNTER,
       "HEADs by the write path for an object's metadata not known from memory", (),
       _F("writes", "metadata_heads")),
    _M("nfsgw_writes_rebases_total", COUNTER,
       "Commits whose base object changed underneath (writes re-applied to the new version)", (),
       _F("writes", "rebases")),
    _M("nfsgw_writes_jukebox_total", COUNTER,
       "WRITEs answered NFS3ERR_JUKEBOX (spool or staged-file limit reached; the client retries)",
       (), _F("writes", "jukebox")),
    _M("nfsgw_writes_orphan_uploads_aborted_total", COUNTER,
       "Multipart uploads of an earlier process aborted at start-up", (),
       _F("writes", "orphan_uploads_aborted")),
    _M("nfsgw_writes_staged_files", GAUGE, "Files with staged writes not yet committed", (),
       _F("writes", "staged_files")),
    _M("nfsgw_writes_spool_bytes", GAUGE, "Bytes of staged data reserved in the spool", (),
       _F("writes", "spool_bytes")),
    # -- the process: ServerStats ---------------------------------------------------------
    _M("nfsgw_exports", GAUGE, "Exports served", (), _F("server", "exports"), merge=MAX),
    _M("nfsgw_connections_refused_total", COUNTER,
       "Connections closed at once: max_connections (or per address) reached, all busy", (),
       _F("server", "connections_refused")),
    _M("nfsgw_connections_evicted_total", COUNTER,
       "Connections closed to make room for a new one at max_connections or "
       "max_connections_per_address (never-answered first, else the longest idle)", (),
       _F("server", "connections_evicted")),
    _M("nfsgw_connections_refused_peer_total", COUNTER,
       "Connections closed at accept: the peer is in no export's clients "
       "(refuse_unknown_peers)", (),
       _F("server", "connections_refused_peer")),
    _M("nfsgw_connections_idle_closed_total", COUNTER,
       "Connections closed after idle_timeout_s without a call", (),
       _F("server", "connections_idle_closed")),
    _M("nfsgw_config_reloads_total", COUNTER, "Configuration reloads by outcome", ("outcome",),
       PerLabel("server", (("error", "reloads_error"), ("ok", "reloads_ok")))),
    _M("nfsgw_data_cache_budget_bytes", GAUGE, "Data cache budget", (),
       _F("server", "data_cache_budget_bytes")),
    _M("nfsgw_metadata_cache_budget_bytes", GAUGE, "Directory index budget across exports", (),
       _F("server", "metadata_cache_budget_bytes")),
    _M("nfsgw_start_time_seconds", GAUGE, "Start time of the process (Unix time)", (),
       Hook.START_TIME, merge=SUPERVISOR),
    # -- the garbage collector: ops.gcwatch.GcStats --------------------------------------------
    _M("nfsgw_gc_full_collections_total", COUNTER, "Full (generation 2) garbage collections",
       (), _F("gc", "full")),
    _M("nfsgw_gc_seconds_total", COUNTER,
       "Time the process spent in garbage collections (every call waits meanwhile)", (),
       _F("gc", "seconds")),
    # the worst worker's
    _M("nfsgw_gc_longest_pause_seconds", GAUGE,
       "The longest garbage collection since the process started", (),
       _F("gc", "longest_s"), merge=MAX),
    # -- warm-ups: ops.warmup.WarmupStats -----------------------------------------------------
    _M("nfsgw_warmup_jobs", GAUGE, "Warm-up jobs by state", ("state",),
       PerLabel("warmup", tuple((s, s) for s in ("running", "done", "failed", "cancelled")))),
    _M("nfsgw_warmup_dirs_total", COUNTER, "Directories listed by warm-ups", (),
       _F("warmup", "dirs")),
    _M("nfsgw_warmup_files_total", COUNTER, "Files seen by warm-ups", (),
       _F("warmup", "files")),
    _M("nfsgw_warmup_read_bytes_total", COUNTER,
       "Bytes fetched by data warm-ups (into the disk tier, else memory)", (),
       _F("warmup", "bytes_read")),
    # -- workers: forward.RouteStats (a worker other than the owner) ---------------------------
    _M("nfsgw_routed_calls_total", COUNTER,
       "Calls for read-write exports passed to the owner worker", (), _F("route", "routed")),
    _M("nfsgw_routed_link_down_total", COUNTER,
       "Routed calls answered NFS3ERR_JUKEBOX: the owner worker was unreachable or restarting",
       (), _F("route", "link_down")),
)  # fmt: skip

# The supervisor's own series, with ``server.workers`` > 1 (``gateway.ops.fanout`` builds them;
# every worker's families above are summed into one).
SUPERVISOR_METRICS: tuple[MetricDef, ...] = (
    _M("nfsgw_workers", GAUGE, "Worker processes configured", (), Hook.SUPERVISOR),
    _M("nfsgw_worker_up", GAUGE, "1 while the worker is serving, 0 while it (re)starts",
       ("worker",), Hook.SUPERVISOR),
    _M("nfsgw_worker_restarts_total", COUNTER, "Times the supervisor restarted the worker",
       ("worker",), Hook.SUPERVISOR),
    _M("nfsgw_worker_crash_loop", GAUGE,
       "1 while the worker keeps dying young (its restarts back off)", ("worker",),
       Hook.SUPERVISOR),
    _M("nfsgw_worker_rpc_requests_total", COUNTER, "RPC calls served by each worker",
       ("worker",), Hook.SUPERVISOR, per_worker_of="nfsgw_rpc_requests_total"),
)  # fmt: skip


_BY_NAME = {m.name: m for m in METRICS}


def merge_of(family: str) -> Merge:
    """The merge rule of a family as a Prometheus text parser names it (a counter without
    its ``_total``); SUM for a family the table does not declare."""
    m = _BY_NAME.get(family) or _BY_NAME.get(family + "_total")
    return Merge.SUM if m is None else m.merge
