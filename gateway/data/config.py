"""The data layer's settings: read coalescing, read-ahead and fetch bounds. The first three
are keys of the ``[cache]`` table of ``nfsgw.toml`` (declared here, ``gateway.settings``);
the rest are tunables no file sets.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.settings import setting, size

MiB = 1024 * 1024


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
    max_inflight_fetches: int = 32
    max_readahead_fetches: int = 24
    """Of ``max_inflight_fetches``; the rest is reserved for demand fetches."""
    max_readahead_inflight_bytes: int = 256 * MiB
    """Read-ahead requested but not landed yet (running or queued for a slot)."""
    max_streams: int = 4096
    """Objects with read-ahead state (LRU)."""
    max_streams_per_object: int = 8
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
