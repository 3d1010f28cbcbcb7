"""The data tiers below memory, behind one small Protocol: the reader asks "the tiers".

A tier keeps pieces of object versions: the disk tier (``gateway.data.disk``, on this host,
shared by its worker processes) and the shared tier (``gateway.data.shared``, an S3-compatible
bucket shared by a fleet of gateways). ``build()`` composes the ones configured, nearest
first, into one ``Tiers``; the reader, the pack store and the data prefetcher are given that
and never ask which tier they talk to. The memory tier (``DataCache``) stays above them: it is
synchronous (the fast path answers from it without awaiting) and keyed by block.

A piece is named by its object version (the origin store's name, the key, the ETag) and its
byte range; a tier derives its own key from that (a file name, an object key) and never serves
a piece of another version.

Owns: the contract (``Piece``, ``Claim``, ``Tier``) and the walk over the tiers in order
(``Tiers``). Must not: know a tier's storage, its bounds or its failures (each tier keeps its
own: a failing tier answers "not here" and counts it, never raises to the reader).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, Protocol

__all__ = ["NO_CLAIM", "Claim", "Piece", "Tier", "Tiers"]


@dataclass(frozen=True, slots=True)
class Piece:
    """Bytes ``[start, start + length)`` of version ``etag`` of ``key`` in the store named
    ``store`` (``ObjectStore.name``)."""

    store: str
    key: str
    etag: str
    start: int
    length: int


class Claim(Protocol):
    """The right to fetch one piece from the origin, among whoever shares a tier (the worker
    processes of a disk tier; the gateways of a fleet): held until ``release``. ``present``:
    the piece turned up in the tier while waiting (look it up instead of fetching)."""

    @property
    def present(self) -> bool: ...

    def release(self) -> None: ...


class _NoClaim:
    """Nothing to wait for and nothing held: fetch."""

    __slots__ = ()
    present: Final = False

    def release(self) -> None:
        pass


NO_CLAIM: Final[Claim] = _NoClaim()


class Tier(Protocol):
    """One data tier below memory. Every method answers; failures are the tier's own."""

    name: str  # "disk", "shared": for metrics and logs

    async def lookup(self, piece: Piece, mapped: bool) -> bytes | memoryview | None:
        """The piece's bytes, verified, or None (not here, or not usable: counted by the
        tier). ``mapped``: a hit may be a mapping of the tier's file (the memory tier's
        mapping budget allows it)."""
        ...

    def admit(self, piece: Piece) -> bool:
        """Whether the tier takes ``piece`` now (room, size limit, its own health); reserves
        what it needs, so call ``put`` next when True. Synchronous, on the loop."""
        ...

    def put(
        self,
        piece: Piece,
        data: bytes | memoryview,
        mapped: Callable[[memoryview], None] | None = None,
    ) -> asyncio.Task[bool]:
        """Store an admitted piece in the background (never delays a READ; failures are
        counted, never raised); the task says whether it was stored. A tier whose stored
        body can be mapped hands that mapping to ``mapped`` (the caller swaps its private
        copy for it)."""
        ...

    async def claim(self, piece: Piece) -> Claim:
        """Wait, bounded, while someone else who shares the tier fetches ``piece``; then
        either the right to fetch it (``release`` after ``put``) or ``present``. A tier
        nobody else shares answers ``NO_CLAIM`` at once."""
        ...

    def owns(self, piece: Piece) -> bool:
        """Whether this gateway is the one that fetches ``piece`` from the origin for all who
        share the tier (a fleet's rendezvous hashing); True for a tier of one host. The data
        prefetcher fetches what it owns first and finds the rest in the tier."""
        ...


class Tiers:
    """The configured tiers, nearest first (``build()``); empty when there are none."""

    __slots__ = ("tiers",)

    def __init__(self, tiers: Sequence[Tier] = ()) -> None:
        self.tiers: tuple[Tier, ...] = tuple(tiers)

    def __bool__(self) -> bool:
        return bool(self.tiers)
