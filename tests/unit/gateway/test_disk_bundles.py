"""The disk tier's bundles (layout v2, ``gateway.data.disk.fileformat``): several entries in one
inode, one hard link per entry name. What is checked: each entry of a bundle is read and
verified on its own (and mapped as a slice charged its own pages); a damaged entry is
dropped alone (its name unlinked) while its neighbours still verify; a damaged or random
table is a BAD entry, never an exception (a small fuzz); eviction takes whole bundles and
frees their bytes only with their last name, the accounting matching the directory after a
rescan; a writer that crashed between link and unlink leaves a temporary name that is
removed by its birth time even while the bundle's entries are hit; batches are written at
``bundle_entries``, at ``bundle_bytes``, after ``bundle_window_s``, and by ``drain``/
``close``; an older layout's directory is removed in bounded steps and never read.

Everything runs in ``tmp_path``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import time
from pathlib import Path
from typing import Any

import pytest

from gateway.data.config import DiskConfig
from gateway.data.disk import budget, directory, entries
from gateway.data.disk.entries import BAD, HIT, MISS
from gateway.data.disk.fileformat import DiskKey, bundle_charge, charge_of, disk_key, find_in_table
from gateway.data.disk.store import DiskStore
from gateway.data.mappings import mapped_size
from gateway.data.stats import DiskStats

MiB = 1 << 20
OBJ = 16_000


async def open_disk(d: Path, budget: int = 64 * MiB, **kw: Any) -> DiskStore:
    disk = await DiskStore.open(d, DiskConfig(budget=budget, min_free=0, **kw), DiskStats())
    assert disk is not None
    return disk


def entry(i: int, n: int = OBJ) -> tuple[DiskKey, bytes]:
    return disk_key("s", f"k/{i}", '"e"', 0, n), random.Random(i).randbytes(n)


async def publish_all(disk: DiskStore, items: list[tuple[DiskKey, bytes]]) -> list[bool]:
    tasks = []
    for k, data in items:
        assert disk.admit(k)
        tasks.append(disk.publish(k, data))
    await disk.drain()
    return [t.result() for t in tasks]


def there(path: str) -> bool:
    return os.path.exists(path)


def poke(path: str, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:  # in place: every name of the bundle sees it
        f.seek(offset)
        f.write(data)


def flip_body(path: str, k: DiskKey) -> None:
    """Flip a bit of ``k``'s body inside its bundle."""
    with open(path, "rb") as f:
        why, off, nbytes = find_in_table(f.read(4096), k.name)
    assert not why
    with open(path, "rb") as f:
        f.seek(off + nbytes - 10)
        c = f.read(1)
    poke(path, off + nbytes - 10, bytes([c[0] ^ 0x10]))


def inode_sizes(root: str) -> int:
    """The directory's real size as the tier charges it: each inode once, in 4 KiB blocks."""
    seen: dict[int, int] = {}
    for sub in os.listdir(root):
        if sub == "locks":
            continue
        for name in os.listdir(os.path.join(root, sub)):
            st = os.stat(os.path.join(root, sub, name))
            if not name.startswith("."):
                seen[st.st_ino] = charge_of(st.st_size)
    return sum(seen.values())


async def test_a_bundle_holds_several_entries_each_read_and_verified(tmp_path: Path) -> None:
    disk = await open_disk(tmp_path)
    items = [entry(i, OBJ + 1000 * i) for i in range(5)]
    assert await publish_all(disk, items) == [True] * 5
    stats = [os.stat(disk.path(k)) for k, _ in items]
    assert len({st.st_ino for st in stats}) == 1 and stats[0].st_nlink == 5  # one inode
    assert disk.used_bytes == bundle_charge([k for k, _ in items]) == charge_of(stats[0].st_size)
    assert not list((tmp_path / "v2").glob("*/.tmp*"))  # the temporary name is gone
    for k, data in items:
        assert await disk.read(k, mapped=False) == data
        body = await disk.read(k, mapped=True)
        assert isinstance(body, memoryview) and bytes(body) == data
        # A mapping of the pages the body spans, not of its whole bundle: a fault may map
        # as much of a large page-cache folio as the mapping reaches.
        pages = memoryview(body.obj).nbytes
        assert mapped_size(body) == charge_of(pages) <= charge_of(len(data)) + 4096
        assert pages < stats[0].st_size
        assert entries.read_entry(disk.path(k), k) == (HIT, data, "")
    assert disk.stats.hits == 10 and disk.stats.corrupt == 0
    await disk.rescan()
    assert disk.used_bytes == inode_sizes(disk.root) and disk.stats.entries == 5
    await disk.close()


async def test_a_shared_tier_hands_each_publisher_a_slice_of_the_bundle(tmp_path: Path) -> None:
    disk = await DiskStore.open(tmp_path, DiskConfig(budget=64 * MiB, min_free=0), shared=True)
    assert disk is not None
    items = [entry(i) for i in range(3)]
    got: dict[str, memoryview] = {}
    for k, data in items:
        assert disk.admit(k)
        disk.publish(k, data, lambda v, name=k.name: got.__setitem__(name, v))
    await disk.drain()
    assert {n: bytes(v) for n, v in got.items()} == {k.name: d for k, d in items}
    size = os.stat(disk.path(items[0][0])).st_size
    for k, data in items:  # each its own pages, not the whole bundle
        assert memoryview(got[k.name].obj).nbytes <= charge_of(len(data)) + 4096 < size
    await disk.close()


async def test_a_damaged_entry_in_a_bundle_is_dropped_alone(tmp_path: Path) -> None:
    disk = await open_disk(tmp_path)
    items = [entry(i) for i in range(3)]
    await publish_all(disk, items)
    used = disk.used_bytes
    (k0, d0), (k1, _), (k2, d2) = items
    path = disk.path(k1)
    flip_body(path, k1)
    assert await disk.read(k1) is None
    assert disk.stats.corrupt == 1 and not there(path)  # only its name unlinked
    assert os.stat(disk.path(k0)).st_nlink == 2
    assert disk.used_bytes == used  # the bundle's bytes are still held by two names
    assert await disk.read(k0, mapped=False) == d0 and await disk.read(k2, mapped=False) == d2
    assert disk.stats.corrupt == 1
    await disk.close()


async def test_a_bundle_whose_table_is_damaged_frees_its_bytes_with_its_last_name(
    tmp_path: Path,
) -> None:
    disk = await open_disk(tmp_path)
    items = [entry(i) for i in range(2)]
    await publish_all(disk, items)
    poke(disk.path(items[0][0]), 30, b"\xff")  # a row of the table: its CRC fails, for all
    assert await disk.read(items[0][0]) is None
    assert disk.used_bytes == bundle_charge([k for k, _ in items])
    assert await disk.read(items[1][0]) is None
    assert disk.used_bytes == 0 and disk.stats.corrupt == 2
    assert inode_sizes(disk.root) == 0
    await disk.close()


def test_random_damage_to_a_bundle_is_never_served_nor_raised(tmp_path: Path) -> None:
    """A small fuzz of the table and headers: random flips, truncations and garbage in a
    bundle's first page are BAD or MISS for every name (a HIT only with the right bytes)."""
    root = str(tmp_path)
    for sub in ("00", "ff", *(f"{i:02x}" for i in range(256))):
        os.makedirs(os.path.join(root, sub), exist_ok=True)
    items = [entry(i, 3000 + i) for i in range(4)]
    keys = [k for k, _ in items]
    rng = random.Random(5)
    for trial in range(150):
        for k in keys:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(root, k.name[:2], k.name))
        status, _, _, _ = entries.write_bundle(
            root, keys, [d for _, d in items], 0, f".tmp.{trial}.0.{int(time.time())}"
        )
        assert status == [entries.WRITTEN] * 4
        path = os.path.join(root, keys[0].name[:2], keys[0].name)
        raw = bytearray(Path(path).read_bytes())
        kind = trial % 3
        if kind == 0:
            for _ in range(rng.randint(1, 4)):
                raw[rng.randrange(min(len(raw), 4096 + 64))] ^= 1 << rng.randrange(8)
        elif kind == 1:
            raw = raw[: rng.randrange(len(raw))]
        else:
            raw[: rng.randrange(1, 200)] = rng.randbytes(rng.randrange(1, 200))
        with open(path, "r+b") as f:  # in place: every name of the bundle sees it
            f.truncate(0)
            f.write(raw)
        for (k, data), mapped in zip(items, (False, True, False, True), strict=True):
            st, body, why, _ = entries.verify(os.path.join(root, k.name[:2], k.name), k, mapped)
            assert st in (HIT, BAD, MISS)
            if st == HIT:
                assert bytes(body) == data
            else:
                assert body == b"" and (st == MISS or why)
    for _ in range(2000):
        page = rng.randbytes(rng.randrange(0, 5000))
        if rng.random() < 0.5 and len(page) >= 8:  # a plausible head
            page = b"NFGB\x02\x00" + bytes([rng.randrange(256), 0]) + page[8:]
        why, off, nbytes = find_in_table(page, keys[0].name)
        assert why or (off >= 44 and nbytes >= 0)


async def test_eviction_takes_whole_bundles_and_frees_their_bytes_with_the_last_name(
    tmp_path: Path,
) -> None:
    one = bundle_charge([entry(i)[0] for i in range(4)])
    disk = await open_disk(tmp_path, budget=2 * one + one // 8, bundle_entries=4)
    old, newer = [entry(i) for i in range(4)], [entry(i) for i in range(4, 8)]
    await publish_all(disk, old)
    t = time.time() - 100
    for k, _ in old:  # the older bundle (one inode: one mtime for all its names)
        os.utime(disk.path(k), (t, t))
    await publish_all(disk, newer)
    await disk.rescan()
    assert disk.used_bytes == 2 * one == inode_sizes(disk.root)
    hot, hot_data = entry(100)
    for _ in range(3):  # a lookup that misses counts a visit: the second wins the duel
        assert await disk.read(hot) is None
        if disk.admit(hot):
            disk.publish(hot, hot_data)
            break
    assert disk.stats.rejected == 1  # est(new) - 1 = 0 ties the never-read victims' 0
    await disk.drain()
    # The whole older bundle went: its four names, its bytes once.
    assert [there(disk.path(k)) for k, _ in old] == [False] * 4
    assert all(there(disk.path(k)) for k, _ in newer)
    assert disk.stats.evictions == 4 and disk.stats.evicted_bytes == one
    assert disk.used_bytes == inode_sizes(disk.root) <= disk.budget_bytes
    await disk.rescan()
    assert disk.used_bytes == inode_sizes(disk.root)
    await disk.close()


def test_a_bundle_is_freed_only_when_its_last_name_goes(tmp_path: Path) -> None:
    root, _, _ = directory.prepare(tmp_path)
    items = [entry(i) for i in range(3)]
    entries.write_bundle(root, [k for k, _ in items], [d for _, d in items], 0, ".tmp.1.0.0")
    sc = directory.scan(root, 100)
    assert sc.entries == 3 and sc.bundles == 1 and len(sc.oldest) == 1
    (v,) = sc.oldest
    assert sorted(v.names) == sorted(k.name for k, _ in items)
    unseen = v.names.pop()  # a name the scan did not see (linked during it)
    assert directory.evict(root, [v]) == (2, 0)  # unlinked, but nothing freed
    assert directory.scan(root, 100).used == v.charge
    v.names = [unseen]
    assert directory.evict(root, [v]) == (1, v.charge)
    assert directory.scan(root, 100).used == 0


async def test_a_touched_bundle_is_not_evicted_and_the_accounting_says_so(
    tmp_path: Path,
) -> None:
    disk = await open_disk(tmp_path)
    items = [entry(i) for i in range(2)]
    await publish_all(disk, items)
    await disk.rescan()
    used = disk.used_bytes
    (v,) = list(disk._oldest)
    later = time.time() + 5
    os.utime(disk.path(items[1][0]), (later, later))  # a hit on one name touches the inode
    disk._used -= v.charge  # what _make_room takes off when it picks the victim
    disk._evict_later([v], v.charge)
    await disk.drain()
    assert all(there(disk.path(k)) for k, _ in items)
    assert disk.used_bytes == used and disk.stats.evictions == 0
    await disk.close()


def test_a_writer_that_crashed_between_link_and_unlink(tmp_path: Path) -> None:
    """Its temporary name is one more link to a bundle whose entries are fine: the scan
    charges the bundle once, and removes the temporary name by the birth time in its name
    (an hour), although hits on the entries keep the shared inode's mtime fresh."""
    root, _, _ = directory.prepare(tmp_path)
    items = [entry(i) for i in range(2)]
    keys = [k for k, _ in items]
    entries.write_bundle(root, keys, [d for _, d in items], 0, ".tmp.1.0.0")
    d = os.path.join(root, keys[0].name[:2])
    path0 = os.path.join(d, keys[0].name)
    born = int(time.time())
    crashed = os.path.join(d, f".tmp.4242.7.{born - 2 * 3600}")  # two hours ago
    recent = os.path.join(d, f".tmp.4243.8.{born}")
    os.link(path0, crashed)
    os.link(path0, recent)
    directory.touch(root, [keys[1].name])  # a hit: mtime now
    for k, data in items:
        assert entries.read_entry(os.path.join(root, k.name[:2], k.name), k) == (HIT, data, "")
    sc = directory.scan(root, 100)
    assert sc.used == bundle_charge(keys) and sc.entries == 2
    assert not os.path.exists(crashed) and os.path.exists(recent)
    assert os.stat(path0).st_nlink == 3
    # A temporary file that was never linked: by its mtime, as in layout v1.
    lone = os.path.join(d, ".tmp.99.1")
    open(lone, "wb").close()
    os.utime(lone, (born - 7200, born - 7200))
    directory.scan(root, 100)
    assert not os.path.exists(lone)


async def test_a_batch_is_written_at_its_size_or_after_its_window(tmp_path: Path) -> None:
    disk = await open_disk(tmp_path, bundle_entries=3, bundle_window_s=0.5)
    items = [entry(i) for i in range(4)]
    tasks = []
    for k, data in items:
        assert disk.admit(k)
        tasks.append(disk.publish(k, data))
    await asyncio.wait_for(asyncio.gather(*tasks[:3]), 5)  # three: written at once
    assert all(t.result() for t in tasks[:3]) and not tasks[3].done()
    await asyncio.sleep(0.05)
    assert not tasks[3].done()  # alone in its batch: waits for the window
    t0 = time.monotonic()
    assert await asyncio.wait_for(tasks[3], 5)
    assert time.monotonic() - t0 < 3.0
    inodes = {os.stat(disk.path(k)).st_ino for k, _ in items}
    assert len(inodes) == 2 and disk.stats.writes == 4
    # Bytes: an entry that does not fit the open batch's bytes starts the next one.
    by_bytes = await open_disk(tmp_path / "b", bundle_bytes=2 * OBJ + 100, bundle_window_s=30)
    items = [entry(i) for i in range(10, 15)]
    tasks = []
    for k, data in items:
        assert by_bytes.admit(k)
        tasks.append(by_bytes.publish(k, data))
    await asyncio.wait_for(asyncio.gather(*tasks[:4]), 5)  # two bundles of two
    assert not tasks[4].done()
    await by_bytes.close()  # close writes the open batch
    assert tasks[4].done() and tasks[4].result()
    assert len({os.stat(by_bytes.path(k)).st_ino for k, _ in items}) == 3
    await disk.close()


async def test_close_writes_the_open_batch_and_a_restart_reads_it(tmp_path: Path) -> None:
    disk = await open_disk(tmp_path, bundle_window_s=60)
    items = [entry(i) for i in range(3)]
    tasks = []
    for k, data in items:
        assert disk.admit(k)
        tasks.append(disk.publish(k, data))
    await asyncio.sleep(0.01)
    assert not any(t.done() for t in tasks)
    await disk.close()
    assert all(t.result() for t in tasks) and disk.stats.writes == 3
    again = await open_disk(tmp_path)
    assert again.stats.entries == 3
    for k, data in items:
        assert await again.read(k, mapped=False) == data
    await again.close()


async def test_a_publish_of_a_name_already_there_is_counted_present(tmp_path: Path) -> None:
    a, b = await open_disk(tmp_path), await open_disk(tmp_path)
    items = [entry(i) for i in range(3)]
    await publish_all(a, items[:2])
    assert await publish_all(b, items) == [False, False, True]
    assert b.stats.duplicate_fetches == 2 and b.stats.writes == 1
    assert b.used_bytes == bundle_charge([items[2][0]])
    await a.close()
    await b.close()


async def test_an_old_layout_is_removed_in_bounded_steps_and_never_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    k, _ = entry(1)
    old = tmp_path / "v1"
    for sub in ("00", k.name[:2], "locks"):
        (old / sub).mkdir(parents=True, exist_ok=True)
    (old / k.name[:2] / k.name).write_bytes(b"a v1 entry file")
    for i in range(9):
        (old / "00" / f"{i:032x}").write_bytes(b"x")
    (old / "locks" / "abc").write_bytes(b"")
    monkeypatch.setattr(budget, "SWEEP_FILES", 4)
    disk = await open_disk(tmp_path)
    assert await disk.read(k) is None and disk.stats.misses == 1  # v1 is not read
    rounds = 0
    while old.exists():
        await disk.sweep_old_layouts()
        rounds += 1
        assert rounds <= 4  # 11 files, 4 per round
    assert rounds == 3 and disk._swept
    assert (tmp_path / "v2" / "ff").is_dir()
    await disk.close()


async def test_a_filesystem_without_hard_links_turns_the_tier_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_links(src: Any, dst: Any, **kw: Any) -> None:
        raise OSError(1, "Operation not permitted", str(dst))

    monkeypatch.setattr(os, "link", no_links)
    stats = DiskStats()
    assert await DiskStore.open(tmp_path, DiskConfig(budget=MiB, min_free=0), stats) is None
    assert stats.enabled == 0
    assert not [p for p in (tmp_path / "v2").iterdir() if p.name.startswith(".")]
