"""Counters and gauges of the data layer, read by ``gateway.ops.metrics``.

Owns: plain integers, updated in place on the event loop (no locks needed). Must not: import
prometheus_client or know metric names: every field has its row (name, counter or gauge, help)
in ``gateway/ops/metrics.py``'s ``METRICS`` table, and the server refuses to start on a field
without one.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DataStats"]


@dataclass(slots=True)
class DataStats:
    # Counters (monotonic).
    hits: int = 0
    """Block lookups of READs served from memory (a small object is one block)."""
    misses: int = 0
    """Block lookups of READs that had to wait for a backend fetch (started or joined)."""
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
    entries: int = 0
    inflight_fetches: int = 0
    """Backend GETs currently running (holding a fetch slot)."""
    queued_inflight: int = 0
    """Fetches waiting for a fetch slot (demand and read-ahead)."""
    pending_fetch_bytes: int = 0
    """Bytes requested by fetches running or queued (not charged to ``cache_bytes``)."""
