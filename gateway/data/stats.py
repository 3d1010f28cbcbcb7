"""Counters and gauges of the data layer, read by ``gateway.ops.metrics``.

Owns: plain integers, updated in place on the event loop (no locks needed). Must not: import
prometheus_client or know metric names: every field has its row (name, counter or gauge, help)
in ``gateway/ops/metricdefs.py``'s ``METRICS`` table, and the server refuses to start on a field
without one.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DataStats", "DiskStats"]


@dataclass(slots=True)
class DataStats:
    # Counters (monotonic).
    hits: int = 0
    """Block lookups of READs served from memory (a small object is one block)."""
    misses: int = 0
    """Block lookups of READs that missed memory and waited for a fetch (started or joined),
    which the disk tier or the backend answered."""
    joined: int = 0
    """Misses that joined a fetch already in flight instead of starting one (single-flight)."""
    bytes_hit: int = 0
    """READ payload bytes served from blocks already in memory."""
    bytes_fetched: int = 0
    """Body bytes received from the backend."""
    gets: int = 0
    """Backend GET requests issued (demand and read-ahead)."""
    readahead_blocks: int = 0
    """Blocks requested by read-ahead (not by a READ that needed them)."""
    readahead_unused: int = 0
    """Read-ahead blocks dropped from memory before any READ used them."""
    ahead_used: int = 0
    """Objects the data prefetcher fetched that a READ then used (useful prefetches)."""
    ahead_joined: int = 0
    """READs that joined a data prefetch in flight (it then ran as a demand fetch)."""
    ahead_dropped: int = 0
    """Prefetched objects not kept: no room left when they landed (demand READs took it)."""
    ahead_wasted: int = 0
    """Objects the data prefetcher fetched that left memory before any READ used them
    (evicted or invalidated: wasted prefetches)."""
    slices_copied: int = 0
    """Cached slices of a shared buffer (a pack group's members) copied to bytes of their own
    so the buffer, mostly evicted, could be let go (``DataCache``, "Slices of a shared
    buffer")."""
    evictions: int = 0
    """Entries dropped for space, including candidates the admission filter turned away."""
    rejected: int = 0
    """The part of ``evictions`` that were admission refusals (window -> main)."""
    uncacheable: int = 0
    """Fetched blocks not cached because they alone exceed the budget (served, then freed)."""
    fetch_errors: int = 0
    """Fetches that failed (every waiter got the error; nothing was cached)."""
    precondition_failed: int = 0
    """Fetches refused with 412: the object changed; its cached blocks were dropped."""
    # Gauges.
    cache_bytes: int = 0
    """Bytes charged to the cache budget (bodies plus a fixed per-entry overhead)."""
    mapped_bytes: int = 0
    """Of the cached bodies, the bytes that are mappings of the shared disk tier's entries
    (the page cache's pages, held once by the host however many workers map them; charged
    ``1 / workers`` of their size each)."""
    entries: int = 0
    inflight_fetches: int = 0
    """Backend GETs currently running (holding a fetch slot)."""
    queued_inflight: int = 0
    """Fetches waiting for a fetch slot (demand and read-ahead)."""
    pending_fetch_bytes: int = 0
    """Bytes requested by fetches running or queued (not charged to ``cache_bytes``)."""


@dataclass(slots=True)
class DiskStats:
    """The disk tier of one process (``gateway.data.disk``); with several worker processes on
    one cache directory the counters are per process, the gauges each process's view of the
    shared directory (aggregate them with max, not sum)."""

    # Counters (monotonic).
    hits: int = 0
    """Block lookups that missed memory and were served from a verified disk entry."""
    misses: int = 0
    """Block lookups that missed memory and disk (a backend GET follows)."""
    bytes_hit: int = 0
    """Bytes read from disk entries."""
    writes: int = 0
    """Entries published (written to a temporary file, then renamed into place)."""
    bytes_written: int = 0
    corrupt: int = 0
    """Entries that failed verification (truncated, wrong size, checksum or identity): dropped
    and fetched again."""
    read_errors: int = 0
    """Disk reads that failed with an I/O error (the READ went to the backend)."""
    write_errors: int = 0
    """Publishes that failed (ENOSPC, EIO...): nothing was published, the READ was served."""
    evictions: int = 0
    """Entries this process deleted to stay within the budget."""
    evicted_bytes: int = 0
    rejected: int = 0
    """Publishes refused by the admission filter (the tier was full of more frequent ones)."""
    refused_full: int = 0
    """Publishes refused because the filesystem was below ``disk_min_free`` (another tenant
    filled it) or a write had just failed."""
    refused_backlog: int = 0
    """Publishes skipped because ``max_pending_write_bytes`` were already waiting."""
    refused_budget: int = 0
    """Warm-up writes refused because the tier was full (warm-ups never evict)."""
    scans: int = 0
    """Directory scans (accounting and eviction candidates)."""
    duplicate_fetches: int = 0
    """Backend fetches whose entry another process had published by the time this one
    would have: the same bytes fetched twice by the gateway (the claims make it 0 unless a
    claim wait timed out)."""
    lookups_skipped: int = 0
    """Block lookups the tier's sole user answered "not on disk" from its name filter, with no
    file opened (counted in ``misses`` too)."""
    claim_waits: int = 0
    """Fetches that waited for another process's fetch of the same entry (then read it)."""
    claim_timeouts: int = 0
    """Claim waits that gave up after ``claim_wait_s`` and fetched anyway."""
    # Gauges.
    enabled: int = 0
    """1 when the disk tier is on."""
    used_bytes: int = 0
    """Bytes of cache files (each rounded up to 4 KiB), as this process last saw them."""
    budget_bytes: int = 0
    entries: int = 0
    fs_free_bytes: int = 0
    """Free bytes of the cache filesystem (for unprivileged users) at the last check."""
    pending_write_bytes: int = 0
    name_filter_bytes: int = 0
    """Memory of the name filter this process keeps as the tier's sole user (0: not kept)."""
