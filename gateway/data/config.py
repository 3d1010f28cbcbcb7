"""The data layer's settings: read coalescing, read-ahead and fetch bounds (``DataConfig``)
and the local-disk tier (``DiskConfig``, inlined). The keys with ``setting(...)`` metadata are
keys of the ``[cache]`` table of ``nfsgw.toml`` (declared here, ``gateway.settings``); the rest
are tunables no file sets.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.settings import (
    INLINE,
    Conv,
    Invalid,
    boolean,
    int_in,
    optional_string,
    seconds,
    setting,
    size,
    string,
)
from gateway.settings import (
    url as http_url,
)

MiB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class DiskConfig:
    """The disk tier under ``server.cache_dir`` (``gateway.data.disk``)."""

    budget: int | None = field(
        default=None,
        metadata=setting(
            size(0),
            "disk cache budget; 0 turns the disk tier off",
            key="disk",
            flag="--cache-disk",
            default_text="half of what the cache filesystem has free at start (plus what the "
            "cache already holds), minus disk_min_free",
        ),
    )
    """Bytes of cache files (rounded up to 4 KiB each) the disk tier may hold; None: auto."""
    min_free: int | None = field(
        default=None,
        metadata=setting(
            size(0),
            "free space the disk tier always leaves on its filesystem (new entries are "
            "refused below it)",
            key="disk_min_free",
            flag="--cache-disk-min-free",
            default_text="5 percent of the filesystem",
        ),
    )
    threads: int = 4
    """Threads doing the tier's file I/O (reads, writes, scans) off the event loop."""
    max_pending_write_bytes: int = 64 * MiB
    """Bytes waiting to be written to the tier; a publish past it is skipped (still served)."""
    rescan_interval_s: float = 30.0
    """Least time between directory scans (accounting of other workers' entries, eviction
    candidates); a scan that took ``t`` seconds waits at least ``20 t`` for the next one."""
    touch_interval_s: float = 10.0
    """Hits are written to the entries' mtimes (the shared access clock) in batches."""
    claim_wait_s: float = 30.0
    """Longest a fetch waits for another worker's fetch of the same entry before it fetches
    itself (a worker stuck on a backend that never answers must not stall the others)."""
    bundle_entries: int = 64
    """Most entries written as one bundle (one file, a hard link per entry: creating and
    evicting files costs the filesystem more CPU than their bytes); at most 127 (the table
    fits the bundle's first 4 KiB page)."""
    bundle_bytes: int = 8 * MiB
    """A batch is written as a bundle once its entries reach this many bytes."""
    bundle_window_s: float = 0.05
    """... or this long after its first entry joined it, whichever comes first (a publish
    completes, and a shared tier's other workers see the entry, when its bundle is written)."""

    def __post_init__(self) -> None:
        if self.threads < 1 or self.max_pending_write_bytes < 0:
            raise ValueError("threads must be >= 1 and max_pending_write_bytes >= 0")
        if self.rescan_interval_s <= 0 or self.touch_interval_s <= 0:
            raise ValueError("rescan_interval_s and touch_interval_s must be > 0")
        if not 1 <= self.bundle_entries <= 127 or self.bundle_bytes < 1:
            raise ValueError("bundle_entries must be in [1, 127] and bundle_bytes >= 1")
        if self.bundle_window_s < 0:
            raise ValueError("bundle_window_s must be >= 0")


@dataclass(frozen=True, slots=True)
class PrefetchConfig:
    """The data prefetcher (``gateway.data.prefetch``), inlined in ``[cache]``."""

    enabled: bool = field(
        default=True,
        metadata=setting(
            boolean,
            "disable data prefetch (fetching a listed directory's small files ahead of READs)",
            key="data_prefetch",
            flag="--no-data-prefetch",
        ),
    )
    concurrency: int = field(
        default=64,
        metadata=setting(
            int_in(1, 1024),
            "most objects the data prefetcher fetches at once (it backs off under SlowDown/503)",
            key="prefetch_concurrency",
            flag="--prefetch-concurrency",
        ),
    )
    max_size: int | None = field(
        default=None,
        metadata=setting(
            size(0, 1 << 30),
            "largest object the data prefetcher fetches",
            key="prefetch_max_size",
            flag="--prefetch-max-size",
            default_text="small_file_max",
        ),
    )
    max_inflight_bytes: int = field(
        default=64 * MiB,
        metadata=setting(
            size(1 * MiB),
            "bytes the data prefetcher may have requested and not received",
            key="prefetch_inflight",
            flag="--prefetch-inflight",
        ),
    )
    pass_fraction: float = 1.0
    """A new pass (epoch) starts once this share of the files of the directories being read
    has been read in the current one. All, by default: with less, the last files of an epoch
    count in the next pass, and their reads in the next epoch look like re-reads."""
    reread_fraction: float = 0.01
    """A pass also ends once files read again in it (``gateway.data.prefetch``) reach this
    share of the files read in it."""
    hit_pause: float = 0.97
    """The prefetcher starts no new fetch while at least this share of the last
    ``HIT_WINDOW`` first READs of the files it tracks found them in memory: READs are served,
    and more prefetching would only take CPU from them (``gateway.data.prefetch``)."""
    idle_open_s: float = 1.0
    """... unless no such READ came for this long: spare time is the prefetcher's again."""
    max_dirs: int = 1_000_000
    """Directories tracked (their listing is the namespace's, not a copy: a reference and
    a bitmap of one bit per entry each)."""
    max_retries: int = 16_384
    """Failed objects waiting to be retried (oldest dropped first)."""
    retry_after_s: float = 5.0
    attempts: int = 3
    """Tries per object and pass (then left to demand READs)."""
    backoff_s: float = 0.5
    max_backoff_s: float = 30.0
    """After a retried backend request (503/SlowDown/connection error) the prefetcher halves
    its concurrency and pauses, doubling the pause up to this while they continue."""
    idle_poll_s: float = 0.05
    """While the cache has no room: how often to look again."""
    browse_quiet_s: float = 0.5
    """After a client asked for a READDIR page: start nothing new for this long. A client
    listing directories (ImageFolder's scan, ``ls -lR``) waits for that metadata; prefetching
    the files it lists at the same time slowed a 1.28M-entry listing about 7x."""

    def __post_init__(self) -> None:
        if not 0 < self.pass_fraction <= 1 or not 0 < self.reread_fraction <= 1:
            raise ValueError("pass_fraction and reread_fraction must be in (0, 1]")
        if self.max_dirs < 1 or self.attempts < 1 or self.max_retries < 0:
            raise ValueError("max_dirs and attempts must be >= 1, max_retries >= 0")
        if min(self.retry_after_s, self.backoff_s, self.max_backoff_s, self.idle_poll_s) <= 0:
            raise ValueError("prefetch intervals must be > 0")
        if self.browse_quiet_s < 0:
            raise ValueError("browse_quiet_s must be >= 0")


def _bucket_url(v: object) -> str | None:
    s = string.parse(v)
    if not s:
        return None
    from gateway.backend import StoreUrlError, check_store_url

    try:
        check_store_url(s, object_store=True)
    except StoreUrlError as e:
        raise Invalid(str(e), 'e.g. "s3://nfsgw-shared/imagenet/"') from None
    return s


@dataclass(frozen=True, slots=True)
class SharedConfig:
    """The shared tier (``gateway.data.shared``): a bucket a fleet of gateways shares, so
    the fleet fetches each object from the origin once. Off unless ``shared`` is set; reached
    with its own endpoint, region and credentials (the AWS chain, or ``shared_profile``)."""

    url: str | None = field(
        default=None,
        metadata=setting(
            Conv(_bucket_url),
            "the fleet's shared cache tier, an S3 bucket (and prefix) every gateway reads "
            "and fills; off when unset",
            key="shared",
            flag="--shared-cache",
            metavar="s3://BUCKET/PREFIX",
        ),
    )
    endpoint_url: str | None = field(
        default=None,
        metadata=setting(
            http_url,
            "the shared tier's S3 endpoint (default: AWS's for its region)",
            key="shared_endpoint_url",
            flag="--shared-cache-endpoint-url",
        ),
    )
    region: str | None = field(
        default=None,
        metadata=setting(
            optional_string,
            "the shared tier's region (default: the AWS chain's)",
            key="shared_region",
            flag="--shared-cache-region",
        ),
    )
    profile: str | None = field(
        default=None,
        metadata=setting(
            optional_string,
            "AWS profile for the shared tier's credentials (default: the AWS chain)",
            key="shared_profile",
        ),
    )
    max_piece: int = field(
        default=64 * MiB,
        metadata=setting(
            size(0, 5 << 30),
            "larger objects (and pieces) are not put in the shared tier",
            key="shared_max_piece",
        ),
    )
    max_inflight_puts: int = field(
        default=16,
        metadata=setting(
            int_in(1, 1024),
            "PUTs filling the shared tier at once (more fills wait their turn)",
            key="shared_max_inflight_puts",
        ),
    )
    max_inflight_bytes: int = field(
        default=256 * MiB,
        metadata=setting(
            size(1 * MiB),
            "bytes held for fills waiting or being sent (past it a fill is skipped)",
            key="shared_max_inflight_bytes",
        ),
    )
    timeout_s: float = field(
        default=10.0,
        metadata=setting(
            seconds(0.1),
            "a shared-tier request slower than this is a miss (and a failure)",
            key="shared_timeout_s",
        ),
    )
    retry_after_s: float = field(
        default=30.0,
        metadata=setting(
            seconds(1.0),
            "after failures, the shared tier is skipped this long before one request tries again",
            key="shared_retry_after_s",
        ),
    )


@dataclass(frozen=True, slots=True)
class DataConfig:
    small_file_max: int = field(
        default=4 * MiB,
        metadata=setting(
            size(0, 1 << 30), "objects up to this size are fetched whole", flag="--small-file-max"
        ),
    )
    """Objects up to this size are fetched whole on the first READ and cached as one entry."""
    block_size: int = field(
        default=1 * MiB,
        metadata=setting(
            size(4096, 256 * MiB), "read block of larger objects", flag="--block-size"
        ),
    )
    """Cache block of larger objects (see the module docstring for the choice)."""
    initial_readahead: int = 1 * MiB
    max_readahead: int = field(
        default=32 * MiB,
        metadata=setting(size(0, 1 << 34), "largest read-ahead window", flag="--max-readahead"),
    )
    """Per stream; also capped at half the cache's read-ahead share."""
    max_request_bytes: int = 8 * MiB
    """Largest ranged GET read-ahead coalesces adjacent blocks into (at least one block)."""
    max_inflight_fetches: int = 72
    max_readahead_fetches: int = 64
    """Of ``max_inflight_fetches`` (read-ahead, data prefetch and warm-ups); the rest is
    reserved for demand fetches. A cold epoch runs at about (GETs in flight) / (GET time):
    64 hide ~45 ms per GET at ~1,400 objects/s, where 32 capped an epoch over a 20 ms store
    at ~700 files/s (docs/benchmarks.md, "More GETs in flight"). Bytes stay bounded by
    ``max_readahead_inflight_bytes`` and the prefetcher's ``prefetch_inflight``."""
    max_readahead_inflight_bytes: int = 256 * MiB
    """Read-ahead requested but not landed yet (running or queued for a slot)."""
    max_streams: int = 4096
    """Objects with read-ahead state (LRU)."""
    max_streams_per_object: int = 8
    disk: DiskConfig = field(default_factory=DiskConfig, metadata=INLINE)
    prefetch: PrefetchConfig = field(default_factory=PrefetchConfig, metadata=INLINE)
    shared: SharedConfig = field(default_factory=SharedConfig, metadata=INLINE)
    fetch_timeout_s: float | None = 300.0
    """Safety net around one GET (slot wait excluded); the backend's own timeouts and retries
    should fire first. Expiry fails the waiters with ``BackendUnavailable``."""

    def __post_init__(self) -> None:
        if self.block_size <= 0 or self.small_file_max < 0:
            raise ValueError("block_size must be > 0 and small_file_max >= 0")
        if not 0 <= self.max_readahead_fetches < self.max_inflight_fetches:
            raise ValueError("need 0 <= max_readahead_fetches < max_inflight_fetches")
        if min(self.initial_readahead, self.max_readahead, self.max_readahead_inflight_bytes) < 0:
            raise ValueError("read-ahead sizes must be >= 0")
        if self.max_streams < 1 or self.max_streams_per_object < 1:
            raise ValueError("stream limits must be >= 1")
        if self.fetch_timeout_s is not None and self.fetch_timeout_s <= 0:
            raise ValueError("fetch_timeout_s must be > 0 or None")
