"""The shared tier: pieces of objects kept in an S3-compatible bucket that a fleet of gateways
shares (``[cache] shared = "s3://bucket/prefix"``), so the fleet fetches each object from the
origin once.

A piece's key in the shared bucket is derived from the origin's identity (its endpoint and
bucket, ``origins``), the object's key, its ETag and the layout version (``LAYOUT``), so a
replaced object (a new ETag) is never served from it. Each body is stored with metadata that
says what it is (origin, object, ETag, range) and its CRC64NVME; the PUT also carries a CRC32
the store checks on the way in (``S3Store``). A body whose length, metadata or checksum does
not match is a miss, counted by cause and logged once per cause, never served.

Fills (``admit`` then ``put``) run in the background and are bounded (fills queued, the bytes
they hold, PUTs sent at once, the largest piece taken): they never delay a READ. A fill past
the PUTs at once waits its turn rather than being dropped (a dropped fill is an origin GET
for every other gateway). A shared tier that fails
(unreachable, slow, refusing credentials, full) is never an error for a client: its lookups
and fills are skipped while its breaker is open (``Breaker``: a run of failures opens it for a
cooldown, after which one request tries again), and one warning names the cause and the fix.

Owns: the key layout, the metadata and its verification, the fill bounds, the breaker and the
tier's counters (``SharedStats``). Must not: know who reads (the reader asks the tier), decide
which gateway owns a piece (``gateway.data.fleet``), or how the bucket is reached (an
``ObjectStore``, opened by ``build()``).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

import structlog

from gateway.backend.base import (
    AccessDeniedError,
    BackendError,
    GetResult,
    ObjectNotFound,
    ObjectStore,
)
from gateway.backend.checksums import crc64nvme, fast_crcs
from gateway.data.fleet import Fleet
from gateway.data.tiers import NO_CLAIM, Claim, Piece

__all__ = [
    "LAYOUT",
    "Breaker",
    "NotFilledYet",
    "SharedLimits",
    "SharedStats",
    "SharedTier",
    "shared_key",
]

log = structlog.get_logger(__name__)

LAYOUT: Final = "v1"  # in every key: a new layout never reads an old one's bodies
_META: Final = "nfsgw-"  # user-metadata names (x-amz-meta-nfsgw-...)
_BIG: Final = 1 << 20  # a checksum over more than this runs off the event loop


class NotFilledYet(BackendError):
    """A prefetch of an object another fleet member owns found it missing from the shared
    tier: its owner has not filled it yet. The data prefetcher tries again later (the last
    attempt goes to the origin) instead of fetching it a second time for the fleet."""


def shared_key(prefix: str, origin: str, piece: Piece) -> str:
    """The key of ``piece`` of an object of ``origin`` in the shared bucket."""
    h = hashlib.sha256(f"{LAYOUT}\0{origin}\0{piece.key}\0{piece.etag}".encode()).hexdigest()
    return f"{prefix}{LAYOUT}/{h[:2]}/{h[2:]}/{piece.start}-{piece.length}"


def _metadata(origin: str, piece: Piece, crc: int) -> dict[str, str]:
    """What a stored body says about itself (ASCII: the key is named by its digest)."""
    return {
        _META + "origin": origin.encode("unicode_escape").decode("ascii"),
        _META + "object": hashlib.sha256(piece.key.encode()).hexdigest(),
        _META + "etag": piece.etag.encode("unicode_escape").decode("ascii"),
        _META + "range": f"{piece.start}-{piece.length}",
        _META + "crc64nvme": f"{crc:016x}",
    }


@dataclass(frozen=True, slots=True)
class SharedLimits:
    """The shared tier's bounds (``[cache] shared_*``)."""

    max_piece: int = 64 << 20  # larger pieces are not filled
    max_inflight_puts: int = 16  # PUTs sent at once; more fills wait their turn
    max_queued_fills: int = 4096  # fills waiting or being sent; past it a fill is skipped
    max_inflight_bytes: int = 256 << 20  # held for PUTs in flight
    breaker_failures: int = 3  # failures in a row that open the breaker
    breaker_cooldown_s: float = 30.0  # open this long, then one request tries again
    timeout_s: float = 10.0  # a lookup slower than this is a miss (and a failure)


@dataclass(slots=True)
class SharedStats:
    """The shared tier's counters (``nfsgw_shared_*`` metrics); ``bad_*`` by cause of a
    refused body, ``skip_*`` by cause of a fill not admitted."""

    hits: int = 0
    hit_bytes: int = 0
    misses: int = 0
    fills: int = 0
    fill_bytes: int = 0
    fill_errors: int = 0
    foreign_fills: int = 0  # fetched from the origin here though another member owns them
    errors: int = 0  # failed requests (lookups and fills), each a breaker failure
    skipped: int = 0  # lookups not sent: the breaker was open
    breaker_trips: int = 0
    breaker_open: int = 0  # 1 while open (a gauge)
    bad_length: int = 0
    bad_metadata: int = 0
    bad_checksum: int = 0
    skip_breaker: int = 0
    skip_too_big: int = 0
    skip_queue: int = 0
    skip_bytes: int = 0
    queued_fills: int = 0  # admitted, not finished (waiting or being sent)
    inflight_puts: int = 0  # being sent
    inflight_bytes: int = 0  # held by the queued fills
    fleet_members: int = 0  # a gauge (``SharedTier.read_stats``)
    fleet_changes: int = 0

    def count(self, prefix: str, cause: str) -> None:
        name = f"{prefix}_{cause}"
        setattr(self, name, getattr(self, name) + 1)


class Breaker:
    """Closed until ``failures`` requests in a row fail; then open for ``cooldown_s``, after
    which it lets one request through (half open): its success closes it, its failure opens
    it again."""

    __slots__ = ("_clock", "_probe_at", "cooldown_s", "failures", "open_until", "run")

    def __init__(
        self, failures: int, cooldown_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.failures = failures
        self.cooldown_s = cooldown_s
        self._clock = clock
        self.run = 0  # failures in a row
        self.open_until: float | None = None
        # When the half-open state let its one request through (None: it has not): another
        # goes only a cooldown later, so a request that never reports (cancelled) cannot
        # keep the breaker open for good.
        self._probe_at: float | None = None

    @property
    def is_open(self) -> bool:
        return self.open_until is not None

    def allow(self) -> bool:
        """Whether a request may be sent now."""
        if self.open_until is None:
            return True
        now = self._clock()
        if now < self.open_until:
            return False
        if self._probe_at is not None and now < self._probe_at + self.cooldown_s:
            return False
        self._probe_at = now  # the one request of the half-open state
        return True

    def success(self) -> None:
        self.run = 0
        self.open_until = None
        self._probe_at = None

    def failure(self, at_once: bool = False) -> bool:
        """Count a failure (``at_once``: one that will not heal by itself, e.g. refused
        credentials); True when it opened the breaker."""
        self.run += 1
        was_open = self.open_until is not None
        if was_open or at_once or self.run >= self.failures:
            self.open_until = self._clock() + self.cooldown_s
            self._probe_at = None
            return not was_open
        return False


def _cause(e: BaseException) -> tuple[str, str]:
    """A failure's cause and the fix a warning names."""
    if isinstance(e, AccessDeniedError):
        return "credentials", "give the gateway's credentials read and write on the bucket"
    if isinstance(e, TimeoutError | asyncio.TimeoutError):
        return "slow", "put the shared tier near the gateways, or raise its timeout"
    text = str(e)
    if any(s in text for s in ("QuotaExceeded", "507", "InsufficientStorage", "EntityTooLarge")):
        return "full", "give the shared bucket room, or lower shared_max_piece"
    if "NoSuchBucket" in text:
        return "no_bucket", "create the shared bucket"
    return "unreachable", "check [cache] shared and shared_endpoint_url"


class SharedTier:
    """A ``Tier`` in an S3 bucket shared by a fleet (see the module docstring)."""

    name: str = "shared"

    def __init__(
        self,
        store: ObjectStore,
        prefix: str = "",
        *,
        origins: Mapping[str, str] | None = None,
        limits: SharedLimits | None = None,
        stats: SharedStats | None = None,
        fleet: Fleet | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.prefix = prefix
        self.origins = origins if origins is not None else {}  # filled as exports are built
        self.limits = limits or SharedLimits()
        self.stats = stats or SharedStats()
        self.breaker = Breaker(self.limits.breaker_failures, self.limits.breaker_cooldown_s, clock)
        self.fleet = fleet
        self._puts = asyncio.Semaphore(self.limits.max_inflight_puts)
        self._tasks: set[asyncio.Task[bool]] = set()
        self._warned: set[str] = set()

    def origin(self, piece: Piece) -> str:
        """The identity of the origin ``piece`` comes from (its endpoint and bucket)."""
        return self.origins.get(piece.store, piece.store)

    def key(self, piece: Piece) -> str:
        return shared_key(self.prefix, self.origin(piece), piece)

    # -- the Tier protocol ---------------------------------------------------------------------

    async def lookup(self, piece: Piece, mapped: bool) -> bytes | memoryview | None:
        """The piece's verified bytes, or None (absent, unusable, or the tier failing)."""
        if not self.breaker.allow():
            self.stats.skipped += 1
            return None
        try:
            async with asyncio.timeout(self.limits.timeout_s):
                got = await self.store.get(self.key(piece), size=piece.length)
        except ObjectNotFound:
            self._succeeded()
            self.stats.misses += 1
            return None
        except (BackendError, OSError, TimeoutError) as e:
            self._failed("lookup", e)
            self.stats.misses += 1
            return None
        self._succeeded()
        bad = await self._verify(piece, got)
        if bad is not None:
            self.stats.count("bad", bad)
            self.stats.misses += 1
            if bad not in self._warned:
                self._warned.add(bad)
                log.warning("shared_tier_entry_refused", cause=bad, key=self.key(piece))
            return None
        self.stats.hits += 1
        self.stats.hit_bytes += len(got.data)
        return got.data

    def admit(self, piece: Piece) -> bool:
        """Whether a fill of ``piece`` may start now; reserves its place (``put`` next)."""
        lim, st = self.limits, self.stats
        cause = None
        if self.breaker.is_open:
            cause = "breaker"
        elif piece.length > lim.max_piece:
            cause = "too_big"
        elif st.queued_fills >= lim.max_queued_fills:
            cause = "queue"
        elif st.inflight_bytes + piece.length > lim.max_inflight_bytes:
            cause = "bytes"
        if not self.owns(piece):
            # Asked after every origin fetch of a shared piece: one another member owns
            # (a duplicate when the owner fetches it too), whether or not it is filled.
            st.foreign_fills += 1
        if cause is not None:
            st.count("skip", cause)
            return False
        st.queued_fills += 1
        st.inflight_bytes += piece.length
        return True

    def put(
        self,
        piece: Piece,
        data: bytes | memoryview,
        mapped: Callable[[memoryview], None] | None = None,
    ) -> asyncio.Task[bool]:
        """Store an admitted piece in the background (a private copy: the caller's buffer
        may be reused); the task says whether it was stored."""
        task = asyncio.get_running_loop().create_task(
            self._put(piece, bytes(data)), name="shared-tier-fill"
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def claim(self, piece: Piece) -> Claim:
        """Nothing to wait for: the fleet's owner fills the tier (``owns``)."""
        return NO_CLAIM

    def owns(self, piece: Piece) -> bool:
        return self.fleet is None or self.fleet.owns(piece)

    def backlogged(self) -> bool:
        """Whether fills hold more than half their bytes bound: the data prefetcher then
        waits (a fill skipped for room costs every other gateway an origin GET)."""
        return self.stats.inflight_bytes * 2 > self.limits.max_inflight_bytes

    # -- the rest -----------------------------------------------------------------------------

    async def _put(self, piece: Piece, data: bytes) -> bool:
        st = self.stats
        try:
            if len(data) != piece.length:
                st.fill_errors += 1
                log.warning("shared_tier_fill_refused", why="length", key=piece.key)
                return False
            crc = await _crc(data)
            meta = _metadata(self.origin(piece), piece, crc)
            async with self._puts:
                if self.breaker.is_open:  # it opened while this fill waited its turn
                    st.count("skip", "breaker")
                    return False
                st.inflight_puts += 1
                try:
                    async with asyncio.timeout(self.limits.timeout_s):
                        await self.store.put(self.key(piece), data, meta)
                except (BackendError, OSError, TimeoutError) as e:
                    st.fill_errors += 1
                    self._failed("fill", e)
                    return False
                finally:
                    st.inflight_puts -= 1
            self._succeeded()
            st.fills += 1
            st.fill_bytes += len(data)
            return True
        finally:
            st.queued_fills -= 1
            st.inflight_bytes -= piece.length

    async def _verify(self, piece: Piece, got: GetResult) -> str | None:
        """Why ``got`` is not ``piece`` (a cause for the counters), or None."""
        if len(got.data) != piece.length:
            return "length"
        want = _metadata(self.origin(piece), piece, 0)
        meta = {k.lower(): v for k, v in got.metadata.items()}
        for name in ("origin", "object", "etag", "range"):
            if meta.get(_META + name) != want[_META + name]:
                return "metadata"
        stored = meta.get(_META + "crc64nvme")
        if stored is None or stored != f"{await _crc(got.data):016x}":
            return "checksum"
        return None

    def _succeeded(self) -> None:
        if self.breaker.is_open:
            log.info("shared_tier_back", failures=self.breaker.run)
        self.breaker.success()
        self.stats.breaker_open = 0

    def _failed(self, what: str, e: BaseException) -> None:
        self.stats.errors += 1
        cause, fix = _cause(e)
        if self.breaker.failure(at_once=cause in ("credentials", "no_bucket")):
            self.stats.breaker_trips += 1
            self.stats.breaker_open = 1
            log.warning(
                "shared_tier_off",
                cause=cause,
                fix=fix,
                failed=what,
                error=str(e)[:200],
                retry_in_s=self.limits.breaker_cooldown_s,
                served_from="origin",
            )

    def read_stats(self) -> SharedStats:
        """The counters, with the fleet's gauges current (what a scrape reads)."""
        if self.fleet is not None:
            self.stats.fleet_members = len(self.fleet.members)
            self.stats.fleet_changes = self.fleet.changes
        return self.stats

    async def probe(self) -> bool:
        """At start: whether the bucket answers (a GET of a key nobody writes: "not found"
        is the answer wanted). A failure is logged once with its fix (``_failed``) and
        counted like any other; the gateway serves from the origin meanwhile."""
        try:
            async with asyncio.timeout(self.limits.timeout_s):
                await self.store.get(f"{self.prefix}{LAYOUT}/probe", size=0)
        except ObjectNotFound:
            pass
        except (BackendError, OSError, TimeoutError) as e:
            self._failed("probe", e)
            return False
        self._succeeded()
        log.info(
            "shared_tier_ready",
            bucket=self.store.name,
            prefix=self.prefix,
            members=len(self.fleet.members) if self.fleet is not None else None,
        )
        return True

    async def drain(self, timeout_s: float = 10.0) -> None:
        """Wait (bounded) for the fills in flight."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout_s)

    async def close(self) -> None:
        await self.drain()
        for t in list(self._tasks):
            t.cancel()
        await self.store.close()


async def _crc(data: bytes) -> int:
    """CRC64NVME of ``data``, off the loop when it costs more than microseconds (big, or the
    compiled CRCs missing: ~7 ms per 110 kB in Python)."""
    if len(data) > _BIG or not fast_crcs():
        return await asyncio.to_thread(crc64nvme, data)
    return crc64nvme(data)
