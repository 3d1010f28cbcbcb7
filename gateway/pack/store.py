"""Serving a packed dataset: ``PackedStore`` is an export's ``ObjectStore`` that
answers a whole-object GET of a packed object from its shard, everything else from the
bucket, so the client sees the original tree and unmodified training code reads it.

Owns: when the index is loaded and what a failed load means (``load``; the reads and checks
are ``gateway.pack.indexload``'s: a HEAD and a GET each of the index and the unpacked keys, a
LIST of the shards, parses off the event loop), deciding per GET whether the shard may
answer it, the shard range fetches (single-flight per range) and their checks, and when
listings come from the index (``list_from_index``: immutable exports, 0 LIST requests; the
pages are ``gateway.pack.listing``'s). Must not: cache or
write the disk tier (neighbours go to the data layer through ``tiers``,
``gateway.pack.tiers``), copy a member out of its group's buffer, or serve bytes it has not
verified.

- **Until the index is loaded.** Listings from the index wait for it: a listing asked for
  while ``load`` runs (a client that mounted as the gateway started) waits until the index is
  in (then costs 0 LISTs) or ``index_wait_s`` after ``load`` began; then the wait gives up
  (``pack_index_wait_gave_up`` at error level, once), everything is served from the bucket
  until the index arrives, and nothing waits again. ``pending`` (readiness: ``/readyz`` and
  ``READY=1``) is true until then. GETs never wait: until the index is in they go to the
  objects.

- **Which GETs.** A GET of a whole object (no range) whose key is in the index, whose
  ``If-Match`` ETag is the index's (the object was not replaced since it was packed: the
  namespace lists the bucket, so a replaced object has a new ETag) and whose size is at most
  ``small_file_max`` (larger ones are read in blocks, which a member CRC cannot check). All
  other requests go to the bucket, as without a pack.
- **Groups.** A packed member is fetched with its *group*: the members of its shard whose
  data starts in the same aligned ``range_bytes`` window (8 MiB: ~75 ImageNet files, so a cold
  epoch costs ~0.013 GET per file), as one range from the first's data to the last's end.
  Groups do not overlap, so no byte is fetched twice; concurrent GETs of members of one group
  share its fetch, and ``covered`` tells the data prefetcher to move on to the next group. When
  ``tiers.memory_room`` says the memory tier has no space for the group (a dataset larger
  than memory), its neighbours go to the disk tier only (``tiers.disk_room``: if it has
  space), so they do not push each other out of memory unread; with space in neither, only
  the member itself is fetched: neighbours evicted unread would multiply the bytes read.
- **No copies.** The group is received once, into one ``bytes`` buffer; every member is a
  read-only ``memoryview`` slice of it (``.obj`` is the group's buffer), checked against its
  CRC-32 on the slice (``checksums.crc32``: the compiled one, ~3 µs per 110 kB where zlib's
  took ~30, the largest share of the pack's own CPU in a cold epoch; zlib's under
  ``NFSGW_PURE_PYTHON=1``, the same values), returned (the member asked for) or handed to
  ``tiers.deposit`` (the neighbours), which keeps the slice in memory as prefetched data if
  the cache has room, and publishes it to the disk tier when workers share it or memory has
  no room. The memory tier charges each slice its own length; the group's buffer lives as
  long as any slice of it does (cached, or in a reply being written). The bytes of evicted
  members still held that way are bounded by the cache (``DataCache``, "Slices of a shared
  buffer": past ``slack_bytes`` the survivors of the buffers holding most are copied out and
  the buffers freed); with a shared disk tier (``--workers`` > 1) each slice is swapped for a
  mapping of its entry once published, so the buffer goes within milliseconds.
- **Shared tier.** With a disk tier shared by several workers (``tiers.deposit`` publishes
  the neighbours to it) the other worker processes find the members there, and a group fetch
  is also *claimed* among them (``tiers.shared``, a ``SharedTier``), like the data layer's
  fetches (``DiskStore.claim``): a lock stripe of the disk tier named after the group's range, held
  from before the GET until the neighbours' entries are written. A worker wanting a member
  of a group another one is fetching waits for it, then reads its member from the tier (0
  GETs: ``tier_hits``); if it is not there, it fetches the group itself. The reader asking
  for a member holds that member's own claim already: when the group's claim falls on the
  same stripe (1 in 4,096), this process holds it already (other workers wait on it), and
  it is not waited for (its release may then come before the neighbours' entries are
  written: a worker that waited and does not find its member fetches the group). A claim
  not obtained within ``claim_wait_s`` is given up (the group is fetched; ``claim_timeouts``).
- **Bad input.** An index that is missing, truncated, of another version, for another source
  prefix, or whose shards are not all there with their sizes: the export is served from the
  bucket (every GET falls through), the reason logged once at error level and shown in
  ``/readyz`` (``status``). A member whose bytes fail their CRC, or whose shard range cannot
  be read (a shard deleted since, the pack's bucket failing), is served from its own object
  and counted (``corrupt``, ``fallbacks``).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import OrderedDict
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Final, cast

import structlog

from gateway.backend.base import (
    BackendError,
    GetResult,
    ListPage,
    ObjectStore,
    StoreWrapper,
)
from gateway.backend.checksums import crc32
from gateway.data.tiers import Piece, Tier
from gateway.pack.format import PackError, PackIndex
from gateway.pack.indexload import UnpackedKeys, load_pack
from gateway.pack.listing import list_from_index
from gateway.pack.tiers import NO_TIERS, NeighbourTiers, SharedTier, TierClaims

__all__ = [
    "NO_TIERS",
    "NeighbourTiers",
    "PackConfig",
    "PackStats",
    "PackedStore",
    "SharedTier",
    "TierClaims",
]

log = structlog.get_logger("nfsgw.pack")

MiB = 1024 * 1024
RECENT_GROUPS: Final = 4  # group buffers kept for members asked for just after (~32 MiB)
ON_TIER_GROUPS: Final = 1 << 17  # groups remembered as fetched to the disk tier (~10 MiB)
CLAIM_POLL_S: Final = (0.001, 0.02)  # first and longest pause between group claim attempts
ROWS_MEMO: Final = 512  # keys whose index row is remembered (``_row``)
GROUPS_MEMO: Final = 4096  # windows whose group's rows are remembered (``_bounds``)


@dataclass(frozen=True, slots=True)
class PackConfig:
    range_bytes: int = 8 * MiB
    """Aligned shard range fetched for a packed member (its neighbours come along)."""
    max_ranges: int = 16
    """Shard ranges being fetched at once (more GETs of packed members wait)."""
    max_index_bytes: int = 2 << 30
    """Largest index (or unpacked keys) object read, and largest text it may decompress to
    (~100 B per member: 20M members)."""
    index_wait_s: float = 30.0
    """How long listings (and readiness) wait for the index after its load began; then they
    go to the bucket until it is in. A 400 kB index loads in well under a second, 20M members
    in tens; an NFS client retransmits a call after 60 s (``timeo=600``)."""
    claim_wait_s: float = 5.0
    """Longest a group fetch waits for another worker's fetch of the same group (an 8 MiB
    range takes well under a second); then it fetches the group itself."""


@dataclass(slots=True)
class PackStats:
    # Counters.
    members: int = 0
    """GETs answered from a shard."""
    ranges: int = 0
    """Shard range GETs (a member with its neighbours, or a member alone)."""
    range_bytes: int = 0
    deposited: int = 0
    """Neighbours handed to the data cache with a range."""
    recent_hits: int = 0
    """Members answered from a group fetched a moment before (no GET)."""
    fallbacks: int = 0
    """GETs of packed keys answered by the bucket: replaced, partial, large or damaged."""
    corrupt: int = 0
    """Members whose bytes failed their CRC-32 (served from their own object)."""
    load_errors: int = 0
    # Gauges.
    loaded: int = 0
    """1 while an index is in use."""
    entries: int = 0
    index_bytes: int = 0


class _Group:
    """One shard range being fetched: ``[lo, hi)`` of its shard; the future's result is the
    range's bytes, or None when the group is on the shared tier (another worker fetched
    it); ``stripes``: the lock stripes of the members this process is fetching it for."""

    __slots__ = ("future", "lo", "hi", "stripes")

    def __init__(self, lo: int, hi: int) -> None:
        self.future: asyncio.Future[bytes | None] = asyncio.get_running_loop().create_future()
        self.lo = lo
        self.hi = hi
        self.stripes: set[str] = set()


class PackedStore(StoreWrapper):
    """An ``ObjectStore`` over ``inner`` (the export's bucket) that answers packed objects'
    GETs from ``packs`` (the pack's bucket) under ``pack_prefix``."""

    def __init__(
        self,
        inner: ObjectStore,
        packs: ObjectStore,
        pack_prefix: str,
        source_prefix: str,
        url: str,
        source_url: str,
        *,
        small_file_max: int,
        list_from_index: bool = False,
        config: PackConfig | None = None,
        stats: PackStats | None = None,
        tiers: NeighbourTiers = NO_TIERS,
        fleet: Tier | None = None,
    ) -> None:
        super().__init__(inner)
        self._tiers = tiers
        # The fleet's shared tier (``gateway.data.shared``): a group's range is looked for
        # there before the shard is asked, and put there after.
        self._fleet = fleet
        self._packs = packs
        self._pack_prefix = pack_prefix
        self._source_prefix = source_prefix
        self.url = url
        self._source_url = source_url  # the export's backend: what the pack must be made of
        self._small = small_file_max
        self._list_from_index = list_from_index
        self._cfg = config if config is not None else PackConfig()
        self.stats = stats if stats is not None else PackStats()
        self.index: PackIndex | None = None
        self.status = "loading"
        """"loading", "ok" or why the pack is not used (``/readyz``)."""
        self._ranges: dict[tuple[int, int], _Group] = {}  # (shard, window) or (shard, -1 - row)
        # Groups fetched to the disk tier only (no room in memory), most recent last: a later
        # miss of one of their members (one the tier refused or evicted) fetches that member
        # alone, not the whole group again (which multiplied the bytes read: a dataset twice
        # the memory tier re-read half of itself per epoch).
        self._on_tier: OrderedDict[tuple[int, int], None] = OrderedDict()
        # The last groups fetched, (start, bytes) by (shard, window): RECENT_GROUPS x
        # range_bytes at most, held besides what the data cache holds of them.
        self._recent: OrderedDict[tuple[int, int], tuple[int, bytes]] = OrderedDict()
        self._releasing: set[asyncio.Task[None]] = set()
        self._rows: dict[str, int] = {}  # key -> row, the last ROWS_MEMO keys looked up
        self._groups: dict[tuple[int, int], tuple[int, int]] = {}  # window -> its group's rows
        self.tier_hits = 0
        """Members read from the shared tier after another worker fetched their group."""
        self.claim_waits = 0
        """Group fetches that waited for another worker's fetch of the group."""
        self.claim_timeouts = 0
        self._unpacked: UnpackedKeys | None = None
        self._range_slots = asyncio.Semaphore(self._cfg.max_ranges)
        self._loading = False
        self._settled = asyncio.Event()  # the index is in, failed, or was waited for long enough
        self.listings_waited = 0
        """Listings that waited for the index."""

    # -- the index ------------------------------------------------------------------------

    @property
    def pending(self) -> bool:
        """Whether the index is still awaited (``load`` running, within ``index_wait_s``)."""
        return self._loading and not self._settled.is_set()

    async def settled(self) -> None:
        """Until the index is in, has failed, or was waited for ``index_wait_s``."""
        if self._loading:
            await self._settled.wait()

    async def load(self) -> None:
        """Load and check the index; on any problem the export keeps serving the bucket."""
        t0 = time.perf_counter()
        self._loading = True
        wait_s = self._cfg.index_wait_s
        timer = asyncio.get_running_loop().call_later(wait_s, self._give_up, wait_s)
        try:
            try:
                index, self._unpacked = await load_pack(
                    self._packs,
                    self._pack_prefix,
                    self._source_url,
                    max_bytes=self._cfg.max_index_bytes,
                    listings=self._list_from_index,
                    url=self.url,
                )
            except (PackError, BackendError, OSError, EOFError, UnicodeDecodeError) as e:
                self.status = f"pack not used: {e}"
                self.stats.load_errors += 1
                log.error("pack_not_used", pack=self.url, error=str(e))
                return
            self._rows.clear()
            self._groups.clear()
            self.index = index
            self.status = "ok"
            self.stats.loaded = 1
            self.stats.entries = len(index)
            self.stats.index_bytes = index.nbytes()
        finally:  # waiters see the index (or its absence) when they wake
            timer.cancel()
            self._settled.set()
        log.info(
            "pack_loaded",
            pack=self.url,
            entries=len(index),
            shards=len(index.shards),
            index_bytes=index.nbytes(),
            seconds=round(time.perf_counter() - t0, 3),
        )

    def _give_up(self, wait_s: float) -> None:
        if self._settled.is_set():
            return
        self.status = f"loading; not waited for after {wait_s:g} s: served from the bucket"
        log.error(
            "pack_index_wait_gave_up",
            pack=self.url,
            waited_s=wait_s,
            consequence="listings and reads come from the bucket until the index is loaded",
        )
        self._settled.set()

    # -- reads ----------------------------------------------------------------------------

    async def _get(self, key: str, start: int, end: int | None, if_match: str | None) -> GetResult:
        index = self.index
        if index is not None and start == 0 and key.startswith(self._source_prefix):
            i = self._row(index, key)
            if i >= 0:
                size = index.sizes[i]
                etag = index.etag(i)
                if (
                    (end is None or end == size)
                    and size <= self._small
                    and (if_match is None or _same(if_match, etag))
                ):
                    try:
                        data = await self._member(index, i)
                    except BackendError as e:  # the shard's store failed: the object may not
                        log.warning("pack_range_failed", pack=self.url, error=str(e))
                        data = None
                    if data is not None:
                        self.stats.members += 1
                        # A read-only view of the group's bytes (or the tier's mapping), not
                        # a copy: the data layer keeps views of immutable bytes as they are.
                        return GetResult(cast(bytes, data), etag, size, index.mtimes[i])
                self.stats.fallbacks += 1
        return await super()._get(key, start, end, if_match)

    def _group(self, index: PackIndex, i: int) -> tuple[int, int]:
        """The rows [a, b] fetched with member ``i``: the members of its shard whose data
        starts in the same ``range_bytes`` window as its own (consecutive rows: members are
        in key order), large ones (read from their objects) left out."""
        r, small, n = self._cfg.range_bytes, self._small, index.n
        shard_of, data_at, sizes = index.shard_of, index.data_at, index.sizes
        shard, k = shard_of[i], data_at[i] // r
        a = i
        while a > 0 and shard_of[a - 1] == shard and data_at[a - 1] // r == k:
            if sizes[a - 1] > small:
                break
            a -= 1
        b = i
        while b + 1 < n and shard_of[b + 1] == shard and data_at[b + 1] // r == k:
            if sizes[b + 1] > small:
                break
            b += 1
        return a, b

    def _window(self, key: str) -> tuple[int, int, int] | None:
        """(row, shard, window) of packed member ``key``; None when it is not one."""
        index = self.index
        if index is None or not key.startswith(self._source_prefix):
            return None
        i = self._row(index, key)
        if i < 0:
            return None
        return i, index.shard_of[i], index.data_at[i] // self._cfg.range_bytes

    def _row(self, index: PackIndex, key: str) -> int:
        """``index.find`` of ``key`` (under the source prefix), remembered for the last keys
        asked: a prefetched member is asked for 3-4 times in a row (the prefetcher's
        ``covered``, the reader's ``covered`` and ``fetch_group``, the GET)."""
        row = self._rows.get(key)
        if row is None:
            row = index.find(key[len(self._source_prefix) :])
            if len(self._rows) >= ROWS_MEMO:
                self._rows.clear()
            self._rows[key] = row
        return row

    def _bounds(self, index: PackIndex, i: int, window: tuple[int, int]) -> tuple[int, int]:
        """``_group(index, i)``, remembered per window: any row of a group gives that group."""
        ab = self._groups.get(window)
        if ab is None or not ab[0] <= i <= ab[1]:
            ab = self._group(index, i)
            if len(self._groups) >= GROUPS_MEMO:
                self._groups.clear()
            self._groups[window] = ab
        return ab

    def fetch_group(self, key: str) -> tuple[int, int] | None:
        """The group packed member ``key`` comes with when fetched now ((shard, window), shared
        by the members of one group): its group is on its way, or would be fetched whole with
        the neighbours kept in memory (``tiers.memory_room``). None when it is not a member or
        would be fetched alone or for the disk tier only: then each member is fetched (or
        looked for in the disk tier) for itself. The data layer looks for one member of a
        group in its disk tier at a time; the others join the group's fetch."""
        w = self._window(key)
        index = self.index
        if w is None or index is None:
            return None
        i, shard, window = w
        if (shard, window) in self._ranges:
            return shard, window
        a, b = self._bounds(index, i, (shard, window))
        if a == b or not self._tiers.memory_room(
            index.data_at[b] + index.sizes[b] - index.data_at[a]
        ):
            return None
        return shard, window

    def covered(self, key: str) -> bool:
        """Whether ``key`` is being fetched with another member's group (the data prefetcher
        then moves on to another group)."""
        w = self._window(key)
        return w is not None and (w[1], w[2]) in self._ranges

    async def _member(self, index: PackIndex, i: int) -> bytes | memoryview | None:
        """Member ``i``'s verified bytes, a slice of its group's buffer (fetched with its
        group, or alone), or the shared tier's entry; None when they fail their CRC."""
        off, size = index.data_at[i], index.sizes[i]
        if size == 0:
            return b""
        shard_no = index.shard_of[i]
        rkey = (shard_no, off // self._cfg.range_bytes)
        a, b = self._bounds(index, i, rkey)
        lo, hi = index.data_at[a], index.data_at[b] + index.sizes[b]
        recent = self._recent.get(rkey)
        if recent is not None and recent[0] <= off and off + size <= recent[0] + len(recent[1]):
            # Its group arrived a moment ago: a prefetch or READ of this member that began
            # before the group's fetch ended (or before its neighbours were cached) takes its
            # slice of that buffer instead of fetching the group again.
            self._recent.move_to_end(rkey)
            self.stats.recent_hits += 1
            return self._verified(index, i, recent[1], recent[0])
        g = self._ranges.get(rkey)
        tiers = self._tiers
        memory = g is not None or a == b or tiers.memory_room(hi - lo)
        if (
            a == b
            or (not memory and (rkey in self._on_tier or not tiers.disk_room(hi - lo)))
            or (g is not None and not g.lo <= off < off + size <= g.hi)  # split by a large one
        ):  # alone
            a = b = i
            lo, hi, rkey = off, off + size, (shard_no, -1 - i)
            g = self._ranges.get(rkey)
        tier = tiers.shared
        if g is None:
            g = _Group(lo, hi)
            if tier is not None and a != b:
                g.stripes.add(self._stripe(tier, index, i))
            self._ranges[rkey] = g
            try:
                data = await self._fetch(index, g, a, b, i, memory)
            except asyncio.CancelledError:
                g.future.cancel()
                raise
            except Exception as e:
                g.future.set_exception(e)
                g.future.exception()  # retrieved: the waiters re-raise it
                raise
            else:
                g.future.set_result(data)
                if data is not None and a != b:
                    self._recent[rkey] = (g.lo, data)
                    if len(self._recent) > RECENT_GROUPS:
                        self._recent.popitem(last=False)
                if not memory and a != b:
                    self._on_tier[rkey] = None
                    if len(self._on_tier) > ON_TIER_GROUPS:
                        self._on_tier.popitem(last=False)
            finally:
                del self._ranges[rkey]
        else:
            if tier is not None and g.hi - g.lo > size:
                g.stripes.add(self._stripe(tier, index, i))
            data = await asyncio.shield(g.future)
        if data is None:  # another worker fetched the group: the members are on the tier
            return await self._from_tier(index, i)
        return self._verified(index, i, data, g.lo)

    def _verified(self, index: PackIndex, i: int, data: bytes, lo: int) -> memoryview | None:
        """Member ``i``'s slice of ``data`` (its shard's bytes from ``lo``) if its CRC holds."""
        off = index.data_at[i]
        body = memoryview(data)[off - lo : off - lo + index.sizes[i]]
        if crc32(body) != index.crcs[i]:
            self.stats.corrupt += 1
            log.warning("pack_member_corrupt", pack=self.url, path=index.path(i))
            return None
        return body

    async def _fetch(
        self, index: PackIndex, g: _Group, a: int, b: int, i: int, memory: bool = True
    ) -> bytes | None:
        """Rows [a, b]'s range ``[g.lo, g.hi)`` of their shard, in one buffer, the
        neighbours deposited (to the disk tier only unless ``memory``); None when another
        worker fetched it meanwhile and member ``i`` is on the shared tier."""
        shard = index.shards[index.shard_of[i]]
        tier = self._tiers.shared if a != b else None
        fd, look = (-1, False) if tier is None else await self._claim(tier, shard.name, g)
        writes: list[Awaitable[bool]] = []
        try:
            if look and tier is not None:
                path = self._source_prefix + index.path(i)
                if await tier.has(path, index.etag(i), index.sizes[i]):
                    return None
            piece = self._fleet_piece(index, shard.name, g, a, b)
            data = await self._from_fleet(piece)
            if data is None:
                async with self._range_slots:
                    res = await self._packs.get(self._pack_prefix + shard.name, g.lo, g.hi)
                data = res.data if type(res.data) is bytes else bytes(res.data)
                if len(data) != g.hi - g.lo:
                    raise BackendError(f"{shard.name}: got {len(data)} B for {g.hi - g.lo} B")
                self.stats.ranges += 1
                self.stats.range_bytes += len(data)
                if piece is not None and self._fleet is not None and self._fleet.admit(piece):
                    self._fleet.put(piece, data)
            if a != b:
                writes = self._deposit(index, a, b, g.lo, data, i, memory)
            return data
        finally:
            if fd >= 0 and tier is not None:
                if writes:  # held until the neighbours' entries are in place
                    t = asyncio.get_running_loop().create_task(self._release(tier, fd, writes))
                    self._releasing.add(t)
                    t.add_done_callback(self._releasing.discard)
                else:
                    tier.release(fd)

    def _fleet_piece(self, index: PackIndex, shard: str, g: _Group, a: int, b: int) -> Piece | None:
        """A group's range as a piece of the fleet's shared tier. Its version is a digest of
        what the index says the range holds (members' offsets, sizes and CRCs): a shard
        rewritten by a new pack gets other pieces, and every member is checked against
        the index's CRC all the same (``_verified``)."""
        if self._fleet is None or a == b:
            return None
        h = hashlib.blake2b(digest_size=16)
        for col in (index.data_at, index.sizes, index.crcs):
            h.update(memoryview(col)[a : b + 1].tobytes())
        return Piece(self._packs.name, self._pack_prefix + shard, h.hexdigest(), g.lo, g.hi - g.lo)

    async def _from_fleet(self, piece: Piece | None) -> bytes | None:
        if piece is None or self._fleet is None:
            return None
        got = await self._fleet.lookup(piece, False)
        if got is None or len(got) != piece.length:
            return None
        return got if type(got) is bytes else bytes(got)

    @staticmethod
    async def _release(tier: SharedTier, fd: int, writes: list[Awaitable[bool]]) -> None:
        try:
            await asyncio.gather(*writes, return_exceptions=True)
        finally:
            tier.release(fd)

    def _stripe(self, tier: SharedTier, index: PackIndex, i: int) -> str:
        return tier.stripe(self._source_prefix + index.path(i), index.etag(i), index.sizes[i])

    async def _claim(self, tier: SharedTier, shard: str, g: _Group) -> tuple[int, bool]:
        """Claim the group's fetch among the workers: (fd held or -1, whether another worker
        had it: look on the tier first). The claim is an entry no one writes (the group's
        range), so it is never "present": a worker that waited then looks for its member."""
        path, size = f"{self.url}{shard}@{g.lo}", g.hi - g.lo
        stripe = tier.stripe(path, "", size)
        pause, longest = CLAIM_POLL_S
        deadline = 0.0
        while True:
            if stripe in g.stripes:
                # A caller in this process holds that stripe (its member's own claim): the
                # other workers wait on it already.
                return -1, bool(deadline)
            fd, present = await tier.claim(path, "", size)
            if fd >= 0 or present:
                return fd, present or bool(deadline)
            now = time.monotonic()
            if not deadline:
                deadline = now + self._cfg.claim_wait_s
                self.claim_waits += 1
            elif now >= deadline:
                self.claim_timeouts += 1
                return -1, True
            await asyncio.sleep(pause)
            pause = min(2 * pause, longest)

    async def _from_tier(self, index: PackIndex, i: int) -> bytes | memoryview | None:
        """Member ``i`` from the shared tier (another worker's group fetch published it),
        else fetched alone."""
        tier = self._tiers.shared
        if tier is not None:
            path = self._source_prefix + index.path(i)
            body = await tier.read(path, index.etag(i), index.sizes[i])
            if body is not None:
                self.tier_hits += 1
                return body
        off, size = index.data_at[i], index.sizes[i]
        g = _Group(off, off + size)
        rkey = (index.shard_of[i], -1 - i)
        if rkey in self._ranges:
            data = await asyncio.shield(self._ranges[rkey].future)
        else:
            self._ranges[rkey] = g
            try:
                data = await self._fetch(index, g, i, i, i)
            finally:
                del self._ranges[rkey]
        if data is None:  # pragma: no cover - a member alone is never claimed
            return None
        body = memoryview(data)[:size]
        if crc32(body) != index.crcs[i]:
            self.stats.corrupt += 1
            log.warning("pack_member_corrupt", pack=self.url, path=index.path(i))
            return None
        return body

    def _deposit(
        self, index: PackIndex, a: int, b: int, lo: int, data: bytes, skip: int, memory: bool
    ) -> list[Awaitable[bool]]:
        """Rows [a, b] but ``skip``, verified, to the data layer (``tiers.deposit``), each a slice
        of ``data``; the publishing of those the disk tier takes."""
        if not self._tiers.keeps_neighbours:
            return []
        deposit = self._tiers.deposit
        view = memoryview(data)
        writes: list[Awaitable[bool]] = []
        prefix, crcs, data_at, sizes = self._source_prefix, index.crcs, index.data_at, index.sizes
        for j in range(a, b + 1):
            off, size = data_at[j], sizes[j]
            if j == skip or size == 0:
                continue
            body = view[off - lo : off - lo + size]
            if crc32(body) == crcs[j]:
                w = deposit(prefix + index.path(j), index.etag(j), body, memory)
                if w is not None:
                    writes.append(w)
                self.stats.deposited += 1
            else:
                self.stats.corrupt += 1
        return writes

    # -- listings -------------------------------------------------------------------------

    async def _list_page(
        self, prefix: str, delimiter: str | None, token: str | None, after: str | None, limit: int
    ) -> ListPage:
        index = self.index
        if (
            index is None
            and self._list_from_index
            and self.pending
            and delimiter == "/"
            and prefix.startswith(self._source_prefix)
        ):
            self.listings_waited += 1
            await self._settled.wait()
            index = self.index
        if (
            index is None
            or self._unpacked is None
            or not self._list_from_index
            or delimiter != "/"
            or not prefix.startswith(self._source_prefix)
        ):
            return await super()._list_page(prefix, delimiter, token, after, limit)
        return list_from_index(
            index, self._unpacked, self._source_prefix, prefix, token or after, limit
        )

    async def close(self) -> None:
        for t in self._releasing:  # group claims still held for their writes: dropped
            t.cancel()
        if self._releasing:
            await asyncio.gather(*self._releasing, return_exceptions=True)
        try:
            await self.inner.close()
        finally:
            if self._packs is not self.inner:
                await self._packs.close()


def _same(a: str, b: str) -> bool:
    return a == b or a.strip('"') == b.strip('"')
