"""The namespace layer's settings. ``prefetch`` and ``attr_ttl_max_s`` are keys of the
``[cache]`` table of ``nfsgw.toml`` (declared here, ``gateway.settings``); ``attr_ttl_s`` and
``immutable`` come from the export (``ExportConfig``) and ``memory_bytes`` from its share of
``[cache] metadata_memory``, both set per export by the composition root; the rest are tunables
no file sets.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from gateway.settings import boolean, int_in, seconds, setting

TTL_MAX_FACTOR: Final = 5.0
"""``attr_ttl_max_s`` when unset: 5 x ``attr_ttl_s`` (300 s at the default 60 s). At ImageNet
scale a re-list of everything is 1,282 LIST pages (on S3 ~6 ms of CPU each to parse): at
60 s that is ~21 requests/s and ~13 % of a core spent finding nothing new, at 300 s ~4/s and
~3 %; and half of the default hard limit (``hard_ttl_factor`` x 60 s = 600 s) is left for
serving a view while its re-list runs, so the longest a view can be served stays 600 s."""


@dataclass(frozen=True, slots=True)
class NamespaceConfig:
    attr_ttl_s: float = 60.0
    immutable: bool = False
    attr_ttl_max_s: float | None = field(
        default=None,
        metadata=setting(
            seconds(),
            "a directory a re-list finds unchanged gets twice its TTL, up to this (per export: "
            "at least its attr_ttl_s; 0 keeps every TTL at attr_ttl_s)",
            default_text="5 x attr_ttl_s",
        ),
    )
    hard_ttl_factor: float = 10.0
    age_ttl_factor: float = 0.1
    """A directory of files whose newest file was modified ``age`` ago gets a TTL of at least
    ``age_ttl_factor`` x ``age`` (within [``attr_ttl_s``, ``attr_ttl_max_s``]): long-unchanged
    directories are unlikely to change soon (the BSD NFS client's attribute-cache rule)."""
    list_ahead: int = field(
        default=8,
        metadata=setting(
            int_in(0, 64),
            "a client reading a folder from the top: list this many of the next never-listed "
            "sibling folders in the background (0: off)",
            flag="--list-ahead",
        ),
    )
    """``ls -R``, ``du`` and ImageFolder's scan read sibling folders in order: the next
    folders' LIST pages then overlap this one's READDIRs. At most this many in flight."""
    background_relists: int = 4
    """Background re-lists in flight at once per export; a stale directory past this waits
    for a free slot (served meanwhile, until the hard limit), so re-lists never take every
    backend thread or connection from the READs."""
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

    def ttl_max_s(self) -> float:
        """The longest TTL a directory found unchanged grows to (at least ``attr_ttl_s``)."""
        if self.attr_ttl_max_s is None:
            return TTL_MAX_FACTOR * self.attr_ttl_s
        return max(self.attr_ttl_s, self.attr_ttl_max_s)
