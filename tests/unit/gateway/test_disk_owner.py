"""The disk tier's sole user answers misses without opening a file (``gateway.data.disk``,
"One user, no look-ups"): the name filter (``sharing.NameFilter``), the owner and its guests
(``sharing.presence``), and the tier's behaviour around them: what the owner skips, what a
guest's arrival changes, what a scan restores, and that a shared tier never skips.

Everything runs in ``tmp_path`` over the counting fake store of ``test_datacache``.
"""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path
from typing import Any

import pytest

from gateway.data.config import DiskConfig
from gateway.data.disk import directory, entries
from gateway.data.disk.fileformat import LOCKS, OWNER_LOCK
from gateway.data.disk.sharing import NameFilter, guests_present, presence
from gateway.data.disk.store import DiskStore
from gateway.data.stats import DiskStats
from tests.unit.gateway.test_datacache import FakeStore, payload
from tests.unit.gateway.test_disk_cache import OBJ, dkey, open_disk, read_all, reader_over

# -- the filter ------------------------------------------------------------------------------


def test_a_name_filter_never_forgets_a_name_and_rarely_invents_one() -> None:
    rng = random.Random(7)
    added = [rng.getrandbits(64) for _ in range(100_000)]
    f = NameFilter.sized_for(len(added))
    for h in added:
        f.add(h)
    assert all(h in f for h in added)
    others = [rng.getrandbits(64) for _ in range(100_000)]
    false_present = sum(h in f for h in others)
    assert false_present < 1_000  # < 1 %
    assert f.count == len(added)


def test_a_name_filter_is_bounded() -> None:
    assert NameFilter.sized_for(0).nbytes == NameFilter.MIN_BITS // 8
    assert NameFilter.sized_for(10**9).nbytes == NameFilter.MAX_BITS // 8
    with pytest.raises(ValueError):
        NameFilter(1000)


# -- owner and guests ------------------------------------------------------------------------


def test_the_first_user_owns_the_directory_and_sees_a_guest_arrive(tmp_path: Path) -> None:
    root = str(tmp_path)
    (tmp_path / LOCKS).mkdir()
    owner = presence(root)
    assert owner.owner and not guests_present(owner.guests_fd)
    mark = owner.mark()
    guest = presence(root)  # another open: another lock holder, as another process would be
    assert not guest.owner
    assert guests_present(owner.guests_fd)
    assert owner.mark() != mark  # the guest's nonce, seen through the mapping
    guest.close()
    assert not guests_present(owner.guests_fd)
    owner.close()
    again = presence(root)  # the owner left (or died): the next user owns it
    assert again.owner
    again.close()


# -- the tier --------------------------------------------------------------------------------


def count_verifies(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names the tier opened (``entries.verify`` runs on its executor)."""
    opened: list[str] = []
    real = entries.verify

    def verify(path: str, *a: Any) -> Any:
        opened.append(path)
        return real(path, *a)

    monkeypatch.setattr(entries, "verify", verify)
    return opened


def objects(n: int) -> tuple[FakeStore, list[str]]:
    store = FakeStore()
    keys = [f"img/{i}.jpg" for i in range(n)]
    for i, k in enumerate(keys):
        store.put(k, payload(OBJ + i, seed=i))
    return store, keys


async def read_each(disk: DiskStore, store: FakeStore, keys: list[str]) -> None:
    """Read every key whole through a fresh reader (a cold memory tier), bytes checked."""
    r = reader_over(disk)
    for k in keys:
        assert await read_all(r, store, k) == store.objects[k][0]


async def test_the_sole_user_opens_no_file_for_what_is_not_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, keys = objects(10)
    disk = await open_disk(tmp_path)
    assert disk.stats.name_filter_bytes == NameFilter.MIN_BITS // 8
    opened = count_verifies(monkeypatch)
    await read_each(disk, store, keys)
    assert opened == [] and disk.stats.lookups_skipped == 10 and disk.stats.misses == 10
    await disk.drain()
    # What it wrote it finds (one open each, verified as always), from a cold memory tier.
    await read_each(disk, store, keys)
    assert len(opened) == 10 and disk.stats.hits == 10 and store.gets == 10
    assert await disk.contains(dkey(store, keys[0]))
    store.put("new", payload(OBJ, seed=99))
    assert not await disk.contains(dkey(store, "new")) and len(opened) == 10
    await disk.close()


async def test_a_restarted_owner_knows_what_its_predecessor_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, keys = objects(10)
    a = await open_disk(tmp_path)
    await read_each(a, store, keys)
    await a.close()
    b = await open_disk(tmp_path)  # its scan built the filter from the names on disk
    opened = count_verifies(monkeypatch)
    await read_each(b, store, keys)
    assert b.stats.hits == 10 and b.stats.lookups_skipped == 0 and store.gets == 10
    assert len(opened) == 10
    await b.close()


async def test_a_guest_stops_the_skipping_at_once_and_a_scan_without_it_restores_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, keys = objects(20)
    owner = await open_disk(tmp_path)
    guest = await open_disk(tmp_path)  # a second unshared user of the directory
    assert owner.stats.name_filter_bytes > 0 and guest.stats.name_filter_bytes == 0
    await read_each(guest, store, keys[:10])
    await guest.drain()
    assert store.gets == 10
    # The owner never saw those names, but it sees the guest's nonce: it looks, and finds.
    await read_each(owner, store, keys[:10])
    assert store.gets == 10 and owner.stats.hits == 10 and owner.stats.lookups_skipped == 0
    assert owner.stats.name_filter_bytes == 0  # dropped at the first look after the guest came
    await owner.rescan()  # a guest is there: no filter
    assert owner.stats.name_filter_bytes == 0
    await guest.close()
    await owner.rescan()  # alone again: a filter of every name, the guest's included
    assert owner.stats.name_filter_bytes > 0
    opened = count_verifies(monkeypatch)
    await read_each(owner, store, keys)
    assert owner.stats.hits == 20 and owner.stats.lookups_skipped == 10
    assert len(opened) == 10 and store.gets == 20
    await owner.close()


async def test_names_written_while_a_scan_runs_stay_known(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, keys = objects(4)
    disk = await open_disk(tmp_path)
    guest = await open_disk(tmp_path)  # came and went: the owner's next scan rebuilds
    await guest.close()
    assert not await disk.contains(dkey(store, keys[0])) and disk.stats.name_filter_bytes == 0
    real_scan = directory.scan
    scanning = asyncio.Event()
    loop = asyncio.get_running_loop()

    def slow_scan(*a: Any) -> directory.Scan:
        assert a[2] >= 0  # a rebuild: the guests' lock is asked, the names collected
        sc = real_scan(*a)  # it saw nothing yet; the entries are written while it "runs"
        loop.call_soon_threadsafe(scanning.set)
        time.sleep(0.3)
        return sc

    monkeypatch.setattr(directory, "scan", slow_scan)
    task = asyncio.create_task(disk.rescan())
    await scanning.wait()
    await read_each(disk, store, keys)
    await disk.drain()
    await task
    assert disk.stats.name_filter_bytes > 0
    await read_each(disk, store, keys)
    assert disk.stats.hits == 4 and store.gets == 4
    await disk.close()


async def test_a_routine_rescan_keeps_the_filter_and_collects_no_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, keys = objects(3)
    disk = await open_disk(tmp_path)
    asked: list[int] = []
    real_scan = directory.scan

    def scan(*a: Any) -> directory.Scan:
        asked.append(a[2])
        return real_scan(*a)

    monkeypatch.setattr(directory, "scan", scan)
    await read_each(disk, store, keys)
    await disk.drain()
    await disk.rescan()
    assert asked == [-1] and disk.stats.name_filter_bytes > 0
    opened = count_verifies(monkeypatch)
    await read_each(disk, store, keys)  # what it wrote: found, one open each
    store.put("new", payload(OBJ, seed=42))
    await read_each(disk, store, ["new"])  # not there: no open
    assert len(opened) == 3 and disk.stats.hits == 3 and disk.stats.lookups_skipped == 4
    await disk.close()


async def test_a_shared_tier_always_looks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store, keys = objects(5)
    disk = await DiskStore.open(tmp_path, DiskConfig(min_free=0), DiskStats(), shared=True)
    assert disk is not None and disk.stats.name_filter_bytes == 0
    opened = count_verifies(monkeypatch)
    await read_each(disk, store, keys)
    assert len(opened) == 5 and disk.stats.lookups_skipped == 0
    await disk.close()


async def test_a_tier_whose_owner_lock_cannot_be_opened_works_without_skipping(
    tmp_path: Path,
) -> None:
    store, keys = objects(3)
    (tmp_path / "v2" / LOCKS / OWNER_LOCK).mkdir(parents=True)  # EISDIR
    disk = await open_disk(tmp_path)
    assert disk.stats.name_filter_bytes == 0
    await read_each(disk, store, keys)
    await disk.drain()
    assert disk.stats.lookups_skipped == 0 and disk.stats.writes == 3
    await disk.close()
