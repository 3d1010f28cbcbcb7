"""When a cached directory is listed again (``ListingSchedule``): TTLs, freshness, background
re-lists and listings ahead of a client, for one export's index (``index.Namespace``).

Owns: a directory's TTL and when its view stops being fresh, the change-notification shortcut,
and the two budgets of listings nobody waits for (background re-lists, listings ahead). Must
not: start a listing itself (the index does, through the callable it passes), touch the
directory collection or the memory budget, or import the write path or ``gateway.exports``.

Decisions (DESIGN §3 "Index at ImageNet scale"; what a user can expect: docs/operations.md
"Directory caching and staleness"):

- **TTL.** A view is fresh for its directory's TTL after its listing *started*, less a random
  0-20 % (``JITTER``: directories listed together are re-listed spread over time). The TTL
  starts at ``attr_ttl_s``, doubles each time a re-list finds the directory unchanged, up to
  ``attr_ttl_max_s``, and is back at ``attr_ttl_s`` after a change or an invalidate
  (``immutable``: fresh forever); while unchanged, a directory of files has at least
  ``age_ttl_factor`` x the age of its newest file (within the same bounds). Past that, the
  view is served to every caller while one background re-list runs (at most
  ``background_relists`` per export at once; ``current`` callers take the re-list's answer for
  a name it has passed); past the hard limit, max(``hard_ttl_factor`` x ``attr_ttl_s``, 2 x
  ``attr_ttl_max_s``) after its listing, callers wait for the re-list. A failed background
  re-list keeps the old view and is retried after ``retry_after_error_s``.
- **Change notification.** A store that can say a directory is unchanged (``watch_listing``
  and ``unchanged_since``: a local export's inotify watches, ``gateway.backend.dirwatch``)
  is asked first when a view's TTL has passed: unchanged since its listing started, the view
  is fresh again for its TTL from now (``relists_avoided``), with no re-list; otherwise, or
  when the store cannot watch it, the re-list goes as above.
- **Listing ahead.** A client's READDIR of a folder from the top lists the next
  ``list_ahead`` sibling folders never listed (at most ``list_ahead`` such listings in flight),
  while the index holds less than half its memory budget.

How ``Namespace._lookup_in`` answers name N in directory D, by D's state (``freshness``):

+------------------------+------------------------------+------------------------------------------+
| state of D             | listing of D                 | answer for name N                        |
| (``freshness``)        |                              |                                          |
+========================+==============================+==========================================+
| prefetch off           | none                         | a targeted lookup (``probes``), kept one |
| (``config.prefetch``   |                              | TTL                                      |
| False)                 |                              |                                          |
+------------------------+------------------------------+------------------------------------------+
| "fresh"                | none                         | from the view (hit or negative hit); a   |
|                        |                              | partial view and N past its last key: a  |
|                        |                              | targeted lookup                          |
+------------------------+------------------------------+------------------------------------------+
| "stale": past the TTL, | one background re-list, if   | from the view, as "fresh"; a ``current`` |
| within the hard limit  | the budget has room and      | caller (READ) takes the re-list's answer |
|                        | ``retry_at`` has passed      | once it has passed N                     |
+------------------------+------------------------------+------------------------------------------+
| "expired": past the    | started unless one is in     | from the listing once it has passed N    |
| hard limit, or         | flight (single-flight), and  | (or ended); past ``huge_dir_pages``      |
| invalidated; "none":   | waited for                   | pages and N not reached: a targeted      |
| never listed           |                              | lookup; a listing that predates an       |
|                        |                              | invalidate: waited for, then D listed    |
|                        |                              | again                                    |
+------------------------+------------------------------+------------------------------------------+
| its listing failed     | a re-list leaves the view as | the waiters get its error                |
|                        | it was; ``retry_at`` = now + | (``errors.from_backend``); the next      |
|                        | ``retry_after_error_s``      | caller of an expired D lists again       |
+------------------------+------------------------------+------------------------------------------+

A store's change notification can turn "stale" or "expired" into "fresh" first (above).
READDIR (``Namespace._view``) follows the same rows, but waits for the whole listing.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Callable, Mapping
from typing import Final

from gateway.backend.base import ObjectStore
from gateway.clock import Clock
from gateway.namespace.columns import KIND_DIR
from gateway.namespace.config import NamespaceConfig
from gateway.namespace.directory import Directory, Fresh
from gateway.namespace.entries import NamespaceStats
from gateway.namespace.listing import Listing
from gateway.namespace.paths import join_path

JITTER: Final = 0.2
"""A view's freshness ends up to this fraction of its TTL early (never late), at random, so
directories listed together are re-listed spread over time."""

_DIR_KIND: Final = bytes([KIND_DIR])


class Budget:
    """At most ``limit`` listings of one kind in flight that nobody waits for."""

    __slots__ = ("limit", "inflight")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.inflight = 0

    def full(self) -> bool:
        return self.inflight >= self.limit

    def take(self, lst: Listing) -> None:
        """``lst`` (started) counts until its task ends."""
        assert lst.task is not None
        self.inflight += 1
        lst.task.add_done_callback(self._ended)

    def _ended(self, _task: asyncio.Task[None]) -> None:
        self.inflight -= 1


class ListingSchedule:
    """TTLs and re-list decisions of one export's index. See the module docstring."""

    def __init__(
        self,
        config: NamespaceConfig,
        clock: Clock,
        stats: NamespaceStats,
        store: ObjectStore,
    ) -> None:
        self.ttl = math.inf if config.immutable else config.attr_ttl_s
        """A directory's first TTL, and its TTL after a change or an invalidate."""
        self.ttl_max = max(self.ttl, config.ttl_max_s())
        self.hard_ttl = max(self.ttl * config.hard_ttl_factor, 2 * self.ttl_max)
        self.config = config
        self.clock = clock
        self.stats = stats
        self.random = random.Random()
        # Optional store capabilities (a local export's change notification): the base
        # docstring of ObjectStore.
        self._watch_listing: Callable[[str], object | None] | None = getattr(
            store, "watch_listing", None
        )
        self._unchanged_since: Callable[[object], bool] | None = getattr(
            store, "unchanged_since", None
        )
        self.relists = Budget(config.background_relists)
        self.ahead = Budget(config.list_ahead)

    def watch(self, key_prefix: str) -> object | None:
        """The store's change token for a listing of ``key_prefix`` starting now, if it can
        watch it (``ObjectStore.watch_listing``)."""
        return None if self._watch_listing is None else self._watch_listing(key_prefix)

    def jitter(self) -> float:
        return JITTER * self.random.random()

    def freshness(self, d: Directory) -> Fresh:
        now = self.clock.monotonic()
        state = d.freshness(now, self.hard_ttl)
        if (state == "stale" or state == "expired") and d.watch is not None:
            # Invalidated (listed_at -inf) or being re-listed: as without notification.
            unchanged = self._unchanged_since
            if (
                d.listing is None
                and d.listed_at != -math.inf
                and unchanged is not None
                and unchanged(d.watch)  # nothing changed since the view's listing started
            ):
                d.listed(now, self.jitter())
                self.stats.relists_avoided += 1
                return "fresh"
            d.watch = None
        return state

    def relist_in_background(self, d: Directory, start: Callable[[Directory], Listing]) -> None:
        """``d`` is stale: ``start`` its re-list unless one runs, the budget is full or a failed
        one is waiting out ``retry_after_error_s``."""
        if d.listing is None and not self.relists.full() and self.clock.monotonic() >= d.retry_at:
            self.relists.take(start(d))

    def list_ahead(
        self, path: str, dirs: Mapping[str, Directory], start: Callable[[str], Listing]
    ) -> None:
        """A client reads ``path`` from the top: ``start`` the listing of each of the next
        ``list_ahead`` subdirectories of its parent not in ``dirs`` (the cached ones), within
        the budget, while the index holds less than half its memory budget."""
        if not path or self.ahead.full() or self.stats.bytes > self.config.memory_bytes // 2:
            return
        parent, _, name = path.rpartition("/")
        pd = dirs.get(parent)
        if pd is None or pd.cols is None:
            return
        cols = pd.cols
        limit = self.config.list_ahead
        r = cols.after(name)
        for _ in range(limit):  # the next ``limit`` subdirectories, listed or not
            r = cols.kinds.find(_DIR_KIND, r)  # at C speed
            if r < 0:
                return
            sub = join_path(parent, cols.name(r))
            r += 1
            if sub in dirs:
                continue
            if self.ahead.full():
                return
            lst = start(sub)
            lst.ahead = True
            self.stats.listed_ahead += 1
            self.ahead.take(lst)

    def installed(self, d: Directory, lst: Listing, *, relist: bool, changed: bool) -> None:
        """``lst`` (partial or not: ``d.partial``) was installed in ``d``: its next TTL, how
        long the view is fresh, and the store's change token to ask when that has passed."""
        if relist and changed:
            d.ttl = self.ttl
        else:  # acdirmin/acdirmax style: unchanged, the next re-list comes later
            d.ttl = max(min(2 * d.ttl, self.ttl_max) if relist else d.ttl, self._age_ttl(d))
        d.listed(-math.inf if lst.invalid else lst.started_at, self.jitter())
        d.watch = None if lst.invalid or d.partial else lst.watch

    def _age_ttl(self, d: Directory) -> float:
        """``age_ttl_factor`` x the age of the newest file of a directory of files (one with
        subdirectories: 0, their changes do not show in its mtimes)."""
        cols = d.cols
        if cols is None or not cols.n or not cols.allfiles or math.isinf(self.ttl):
            return 0.0
        age_s = (self.clock.time_ns() - max(cols.mtimes)) / 1e9
        return min(self.config.age_ttl_factor * age_s, self.ttl_max)
