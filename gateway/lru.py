"""A mapping bounded by its number of entries: putting a key makes it the most recent, and
past ``max_entries`` the least recently put is forgotten.

Owns: the one least-recently-used rule of the small bookkeeping maps (directory markers'
metadata, renamed paths, object metadata, hashed handle names). Must not: know what it holds
(byte budgets are the caches' own: ``gateway.data.cache``, ``gateway.namespace.index``).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TypeVar

K = TypeVar("K")
V = TypeVar("V")


class Lru(OrderedDict[K, V]):
    def __init__(self, max_entries: int) -> None:
        super().__init__()
        self.max_entries = max_entries

    def put(self, key: K, value: V) -> None:
        """``key`` holds ``value`` and is the most recent; the oldest go past the bound."""
        self[key] = value
        self.move_to_end(key)
        while len(self) > self.max_entries:
            self.popitem(last=False)
