"""One data cache for all workers (``DiskStore(shared=True)``): two readers on one cache
directory stand for two worker processes (``flock`` claims conflict between two open files
of one process exactly as between two processes).

What is checked: two workers missing the same objects at once make one GET per object;
a second epoch makes none; the bodies both hold are mappings of the same entry files (the
private copy of the fetching worker is swapped for the mapping once published), charged
``1 / workers`` of their size; a flipped or torn entry is never served as a mapping; a claim
held by a worker that dies is released by the kernel; a claim wait that times out fetches
anyway and is counted as a duplicate; warm-ups (the data prefetcher's disk path) claim too.
"""

from __future__ import annotations

import asyncio
import mmap
import os
from pathlib import Path
from typing import Any

from gateway.data import DataCache, DataConfig, DataStats, ObjectReader
from gateway.data.cache import BLOCK_ENTRY_CHARGE_BYTES
from gateway.data.config import DiskConfig
from gateway.data.disk.fileformat import disk_key
from gateway.data.disk.sharing import claim as claim_file
from gateway.data.disk.store import DiskStore
from gateway.data.mappings import is_mapping, mapped_size
from gateway.data.warm import warm_object
from tests.unit.gateway.test_datacache import FakeStore, as_store, payload

MiB = 1 << 20
OBJ = 20_000


async def shared_disk(d: Path, **kw: Any) -> DiskStore:
    disk = await DiskStore.open(d, DiskConfig(budget=64 * MiB, min_free=0, **kw), shared=True)
    assert disk is not None and disk.shared
    return disk


def worker(disk: DiskStore, workers: int = 2) -> ObjectReader:
    stats = DataStats()
    return ObjectReader(
        DataCache(64 * MiB, stats=stats, shared_by=workers), DataConfig(), stats, disk
    )


def objects(store: FakeStore, n: int) -> list[str]:
    keys = [f"train/c{i % 3}/{i}.jpg" for i in range(n)]
    for i, k in enumerate(keys):
        store.put(k, payload(OBJ + i, seed=i))
    return keys


async def read(r: ObjectReader, store: FakeStore, key: str) -> bytes:
    data, etag = store.objects[key]
    out, eof = await r.read(as_store(store), key, etag, len(data), 0, len(data))
    assert eof
    return bytes(out)


def cached(r: ObjectReader, store: FakeStore, key: str) -> bytes | memoryview | None:
    etag = store.objects[key][1]
    return r.cache.lookup((store.name, key, etag, 0))


async def test_two_workers_missing_the_same_objects_make_one_get_each(tmp_path: Path) -> None:
    store = FakeStore(latency=0.02)
    keys = objects(store, 24)
    a, b = await shared_disk(tmp_path / "c"), await shared_disk(tmp_path / "c")
    ra, rb = worker(a), worker(b)
    got = await asyncio.gather(
        *(read(ra, store, k) for k in keys), *(read(rb, store, k) for k in reversed(keys))
    )
    assert got == [store.objects[k][0] for k in keys] + [store.objects[k][0] for k in keys[::-1]]
    await a.drain()
    await b.drain()
    assert store.gets == 24 and max(store.calls.values()) == 1
    assert a.stats.claim_waits + b.stats.claim_waits > 0  # they did meet
    assert a.stats.duplicate_fetches == b.stats.duplicate_fetches == 0
    assert a.stats.writes + b.stats.writes == 24
    # Both now hold every object as a mapping of the one entry file: nothing private.
    for r in (ra, rb):
        for k in keys:
            body = cached(r, store, k)
            assert body is not None and is_mapping(body) and bytes(body) == store.objects[k][0]
        assert r.stats.mapped_bytes == sum(len(store.objects[k][0]) for k in keys)
        # Charged half of the entry file's pages each (two workers share them).
        views = [cached(r, store, k) for k in keys]
        charge = BLOCK_ENTRY_CHARGE_BYTES
        assert r.cache.used_bytes == sum(
            mapped_size(v) // 2 + charge for v in views if isinstance(v, memoryview)
        )
    # A second epoch, and a third worker started later: no GET.
    rc = worker(await shared_disk(tmp_path / "c"))
    for r in (ra, rb, rc):
        for k in keys:
            assert await read(r, store, k) == store.objects[k][0]
    assert store.gets == 24
    for d in (a, b):
        await d.close()


async def test_the_fetching_worker_swaps_its_copy_for_the_mapping(tmp_path: Path) -> None:
    store = FakeStore()
    (key,) = objects(store, 1)
    disk = await shared_disk(tmp_path / "c")
    r = worker(disk)
    assert await read(r, store, key) == store.objects[key][0]
    await disk.drain()
    body = cached(r, store, key)
    assert body is not None and is_mapping(body)
    assert isinstance(body, memoryview)
    assert r.cache.used_bytes == mapped_size(body) // 2 + BLOCK_ENTRY_CHARGE_BYTES
    # Evicting it drops the mapping's bytes from the gauge.
    r.invalidate(store.name, key)
    assert r.stats.mapped_bytes == 0
    await disk.close()


def damage(flip: str, tear: str) -> None:
    """A flipped bit in the body of ``flip``; ``tear`` loses its last 7 bytes."""
    with open(flip, "r+b") as f:
        f.seek(-100, os.SEEK_END)
        c = f.read(1)
        f.seek(-100, os.SEEK_END)
        f.write(bytes([c[0] ^ 1]))
    os.truncate(tear, os.path.getsize(tear) - 7)


async def test_a_flipped_or_torn_entry_is_never_mapped(tmp_path: Path) -> None:
    store = FakeStore()
    k1, k2 = objects(store, 2)
    disk = await shared_disk(tmp_path / "c")
    r = worker(disk)
    for k in (k1, k2):  # a bundle each (damage() flips and cuts the end of a file)
        await read(r, store, k)
        await disk.drain()
    paths = {
        k: disk.path(disk_key(store.name, k, store.objects[k][1], 0, len(store.objects[k][0])))
        for k in (k1, k2)
    }
    damage(paths[k1], paths[k2])
    fresh = worker(await shared_disk(tmp_path / "c"))
    for k in (k1, k2):
        assert await read(fresh, store, k) == store.objects[k][0]  # fetched again, right bytes
    assert store.gets == 4 and fresh.disk is not None and fresh.disk.stats.corrupt == 2
    await disk.close()


async def test_a_dead_workers_claim_is_released_and_the_object_fetched(tmp_path: Path) -> None:
    store = FakeStore()
    (key,) = objects(store, 1)
    disk = await shared_disk(tmp_path / "c")
    k = disk_key(store.name, key, store.objects[key][1], 0, OBJ)
    fd, present = claim_file(disk.root, k)  # "another worker" starts fetching
    assert fd >= 0 and not present
    r = worker(disk)
    reading = asyncio.ensure_future(read(r, store, key))
    await asyncio.sleep(0.1)
    assert not reading.done() and store.gets == 0  # waiting for the other worker's entry
    os.close(fd)  # it died (the kernel drops a dead process's flocks the same way)
    assert await asyncio.wait_for(reading, 5) == store.objects[key][0]
    assert store.gets == 1 and disk.stats.claim_waits == 1
    await disk.close()


async def test_a_claim_wait_that_times_out_fetches_and_counts_the_duplicate(
    tmp_path: Path,
) -> None:
    store = FakeStore()
    (key,) = objects(store, 1)
    disk = await shared_disk(tmp_path / "c", claim_wait_s=0.05)
    k = disk_key(store.name, key, store.objects[key][1], 0, OBJ)
    fd, _ = claim_file(disk.root, k)  # a worker stuck on its GET
    r = worker(disk)
    assert await read(r, store, key) == store.objects[key][0]  # not stalled behind it
    await disk.drain()
    assert disk.stats.claim_timeouts == 1 and store.gets == 1 and disk.stats.writes == 1
    # The stuck worker's GET returns after all: its publish finds the entry and counts the
    # second fetch of the same bytes.
    stuck = await shared_disk(tmp_path / "c")
    assert stuck.admit(k)
    assert not await stuck.publish(k, store.objects[key][0])
    os.close(fd)
    assert stuck.stats.duplicate_fetches == 1 and stuck.stats.writes == 0
    await disk.close()
    await stuck.close()


async def test_two_warm_ups_of_the_same_objects_make_one_get_each(tmp_path: Path) -> None:
    store = FakeStore(latency=0.02)
    keys = objects(store, 12)
    a, b = await shared_disk(tmp_path / "c"), await shared_disk(tmp_path / "c")
    ra, rb = worker(a), worker(b)

    async def warm(r: ObjectReader, k: str) -> str:
        data, etag = store.objects[k]
        outcome, _ = await warm_object(r, as_store(store), k, etag, len(data))
        return outcome

    outcomes = await asyncio.gather(*(warm(ra, k) for k in keys), *(warm(rb, k) for k in keys))
    assert store.gets == 12 and sorted(set(outcomes)) == ["cached", "written"]
    assert outcomes.count("written") == 12
    for k in keys:  # and READs in either worker are served from the tier
        assert await read(rb, store, k) == store.objects[k][0]
    assert store.gets == 12
    for d in (a, b):
        await d.close()


def test_a_mapping_is_charged_its_share_a_private_copy_in_full(tmp_path: Path) -> None:
    from gateway import fastwire

    p = tmp_path / "f"
    p.write_bytes(b"x" * 40_000)
    with open(p, "rb") as f:
        m = fastwire.map_file(f.fileno(), 40_000)
    cache = DataCache(1 * MiB, shared_by=4)
    view = memoryview(m)[1000:]
    assert is_mapping(view) and not is_mapping(memoryview(b"abc")) and not is_mapping(b"abc")
    pages = -(-40_000 // mmap.PAGESIZE) * mmap.PAGESIZE  # the whole mapping, in pages
    assert cache.charge_of(view) == pages // 4 + BLOCK_ENTRY_CHARGE_BYTES
    assert cache.charge_of(b"y" * 39_000) == 39_000 + BLOCK_ENTRY_CHARGE_BYTES
    key = ("s", "k", "e", 0)
    assert cache.insert(key, b"y" * 39_000)
    assert not cache.swap(key, b"y" * 39_000, view)  # not the object it holds
    assert cache.swap(key, cache.lookup(key) or b"", view)
    assert cache.used_bytes == pages // 4 + BLOCK_ENTRY_CHARGE_BYTES
    assert cache.stats.mapped_bytes == 39_000


async def test_past_the_mapping_limit_disk_hits_are_copies(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """A cache holds at most ``max_mappings`` mappings (each is a kernel memory area, and a
    process has ``vm.max_map_count`` of them); a mapping the kernel refuses is a copy too."""
    store = FakeStore()
    keys = objects(store, 3)
    disk = await shared_disk(tmp_path / "c")
    r = worker(disk)
    for k in keys:
        await read(r, store, k)
    await disk.drain()
    stats = DataStats()
    capped = ObjectReader(
        DataCache(64 * MiB, stats=stats, shared_by=2, max_mappings=1), DataConfig(), stats, disk
    )
    for k in keys:
        assert await read(capped, store, k) == store.objects[k][0]
    held = [cached(capped, store, k) for k in keys]
    assert [is_mapping(b) for b in held if b is not None] == [True, False, False]
    assert capped.cache.mappings == 1
    from gateway import fastwire

    def refuse(*_: Any, **__: Any) -> Any:
        raise OSError(12, "Cannot allocate memory")

    monkeypatch.setattr(fastwire, "map_file", refuse)
    fresh = worker(disk)
    assert await read(fresh, store, keys[0]) == store.objects[keys[0]][0]
    body = cached(fresh, store, keys[0])
    assert body is not None and not is_mapping(body) and store.gets == 3
    await disk.close()


async def test_a_finished_fetch_leaves_no_cycle_holding_its_bytes(tmp_path: Path) -> None:
    """A fetch's blocks pointed back at it: every fetch became cyclic garbage that kept its
    bytes (a private copy or a mapping of a disk-tier file) alive, beyond the cache's budget,
    until a full collection (the soak test saw the process map 60 % more than the cache held).
    Now nothing of a finished fetch waits for the collector."""
    import gc

    from gateway.data.fetches import Fetch

    store = FakeStore()
    keys = objects(store, 6)
    disk = await shared_disk(tmp_path / "c")
    r = worker(disk)
    gc.collect()
    gc.disable()
    try:
        for k in keys:  # a GET each, then disk hits (mappings) for a cache that has no room
            assert await read(r, store, k) == store.objects[k][0]
        await disk.drain()
        r2 = ObjectReader(DataCache(0, stats=DataStats()), DataConfig(), DataStats(), disk)
        for k in keys:
            assert await read(r2, store, k) == store.objects[k][0]
        await asyncio.sleep(0)
        left = [o for o in gc.get_objects() if type(o) is Fetch]
        assert left == []
    finally:
        gc.enable()
    await disk.close()
