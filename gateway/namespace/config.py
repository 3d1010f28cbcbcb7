"""The namespace layer's settings (the ``[cache]`` TTL/prefetch knobs and the export's
``attr_ttl_s``/``immutable``).
"""

from __future__ import annotations

from dataclasses import dataclass


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
    prefetch: bool = True  # False: lookups are targeted requests, never listings (comparisons)
