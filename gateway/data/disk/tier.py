"""The disk tier as a ``Tier`` (``gateway.data.tiers``): the same pieces the reader asks of a
``DiskStore`` today, asked by ``Piece`` instead of by ``DiskKey``.

A piece's entry is named by ``disk_key(piece.store, piece.key, piece.etag, piece.start,
piece.length)``, exactly the name the reader gives the same bytes (``ObjectStore.name`` is
the ``store`` of both), so what one of them wrote the other finds. The tier is of one host:
it fetches every piece it is asked for (``owns``), and its claims are the ``DiskStore``'s
(``flock`` stripes among the processes that share the directory; none when it is unshared).

Owns: the translation from ``Piece`` to ``DiskKey`` and the ``Tier`` methods over
``DiskStore.read``, ``admit``, ``publish`` and ``claim``. Must not: keep state of its own
(accounting, batches, counts and failures are the ``DiskStore``'s), raise to a caller (the
store counts its failures and answers "not here" or "not stored"), or open or close the store
(its owner does).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

from gateway.data.disk.fileformat import DiskKey, disk_key
from gateway.data.disk.store import DiskStore
from gateway.data.tiers import Claim, Piece

if TYPE_CHECKING:
    from gateway.data.tiers import Tier

__all__ = ["DiskTier"]


class DiskTier:
    """A ``Tier`` over one process's ``DiskStore`` (the store stays its owner's to close)."""

    __slots__ = ("disk",)

    name: str = "disk"

    def __init__(self, disk: DiskStore) -> None:
        self.disk = disk

    @staticmethod
    def key(piece: Piece) -> DiskKey:
        """The entry holding ``piece`` (the reader's name for the same bytes)."""
        return disk_key(piece.store, piece.key, piece.etag, piece.start, piece.length)

    async def lookup(self, piece: Piece, mapped: bool) -> bytes | memoryview | None:
        """The piece's verified bytes (a mapping of its pages when ``mapped``), or None:
        absent, bad (dropped), or an I/O error (``DiskStore.read``)."""
        return await self.disk.read(self.key(piece), mapped)

    def admit(self, piece: Piece) -> bool:
        """Whether the tier takes ``piece`` now (room, or the admission duel won; floor,
        backlog, no recent write error): its room reserved, ``put`` next when True."""
        return self.disk.admit(self.key(piece))

    def put(
        self,
        piece: Piece,
        data: bytes | memoryview,
        mapped: Callable[[memoryview], None] | None = None,
    ) -> asyncio.Task[bool]:
        """Write an admitted piece in the open batch (``DiskStore.publish``); a shared tier
        hands the written body's mapping to ``mapped``."""
        return self.disk.publish(self.key(piece), data, mapped)

    async def claim(self, piece: Piece) -> Claim:
        """The store's claim of ``piece`` (``DiskStore.claim``): nothing held when the tier
        is unshared or closed; else held (``release`` after ``put``), or ``present``."""
        return await self.disk.claim(self.key(piece))

    def owns(self, piece: Piece) -> bool:
        """A tier of one host: this gateway fetches every piece it lacks."""
        return True


if TYPE_CHECKING:

    def _is_a_tier(t: DiskTier) -> Tier:  # checked by mypy: every member of the Protocol
        return t
