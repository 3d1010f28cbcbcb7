"""Backend GET slots of the data layer: ``max_inflight_fetches`` in all, read-ahead (and
warm-up) limited to ``max_readahead_fetches`` of them, a freed slot going to a waiting demand
fetch first.

Owns: the queueing of fetches for slots. Must not: fetch, cache or know what a fetch is beyond
its ``demand``/``slot_ra``/``waiter`` fields (``fetches.Fetch``).
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Protocol

from gateway.data.stats import DataStats

__all__ = ["FetchSlots", "SlotUser"]


class SlotUser(Protocol):
    demand: bool
    slot_ra: bool
    waiter: asyncio.Future[None] | None


class FetchSlots:
    """``total`` GET slots; demand first, read-ahead limited to ``ra_limit`` of them."""

    def __init__(self, total: int, ra_limit: int, stats: DataStats) -> None:
        self._free = total
        self._ra_running = 0
        self._ra_limit = ra_limit
        self._demand: deque[SlotUser] = deque()
        self._ahead: deque[SlotUser] = deque()
        self._stats = stats

    def _take(self, f: SlotUser) -> None:
        self._free -= 1
        f.slot_ra = not f.demand
        if f.slot_ra:
            self._ra_running += 1

    async def acquire(self, f: SlotUser) -> None:
        if self._free > 0 and (
            f.demand or (not self._demand and self._ra_running < self._ra_limit)
        ):
            self._take(f)
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        f.waiter = waiter
        (self._demand if f.demand else self._ahead).append(f)
        self._stats.queued_inflight += 1
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release(f)  # granted, then cancelled before it could run
            elif f in self._demand:
                self._demand.remove(f)
            elif f in self._ahead:
                self._ahead.remove(f)
            raise
        finally:
            f.waiter = None
            self._stats.queued_inflight -= 1

    def release(self, f: SlotUser) -> None:
        if f.slot_ra:
            self._ra_running -= 1
        self._free += 1
        self._dispatch()

    def promote(self, f: SlotUser) -> None:
        """A READ now waits on this read-ahead fetch: it queues (or runs) as demand."""
        if f.demand:
            return
        f.demand = True
        if f.waiter is not None and f in self._ahead:
            self._ahead.remove(f)
            self._demand.append(f)
            self._dispatch()

    def _dispatch(self) -> None:
        while self._free > 0:
            if self._demand:
                f = self._demand.popleft()
            elif self._ahead and self._ra_running < self._ra_limit:
                f = self._ahead.popleft()
            else:
                return
            self._take(f)
            assert f.waiter is not None
            f.waiter.set_result(None)
