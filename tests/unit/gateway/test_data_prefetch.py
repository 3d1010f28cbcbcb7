"""Data prefetch in-process: the gateway over a ``MemoryStore`` (requests counted,
GETs slowed where a test needs a fetch in flight), called with whole RPC records. The
end-to-end versions (SeaweedFS, libnfs, a 503 storm through a fault proxy) are in
``tests/integration/test_data_prefetch.py``.

- A listed directory's small files are fetched once each, before any READ; the READs then
  cost no request; empty and large objects are left alone.
- A READ of an object being prefetched joins its GET (one GET for the key).
- With the cache full of unread prefetched data nothing more is fetched, nothing is evicted;
  reading makes room and the prefetcher resumes.
- Shuffled epochs over a dataset twice the cache: about one GET per file per epoch, no
  waste, and more READs served from memory than with data prefetch off.
- Failed prefetches back the prefetcher off and are retried; no READ fails for them.
- Off (globally or per export): no GET before a READ, exactly one per file read.
- Passes: one ends when most files were read, or when re-reads pile up (a hot set).
- A client listing directories (READDIR) goes first: nothing is fetched until it is over.
- READs served from memory pause it; a miss, or a second without READs, resumes it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from gateway.backend.base import BackendUnavailable, StoreTraits
from gateway.backend.memory import MemoryStore
from gateway.data.cache import DataCache
from gateway.data.events import FileOpened
from gateway.data.prefetch import DataPrefetcher
from gateway.data.reader import ObjectReader
from gateway.exports import ExportConfig
from gateway.namespace.columns import Columns
from nfsproto.nfs3 import Nfs3Proc, NfsStat3, StableHow, Write3Args
from tests.harness.memory import MemoryGateway

KiB = 1024
RO = dict(read_only=True, immutable=True)


def tree(classes: int, per_class: int, size: int = 2 * KiB, seed: int = 1) -> dict[str, bytes]:
    rng = random.Random(seed)
    return {
        f"ds/c{c}/img_{i:03d}.jpg": rng.randbytes(size + rng.randrange(256))
        for c in range(classes)
        for i in range(per_class)
    }


def gateway(
    tmp_path: Path,
    files: Mapping[str, bytes],
    *,
    store: MemoryStore | None = None,
    export: dict[str, Any] | None = None,
    **settings: Any,
) -> MemoryGateway:
    settings.setdefault("cache_data_prefetch", True)
    # The memory tier's prefetching (room, epochs, waste) is what these tests measure: no
    # disk tier behind it unless a test asks (test_disk_cache, test_shared_cache do).
    settings.setdefault("cache_disk", 0)
    ec = ExportConfig("/data", "s3://b/ds/", **(RO if export is None else export))
    return MemoryGateway.of(tmp_path, [ec], files=files, store=store, **settings)


def prefetcher(gw: MemoryGateway) -> DataPrefetcher:
    p = gw.server.prefetcher
    assert p is not None
    return p


async def until(cond: Callable[[], bool], timeout_s: float = 10.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not cond():  # noqa: ASYNC110 - polling the gateway's state
            await asyncio.sleep(0.01)


async def settle(gw: MemoryGateway, timeout_s: float = 10.0) -> None:
    """Until the prefetcher has nothing queued or in flight (or waits for room)."""
    await until(lambda: prefetcher(gw).idle, timeout_s)


async def scan(gw: MemoryGateway, classes: int) -> tuple[bytes, dict[str, bytes]]:
    """ImageFolder's scan: every class folder looked up (listed), no file read; the handles
    of every file by key."""
    root = await gw.mount(b"/data")
    handles: dict[str, bytes] = {}
    stored = gw.store.keys()
    for c in range(classes):
        d = await gw.walk(root, f"c{c}")
        for key in sorted(k for k in stored if k.startswith(f"ds/c{c}/")):
            res = await gw.lookup(d, key.rpartition("/")[2].encode())
            assert res.status == NfsStat3.NFS3_OK
            handles[key] = res.object
    return root, handles


async def read_all(
    gw: MemoryGateway,
    handles: Mapping[str, bytes],
    files: Mapping[str, bytes],
    order: list[str],
    workers: int = 4,
) -> None:
    queue = list(reversed(order))

    async def worker() -> None:
        while queue:
            key = queue.pop()
            res = await gw.read(handles[key])
            assert res.status == NfsStat3.NFS3_OK, key
            assert bytes(res.data) == files[key], key

    await asyncio.gather(*(worker() for _ in range(workers)))


def gets(store: MemoryStore) -> Counter[str]:
    return Counter(k for op, k in store.log if op == "get")


async def test_listed_small_files_are_fetched_once_before_any_read(tmp_path: Path) -> None:
    files = tree(3, 40)
    files["ds/c0/empty.jpg"] = b""
    files["ds/c1/large.bin"] = random.Random(2).randbytes(200 * KiB)
    async with gateway(tmp_path, files, cache_small_file_max=64 * KiB) as gw:
        _, handles = await scan(gw, 3)
        await settle(gw)
        small = [k for k, v in files.items() if 0 < len(v) <= 64 * KiB]
        assert gets(gw.store) == Counter(small)  # each once; empty and large left alone
        gw.reset_requests()
        order = sorted(handles)
        random.Random(3).shuffle(order)
        await read_all(gw, handles, files, order)
        assert gets(gw.store) == Counter(["ds/c1/large.bin"])  # only what was not small
        data = gw.gateway.reader.stats
        assert (data.ahead_used, data.ahead_wasted, data.ahead_dropped) == (len(small), 0, 0)
        snap = prefetcher(gw).snapshot()
        assert snap["objects"] == len(small) and snap["errors"] == 0


async def test_a_read_joins_the_prefetch_in_flight(tmp_path: Path) -> None:
    files = tree(1, 30)
    store = MemoryStore("mem", latency_s={"get": 0.3})
    async with gateway(tmp_path, files, store=store, cache_prefetch_concurrency=1) as gw:
        root = await gw.mount(b"/data")
        d = await gw.walk(root, "c0")
        await gw.lookup(d, b"img_029.jpg")  # c0 listed: the prefetcher starts on img_000
        await asyncio.sleep(0.05)
        assert prefetcher(gw).stats.inflight == 1
        first = "ds/c0/img_000.jpg"
        res = await gw.read((await gw.lookup(d, b"img_000.jpg")).object)
        assert bytes(res.data) == files[first]
        assert gets(store)[first] == 1
        assert gw.gateway.reader.stats.ahead_joined == 1


async def test_a_full_cache_stops_the_prefetcher_until_reads_make_room(tmp_path: Path) -> None:
    files = tree(4, 50, size=16 * KiB)  # ~3.3 MB
    async with gateway(tmp_path, files, cache_memory=1 << 20) as gw:
        _, handles = await scan(gw, 4)
        p = prefetcher(gw)
        await until(lambda: p.stats.waiting_room == 1 and p.stats.inflight == 0)
        # An object that just landed is in the cache and, until its prefetch task runs
        # again, still in the prefetcher's in-flight charge: with many landing at once the
        # prefetcher can see no room, then find some at its next look (idle_poll_s). Let
        # it settle, then it must stay stopped.
        await asyncio.sleep(0.2)
        await until(lambda: p.stats.waiting_room == 1 and p.stats.inflight == 0)
        fetched = sum(gets(gw.store).values())
        assert 20 < fetched < 70  # what 1 MiB holds, not the tree
        await asyncio.sleep(0.2)
        assert sum(gets(gw.store).values()) == fetched  # stopped, not evicting
        cached = [k for k in handles if gets(gw.store)[k]]
        await read_all(gw, handles, files, cached[:20])  # read 20: they may now go
        await until(lambda: sum(gets(gw.store).values()) > fetched)  # resumed
        data = gw.gateway.reader.stats
        assert data.ahead_wasted == 0 and data.ahead_used == 20


async def test_shuffled_epochs_over_twice_the_cache(tmp_path: Path) -> None:
    """4 readers, 20 ms per GET, a dataset twice the cache: with data prefetch about one GET
    per file per epoch, no waste, and clearly more READs served from memory than without."""
    files = tree(8, 40, size=20 * KiB)  # 320 files, ~6.6 MB
    ratios: dict[bool, list[float]] = {}
    for on in (False, True):
        store = MemoryStore("mem", latency_s={"get": 0.02})
        async with gateway(
            tmp_path / str(on), files, store=store, cache_memory=3300 * KiB,
            cache_data_prefetch=on,
        ) as gw:  # fmt: skip
            _, handles = await scan(gw, 8)
            rng = random.Random(5)
            data = gw.gateway.reader.stats
            ratios[on] = []
            for _ in range(3):
                order = sorted(handles)
                rng.shuffle(order)
                gw.reset_requests()
                hits, misses = data.hits, data.misses
                await read_all(gw, handles, files, order)
                n_gets = sum(gets(store).values())
                assert n_gets <= 1.05 * len(files)
                ratios[on].append((data.hits - hits) / (data.hits - hits + data.misses - misses))
            if on:
                assert data.ahead_wasted <= 0.05 * prefetcher(gw).stats.objects
                assert prefetcher(gw).stats.passes >= 2
    off, on_ = ratios[False][1:], ratios[True][1:]
    assert max(off) < 0.6  # about cache / dataset
    assert min(on_) > max(off) + 0.15


async def test_failed_prefetches_back_off_and_never_fail_a_read(tmp_path: Path) -> None:
    files = tree(2, 30)
    failed: set[str] = set()
    storm = True

    def fail(op: str, key: str) -> Exception | None:
        if storm and op == "get" and key not in failed:  # each object's first GET fails
            failed.add(key)
            return BackendUnavailable(f"{key}: 503 SlowDown (retries exhausted)")
        return None

    store = MemoryStore("mem", fail=fail)
    async with gateway(tmp_path, files, store=store) as gw:
        p = prefetcher(gw)
        p._cfg = p._cfg.__class__(retry_after_s=0.05, backoff_s=0.05, max_backoff_s=0.1)
        _, handles = await scan(gw, 2)
        await until(lambda: p.stats.objects >= len(files) - 10)
        assert p.stats.errors >= 1 and p.stats.backoffs >= 1
        storm = False
        order = sorted(handles)
        await read_all(gw, handles, files, order)  # every READ succeeds, bytes right
        assert gw.statuses()[("NFS3.READ", "NFS3ERR_IO")] == 0


@pytest.mark.parametrize("where", ["global", "export"])
async def test_off_restores_todays_request_counts(tmp_path: Path, where: str) -> None:
    files = tree(2, 20)
    kw: dict[str, Any] = (
        {"cache_data_prefetch": False}
        if where == "global"
        else {"export": {**RO, "data_prefetch": False}}
    )
    async with gateway(tmp_path, files, **kw) as gw:
        _, handles = await scan(gw, 2)
        await asyncio.sleep(0.2)
        assert gw.requests() == {"list": 3}
        await read_all(gw, handles, files, sorted(handles))
        assert gets(gw.store) == Counter(list(files))  # one GET per file read
        assert gw.gateway.reader.stats.ahead_used == 0


async def test_files_being_written_are_not_prefetched(tmp_path: Path) -> None:
    files = tree(1, 10)
    store = MemoryStore("mem", latency_s={"get": 0.05})
    rw = {"squash": "no_root_squash"}
    async with gateway(tmp_path, files, store=store, export=rw, cache_prefetch_concurrency=1) as gw:
        root = await gw.mount(b"/data")
        d = await gw.walk(root, "c0")
        fh = (await gw.lookup(d, b"img_009.jpg")).object  # lists c0: the prefetch starts
        write = Write3Args(fh, 0, 5, StableHow.UNSTABLE, b"hello")
        assert (await gw.nfs(Nfs3Proc.WRITE, write)).status == NfsStat3.NFS3_OK
        await settle(gw)
        fetched = gets(store)
        assert fetched["ds/c0/img_009.jpg"] == 0  # staged: left alone
        assert sum(fetched.values()) == 9


def test_a_pass_ends_when_every_file_was_read_or_rereads_pile_up() -> None:
    async def run() -> None:
        reader = ObjectReader(DataCache(1 << 20))
        p = DataPrefetcher(reader)
        store = MemoryStore("s")
        names = [f"f{i:03d}" for i in range(100)]
        cols = Columns(names, bytes(100), [10] * 100, [0] * 100, ["e"] * 100)
        p.add_dir(store, "d/", cols)
        for n in names[:99]:
            p.note_open("s", "d/" + n, False)
        assert p.stats.passes == 0
        p.note_open("s", "d/" + names[99], False)  # all of them
        assert p.stats.passes == 1
        # A hot set of 50 files read over and over: re-reads end passes.
        for _ in range(4):
            for n in names[:50]:
                p.note_open("s", "d/" + n, False)
        assert p.stats.passes >= 2
        # A decoder reading the header again right away is not a re-read.
        before = p.stats.passes
        for _ in range(100):
            p.note_open("s", "d/" + names[50], False)
        assert p.stats.passes == before
        await p.close()

    asyncio.run(run())


async def test_a_client_listing_directories_goes_first(tmp_path: Path) -> None:
    """While READDIR pages are being asked for (ImageFolder's scan, ``ls -lR``) nothing is
    fetched; what was listed is fetched once the listing is over."""
    files = tree(3, 20)
    async with gateway(tmp_path, files) as gw:
        p = prefetcher(gw)
        p._cfg = p._cfg.__class__(browse_quiet_s=0.3)
        root = await gw.mount(b"/data")
        for c in range(3):  # list the folders, then keep listing the last one
            d = await gw.walk(root, f"c{c}")
            assert (await gw.readdirplus(d)).status == NfsStat3.NFS3_OK
        for _ in range(5):
            await asyncio.sleep(0.1)
            assert (await gw.readdirplus(d)).status == NfsStat3.NFS3_OK
            assert gets(gw.store) == Counter() and p.stats.waiting_listing == 1
        await settle(gw)
        assert gets(gw.store) == Counter(list(files))  # each once, after the listing
        assert p.stats.waiting_listing == 0


async def test_a_read_ends_the_listing_pause(tmp_path: Path) -> None:
    """ImageFolder's scan, then the first batch: prefetching starts with the first READ,
    not ``browse_quiet_s`` after the last READDIR."""
    files = tree(2, 20)
    async with gateway(tmp_path, files) as gw:
        p = prefetcher(gw)
        p._cfg = p._cfg.__class__(browse_quiet_s=60.0)
        root = await gw.mount(b"/data")
        d = await gw.walk(root, "c0")
        assert (await gw.readdirplus(d)).status == NfsStat3.NFS3_OK
        await asyncio.sleep(0.1)
        assert gets(gw.store) == Counter() and p.stats.waiting_listing == 1
        first = (await gw.lookup(d, b"img_000.jpg")).object
        assert (await gw.read(first)).status == NfsStat3.NFS3_OK
        await settle(gw)  # well within the 60 s pause
        # c0 only (c1 was listed ahead of the client, but no client has used it): each once
        assert sum(gets(gw.store).values()) == 20 and max(gets(gw.store).values()) == 1
        assert {k.split("/")[1] for k in gets(gw.store)} == {"c0"}


async def test_a_local_backend_is_not_prefetched(tmp_path: Path) -> None:
    """A file:// export: a READ costs what a prefetch would, so nothing is fetched ahead. The
    store says so (``traits``, as ``LocalStore``'s do), not the export's URL."""
    files = tree(2, 10)
    local = {"read_only": True, "immutable": True}
    ec = ExportConfig("/data", f"file://{tmp_path}/ds", **local)
    store = MemoryStore("mem")
    store.traits = StoreTraits("local", latency_to_hide=False, endpoint="local")
    kw: dict[str, Any] = {"files": files, "store": store, "cache_data_prefetch": True}
    async with MemoryGateway.of(tmp_path, [ec], **kw) as gw:
        root = await gw.mount(b"/data")
        for c in range(2):
            d = await gw.walk(root, f"ds/c{c}")
            assert (await gw.readdirplus(d)).status == NfsStat3.NFS3_OK
        await asyncio.sleep(0.8)  # past the listing's pause
        assert prefetcher(gw).stats.dirs == 0 and gets(gw.store) == Counter()


async def test_the_gateways_own_listings_do_not_pause_it(tmp_path: Path) -> None:
    """Warm-ups, handle resolution and emptiness checks read pages too (``Namespace.readdir``):
    only a client's READDIR is a client listing."""
    files = tree(1, 20)
    async with gateway(tmp_path, files) as gw:
        p = prefetcher(gw)
        p._cfg = p._cfg.__class__(browse_quiet_s=60.0)
        (export,) = gw.gateway.exports.values()
        assert (await export.ns.readdir("c0", 0, 10)).entries
        await settle(gw)  # well within the 60 s a client's READDIR would pause it
        assert gets(gw.store) == Counter(list(files)) and p.stats.waiting_listing == 0


async def test_reads_served_from_memory_pause_it_until_a_miss_or_idle_time(tmp_path: Path) -> None:
    """A subset of a listed tree read again and again (the second epoch over 50,000 of
    1.28M objects): while the READs find their files in memory, the prefetcher fetches
    nothing more of the rest; two misses in the window, or idle time, resume it."""
    files = tree(8, 24)
    store = MemoryStore("mem", latency_s={"get": 0.02})
    async with gateway(tmp_path, files, store=store, cache_prefetch_concurrency=1) as gw:
        p = prefetcher(gw)
        p._cfg = dataclasses.replace(p._cfg, idle_open_s=60.0)
        _, handles = await scan(gw, 8)  # every class listed: the walk starts on c0
        subset = sorted(handles)[::4]  # 48 files over every class
        await read_all(gw, handles, files, subset)  # mostly misses: demand GETs
        assert p.stats.waiting_hits == 0
        await read_all(gw, handles, files, subset * 2)  # 96 memory hits: the window's 64
        await until(lambda: p.stats.waiting_hits == 1 and p.stats.inflight == 0)
        fetched = sum(gets(store).values())
        await asyncio.sleep(0.3)  # 15 GETs' time at 20 ms each
        assert sum(gets(store).values()) == fetched and p.stats.waiting_hits == 1
        # Two files nobody fetched yet (the walk is in c0-c1): two misses resume it.
        unfetched = [k for k in sorted(handles, reverse=True) if not gets(store)[k]][:2]
        await read_all(gw, handles, files, unfetched, workers=1)
        await until(lambda: sum(gets(store).values()) >= fetched + 2 + 5)
        assert p.stats.waiting_hits == 0
        # Paused again; with no READ for idle_open_s it resumes by itself.
        p._cfg = dataclasses.replace(p._cfg, idle_open_s=0.3)
        await read_all(gw, handles, files, subset * 2)
        await until(lambda: p.stats.waiting_hits == 1 and p.stats.inflight == 0)
        fetched = sum(gets(store).values())
        await until(lambda: sum(gets(store).values()) >= fetched + 5)
        assert p.stats.waiting_hits == 0
        await settle(gw, timeout_s=30.0)  # the rest of the tree, each file once
        assert gets(store) == Counter(list(files))
        data = gw.gateway.reader.stats
        assert data.ahead_wasted == 0


def test_directories_relisted_while_queued_leave_a_bounded_queue() -> None:
    """The prefetcher never runs here (its head never moves, as when it waits for room for
    hours) while 10 directories are re-listed 1,000 times each: stale queue entries are
    compacted away, every live directory stays queued once."""

    async def run() -> None:
        from gateway.data.prefetch import STALE_SLACK

        p = DataPrefetcher(ObjectReader(DataCache(1 << 20)))
        store = MemoryStore("s")
        names = [f"f{i:03d}" for i in range(10)]
        for _ in range(1000):
            for d in range(10):
                cols = Columns(names, bytes(10), [10] * 10, [0] * 10, ["e"] * 10)
                p.add_dir(store, f"d{d}/", cols)  # new columns: a changed re-list
                p.add_dir(store, f"d{d}/", cols)  # the same ones: an unchanged re-list
        assert p.snapshot()["queued_dirs"] == 10
        assert len(p._queue) <= 2 * 10 + STALE_SLACK
        assert sorted(q.prefix for q in p._queue if q.queued) == [f"d{d}/" for d in range(10)]

    asyncio.run(run())


def test_reads_at_offset_0_reach_the_prefetcher_through_the_relay() -> None:
    """``FileOpened`` built first, given to the reader and the prefetcher: each READ at
    offset 0 of a small object reaches ``note_open`` at once, with its memory hit; a READ
    further in does not. Without listeners the relay does nothing."""

    async def run() -> None:
        idle = FileOpened()
        idle.note_open("s", "d/f", True)  # nobody listens: nothing happens
        assert not idle.listening
        opened = FileOpened()
        reader = ObjectReader(DataCache(1 << 20), opened=opened)
        seen: list[tuple[str, str, bool]] = []

        class Spy:
            def note_open(self, store_name: str, key: str, hit: bool) -> None:
                seen.append((store_name, key, hit))

        p = DataPrefetcher(reader, opened=opened)
        opened.subscribe(Spy())
        store = MemoryStore("s")
        store.seed("d/f", b"0123456789")
        cols = Columns(["f"], bytes(1), [10], [0], [store._objects[b"d/f"].etag])
        p.add_dir(store, "d/", cols)
        etag = store._objects[b"d/f"].etag
        await reader.read(store, "d/f", etag, 10, 0, 10)  # a miss
        await reader.read(store, "d/f", etag, 10, 0, 10)  # a memory hit
        await reader.read(store, "d/f", etag, 10, 5, 5)  # not at offset 0
        assert seen == [("s", "d/f", False), ("s", "d/f", True)]
        assert list(p._outcomes) == [False, True]
        await p.close()

    asyncio.run(run())


def test_with_a_fleet_the_owned_files_are_fetched_first() -> None:
    """``owns`` (a fleet's rendezvous hashing): every directory is walked for the files this
    gateway owns before any is walked for the others; each file is fetched once."""

    async def run() -> None:
        from gateway.data.config import PrefetchConfig

        store = MemoryStore("s")
        names = [f"f{i:02d}" for i in range(30)]
        etags: dict[str, list[str]] = {}
        for d in ("a", "b"):
            for n in names:
                store.seed(f"{d}/{n}", (d + n).encode() * 100)
            etags[d] = [store._objects[f"{d}/{n}".encode()].etag for n in names]

        def owns(store_name: str, key: str, etag: str) -> bool:
            assert store_name == "s"
            return int(key[-2:]) % 3 == 0

        reader = ObjectReader(DataCache(8 << 20))
        p = DataPrefetcher(reader, PrefetchConfig(concurrency=1), owns=owns)
        for d in ("a", "b"):
            p.add_dir(store, f"{d}/", Columns(names, bytes(30), [200] * 30, [0] * 30, etags[d]))
        p.start()
        try:
            await until(lambda: store.requests["get"] == 60)
        finally:
            await p.close()
        order = [key for op, key in store.log if op == "get"]
        owned = [f"{d}/{n}" for d in ("a", "b") for n in names if int(n[-2:]) % 3 == 0]
        assert sorted(order) == sorted(f"{d}/{n}" for d in ("a", "b") for n in names)
        assert order[: len(owned)] == owned  # both directories' owned ones first
        assert p.snapshot()["queued_dirs"] == 0

    asyncio.run(run())


@pytest.mark.parametrize("owner_fills", [True, False])
def test_another_members_objects_wait_for_its_fill_before_the_origin(owner_fills: bool) -> None:
    """A prefetch of an object another fleet member owns looks in the shared tier only; a
    miss is tried again later (``deferred``), and only the last attempt asks the origin: an
    owner that fills in time costs the fleet no second origin GET."""

    async def run() -> None:
        from gateway.data.config import PrefetchConfig
        from gateway.data.shared import SharedTier
        from gateway.data.tiers import Piece

        origin, bucket = MemoryStore("s"), MemoryStore("shared")
        names = [f"f{i}" for i in range(6)]
        for n in names:
            origin.seed(f"d/{n}", n.encode() * 500)
        etags = [origin._objects[f"d/{n}".encode()].etag for n in names]
        mine = {f"d/f{i}" for i in (0, 2, 4)}

        def owns(store_name: str, key: str, etag: str) -> bool:
            return key in mine

        tier = SharedTier(bucket, "c/")
        reader = ObjectReader(DataCache(8 << 20), shared=tier)
        cfg = PrefetchConfig(concurrency=2, retry_after_s=0.1, attempts=3)
        p = DataPrefetcher(reader, cfg, owns=owns, backlog=tier.backlogged)
        p.add_dir(origin, "d/", Columns(names, bytes(6), [1000] * 6, [0] * 6, etags))
        p.start()
        try:
            if owner_fills:  # the owner's fills land while the first attempts wait
                await until(lambda: p.stats.deferred >= 3)
                owner = SharedTier(bucket, "c/")
                for n, e in zip(names, etags, strict=True):
                    if f"d/{n}" not in mine:
                        piece = Piece("s", f"d/{n}", e, 0, 1000)
                        assert owner.admit(piece)
                        await owner.put(piece, n.encode() * 500)
            pairs = list(zip(names, etags, strict=True))
            await until(lambda: all(reader.cached("s", f"d/{n}", e) for n, e in pairs))
            await tier.drain()
        finally:
            await p.close()
        gets = sorted(k for op, k in origin.log if op == "get")
        if owner_fills:
            assert gets == sorted(mine) and tier.stats.hits == 3
        else:  # the third attempt of each went to the origin
            assert len(gets) == 6 and p.stats.deferred == 6
        assert p.stats.errors == 0 and reader.stats.fetch_errors == 0

    asyncio.run(run())


def test_deferring_stops_when_the_owners_never_fill() -> None:
    """A gateway alone (its fleet's other members not reading): after ``DEFER_GIVE_UP``
    retries in a row that found nothing, another member's objects go to the origin at once."""

    async def run() -> None:
        from gateway.data.config import PrefetchConfig
        from gateway.data.prefetch import DEFER_GIVE_UP
        from gateway.data.shared import SharedTier

        origin = MemoryStore("s")
        names = [f"f{i:02d}" for i in range(80)]
        for n in names:
            origin.seed(f"d/{n}", n.encode() * 100)
        etags = [origin._objects[f"d/{n}".encode()].etag for n in names]
        tier = SharedTier(MemoryStore("shared"), "c/")
        reader = ObjectReader(DataCache(8 << 20), shared=tier)
        cfg = PrefetchConfig(concurrency=4, retry_after_s=0.05, attempts=3)
        p = DataPrefetcher(reader, cfg, owns=lambda s, k, e: False)
        p.add_dir(origin, "d/", Columns(names, bytes(80), [200] * 80, [0] * 80, etags))
        p.start()
        try:
            await until(lambda: origin.requests["get"] == 80)
        finally:
            await p.close()
        assert p._defer_off_until > 0
        # every object deferred once; retries of DEFER_GIVE_UP of them missed; the rest, and
        # every attempt after deferring stopped, went to the origin
        assert 80 + DEFER_GIVE_UP <= p.stats.deferred < 2 * 80
        assert sorted(k for op, k in origin.log if op == "get") == [f"d/{n}" for n in names]

    asyncio.run(run())
