"""The namespace layer's settings. ``prefetch`` is a key of the ``[cache]`` table of
``nfsgw.toml`` (declared here, ``gateway.settings``); ``attr_ttl_s`` and ``immutable`` come
from the export (``ExportConfig``) and ``memory_bytes`` from its share of
``[cache] metadata_memory``, both set per export by the composition root; the rest are tunables
no file sets.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.settings import boolean, setting


@dataclass(frozen=True, slots=True)
class NamespaceConfig:
    attr_ttl_s: float = 60.0
    immutable: bool = False
    hard_ttl_factor: float = 10.0
    huge_dir_pages: int = 5
    max_list_pages: int = 10_000
    memory_bytes: int = 256 * 2**20
    list_page_keys: int = 1000
    targeted_max_keys: int = 16
    removed_cookies_per_dir: int = 1024
    probes_per_dir: int = 4096
    dir_times_max: int = 100_000
    retry_after_error_s: float = 1.0
    prefetch: bool = field(
        default=True,
        metadata=setting(
            boolean, "disable directory metadata prefetch (for comparisons)", flag="--no-prefetch"
        ),
    )
    """False: lookups are targeted requests, never listings (comparisons)."""
