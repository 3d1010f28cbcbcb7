"""The local-disk tier of the data cache (DESIGN §3 "Data cache: two levels"): verified
entries under ``server.cache_dir``, shared by every worker process of the host, surviving
restarts.

Owns: nothing but the names other layers import (``DiskStore``, ``DiskKey``, ``disk_key``,
``open_disk_tier``, ``resolve_cache_dir``, ``usable``, ``Claim``). Must not: hold code. Each
module's docstring says what it owns; from the loop down:

- ``store``: ``DiskStore``, the tier's face to the event loop: open, read, claim, close (the
  design's overview: the host's one data cache, held once and fetched once; bad conditions);
- ``budget``: admission (the duel), eviction, scans, the maintenance task;
- ``writes``: batches of entries, each written as one bundle;
- ``state``: the per-process fields those three share;
- ``tier``: ``DiskTier``, the ``gateway.data.tiers.Tier`` protocol over a ``DiskStore``;
- ``entries``: blocking: read and verify an entry (or map it), write a bundle;
- ``directory``: blocking: create, scan, evict, touch, sweep an older layout;
- ``sharing``: blocking: fetch claims, the owner and its guests, the sole user's name filter;
- ``fileformat``: names, a bundle's table and an entry's header, charges (no I/O).
"""

from gateway.data.disk.fileformat import DiskKey, disk_key
from gateway.data.disk.sharing import Claim
from gateway.data.disk.store import DiskStore, open_disk_tier, resolve_cache_dir, usable

__all__ = [
    "Claim",
    "DiskKey",
    "DiskStore",
    "disk_key",
    "open_disk_tier",
    "resolve_cache_dir",
    "usable",
]
