"""The disk tier (``gateway.data.disk``) and the two tiers together: publish and lookup,
verification (a truncated or flipped file is detected, dropped, counted and fetched again),
sharing between two stores on one directory (two worker processes), surviving a restart, the
budget, admission and eviction, the free-space floor, bad cache directories, warm-up, and the
two-tier hit ratio in shuffled epochs.

Everything runs in ``tmp_path`` (never /var/cache) over the counting fake store of
``test_datacache``: GET counts are exact.
"""

from __future__ import annotations

import asyncio
import errno
import os
import random
from pathlib import Path
from typing import Any

import pytest

from gateway.clock import Clock, FakeClock
from gateway.data import DataCache, DataConfig, DataStats, ObjectReader
from gateway.data.cache import BLOCK_ENTRY_CHARGE_BYTES
from gateway.data.config import DiskConfig
from gateway.data.disk.entries import read_entry
from gateway.data.disk.fileformat import TABLE_BYTES, DiskKey, bundle_charge, charge_of, disk_key
from gateway.data.disk.store import DiskStore, resolve_cache_dir
from gateway.data.stats import DiskStats
from gateway.data.warm import warm_object
from tests.unit.gateway.test_datacache import FakeStore, as_store, payload

KiB = 1024
MiB = 1024 * KiB
OBJ = 16_000  # + header and identity: one 16 KiB charge on disk


async def open_disk(
    d: Path, budget: int | None = 64 * MiB, clock: Clock | None = None, **kw: Any
) -> DiskStore:
    cfg = DiskConfig(budget=budget, min_free=kw.pop("min_free", 0), **kw)
    disk = await DiskStore.open(d, cfg, DiskStats(), clock=clock)
    assert disk is not None
    return disk


def reader_over(disk: DiskStore | None, memory: int = 64 * MiB) -> ObjectReader:
    stats = DataStats()
    return ObjectReader(DataCache(memory, stats=stats), DataConfig(), stats, disk)


async def read_all(r: ObjectReader, store: FakeStore, key: str) -> bytes:
    data, etag = store.objects[key]
    out, eof = await r.read(as_store(store), key, etag, len(data), 0, len(data) + 1)
    assert eof
    return bytes(out)


def dkey(store: FakeStore, key: str) -> DiskKey:
    data, etag = store.objects[key]
    return disk_key(store.name, key, etag, 0, len(data))


def entry_path(disk: DiskStore, store: FakeStore, key: str, start: int = 0, n: int = -1) -> Path:
    data, etag = store.objects[key]
    return Path(disk.path(disk_key(store.name, key, etag, start, len(data) if n < 0 else n)))


# -- publish, lookup, sharing, restart ------------------------------------------------------


async def test_published_entries_serve_other_stores_and_survive_a_restart(tmp_path: Path) -> None:
    store = FakeStore()
    keys = [f"img/{i}.jpg" for i in range(20)]
    for i, k in enumerate(keys):
        store.put(k, payload(OBJ + i, seed=i))
    a = await open_disk(tmp_path / "c")
    b = await open_disk(tmp_path / "c")  # a second worker process on the same directory
    ra, rb = reader_over(a), reader_over(b)
    for k in keys:
        assert await read_all(ra, store, k) == store.objects[k][0]
    await a.drain()
    assert store.gets == 20 and a.stats.writes == 20
    for k in keys:  # the other worker finds what the first wrote: no GET
        assert await read_all(rb, store, k) == store.objects[k][0]
    assert store.gets == 20 and b.stats.hits == 20
    await b.rescan()
    # Scans see the other worker's entries: one bundle, charged once, as its writer did.
    one_bundle = bundle_charge([dkey(store, k) for k in keys])
    assert one_bundle == 20 * charge_of(OBJ + 40) + 4096  # the table takes a page here
    assert b.used_bytes == a.used_bytes == one_bundle
    assert b.stats.entries == 20
    await a.close()
    await b.close()
    c = await open_disk(tmp_path / "c")  # a restart: a new process, an empty memory tier
    rc = reader_over(c)
    for k in keys:
        assert await read_all(rc, store, k) == store.objects[k][0]
    assert store.gets == 20 and c.stats.hits == 20 and c.stats.entries == 20
    await c.close()


async def test_large_objects_are_cached_per_block(tmp_path: Path) -> None:
    store = FakeStore()
    size = 5 * MiB + 123
    etag = store.put("big", payload(size))
    disk = await open_disk(tmp_path)
    r = reader_over(disk)
    for off in range(0, size, 256 * KiB):
        await r.read(as_store(store), "big", etag, size, off, 256 * KiB)
    await disk.drain()
    gets = store.gets
    r2 = reader_over(disk)
    got = b"".join(
        [
            bytes((await r2.read(as_store(store), "big", etag, size, off, 300 * KiB))[0])
            for off in range(0, size, 300 * KiB)
        ]
    )
    assert got == store.objects["big"][0] and store.gets == gets
    assert disk.stats.writes == 6  # six 1 MiB blocks
    await disk.close()


async def test_a_replaced_object_is_never_served_from_disk(tmp_path: Path) -> None:
    store = FakeStore()
    store.put("f", b"old" * 1000)
    disk = await open_disk(tmp_path)
    assert await read_all(reader_over(disk), store, "f") == b"old" * 1000
    await disk.drain()
    store.put("f", b"new" * 1000)  # a new version: a new ETag, hence a new entry name
    assert await read_all(reader_over(disk), store, "f") == b"new" * 1000
    assert store.gets == 2
    await disk.close()


# -- verification ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "damage", ["truncate", "flip_body", "flip_header", "flip_table", "swap", "empty"]
)
async def test_a_damaged_entry_is_detected_dropped_and_fetched_again(
    tmp_path: Path, damage: str
) -> None:
    store = FakeStore()
    store.put("a", payload(OBJ, seed=1))
    store.put("b", payload(OBJ, seed=2))
    disk = await open_disk(tmp_path)
    for k in ("a", "b"):  # one bundle each
        await read_all(reader_over(disk), store, k)
        await disk.drain()
    path = entry_path(disk, store, "a")
    raw = bytearray(path.read_bytes())
    if damage == "truncate":  # what a crash mid-write would leave without write-then-link
        path.write_bytes(raw[: len(raw) // 2])
    elif damage == "flip_body":
        raw[-100] ^= 0x01
        path.write_bytes(raw)
    elif damage == "flip_header":  # the entry's header, after the bundle's table page
        raw[TABLE_BYTES + 20] ^= 0x80
        path.write_bytes(raw)
    elif damage == "flip_table":
        raw[20] ^= 0x80
        path.write_bytes(raw)
    elif damage == "empty":
        path.write_bytes(b"")
    else:  # another bundle under this name (a hash collision, a misplaced file)
        os.replace(entry_path(disk, store, "b"), path)
    gets = store.gets
    assert await read_all(reader_over(disk), store, "a") == store.objects["a"][0]
    assert store.gets == gets + 1 and disk.stats.corrupt == 1
    await disk.drain()  # fetched again and published again: the next read is a verified hit
    assert await read_all(reader_over(disk), store, "a") == store.objects["a"][0]
    assert store.gets == gets + 1 and disk.stats.corrupt == 1
    await disk.close()


def test_read_entry_reports_why() -> None:
    k = disk_key("s", "k", "e", 0, 3)
    status, body, why = read_entry("/nonexistent/entry", k)
    assert (status, body, why) == (1, b"", "")


# -- budget, admission, eviction ------------------------------------------------------------


async def test_a_full_tier_refuses_one_pass_entries_and_admits_frequent_ones(
    tmp_path: Path,
) -> None:
    store = FakeStore()
    for i in range(30):
        store.put(f"o{i}", payload(OBJ, seed=i))
    # Bundles of one entry: eviction (whole bundles) is per entry here; see
    # test_eviction_takes_whole_bundles_and_frees_their_bytes_with_the_last_name.
    charge = bundle_charge([dkey(store, "o10")])  # the table fits the entry's last page
    assert charge == dkey(store, "o10").charge
    disk = await open_disk(tmp_path, budget=10 * charge + charge // 2, bundle_entries=1)
    for i in range(30):
        await read_all(reader_over(disk), store, f"o{i}")
    await disk.drain()
    await disk.rescan()
    assert disk.stats.writes == 10 and disk.stats.rejected == 20
    assert disk.used_bytes <= disk.budget_bytes
    # o25 is read again and again (a fresh memory tier each time): it wins a duel.
    for _ in range(3):
        await read_all(reader_over(disk), store, "o25")
        await disk.drain()
    assert entry_path(disk, store, "o25").exists()
    gone = [i for i in range(10) if not entry_path(disk, store, f"o{i}").exists()]
    assert disk.stats.evictions == 1 and len(gone) == 1  # one of the least recently used
    await disk.rescan()
    assert disk.used_bytes <= disk.budget_bytes
    await disk.close()


async def test_a_tier_overfilled_by_other_workers_shrinks_to_its_budget(tmp_path: Path) -> None:
    store = FakeStore()
    for i in range(10):
        store.put(f"o{i}", payload(OBJ, seed=i))
    a = await open_disk(tmp_path, bundle_entries=1)
    for i in range(10):
        await read_all(reader_over(a), store, f"o{i}")
    await a.close()
    one = charge_of(entry_path(a, store, "o0").stat().st_size)
    b = await open_disk(tmp_path, budget=5 * one)
    assert b.used_bytes <= 0.95 * 5 * one and b.stats.evictions == 6
    assert len(list((tmp_path / "v2").glob("[0-9a-f][0-9a-f]/*"))) == 4
    await b.close()


# -- the filesystem filling up, write errors -------------------------------------------------


async def test_a_full_filesystem_refuses_new_entries_and_reads_still_work(
    tmp_path: Path,
) -> None:
    store = FakeStore()
    store.put("a", payload(OBJ))
    disk = await open_disk(tmp_path, min_free=1 << 60)  # the floor is never met
    assert await read_all(reader_over(disk), store, "a") == store.objects["a"][0]
    await disk.drain()
    assert disk.stats.refused_full == 1 and disk.stats.writes == 0
    assert not list((tmp_path / "v2").glob("[0-9a-f][0-9a-f]/*"))
    await disk.close()


async def test_another_tenant_filling_the_disk_turns_writes_into_refusals(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FakeStore()
    store.put("a", payload(OBJ))
    store.put("b", payload(OBJ, seed=3))
    clock = FakeClock()
    disk = await open_disk(tmp_path, min_free=1 * MiB, clock=clock)
    real = os.statvfs

    class Full:
        def __init__(self, p: str) -> None:
            v = real(p)
            self.f_frsize, self.f_blocks, self.f_bavail = v.f_frsize, v.f_blocks, 16

    monkeypatch.setattr(os, "statvfs", Full)
    assert await read_all(reader_over(disk), store, "a") == store.objects["a"][0]
    await disk.drain()
    assert disk.stats.refused_full == 1 and disk.stats.writes == 0
    monkeypatch.setattr(os, "statvfs", real)
    await disk.rescan()  # the periodic scan sees the space back: new entries are taken again

    def no_space(fd: int, bufs: object) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "writev", no_space)
    assert not disk.takes(OBJ)  # the refusal after FULL lasts a second (the tier's clock)
    clock.advance(1.0)
    assert disk.takes(OBJ)
    assert await read_all(reader_over(disk), store, "b") == store.objects["b"][0]
    await disk.drain()
    assert disk.stats.write_errors == 1 and disk.stats.writes == 0
    assert not list((tmp_path / "v2").glob("*/.tmp*"))  # the temporary file was removed
    assert disk.used_bytes == 0
    await disk.close()


# -- bad cache directories --------------------------------------------------------------------


async def test_a_missing_cache_dir_is_created(tmp_path: Path) -> None:
    disk = await open_disk(tmp_path / "a" / "b" / "cache")
    assert (tmp_path / "a" / "b" / "cache" / "v2" / "ff").is_dir()
    await disk.close()


@pytest.mark.parametrize("where", ["a_file", "proc"])
async def test_an_unusable_cache_dir_falls_back_to_memory_only(tmp_path: Path, where: str) -> None:
    if where == "a_file":
        target = tmp_path / "cache"
        target.write_text("not a directory")
    else:
        target = Path("/proc/nfsgw-cache-test")  # not creatable, even by root
    stats = DiskStats()
    assert await DiskStore.open(target, DiskConfig(), stats) is None
    assert stats.enabled == 0


async def test_a_directory_that_refuses_writes_falls_back_to_memory_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EACCES on the start-up probe (an existing directory the service user may not write;
    simulated: these tests run as root, which permissions do not stop)."""
    real = os.open

    def refuse(path: Any, flags: int, mode: int = 0o777, **kw: Any) -> int:
        if ".probe." in str(path):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real(path, flags, mode, **kw)

    monkeypatch.setattr(os, "open", refuse)
    stats = DiskStats()
    assert await DiskStore.open(tmp_path / "cache", DiskConfig(), stats) is None
    assert stats.enabled == 0


async def test_budget_zero_turns_the_tier_off(tmp_path: Path) -> None:
    assert await DiskStore.open(tmp_path, DiskConfig(budget=0)) is None
    assert not (tmp_path / "v2").exists()


async def test_the_automatic_budget_is_a_share_of_free_space(tmp_path: Path) -> None:
    disk = await DiskStore.open(tmp_path, DiskConfig())
    assert disk is not None
    v = os.statvfs(tmp_path)
    free, size = v.f_bavail * v.f_frsize, v.f_blocks * v.f_frsize
    expected = (free - size // 20) // 2  # half of (free - the 5 % floor)
    assert abs(disk.budget_bytes - expected) < 1 << 30  # other tenants write meanwhile
    await disk.close()


def test_the_cache_dir_defaults_to_systemds_cache_directory_then_the_state_dir(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("CACHE_DIRECTORY", raising=False)
    state = Path("/var/lib/nfsgw")
    assert resolve_cache_dir(None, state) == state / "cache"
    assert resolve_cache_dir(Path("/x"), state) == Path("/x")
    monkeypatch.setenv("CACHE_DIRECTORY", "/var/cache/nfsgw")
    assert resolve_cache_dir(None, state) == Path("/var/cache/nfsgw")


# -- warm-up ---------------------------------------------------------------------------------


async def test_warm_up_fills_the_disk_not_memory_resumes_and_stops_at_the_budget(
    tmp_path: Path,
) -> None:
    store = FakeStore()
    for i in range(12):
        store.put(f"w{i}", payload(OBJ, seed=i))
    store.put("big", payload(3 * MiB + 5))
    big_data, big_etag = store.objects["big"]
    # A warm-up's write is a bundle of its own (it is not held for a batch window).
    big = sum(
        bundle_charge([disk_key("fake", "big", big_etag, o, min(MiB, len(big_data) - o))])
        for o in range(0, len(big_data), MiB)
    )
    one = bundle_charge([dkey(store, "w0")])
    disk = await open_disk(tmp_path, budget=big + 8 * one + one // 2)
    r = reader_over(disk)
    cfg = DataConfig(small_file_max=1 * MiB)
    rb = ObjectReader(DataCache(64 * MiB), cfg, None, disk)
    assert await warm_object(rb, as_store(store), "big", big_etag, len(big_data)) == (
        "written",
        len(big_data),
    )
    outcomes = []
    for i in range(12):
        data, etag = store.objects[f"w{i}"]
        outcomes.append((await warm_object(r, as_store(store), f"w{i}", etag, len(data)))[0])
    assert outcomes == ["written"] * 8 + ["budget"] * 4
    assert r.cache.used_bytes == 0 and disk.stats.evictions == 0
    gets = store.gets
    data, etag = store.objects["w0"]
    assert await warm_object(r, as_store(store), "w0", etag, len(data)) == ("cached", 0)
    assert store.gets == gets  # resumed: nothing fetched again
    for i in range(8):
        assert await read_all(reader_over(disk), store, f"w{i}") == store.objects[f"w{i}"][0]
    assert store.gets == gets
    await disk.close()


# -- the two tiers together --------------------------------------------------------------------


async def epoch(r: ObjectReader, store: FakeStore, keys: list[str], rng: random.Random) -> float:
    order = list(keys)
    rng.shuffle(order)
    before = store.gets
    for k in order:
        etag = store.objects[k][1]
        for off in (0, OBJ // 2):
            await r.read(as_store(store), k, etag, OBJ, off, OBJ // 2)
    return 1 - (store.gets - before) / len(order)


async def test_dataset_eight_times_memory_within_disk_costs_no_get_from_epoch_two(
    tmp_path: Path,
) -> None:
    store = FakeStore()
    keys = [f"d/{i:04d}" for i in range(400)]
    blob = payload(OBJ)
    for i, k in enumerate(keys):
        store.put(k, blob, f'"e{i}"')
    disk = await open_disk(tmp_path)
    r = reader_over(disk, memory=50 * (OBJ + BLOCK_ENTRY_CHARGE_BYTES))
    rng = random.Random(1)
    assert await epoch(r, store, keys, rng) == 0.0
    await disk.drain()
    assert await epoch(r, store, keys, rng) == 1.0
    await disk.close()
    disk2 = await open_disk(tmp_path)  # restarted
    r2 = reader_over(disk2, memory=50 * (OBJ + BLOCK_ENTRY_CHARGE_BYTES))
    assert await epoch(r2, store, keys, rng) == 1.0
    await disk2.close()


async def test_two_tiers_hold_their_sum_in_shuffled_epochs(tmp_path: Path) -> None:
    """Dataset 2x (memory + disk): hit ratio >= 0.9 x (memory + disk) / dataset from the
    second epoch (memory 1/5 of the total; with the tiers holding the same subset it would
    be <= 0.4)."""
    store = FakeStore()
    n = 2000
    keys = [f"t/{i:05d}" for i in range(n)]
    blob = payload(OBJ)
    for i, k in enumerate(keys):
        store.put(k, blob, f'"e{i}"')
    one_disk = charge_of(OBJ + 36 + len("fake\0t/00000\0") + 6)
    disk = await open_disk(tmp_path, budget=800 * one_disk)
    r = reader_over(disk, memory=200 * (OBJ + BLOCK_ENTRY_CHARGE_BYTES))
    rng = random.Random(7)
    ratios = []
    for _ in range(4):
        ratios.append(await epoch(r, store, keys, rng))
        await disk.drain()
        await disk.rescan()  # what the periodic scan does between epochs
        assert disk.used_bytes <= disk.budget_bytes
        assert r.cache.used_bytes <= r.cache.budget_bytes
    print("two tiers, shuffled epochs, hit ratio:", [round(x, 3) for x in ratios])
    assert ratios[0] == 0.0
    assert min(ratios[1:]) >= 0.45  # 0.9 x 1000 / 2000
    await disk.close()


async def test_no_slow_callbacks_with_the_disk_tier(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """File I/O and checksums stay off the loop."""
    loop = asyncio.get_running_loop()
    loop.set_debug(True)
    # A tripwire for I/O on the loop, not a timing test: 0.25 s, as the other tripwires, since
    # a loaded 2-core machine stalls a debug-mode step by 0.1 s now and then (seen in CI).
    loop.slow_callback_duration = 0.25
    store = FakeStore()
    for i in range(50):
        store.put(f"s{i}", payload(1 * MiB, seed=i))
    with caplog.at_level("WARNING", logger="asyncio"):
        disk = await open_disk(tmp_path)
        for i in range(50):
            await read_all(reader_over(disk), store, f"s{i}")
        await disk.drain()
        for i in range(50):
            await read_all(reader_over(disk), store, f"s{i}")
        await disk.close()
    assert disk.stats.hits == 50
    assert not [r.getMessage() for r in caplog.records if "took" in r.getMessage()]


def test_a_small_memory_tier_keeps_its_share_with_image_sized_objects() -> None:
    """Memory 1/10 of the dataset (the per-worker tier in front of a disk tier is small):
    the window floor keeps large objects from turning main over like an LRU (0.015 with a
    1 % window, measured)."""
    rng = random.Random(1)
    sizes = [max(1000, int(rng.lognormvariate(11.3, 0.8))) for _ in range(3000)]
    blob = memoryview(bytes(max(sizes)))
    cache = DataCache(sum(sizes) // 10 + 300 * BLOCK_ENTRY_CHARGE_BYTES)
    ratios = []
    for _ in range(4):
        order = list(range(len(sizes)))
        rng.shuffle(order)
        hits = 0
        for i in order:
            bkey = ("s", str(i), "e", 0)
            if cache.lookup(bkey) is not None:
                hits += 1
                continue
            cache.note_miss(bkey)
            cache.insert(bkey, blob[: sizes[i]])  # type: ignore[arg-type]
            assert cache.used_bytes <= cache.budget_bytes
        ratios.append(hits / len(sizes))
    assert min(ratios[1:]) >= 0.09  # 0.9 x 0.1


# -- real processes ----------------------------------------------------------------------------


def _worker_process(root: str, ident: int, budget: int, barrier: Any) -> None:
    """One 'worker': opens the tier (a scan), waits for the other, then publishes 150 entries
    every worker writes (same names, same bytes) and 150 of its own, as fast as it can."""

    async def run() -> None:
        disk = await open_disk(Path(root), budget=budget)
        await asyncio.to_thread(barrier.wait, 60)
        for i in range(300):
            name = f"shared/{i}" if i < 150 else f"own{ident}/{i}"
            k = disk_key("fake", name, '"e"', 0, 5000)
            if disk.admit(k):
                disk.publish(k, random.Random(name).randbytes(5000))
        await disk.close()

    asyncio.run(run())


async def test_two_worker_processes_share_one_directory_safely(tmp_path: Path) -> None:
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    procs = [
        ctx.Process(target=_worker_process, args=(str(tmp_path), n, 64 * MiB, barrier))
        for n in range(2)
    ]
    await open_disk(tmp_path)  # the layout exists before they race
    for p in procs:
        p.start()
    for p in procs:
        await asyncio.to_thread(p.join, 60)
        assert p.exitcode == 0
    disk = await open_disk(tmp_path)
    assert disk.stats.entries == 450  # 150 shared + 2 x 150 own: renames over each other
    names = [f"shared/{i}" for i in range(150)]
    names += [f"own{n}/{i}" for n in range(2) for i in range(150, 300)]
    for name in names:
        got = await disk.read(disk_key("fake", name, '"e"', 0, 5000))
        assert got == random.Random(name).randbytes(5000), name
    leftovers = await asyncio.to_thread(lambda: list(tmp_path.glob("v2/*/.tmp*")))
    assert disk.stats.corrupt == 0 and not leftovers
    await disk.close()


async def test_workers_overshooting_the_budget_between_scans_are_brought_back(
    tmp_path: Path,
) -> None:
    import multiprocessing

    one = disk_key("fake", "own0/299", '"e"', 0, 5000).charge
    budget = 200 * one  # each worker alone would stay within it; together they do not
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)  # both scan an empty tier, then both write: 250 entries in all
    procs = [
        ctx.Process(target=_worker_process, args=(str(tmp_path), n, budget, barrier))
        for n in range(2)
    ]
    await open_disk(tmp_path)
    for p in procs:
        p.start()
    for p in procs:
        await asyncio.to_thread(p.join, 60)
        assert p.exitcode == 0
    files = await asyncio.to_thread(lambda: list(tmp_path.glob("v2/*/[0-9a-f]*")))
    assert len(files) == 250  # 150 shared + 50 own each: 50 entries over the budget
    disk = await open_disk(tmp_path, budget=budget)  # the next scan (here: at open) shrinks
    assert disk.used_bytes <= budget and disk.stats.evictions > 0
    await disk.close()
