"""Byte-budgeted in-memory cache of object bodies and blocks, with a scan- and
shuffle-resistant eviction policy.

Owns: the bytes, their accounting against ``budget_bytes``, and the decision of what to keep.
Must not: talk to the backend, await anything, or know about NFS. ``ObjectReader``
(``reader.py``) decides what to fetch; this module only stores and evicts.

Keys are ``(store name, object key, etag, block index)``: a new version of an object has a
new etag, so it can never be served old bytes. A small object is one entry (block 0).

Policy: window + admission-filtered main (W-TinyLFU, simplified)
-----------------------------------------------------------------
::

    READ miss ──fetch──► WINDOW (LRU, ~1 % of budget) ──LRU end──► admission duel ──► MAIN (LRU)
    read-ahead ────────► PREFETCH (FIFO, unread blocks, <= 25 %) ─read─► WINDOW       │
                              └─overflow: oldest demoted to WINDOW                 evict LRU

* Every new entry enters the **window** unconditionally, so an object stays in memory for the
  burst of READs that follows its fetch (cv2.imread's 11 small READs), even when main is full.
* An entry leaving the window goes to **main** if there is room; otherwise it must win a
  *duel* against main's LRU victim(s): admitted only if it was visited strictly more often
  **before** the visit that brought it in than the victim was (``est(cand) - 1 > est(victim)``).
  Ties go to the incumbent. The visit counts come from a 4-row count-min sketch with aging
  (``sketch.py``).
* A *visit* is a miss, the first READ of a read-ahead block, or a main hit when the entry would
  have aged out of the window since its last counted visit (more visits to other keys than the
  window holds entries); the other hits of a burst are not counted, so an object read in 11
  small READs does not out-rank one read in a single READ.

Why this beats LRU under shuffled epochs: every object is visited once per epoch, so the
candidate (visited this epoch, nothing before that counts yet) and main's LRU victim (not yet
visited this epoch — had it been, it would have moved to the MRU end) have the same history:
the tie keeps the victim, main freezes on one fixed subset, and the hit ratio tends to the
optimum for uniform access, (main size) / (dataset). Plain LRU instead evicts exactly the
objects the epoch has not reached yet (~15 % hits at N = 2C, measured below).

Adaptation: counts are halved every 10 x capacity visits. A new working set read repeatedly
gains a visit per pass while the old one only decays, so once its prior count exceeds the
residents' it wins its duels and takes over main.

Measured (tests/unit/gateway/test_datacache.py; deterministic, the sketch hashes with crc32):

* 2,000 equal objects, cache fits 1,000, 4 shuffled epochs through ``ObjectReader``: hit ratio
  0 / 0.492 / 0.492 / 0.493 (plain LRU on the same trace: 0 / 0.161 / 0.148 / 0.150). The
  optimum is C/N = 0.5; the window (here 16 entries, 1.6 %) is the difference.
* 6,000 objects of ImageNet-like sizes (lognormal, mean ~110 KB), byte budget half the
  dataset: 0 / 0.495 / 0.495 / 0.496.
* Working-set change: after 4 such epochs on dataset A, dataset B (800 objects, fits) read
  repeatedly gets 0 for five passes, 0.20 in the sixth, 1.0 from the seventh: B wins its duels
  once its prior count exceeds A's decayed one: within one to two aging periods (10 x
  cache entries visits each).
* Burst: 8 never-seen files read concurrently, 11 READs each, into a full cache: 8 GETs.

Window size: ``window_fraction`` (1 %) of the budget, but at least ``WINDOW_MIN_ENTRIES`` (16)
entries of the current mean size, capped at an eighth of the budget. A window smaller than the
objects entering it holds one entry most of the time; a large object arriving then has nothing
to push out of the window, so main loses its LRU entries without a duel, and main turns over
like an LRU. Measured (3,000 image-sized objects, shuffled epochs, benchmarks/disk_cache.py's
sizes): cache 10 % of the dataset, 1 % window: 0.015 (optimum 0.10); with the floor: 0.094;
at 5 %: 0.04 (optimum 0.05); at 50 %: 0.497 -> 0.498.

CPU per READ served from memory (CPython 3.11, this 2-core VM): 0.7 us for a small object
in the window (the burst after a fetch), 2.3 us for one in main (a counted visit: crc32 and
four sketch counters), 2.9 us for a 128 KiB READ of a large object (stream bookkeeping).

Two tiers: with a disk tier (``gateway.data.disk``) behind it, each entry knows whether the
disk holds it too (``on_disk``). A candidate the disk does not hold wins its duel against main
victims that are all on disk, whatever the counts: they stay one ``pread`` away, it would be
lost. In shuffled epochs over a dataset larger than both tiers, main thus drifts to blocks the
full disk tier refused, and the hit ratio approaches (memory + disk) / dataset instead of
max(memory, disk) / dataset (tests/unit/gateway/test_disk_cache.py, the two-tier simulation).
When everything is on disk (the dataset fits it) the ordinary duel decides, so a warm dataset
that fits in memory is still served from memory.

Data prefetch and epochs (``gateway.data.prefetch``)
----------------------------------------------------
Two more segments serve the data prefetcher. **Ahead** holds whole objects it fetched that no
READ has used yet (and, after a new pass starts, what was read in the last one): protected,
evicted only when nothing else is left (counted as ``ahead_wasted`` when never read). A READ
moves an ahead entry to the window like any new entry. **Spent** holds objects read in the
current pass (``epochs`` on: a whole object leaving the window goes there, not to the duel for
main): in an epoch a file that has been read will not be read again, so under pressure spent
entries go first, oldest first, and the prefetcher may evict them to make room
(``room_for``), but never anything else: ``room_for`` also keeps the window's share free for
demand READs. ``new_pass`` turns spent into ahead (O(entries), once per pass).

Accounting: each entry is charged ``len(data) + BLOCK_ENTRY_CHARGE_BYTES`` (dict slots, key
tuple, entry tuple); a mapping of a disk-tier entry its whole mapping in pages (header and page
rounding included: what it holds resident), divided by ``shared_by``. Entries are plain tuples of
untracked values and an object's blocks are indexed without a set per object, so a cache of
200,000 small files adds nothing to a full garbage collection
(it added ~0.2 s to each: a stall of every call at ImageNet scale).
**Slices of a shared buffer** (a pack's group: its members are cached as views of the one
buffer they arrived in) are charged their own length, but the buffer lives while any of them
does: an evicted member's bytes stay held by its surviving neighbours. Those bytes (the
*slack*) are counted per buffer; when they pass ``slack_bytes`` (an eighth of the budget, at
least ``MIN_SLACK``) the surviving slices of the buffers with the most are copied out (each
to its own ``bytes``: same charge) and the buffers let go, so evictions free what they
account for, give or take ``slack_bytes`` (``stats.slices_copied``). Not counted: the parts
of a group no slice ever covered (CRC failures, members the cache had no room for when the
group arrived): at most one group's ``range_bytes`` each time memory fills up mid-group.
``used_bytes <= budget_bytes`` holds after every call. An entry larger than the whole
budget is not cached (the READ that fetched it is still served). Bytes in flight are *not*
charged here: ``ObjectReader`` bounds them separately (fetch slots x max request size), and
bytes handed out as memoryviews live until the reply has been written (bounded by the
transport's in-flight cap).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Final

from gateway.data.mappings import is_mapping, mapped_size, mapping_limit, shared_buffer
from gateway.data.sketch import FrequencySketch, key_hash
from gateway.data.stats import DataStats

__all__ = ["BLOCK_ENTRY_CHARGE_BYTES", "BlockKey", "DataCache"]

BlockKey = tuple[str, str, str, int]
"""(store name, object key, etag, block index)."""

# Memory one entry costs besides its body, measured with tracemalloc on CPython 3.11 (20,000
# inserts: index dict slot, segment OrderedDict node, key tuple, entry, per-object index slot,
# sketch counters): ~575 B with an entry object and a set per object, ~307 B with the tuples
# used now; kept at 640 (room for the layout to grow back), plus the 33 B bytes header. Key
# strings are not counted.
BLOCK_ENTRY_CHARGE_BYTES: Final = 640

WINDOW_MIN_ENTRIES: Final = 16
BURST_ENTRIES: Final = 4
"""Whole objects read last that ``room_for`` leaves in the window (epochs)."""
_WINDOW: Final = 0
_MAIN: Final = 1
_PREFETCH: Final = 2
_AHEAD: Final = 3
_SPENT: Final = 4
_UNVISITED: Final = -1


MIN_SLACK: Final = 16 * 1024 * 1024
"""The least slack (bytes of shared buffers held only by other slices) ever allowed."""


class _Shared:
    """One buffer some cached entries are slices of: those entries' lengths, and the bytes of
    its slices that left while others stayed (held, not charged)."""

    __slots__ = ("live", "departed")

    def __init__(self) -> None:
        self.live: dict[BlockKey, int] = {}
        self.departed = 0


_Entry = tuple[bytes | memoryview, int, int, int, bool, bool]
"""An entry: a plain tuple of untracked values, so the garbage collector stops following it
after its first young collection (a class instance stays tracked: 200,000 cached files made
every full collection take ~0.2 s longer). Replaced whole when its segment or mark changes."""
_DATA: Final = 0
_CHARGE: Final = 1  # len(data) + BLOCK_ENTRY_CHARGE_BYTES
_SEG: Final = 2
_MARK: Final = 3
"""The cache's visit counter at the last counted visit (_UNVISITED: a read-ahead block or a
prefetched object no READ has used yet)."""
_ON_DISK: Final = 4  # also held by the disk tier (dropping it loses no bytes)
_WHOLE: Final = 5  # a whole small object (read once per epoch: may become spent)


class _Table(dict):  # type: ignore[type-arg]
    """A dict the garbage collector never untracks. CPython untracks a plain dict once all
    it holds is untracked (our tuples), and tracks it again, as a *new* object, when a fresh
    key is added: the cache's 200,000-entry index then sat in the youngest generation, and
    every young collection walked it (15-30 ms, several times a second). A subclass stays
    tracked, in the oldest generation, walked only by full collections."""

    __slots__ = ()


def _moved(e: _Entry, seg: int) -> _Entry:
    return (e[0], e[1], seg, e[3], e[4], e[5])


class DataCache:
    """Byte-budgeted block cache. Synchronous; called only from the event loop."""

    def __init__(
        self,
        budget_bytes: int,
        *,
        stats: DataStats | None = None,
        window_fraction: float = 0.01,
        prefetch_fraction: float = 0.25,
        expected_entry_bytes: int = 128 * 1024,
        shared_by: int = 1,
        max_mappings: int | None = None,
    ) -> None:
        if budget_bytes < 0 or shared_by < 1:
            raise ValueError("budget_bytes must be >= 0, shared_by >= 1")
        if not 0.0 < window_fraction < 1.0 or not 0.0 <= prefetch_fraction < 1.0:
            raise ValueError("window_fraction must be in (0, 1), prefetch_fraction in [0, 1)")
        self.stats = stats if stats is not None else DataStats()
        self.budget_bytes: Final = budget_bytes
        self._shared_by = shared_by
        self._mapped = 0  # body bytes of entries that are mappings
        self._mappings = 0  # entries that are mappings (each one a kernel VMA)
        self.max_mappings = max_mappings if max_mappings is not None else mapping_limit()
        """Mappings this cache may hold: a disk hit past it is read as a copy."""
        self._window_share = int(budget_bytes * window_fraction)
        self._window_target = self._window_share
        self.prefetch_cap_bytes: Final = int(budget_bytes * prefetch_fraction)
        self._entries: dict[BlockKey, _Entry] = _Table()
        # (store, key) -> its block, or a set of them when it has several (a large object):
        # no per-entry set for the garbage collector to follow.
        self._by_object: dict[tuple[str, str], BlockKey | set[BlockKey]] = _Table()
        self._window: OrderedDict[BlockKey, _Entry] = OrderedDict()
        self._main: OrderedDict[BlockKey, _Entry] = OrderedDict()
        self._prefetch: OrderedDict[BlockKey, _Entry] = OrderedDict()
        self._ahead: OrderedDict[BlockKey, _Entry] = OrderedDict()
        self._spent: OrderedDict[BlockKey, _Entry] = OrderedDict()
        self._window_bytes = 0
        self._main_bytes = 0
        self._prefetch_bytes = 0
        self._ahead_bytes = 0
        self._spent_bytes = 0
        self.epochs = False
        """Whole objects leaving the window become spent (set by the data prefetcher)."""
        self._visits = 0
        self._sketch = FrequencySketch(max(1024, budget_bytes // max(1, expected_entry_bytes)))
        # id(buffer) -> the cached slices of it ("Slices of a shared buffer"); their slack.
        self._shared: dict[int, _Shared] = {}
        self._slack = 0
        self.slack_bytes = max(MIN_SLACK, budget_bytes // 8)

    # -- introspection -------------------------------------------------------------------

    @property
    def used_bytes(self) -> int:
        return (
            self._window_bytes
            + self._main_bytes
            + self._prefetch_bytes
            + self._ahead_bytes
            + self._spent_bytes
        )

    @property
    def mappings(self) -> int:
        """Entries that are mappings of disk-tier files."""
        return self._mappings

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, bkey: object) -> bool:
        """Membership without touching recency or frequency."""
        return bkey in self._entries

    # -- the hot path --------------------------------------------------------------------

    def lookup(self, bkey: BlockKey) -> bytes | memoryview | None:
        """The cached bytes of ``bkey`` as one READ uses them (updates recency and visits)."""
        e = self._entries.get(bkey)
        if e is None:
            return None
        seg = e[_SEG]
        if seg == _WINDOW:
            self._window.move_to_end(bkey)
        elif seg == _MAIN:
            self._main.move_to_end(bkey)
            if self._visits - e[_MARK] > len(self._window):
                self._main[bkey] = self._visit(bkey, e)
        else:  # read-ahead, prefetched or spent: it becomes an ordinary new entry
            charge = e[_CHARGE]
            if seg == _PREFETCH:
                del self._prefetch[bkey]
                self._prefetch_bytes -= charge
            elif seg == _AHEAD:
                del self._ahead[bkey]
                self._ahead_bytes -= charge
                if e[_MARK] == _UNVISITED:
                    self.stats.ahead_used += 1
            else:
                del self._spent[bkey]
                self._spent_bytes -= charge
            self._window[bkey] = self._visit(bkey, _moved(e, _WINDOW))
            self._window_bytes += charge
            self._rebalance()
            self._update_gauges()
        return e[_DATA]

    def note_miss(self, bkey: BlockKey) -> None:
        """Count a visit of a block that is not cached (a READ is about to fetch it)."""
        self._visits += 1
        self._sketch.increment(key_hash(*bkey))

    def _visit(self, bkey: BlockKey, e: _Entry) -> _Entry:
        """A counted visit of ``e``: the entry with its new mark (indexed; the caller puts
        it in its segment)."""
        self._visits += 1
        self._sketch.increment(key_hash(*bkey))
        e = (e[0], e[1], e[2], self._visits, e[4], e[5])
        self._entries[bkey] = e
        return e

    def insert(
        self,
        bkey: BlockKey,
        data: bytes | memoryview,
        *,
        prefetched: bool = False,
        on_disk: bool = False,
        whole: bool = False,
        ahead: bool = False,
    ) -> bool:
        """Cache ``data`` for ``bkey``; False when it was not kept (larger than the budget, or
        already present). ``prefetched``: read-ahead no READ has asked for yet; ``on_disk``:
        the disk tier holds it too (see "Two tiers" in the module docstring); ``whole``: a
        whole small object; ``ahead``: fetched by the data prefetcher, kept only if
        ``room_for`` finds room (nothing but spent entries is evicted for it)."""
        if bkey in self._entries:
            return False
        charge = self.charge_of(data)
        if charge > self.budget_bytes or (prefetched and charge > self.prefetch_cap_bytes):
            self.stats.uncacheable += 1
            return False
        if ahead:
            if not self.room_for(charge):
                return False
            e = (data, charge, _AHEAD, _UNVISITED, on_disk, whole)
            self._ahead[bkey] = e
            self._ahead_bytes += charge
        elif prefetched:
            e = (data, charge, _PREFETCH, _UNVISITED, on_disk, whole)
            self._prefetch[bkey] = e
            self._prefetch_bytes += charge
        else:
            e = (data, charge, _WINDOW, self._visits, on_disk, whole)
            self._window[bkey] = e
            self._window_bytes += charge
        self._entries[bkey] = e
        if is_mapping(data):
            self._mapped += len(data)
            self._mappings += 1
        elif (buf := shared_buffer(data)) is not None:
            self._hold_slice(bkey, buf, len(data))
        obj = (bkey[0], bkey[1])
        keys = self._by_object.get(obj)
        if keys is None:
            self._by_object[obj] = bkey
        elif isinstance(keys, set):
            keys.add(bkey)
        else:
            self._by_object[obj] = {keys, bkey}
        self._sketch.ensure_capacity(len(self._entries))
        if prefetched:
            while self._prefetch_bytes > self.prefetch_cap_bytes:
                self._demote_oldest_prefetch()
        self._rebalance()
        self._update_gauges()
        return True

    def charge_of(self, data: bytes | memoryview) -> int:
        """What ``data`` costs the budget: its length plus ``BLOCK_ENTRY_CHARGE_BYTES``; a mapping
        of a shared disk-tier entry (``is_mapping``) its share of the pages, ``len / shared_by``:
        the worker processes that may map it hold one copy between them (module docstring,
        "Several workers")."""
        if is_mapping(data):
            return mapped_size(data) // self._shared_by + BLOCK_ENTRY_CHARGE_BYTES
        return len(data) + BLOCK_ENTRY_CHARGE_BYTES

    def swap(self, bkey: BlockKey, old: bytes | memoryview, new: memoryview) -> bool:
        """Replace the body of ``bkey`` by ``new``, the same bytes as a mapping of the shared
        disk tier's entry, if ``bkey`` still holds ``old`` (not evicted or replaced since):
        the private copy is freed, and the entry keeps its place, visits and segment."""
        e = self._entries.get(bkey)
        if e is None or e[_DATA] is not old or len(new) != len(old):
            return False
        if not is_mapping(old) and self._mappings >= self.max_mappings:
            return False
        self._let_go(bkey, old)
        charge = self.charge_of(new)
        self._replace(bkey, (new, charge, e[_SEG], e[_MARK], True, e[_WHOLE]), charge - e[_CHARGE])
        if not is_mapping(old):
            self._mapped += len(new)
            self._mappings += 1
        self._update_gauges()
        return True

    def _replace(self, bkey: BlockKey, ne: _Entry, d: int) -> None:
        """``ne`` takes the place of ``bkey``'s entry in its segment; ``d``: the change of
        charge."""
        seg = ne[_SEG]
        self._entries[bkey] = ne
        if seg == _WINDOW:
            self._window[bkey] = ne
            self._window_bytes += d
        elif seg == _MAIN:
            self._main[bkey] = ne
            self._main_bytes += d
        elif seg == _PREFETCH:
            self._prefetch[bkey] = ne
            self._prefetch_bytes += d
        elif seg == _AHEAD:
            self._ahead[bkey] = ne
            self._ahead_bytes += d
        else:
            self._spent[bkey] = ne
            self._spent_bytes += d

    # -- slices of shared buffers ("Slices of a shared buffer") ---------------------------

    def _hold_slice(self, bkey: BlockKey, buf: bytes, n: int) -> None:
        sh = self._shared.get(id(buf))
        if sh is None:
            sh = self._shared[id(buf)] = _Shared()
        sh.live[bkey] = n

    def _let_go(self, bkey: BlockKey, data: bytes | memoryview) -> None:
        """``bkey``'s entry, ``data``, leaves the cache (or is replaced)."""
        buf = shared_buffer(data)
        if buf is None:
            return
        sh = self._shared.get(id(buf))
        if sh is None or sh.live.pop(bkey, None) is None:
            return
        if sh.live:  # its bytes stay held by the others
            sh.departed += len(data)
            self._slack += len(data)
        else:  # the last one: nothing of the buffer is held any more
            del self._shared[id(buf)]
            self._slack -= sh.departed

    def _copy_out(self) -> None:
        """Copy the surviving slices of the buffers with the most slack to bytes of their
        own until the slack is back under half its bound (so this runs rarely)."""
        ranked = sorted(self._shared.items(), key=lambda kv: kv[1].departed)
        while self._slack > self.slack_bytes // 2 and ranked:
            bid, sh = ranked.pop()
            del self._shared[bid]
            self._slack -= sh.departed
            for bkey in sh.live:
                e = self._entries[bkey]
                self._replace(bkey, (bytes(e[_DATA]), e[1], e[2], e[3], e[4], e[5]), 0)
                self.stats.slices_copied += 1

    def room_for(self, nbytes: int) -> bool:
        """Whether ``nbytes`` more fit while the window's share stays free, after evicting
        spent entries (oldest first) if needed; nothing else is evicted."""
        limit = self.budget_bytes - self._window_share
        while self.used_bytes + nbytes > limit and self._spent:
            k, e = self._spent.popitem(last=False)
            self._spent_bytes -= e[_CHARGE]
            self._forget(k, e)
        # Then whole objects read this pass from the window, bar the last few (a burst of
        # READs of one file comes within milliseconds of its first).
        window = self._window
        while self.used_bytes + nbytes > limit and self.epochs and len(window) > BURST_ENTRIES:
            k, e = next(iter(window.items()))
            if not e[_WHOLE]:
                break
            del window[k]
            self._window_bytes -= e[_CHARGE]
            self._forget(k, e)
        self._update_gauges()
        return self.used_bytes + nbytes <= limit

    def new_pass(self) -> int:
        """A new pass (epoch) began: what was read in the last one is unread in this one
        (spent becomes ahead). Returns the entries moved."""
        n = len(self._spent)
        entries = self._entries
        for k, e in self._spent.items():
            self._ahead[k] = entries[k] = _moved(e, _AHEAD)
        self._ahead_bytes += self._spent_bytes
        self._spent.clear()
        self._spent_bytes = 0
        return n

    # -- policy --------------------------------------------------------------------------

    def _demote_oldest_prefetch(self) -> None:
        k, e = self._prefetch.popitem(last=False)
        self._prefetch_bytes -= e[_CHARGE]
        self._window[k] = self._entries[k] = _moved(e, _WINDOW)
        self._window_bytes += e[_CHARGE]

    def _rebalance(self) -> None:
        window = self._window
        n = len(self._entries)
        if n:  # at least WINDOW_MIN_ENTRIES entries of the mean size: see "Window size"
            mean = self.used_bytes // n
            self._window_target = max(
                self._window_share, min(self.budget_bytes // 8, WINDOW_MIN_ENTRIES * mean)
            )
        while self._window_bytes > self._window_target and len(window) > 1:
            k, e = window.popitem(last=False)
            self._window_bytes -= e[_CHARGE]
            self._admit(k, e)
        # The window may still push the total over budget (it grew while main was full):
        # keep shrinking it through the same duel, so main never loses an entry for free.
        # Spent entries go first: this pass will not read them again.
        while self.used_bytes > self.budget_bytes:
            if self._spent:
                k, e = self._spent.popitem(last=False)
                self._spent_bytes -= e[_CHARGE]
                self._forget(k, e)
                continue
            if len(window) > 1:
                k, e = window.popitem(last=False)
                self._window_bytes -= e[_CHARGE]
                self._admit(k, e)
                continue
            if self._prefetch:
                k, e = self._prefetch.popitem(last=False)
                self._prefetch_bytes -= e[_CHARGE]
            elif self._main:
                k, e = self._main.popitem(last=False)
                self._main_bytes -= e[_CHARGE]
            elif self._ahead:  # last: what this pass is still going to read
                k, e = self._ahead.popitem(last=False)
                self._ahead_bytes -= e[_CHARGE]
            else:  # pragma: no cover - a single entry never exceeds the budget (insert checks)
                break
            self._forget(k, e)

    def _admit(self, k: BlockKey, e: _Entry) -> None:
        """Move a window evictee into main, or drop it if it loses the frequency duel; in
        epochs, a whole object read in this pass becomes spent instead."""
        charge = e[_CHARGE]
        if self.epochs and e[_WHOLE]:
            self._spent[k] = self._entries[k] = _moved(e, _SPENT)
            self._spent_bytes += charge
            return
        main = self._main
        need = self.used_bytes + charge - self.budget_bytes
        if need > 0:
            freed = 0
            victims: list[BlockKey] = []
            for vk, ve in main.items():  # least recently used first
                victims.append(vk)
                freed += ve[_CHARGE]
                if freed >= need:
                    break
            sketch = self._sketch
            if (
                freed < need
                or e[_MARK] == _UNVISITED
                or (
                    # Two tiers: victims the disk tier also holds lose nothing by leaving,
                    # so a block the disk lacks takes their place (the tiers add up).
                    (e[_ON_DISK] or not all(main[v][_ON_DISK] for v in victims))
                    and sketch.estimate(key_hash(*k)) - 1
                    <= max(sketch.estimate(key_hash(*v)) for v in victims)
                )
            ):
                self.stats.rejected += 1
                self._forget(k, e)
                return
            for vk in victims:
                ve = main.pop(vk)
                self._main_bytes -= ve[_CHARGE]
                self._forget(vk, ve)
        main[k] = self._entries[k] = _moved(e, _MAIN)
        self._main_bytes += charge

    def _forget(self, k: BlockKey, e: _Entry) -> None:
        """``e`` has already left its segment: drop it from the indexes (an eviction)."""
        del self._entries[k]
        self._unindex(k)
        if is_mapping(e[_DATA]):
            self._mapped -= len(e[_DATA])
            self._mappings -= 1
        else:
            self._let_go(k, e[_DATA])
        self.stats.evictions += 1
        if e[_MARK] == _UNVISITED:
            if e[_SEG] == _AHEAD:
                self.stats.ahead_wasted += 1
            else:
                self.stats.readahead_unused += 1

    def _unindex(self, k: BlockKey) -> None:
        obj = (k[0], k[1])
        keys = self._by_object.get(obj)
        if keys is None:
            return
        if not isinstance(keys, set):
            if keys == k:
                del self._by_object[obj]
            return
        keys.discard(k)
        if len(keys) == 1:
            self._by_object[obj] = next(iter(keys))
        elif not keys:
            del self._by_object[obj]

    def _update_gauges(self) -> None:
        """The end of every call that adds or drops entries (none is being iterated here)."""
        if self._slack > self.slack_bytes:
            self._copy_out()
        self.stats.cache_bytes = self.used_bytes
        self.stats.entries = len(self._entries)
        self.stats.mapped_bytes = self._mapped

    # -- invalidation --------------------------------------------------------------------

    def _drop(self, k: BlockKey) -> None:
        e = self._entries.pop(k)
        if is_mapping(e[_DATA]):
            self._mapped -= len(e[_DATA])
            self._mappings -= 1
        else:
            self._let_go(k, e[_DATA])
        seg = e[_SEG]
        if seg == _WINDOW:
            del self._window[k]
            self._window_bytes -= e[_CHARGE]
        elif seg == _MAIN:
            del self._main[k]
            self._main_bytes -= e[_CHARGE]
        elif seg == _PREFETCH:
            del self._prefetch[k]
            self._prefetch_bytes -= e[_CHARGE]
        elif seg == _AHEAD:
            del self._ahead[k]
            self._ahead_bytes -= e[_CHARGE]
            if e[_MARK] == _UNVISITED:
                self.stats.ahead_wasted += 1
        else:
            del self._spent[k]
            self._spent_bytes -= e[_CHARGE]

    def invalidate(self, store_name: str, key: str, etag: str | None = None) -> int:
        """Drop the cached blocks of ``key`` (of one version when ``etag`` is given).
        Returns how many entries were dropped."""
        keys = self._by_object.get((store_name, key))
        if keys is None:
            return 0
        blocks = keys if isinstance(keys, set) else (keys,)
        doomed = [k for k in blocks if etag is None or k[2] == etag]
        for k in doomed:
            self._drop(k)
            self._unindex(k)
        self._update_gauges()
        return len(doomed)

    def clear(self) -> None:
        """Drop everything (frequency history included)."""
        self._entries.clear()
        self._by_object.clear()
        self._window.clear()
        self._main.clear()
        self._prefetch.clear()
        self._ahead.clear()
        self._spent.clear()
        self._window_bytes = self._main_bytes = self._prefetch_bytes = 0
        self._ahead_bytes = self._spent_bytes = 0
        self._mapped = self._mappings = 0
        self._shared.clear()
        self._slack = 0
        self._sketch = FrequencySketch(self._sketch.capacity)
        self._update_gauges()
