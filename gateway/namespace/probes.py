"""Targeted lookups of one name (``Probes``) for one export's index (``index.Namespace``), when
a directory's listing cannot answer it soon enough.

Owns: asking the store about one name (``listing.targeted_lookup``: is it a file, a directory,
neither), one such question in flight per name, and keeping the answers per directory. Must
not: start or read directory listings, or import the write path or ``gateway.exports``.

Decisions (DESIGN §3 "Metadata prefetch"):

- **When.** With ``NamespaceConfig.prefetch`` False, for every lookup; in a huge directory,
  for a name its listing has not reached after ``huge_dir_pages`` pages; in a partial view
  (``max_list_pages``), for a name past its last key.
- **Kept** in ``Directory.probes`` for one TTL from the question (``probes_per_dir`` at most:
  past it, the directory's answers are all dropped), and only while the directory is still
  cached. A mutation of the name made while the question was in flight wins over its answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from gateway.backend.base import ObjectStore
from gateway.clock import Clock
from gateway.namespace.config import NamespaceConfig
from gateway.namespace.directory import Directory
from gateway.namespace.entries import Entry, NamespaceStats, file_entry
from gateway.namespace.listing import targeted_lookup
from gateway.namespace.paths import join_path


class Probes:
    """Targeted lookups of one export. See the module docstring."""

    def __init__(
        self,
        store: ObjectStore,
        *,
        clock: Clock,
        config: NamespaceConfig,
        stats: NamespaceStats,
        ttl: float,
        dir_entry: Callable[[str, str], Entry],
        kept: Callable[[Directory], bool],
        recost: Callable[[Directory], None],
    ) -> None:
        """``ttl``: how long an answer is kept; ``dir_entry(name, path)``: a directory's entry;
        ``kept(d)``: ``d`` is still in the index; ``recost(d)``: ``d``'s probes changed size."""
        self.store = store
        self.clock = clock
        self.config = config
        self.stats = stats
        self.ttl = ttl
        self._dir_entry = dir_entry
        self._kept = kept
        self._recost = recost
        self._inflight: dict[tuple[str, str], asyncio.Task[Entry | None]] = {}

    def tasks(self) -> list[asyncio.Task[Entry | None]]:
        """The questions in flight."""
        return list(self._inflight.values())

    async def lookup(self, d: Directory, name: str) -> Entry | None:
        """``name`` in ``d`` (None: absent): from ``d.probes`` within its TTL, else one
        question in flight per name."""
        now = self.clock.monotonic()
        hit = d.probes.get(name)
        if hit is not None and hit[1] > now:
            if hit[0] is None:
                self.stats.negative_hits += 1
            else:
                self.stats.hits += 1
            return hit[0]
        key = (d.path, name)
        task = self._inflight.get(key)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._ask(d, name))
            self._inflight[key] = task

            def _done(t: asyncio.Task[Entry | None], key: tuple[str, str] = key) -> None:
                self._inflight.pop(key, None)
                if not t.cancelled():
                    t.exception()

            task.add_done_callback(_done)
        return await asyncio.shield(task)

    async def _ask(self, d: Directory, name: str) -> Entry | None:
        started = self.clock.monotonic()
        path = join_path(d.path, name)
        is_dir, obj = await targeted_lookup(
            self.store, d.key_prefix + name, self.config.targeted_max_keys, self.stats
        )
        e: Entry | None
        if is_dir:
            e = self._dir_entry(name, path)
        elif obj is not None:
            e = file_entry(name, path, obj)
        else:
            e = None
        if self._kept(d):
            lst = d.listing
            if lst is not None and name in lst.overrides:
                return lst.overrides[name]  # a mutation raced with the probe: it wins
            if len(d.probes) >= self.config.probes_per_dir:
                d.probes.clear()
            d.probes[name] = (e, started + self.ttl)
            self._recost(d)
        return e
