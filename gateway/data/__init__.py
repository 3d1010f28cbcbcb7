"""The data layer: read coalescing, read-ahead, single-flight fetches and the byte-budgeted
block cache (DESIGN §3 "Read coalescing", "Data cache").

Owns: object bytes between the backend and the READ handler. Must not: know about NFS, file
handles or attributes (callers pass ``(store, key, etag, size)``), or block the event loop.

``cache.py`` stores and evicts, ``reader.py`` fetches, ``sketch.py`` counts, ``stats.py``
exposes counters for ``gateway.ops.metrics``.
"""

from gateway.data.cache import ENTRY_OVERHEAD, BlockKey, DataCache
from gateway.data.config import DataConfig
from gateway.data.reader import ObjectReader
from gateway.data.stats import DataStats

__all__ = ["ENTRY_OVERHEAD", "BlockKey", "DataCache", "DataConfig", "DataStats", "ObjectReader"]
