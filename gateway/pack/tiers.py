"""Where a pack's group fetch puts the neighbours of the member asked for.

``PackedStore`` gets one ``NeighbourTiers`` in its constructor: ``ReaderTiers`` (the data
layer's memory and disk tiers, as the server builds them) or ``NO_TIERS`` (a store with no
data layer: neighbours are not kept, groups are fetched as if memory always had room, and
group fetches are not claimed among workers).

Owns: the questions a group fetch asks the tiers (room in memory, room on disk, keep this
neighbour, the disk tier shared by the workers) and the claims of group fetches on a shared
disk tier (``TierClaims``). Must not: decide which members form a group (``PackedStore``).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Final, Protocol

from gateway.data.disk import sharing
from gateway.data.disk.fileformat import DiskKey, disk_key
from gateway.data.disk.store import DiskStore

if TYPE_CHECKING:
    from gateway.data.reader import ObjectReader

__all__ = [
    "NO_TIERS",
    "NeighbourTiers",
    "ReaderTiers",
    "SharedTier",
    "TierClaims",
]


class SharedTier(Protocol):
    """The disk tier as a group fetch uses it when worker processes share it (``TierClaims``):
    members named as the data layer names a whole small object's entry."""

    def stripe(self, key: str, etag: str, size: int) -> str:
        """The lock stripe of the member's entry (two claims on one stripe exclude each
        other, in one process too)."""
        ...

    async def claim(self, key: str, etag: str, size: int) -> tuple[int, bool]:
        """One attempt, without waiting: (fd, False) held (``release`` it), (-1, True) the
        entry is there, (-1, False) another holder."""
        ...

    def release(self, fd: int) -> None: ...

    async def has(self, key: str, etag: str, size: int) -> bool: ...

    async def read(self, key: str, etag: str, size: int) -> bytes | memoryview | None: ...


class TierClaims:
    """``SharedTier`` over a shared ``DiskStore`` whose entries the data layer names with
    ``store_name``; ``mapped()``: whether a hit may be a mapping (the cache's mapping limit)."""

    def __init__(self, disk: DiskStore, store_name: str, mapped: Callable[[], bool]) -> None:
        self._disk = disk
        self._name = store_name
        self._mapped = mapped

    def _key(self, key: str, etag: str, size: int) -> DiskKey:
        return disk_key(self._name, key, etag, 0, size)

    def stripe(self, key: str, etag: str, size: int) -> str:
        return self._key(key, etag, size).name[:3]  # sharing.claim's lock file

    async def claim(self, key: str, etag: str, size: int) -> tuple[int, bool]:
        fut = asyncio.get_running_loop().run_in_executor(
            None, sharing.claim, self._disk.root, self._key(key, etag, size)
        )
        try:
            return await asyncio.shield(fut)
        except asyncio.CancelledError:  # the flock may be taken anyway: drop it when it is
            fut.add_done_callback(_close_claim)
            raise

    def release(self, fd: int) -> None:
        os.close(fd)  # drops the flock

    async def has(self, key: str, etag: str, size: int) -> bool:
        return await self._disk.contains(self._key(key, etag, size))

    async def read(self, key: str, etag: str, size: int) -> bytes | memoryview | None:
        return await self._disk.read(self._key(key, etag, size), self._mapped())


def _close_claim(fut: asyncio.Future[tuple[int, bool]]) -> None:
    if not fut.cancelled() and fut.exception() is None and fut.result()[0] >= 0:
        os.close(fut.result()[0])


class NeighbourTiers(Protocol):
    """What a group fetch asks of the data layer's tiers."""

    @property
    def keeps_neighbours(self) -> bool:
        """Whether ``deposit`` keeps neighbours anywhere (when not, they are neither checked
        nor counted)."""
        ...

    @property
    def shared(self) -> SharedTier | None:
        """The disk tier when worker processes share it: group fetches are claimed."""
        ...

    def deposit(
        self, key: str, etag: str, view: memoryview, memory: bool
    ) -> Awaitable[bool] | None:
        """A verified neighbour: (key, etag, verified slice of the group's buffer, memory),
        for the data layer to keep in memory if it can (``memory``: the memory tier had room
        for the group) and to publish to the disk tier; returns the publishing (None when
        nothing is written), which the group's claim waits for."""
        ...

    def memory_room(self, n: int) -> bool:
        """Whether the memory tier has room for ``n`` bytes of neighbours."""
        ...

    def disk_room(self, n: int) -> bool:
        """Whether the disk tier has room for ``n`` bytes of neighbours (memory has none);
        False when there is no disk tier."""
        ...


class _NoTiers:
    """No data layer: nothing is kept, memory always has room (groups are fetched whole,
    their buffer kept only among the last groups), no disk tier, no claims."""

    keeps_neighbours: Final = False
    shared: Final = None

    def deposit(
        self, key: str, etag: str, view: memoryview, memory: bool
    ) -> Awaitable[bool] | None:
        return None

    def memory_room(self, n: int) -> bool:
        return True

    def disk_room(self, n: int) -> bool:
        return False


NO_TIERS: Final[NeighbourTiers] = _NoTiers()


class ReaderTiers:
    """The data layer's tiers behind ``reader``, whose entries are named after the store
    ``store_name``: neighbours go to memory when it has room, else to the disk tier (the
    host's cache, shared by the workers): a group is worth fetching when either has room."""

    keeps_neighbours: Final = True

    def __init__(self, reader: ObjectReader, store_name: str) -> None:
        self._reader = reader
        self._name = store_name
        self._cache = cache = reader.cache
        self._disk = disk = reader.disk
        self.shared: SharedTier | None = None
        if disk is not None and disk.shared:  # group fetches claimed among the workers
            self.shared = TierClaims(disk, store_name, lambda: cache.mappings < cache.max_mappings)

    def deposit(
        self, key: str, etag: str, view: memoryview, memory: bool
    ) -> Awaitable[bool] | None:
        return self._reader.deposit(self._name, key, etag, view, memory)

    def memory_room(self, n: int) -> bool:
        return self._cache.room_for(n)

    def disk_room(self, n: int) -> bool:
        # The entries' files cost a little more than their bodies.
        return self._disk is not None and self._disk.takes(n + n // 16)
