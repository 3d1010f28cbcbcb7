"""The data layer: read coalescing, read-ahead, single-flight fetches and the byte-budgeted
block cache (DESIGN §3 "Read coalescing", "Data cache").

Owns: object bytes between the backend and the READ handler. Must not: know about NFS, file
handles or attributes (callers pass ``(store, key, etag, size)``), or block the event loop.

``cache.py`` stores and evicts (memory tier; ``mappings.py``: the slices and file mappings it
holds), ``disk/`` the disk tier shared by the worker processes (its ``__init__`` maps it),
``reader.py`` fetches (``fetches.py`` its bookkeeping, ``slots.py`` bounds its GETs,
``warm.py`` fills the disk tier for warm-ups) and tells ``events.FileOpened`` of READs (the
prefetcher, ``prefetch.py``, listens), ``sketch.py`` counts, ``stats.py`` exposes counters
for ``gateway.ops.metrics``.
"""

from gateway.data.cache import BLOCK_ENTRY_CHARGE_BYTES, BlockKey, DataCache
from gateway.data.config import DataConfig, DiskConfig
from gateway.data.disk.store import DiskStore, open_disk_tier
from gateway.data.reader import ObjectReader
from gateway.data.stats import DataStats, DiskStats

__all__ = [
    "BLOCK_ENTRY_CHARGE_BYTES",
    "BlockKey",
    "DataCache",
    "DataConfig",
    "DataStats",
    "DiskConfig",
    "DiskStats",
    "DiskStore",
    "ObjectReader",
    "open_disk_tier",
]
