"""Serving a pack in-process: a pack written into a ``MemoryStore`` in the documented
layout (``gateway.pack.format``; the tests of ``nfsgw pack`` itself run it against SeaweedFS in
``tests/integration/test_pack.py``), an export with ``pack = ...``, whole RPC records in.

- Every byte right; a cold read of the tree costs one range GET per ``range_bytes`` of shard,
  not one per file; with ``immutable`` the listings come from the index (no LIST of the tree).
- An object replaced after packing is served from the bucket (its new bytes).
- A member whose bytes fail their CRC is served from its own object, counted.
- A missing, truncated, foreign-version or wrong-source index, or a missing shard: the export
  serves the bucket, the reason is in ``status``.
"""

from __future__ import annotations

import asyncio
import gzip
import io
import os
import random
import tarfile
import zlib
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from gateway.backend import checksums
from gateway.backend.memory import MemoryStore
from gateway.data import DataCache, DataConfig, DataStats, ObjectReader
from gateway.data.cache import BLOCK_ENTRY_CHARGE_BYTES
from gateway.data.config import DiskConfig
from gateway.data.disk.fileformat import disk_key
from gateway.data.disk.store import DiskStore
from gateway.data.mappings import is_mapping
from gateway.data.prefetch import DataPrefetcher
from gateway.exports import ExportConfig
from gateway.namespace.columns import Columns
from gateway.pack.format import (
    END_OF_ARCHIVE,
    INDEX_NAME,
    UNPACKED_NAME,
    Member,
    Shard,
    Unpacked,
    format_index,
    format_unpacked,
    member_header,
    padding,
    shard_name,
)
from gateway.pack.store import PackConfig, PackedStore
from gateway.pack.tiers import NO_TIERS, ReaderTiers
from nfsproto.nfs3 import NfsStat3
from tests.harness.memory import MemoryGateway

KiB = 1024
MiB = 1024 * KiB
PACK = "s3://b/packs/ds/"


def tree(n: int = 120, seed: int = 3) -> dict[str, bytes]:
    rng = random.Random(seed)
    files = {
        f"ds/c{i % 4}/img {i:03d} ü.jpg": rng.randbytes(rng.randrange(1, 40 * KiB))
        for i in range(n)
    }
    files["ds/c0/empty.jpg"] = b""
    return files


def write_pack(
    store: MemoryStore, files: Mapping[str, bytes], shard_bytes: int = 1 * MiB
) -> list[Member]:
    """Pack ``files`` (keys under ds/) as ``nfsgw pack s3://b/ds/ --to s3://b/packs/ds`` does."""
    members: list[Member] = []
    shards: list[Shard] = []
    buf = bytearray()

    def close() -> None:
        if buf:
            buf.extend(END_OF_ARCHIVE)
            name = shard_name(len(shards))
            store.seed("packs/ds/" + name, bytes(buf))
            shards.append(Shard(len(shards), name, len(buf)))
            buf.clear()

    for key in sorted(files, key=lambda k: k.encode()):
        data, path = files[key], key.removeprefix("ds/")
        info = store._objects[key.encode()]
        buf += member_header(path, len(data), info.mtime_ns)
        members.append(
            Member(
                path, len(data), info.mtime_ns, info.etag, len(shards), len(buf), zlib.crc32(data)
            )
        )
        buf += data + padding(len(data))
        if len(buf) >= shard_bytes:
            close()
    close()
    text = "".join(format_index("s3://b/ds/", shards, members)).encode()
    store.seed("packs/ds/" + INDEX_NAME, gzip.compress(text))
    left = [
        Unpacked(o.key.removeprefix("ds/"), len(o.data), o.mtime_ns, o.etag)
        for o in store._objects.values()
        if o.key.startswith("ds/") and (o.key.endswith("/") or o.key not in files)
    ]
    text = "".join(format_unpacked(left)).encode()
    store.seed("packs/ds/" + UNPACKED_NAME, gzip.compress(text))
    return members


def gateway(tmp_path: Path, store: MemoryStore, **export: Any) -> MemoryGateway:
    ec = ExportConfig("/data", "s3://b/ds/", read_only=True, pack=PACK, **export)
    return MemoryGateway.of(tmp_path, [ec], store=store)


async def loaded(gw: MemoryGateway) -> PackedStore:
    store = gw.export("/data").store
    assert isinstance(store, PackedStore)
    async with asyncio.timeout(10):
        while store.status == "loading":  # noqa: ASYNC110 - the index loads in a task
            await asyncio.sleep(0.01)
    return store


async def read_tree(gw: MemoryGateway, files: Mapping[str, bytes]) -> None:
    root = await gw.mount(b"/data")
    order = sorted(files)
    random.Random(1).shuffle(order)
    for key in order:
        fh = await gw.walk(root, key.removeprefix("ds/"))
        res = await gw.read(fh)
        assert res.status == NfsStat3.NFS3_OK, key
        assert bytes(res.data) == files[key], key


def gets(store: MemoryStore, prefix: str) -> int:
    return sum(1 for op, k in store.log if op == "get" and k.startswith(prefix))


@pytest.mark.parametrize("immutable", [True, False])
async def test_a_packed_tree_is_served_from_its_shards(tmp_path: Path, immutable: bool) -> None:
    files = tree()
    store = MemoryStore("mem")
    for k, v in files.items():
        store.seed(k, v)
    write_pack(store, files)
    async with gateway(tmp_path, store, immutable=immutable) as gw:
        packed = await loaded(gw)
        assert packed.status == "ok" and packed.stats.entries == len(files)
        store.reset_counts()
        await read_tree(gw, files)
        assert gets(store, "ds/") == 0  # no object GET
        shards = [len(v) for k, v in store_items(store) if k.startswith("packs/ds/shard-")]
        assert gets(store, "packs/") == sum(-(-n // (8 * MiB)) for n in shards)  # per range
        lists = [k for op, k in store.log if op == "list"]
        assert (lists == []) if immutable else lists  # listings from the index when immutable
        assert packed.stats.corrupt == 0 and packed.stats.members >= 1


def store_items(store: MemoryStore) -> list[tuple[str, bytes]]:
    return [(o.key, o.data) for o in store._objects.values()]


async def test_a_replaced_object_is_served_from_the_bucket(tmp_path: Path) -> None:
    files = tree(40)
    store = MemoryStore("mem")
    for k, v in files.items():
        store.seed(k, v)
    write_pack(store, files)
    files["ds/c1/img 001 ü.jpg"] = b"replaced after packing"
    store.seed("ds/c1/img 001 ü.jpg", files["ds/c1/img 001 ü.jpg"])
    async with gateway(tmp_path, store) as gw:
        packed = await loaded(gw)
        await read_tree(gw, files)
        assert packed.stats.fallbacks == 1


async def test_a_damaged_member_is_served_from_its_object(tmp_path: Path) -> None:
    files = tree(40)
    store = MemoryStore("mem")
    for k, v in files.items():
        store.seed(k, v)
    members = write_pack(store, files)
    m = next(m for m in members if m.size > 100)
    shard = store._objects[f"packs/ds/{shard_name(m.shard)}".encode()]
    data = bytearray(shard.data)
    data[m.offset + 50] ^= 0xFF
    shard.data = bytes(data)  # same size: only the CRC can tell
    async with gateway(tmp_path, store) as gw:
        packed = await loaded(gw)
        await read_tree(gw, files)
        assert packed.stats.corrupt >= 1
        assert gets(store, "ds/" + m.path) == 1


def _truncate(raw: bytes) -> bytes:
    text = gzip.decompress(raw)
    return gzip.compress(text[: len(text) // 2])


def _version(raw: bytes) -> bytes:
    return gzip.compress(gzip.decompress(raw).replace(b"nfsgw-pack\t1\t", b"nfsgw-pack\t9\t", 1))


def _source(raw: bytes) -> bytes:
    return gzip.compress(gzip.decompress(raw).replace(b"s3://b/ds/", b"s3://b/other/", 1))


BAD: dict[str, tuple[Callable[[MemoryStore], None], str]] = {
    "missing": (lambda s: s.unseed("packs/ds/" + INDEX_NAME), "cannot read the index"),
    "truncated": (lambda s: _rewrite(s, _truncate), "index"),
    "version": (lambda s: _rewrite(s, _version), "version '9'"),
    "source": (lambda s: _rewrite(s, _source), "made from s3://b/other/"),
    "not gzip": (lambda s: _put(s, "packs/ds/" + INDEX_NAME, b"hello"), "pack not used"),
    "shard missing": (lambda s: s.unseed("packs/ds/" + shard_name(1)), "missing"),
}


def _put(store: MemoryStore, key: str, data: bytes) -> None:
    store.seed(key, data)


def _rewrite(store: MemoryStore, f: Callable[[bytes], bytes]) -> None:
    key = "packs/ds/" + INDEX_NAME
    store.seed(key, f(store._objects[key.encode()].data))


@pytest.mark.parametrize("bad", sorted(BAD))
async def test_a_bad_pack_leaves_the_export_on_the_bucket(tmp_path: Path, bad: str) -> None:
    files = tree(60)
    store = MemoryStore("mem")
    for k, v in files.items():
        store.seed(k, v)
    write_pack(store, files, shard_bytes=256 * KiB)
    damage, why = BAD[bad]
    damage(store)
    async with gateway(tmp_path, store, immutable=True) as gw:
        packed = await loaded(gw)
        assert packed.status.startswith("pack not used") and why in packed.status, packed.status
        assert packed.stats.load_errors == 1 and packed.stats.loaded == 0
        await read_tree(gw, files)  # every byte right, from the objects
        assert gets(store, "packs/ds/shard-") == 0


def test_the_shards_are_plain_tar() -> None:
    files = tree(30)
    store = MemoryStore("mem")
    for k, v in files.items():
        store.seed(k, v)
    write_pack(store, files, shard_bytes=64 * KiB)
    seen = {}
    for key, data in store_items(store):
        if key.startswith("packs/ds/shard-"):
            with tarfile.open(fileobj=io.BytesIO(data)) as tf:
                for ti in tf.getmembers():
                    f = tf.extractfile(ti)
                    assert f is not None
                    seen["ds/" + ti.name] = f.read()
    assert seen == files


async def test_a_shard_lost_after_loading_falls_back_to_the_objects(tmp_path: Path) -> None:
    files = tree(60)
    store = MemoryStore("mem")
    for k, v in files.items():
        store.seed(k, v)
    write_pack(store, files, shard_bytes=256 * KiB)
    async with gateway(tmp_path, store, immutable=True) as gw:
        packed = await loaded(gw)
        store.unseed("packs/ds/" + shard_name(0))  # deleted under a running gateway
        await read_tree(gw, files)  # every byte right: shard 0's members from their objects
        assert packed.stats.fallbacks >= 1 and packed.stats.members >= 1


@pytest.mark.parametrize("quoted", [True, False])
def test_the_index_gives_etags_back_as_its_source_listed_them(quoted: bool) -> None:
    from gateway.pack.format import parse_index

    def tag(i: int) -> str:
        h = f"{i:032x}"
        return f'"{h}"' if quoted else h

    members = [Member(f"d/f{i}", 1, 0, tag(i), 0, 512 * (2 * i + 1), 0) for i in range(5)]
    members.append(Member("d/multi", 1, 0, '"abc-2"' if quoted else "abc-2", 0, 8192, 0))
    text = "".join(format_index("s3://b/ds/", [Shard(0, "shard-000000.tar", 9000)], members))
    index = parse_index(text.encode())
    assert [index.etag(i) for i in range(index.n)] == [m.etag for m in members]


async def test_keys_the_pack_does_not_hold_are_listed_with_the_index(tmp_path: Path) -> None:
    """Immutable listings from the index add ``unpacked.tsv.gz``'s keys: an empty directory
    that exists only as its marker, an object added after packing."""
    files = tree(40)
    store = MemoryStore("mem")
    for k, v in files.items():
        store.seed(k, v)
    store.seed("ds/c0/empty-dir/", b"")
    store.seed("ds/late.jpg", b"added after packing")
    write_pack(store, {k: v for k, v in files.items()})
    files["ds/late.jpg"] = b"added after packing"
    async with gateway(tmp_path, store, immutable=True) as gw:
        await loaded(gw)
        store.reset_counts()
        root = await gw.mount(b"/data")
        c0 = await gw.walk(root, "c0")
        res = await gw.lookup(c0, b"empty-dir")
        assert res.status == NfsStat3.NFS3_OK
        await read_tree(gw, files)
        assert [op for op, _ in store.log if op == "list"] == []


# -- members without copies, the shared tier, whole groups prefetched ----------------------
#
# A ``PackedStore`` in front of the data layer as the composition root wires it
# (``tiers=ReaderTiers(reader, name)``, the prefetcher's ``covered``),
# with one ``ObjectReader`` per simulated worker process; two workers share one
# disk tier directory as in tests/unit/gateway/test_shared_cache.py (``flock`` claims conflict
# between two open files of one process exactly as between two processes).


def group_tree(n: int = 60, seed: int = 5) -> dict[str, bytes]:
    """``n`` files of 20-60 KiB in one directory: with 1 MiB groups, several groups."""
    rng = random.Random(seed)
    return {
        f"ds/c0/f{i:03d}.jpg": rng.randbytes(rng.randrange(20 * KiB, 60 * KiB)) for i in range(n)
    }


class Worker:
    """One simulated worker: its own ``PackedStore`` and data layer over the shared bucket."""

    def __init__(
        self,
        store: MemoryStore,
        disk: DiskStore | None,
        budget: int = 64 * MiB,
        tiers: type[ReaderTiers] = ReaderTiers,
    ) -> None:
        stats = DataStats()
        cache = DataCache(budget, stats=stats, shared_by=2 if disk and disk.shared else 1)
        self.reader = ObjectReader(cache, DataConfig(), stats, disk)
        self.packed = PackedStore(
            store, store, "packs/ds/", "ds/", PACK, "s3://b/ds/",
            small_file_max=4 * MiB, config=PackConfig(range_bytes=1 * MiB),
            tiers=tiers(self.reader, store.name),
        )  # fmt: skip

    async def read(self, store: MemoryStore, key: str) -> bytes | memoryview:
        o = store._objects[key.encode()]
        data, eof = await self.reader.read(self.packed, key, o.etag, len(o.data), 0, len(o.data))
        assert eof
        return data

    def cached(self, store: MemoryStore, key: str) -> bytes | memoryview | None:
        o = store._objects[key.encode()]
        return self.reader.cache.lookup((self.packed.name, key, o.etag, 0))


def seeded(files: Mapping[str, bytes], **kw: Any) -> tuple[MemoryStore, list[Member]]:
    store = MemoryStore("mem", **kw)
    for k, v in files.items():
        store.seed(k, v)
    members = write_pack(store, files, shard_bytes=64 * MiB)  # one shard
    return store, members


def groups_of(members: list[Member], range_bytes: int = 1 * MiB) -> list[list[str]]:
    """The keys of each group, as ``PackedStore._group`` forms them (one shard)."""
    out: dict[int, list[str]] = {}
    for m in members:
        out.setdefault(m.offset // range_bytes, []).append("ds/" + m.path)
    return list(out.values())


async def test_a_group_is_one_get_and_its_members_are_slices_of_one_buffer() -> None:
    files = group_tree()
    store, members = seeded(files)
    groups = groups_of(members)
    assert len(groups) >= 2 and all(len(g) >= 10 for g in groups)
    w = Worker(store, None)
    await w.packed.load()
    store.reset_counts()
    first = groups[0]
    got = await w.read(store, first[3])  # a member in the middle of its group
    assert gets(store, "packs/ds/shard-") == 1 and gets(store, "ds/") == 0
    assert isinstance(got, memoryview) and bytes(got) == files[first[3]]
    buffer = got.obj
    assert type(buffer) is bytes
    # Every member of the group is cached as a slice of that one buffer: no copy per member.
    for key in first:
        body = w.cached(store, key)
        assert isinstance(body, memoryview) and body.obj is buffer and body.readonly, key
        assert bytes(body) == files[key], key
    assert w.packed.stats.deposited == len(first) - 1
    # Charged its own length each (the buffer is not charged again per slice).
    assert w.reader.cache.used_bytes == sum(len(files[k]) + BLOCK_ENTRY_CHARGE_BYTES for k in first)
    # Reading the whole group: no more GETs, every READ a memory hit.
    for key in first:
        assert bytes(await w.read(store, key)) == files[key]
    assert gets(store, "packs/ds/shard-") == 1
    # The other groups: one GET each.
    for key in sorted(files):
        assert bytes(await w.read(store, key)) == files[key]
    assert gets(store, "packs/ds/shard-") == len(groups) and gets(store, "ds/") == 0


@pytest.fixture(params=["compiled", "pure"])
def crc_twin(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The members' CRC-32 as the compiled one (``gateway._checksums``) and as zlib's
    (``NFSGW_PURE_PYTHON=1``): the same verdicts."""
    monkeypatch.setenv("NFSGW_PURE_PYTHON", "1" if request.param == "pure" else "0")
    checksums.compiled.cache_clear()
    if request.param == "compiled" and checksums.compiled() is None:
        pytest.skip("gateway._checksums is not built")
    yield request.param
    monkeypatch.undo()
    checksums.compiled.cache_clear()


async def test_a_damaged_member_is_neither_served_nor_cached_from_the_shard(crc_twin: str) -> None:
    files = group_tree()
    store, members = seeded(files)
    group = groups_of(members)[0]
    bad = next(m for m in members if "ds/" + m.path == group[5])
    shard = store._objects[f"packs/ds/{shard_name(bad.shard)}".encode()]
    data = bytearray(shard.data)
    data[bad.offset + 100] ^= 0x01  # one bit: only the CRC-32 can tell
    shard.data = bytes(data)
    w = Worker(store, None)
    await w.packed.load()
    store.reset_counts()
    assert bytes(await w.read(store, group[0])) == files[group[0]]
    assert w.packed.stats.corrupt == 1
    assert w.cached(store, group[5]) is None  # not deposited
    got = await w.read(store, group[5])  # from its own object, its right bytes
    assert bytes(got) == files[group[5]]
    # The group's buffer (one of the last fetched) is checked again, no second range: the
    # member's own object answers.
    assert gets(store, "ds/c0/") == 1 and gets(store, "packs/ds/shard-") == 1
    assert w.packed.stats.corrupt == 2 and w.packed.stats.fallbacks == 1
    cached = w.cached(store, group[5])
    assert cached is not None and bytes(cached) == files[group[5]]
    # The damaged member is also refused when asked for first (the group's own read).
    w2 = Worker(store, None)
    await w2.packed.load()
    assert bytes(await w2.read(store, group[5])) == files[group[5]]
    assert w2.cached(store, group[6]) is not None and w2.packed.stats.corrupt == 1


async def shared_tier(d: Path) -> DiskStore:
    disk = await DiskStore.open(d, DiskConfig(budget=256 * MiB, min_free=0), shared=True)
    assert disk is not None
    return disk


async def test_a_group_fetched_by_one_worker_is_read_by_another_with_no_get(
    tmp_path: Path,
) -> None:
    files = group_tree()
    store, members = seeded(files)
    group = groups_of(members)[0]
    a_disk, b_disk = await shared_tier(tmp_path / "c"), await shared_tier(tmp_path / "c")
    a, b = Worker(store, a_disk), Worker(store, b_disk)
    await a.packed.load()
    await b.packed.load()
    store.reset_counts()
    assert bytes(await a.read(store, group[0])) == files[group[0]]
    await a_disk.drain()
    assert gets(store, "packs/ds/shard-") == 1
    assert a_disk.stats.writes == len(group)  # the member and its neighbours, published
    for key in group:  # the other worker: disk hits, mapped, no GET
        assert bytes(await b.read(store, key)) == files[key]
        body = b.cached(store, key)
        assert body is not None and is_mapping(body)
    assert gets(store, "packs/ds/shard-") == 1 and gets(store, "ds/") == 0
    assert b.packed.stats.ranges == 0 and b_disk.stats.hits == len(group)
    # The fetching worker's slices were swapped for the entries' mappings once published:
    # the group's buffer is no longer held by its cache.
    assert all(is_mapping(a.cached(store, k) or b"") for k in group)
    for d in (a_disk, b_disk):
        await d.close()


async def test_two_workers_reading_one_group_at_once_make_one_get(tmp_path: Path) -> None:
    files = group_tree()
    store, members = seeded(files, latency_s={"get": 0.05})
    group = groups_of(members)[0]
    a_disk, b_disk = await shared_tier(tmp_path / "c"), await shared_tier(tmp_path / "c")
    a, b = Worker(store, a_disk), Worker(store, b_disk)
    await a.packed.load()
    await b.packed.load()
    store.reset_counts()
    # Each worker reads half of the group's members, at the same time.
    got = await asyncio.gather(
        *(a.read(store, k) for k in group[0::2]), *(b.read(store, k) for k in group[1::2])
    )
    assert [bytes(x) for x in got] == [files[k] for k in group[0::2] + group[1::2]]
    assert gets(store, "packs/ds/shard-") == 1 and gets(store, "ds/") == 0
    waited = a.packed if a.packed.claim_waits else b.packed
    assert waited.claim_waits == 1 and waited.tier_hits >= 1 and waited.stats.ranges == 0
    assert a.packed.claim_timeouts == b.packed.claim_timeouts == 0
    for d in (a_disk, b_disk):
        await d.close()


async def test_neighbours_go_to_the_disk_tier_when_memory_has_no_room(tmp_path: Path) -> None:
    """One worker, a memory tier without room for a group (256 KiB for 1 MiB): the group is
    still fetched, its neighbours go to the disk tier only (not into memory, where they would
    push each other out unread), and its members are then disk hits. (One worker with room in
    memory keeps them there only: a disk write costs more CPU than the rest of a member's cold
    path.)"""
    files = group_tree()
    store, members = seeded(files)
    group = groups_of(members)[0]
    disk = await DiskStore.open(tmp_path / "c", DiskConfig(budget=256 * MiB, min_free=0))
    assert disk is not None and not disk.shared
    w = Worker(store, disk, budget=256 * KiB)
    await w.packed.load()
    store.reset_counts()
    assert bytes(await w.read(store, group[0])) == files[group[0]]
    await disk.drain()
    # The neighbours on disk only; the member read, kept in memory, not written.
    assert gets(store, "packs/ds/shard-") == 1 and disk.stats.writes == len(group) - 1
    assert w.cached(store, group[0]) is not None
    assert all(w.cached(store, k) is None for k in group[1:])  # not in memory
    for key in group:
        assert bytes(await w.read(store, key)) == files[key]
    assert gets(store, "packs/ds/shard-") == 1 and gets(store, "ds/") == 0
    await disk.close()


async def test_a_member_whose_group_is_on_its_way_is_not_looked_up_on_disk(tmp_path: Path) -> None:
    """One worker (an unshared disk tier): a READ of a member whose group is being fetched
    joins that fetch without asking the disk tier first (it would only miss: the member
    comes with its group); a member of another group still asks it."""
    files = group_tree()
    store, members = seeded(files, latency_s=0.05)
    first, second = groups_of(members)[:2]
    disk = await DiskStore.open(tmp_path / "c", DiskConfig(budget=256 * MiB, min_free=0))
    assert disk is not None and not disk.shared
    w = Worker(store, disk)
    await w.packed.load()
    store.reset_counts()
    a = asyncio.create_task(w.read(store, first[0]))
    for _ in range(2000):  # until the group's fetch is under way
        if w.packed.covered(first[1]):
            break
        await asyncio.sleep(0.001)
    assert w.packed.covered(first[1])
    assert disk.stats.misses == 1  # the first member's own look-up
    got = await asyncio.gather(*(w.read(store, k) for k in first[1:6]), a)
    assert [bytes(g) for g in got] == [files[k] for k in (*first[1:6], first[0])]
    assert disk.stats.misses == 1 and gets(store, "packs/ds/shard-") == 1
    assert bytes(await w.read(store, second[0])) == files[second[0]]
    assert disk.stats.misses == 2 and gets(store, "packs/ds/shard-") == 2
    await disk.close()


async def test_members_of_one_group_started_together_look_on_disk_once(tmp_path: Path) -> None:
    """READs (or prefetches) of several members of one group started at once, before any has
    reached the store (so none is "covered" yet): one of them looks in the disk tier; when it
    is not there the others join the group's fetch without looking."""
    files = group_tree()
    store, members = seeded(files, latency_s=0.01)
    first = groups_of(members)[0]
    disk = await DiskStore.open(tmp_path / "c", DiskConfig(budget=256 * MiB, min_free=0))
    assert disk is not None and not disk.shared
    w = Worker(store, disk)
    await w.packed.load()
    store.reset_counts()
    got = await asyncio.gather(*(w.read(store, k) for k in first[:8]))
    assert [bytes(g) for g in got] == [files[k] for k in first[:8]]
    assert disk.stats.misses == 1 and gets(store, "packs/ds/shard-") == 1
    assert not w.reader._looking
    await disk.close()


async def test_members_prefetched_together_share_their_group_get() -> None:
    """The data prefetcher asks for members in key order, several before the first one's
    fetch reaches the store: each joins the group's one GET (two groups at once: one each),
    and then every member of both is in memory."""
    files = group_tree()
    store, members = seeded(files, latency_s=0.01)
    first, second = groups_of(members)[:2]
    w = Worker(store, None)
    await w.packed.load()
    store.reset_counts()
    reader, packed = w.reader, w.packed

    def prefetch(key: str) -> asyncio.Future[bytes | memoryview] | None:
        o = store._objects[key.encode()]
        return reader.prefetch(packed, key, o.etag, len(o.data))

    futs = [prefetch(k) for k in (*first[:10], second[0])]
    assert all(f is not None for f in futs)
    got = await asyncio.gather(*(f for f in futs if f is not None))
    assert [bytes(g) for g in got] == [files[k] for k in (*first[:10], second[0])]
    assert gets(store, "packs/ds/shard-") == 2 and gets(store, "ds/") == 0
    for key in (*first, *second):
        cached = w.cached(store, key)
        assert cached is not None and bytes(cached) == files[key], key
    assert prefetch(first[3]) is None  # cached


async def test_members_found_on_disk_are_each_looked_for(tmp_path: Path) -> None:
    """The same, when the first member looked for is in the disk tier (a restart over a warm
    tier): the others look for themselves, and are found there too: no GET."""
    files = group_tree()
    store, members = seeded(files, latency_s=0.01)
    group = groups_of(members)[0]
    disk = await DiskStore.open(tmp_path / "c", DiskConfig(budget=256 * MiB, min_free=0))
    assert disk is not None and not disk.shared
    w = Worker(store, disk, budget=256 * KiB)  # no room in memory: neighbours go to disk
    await w.packed.load()
    assert bytes(await w.read(store, group[0])) == files[group[0]]
    await disk.drain()
    assert disk.stats.writes == len(group) - 1
    later = Worker(store, disk)  # a new process over the same tier
    await later.packed.load()
    store.reset_counts()
    misses = disk.stats.misses
    got = await asyncio.gather(*(later.read(store, k) for k in group[1:9]))
    assert [bytes(g) for g in got] == [files[k] for k in group[1:9]]
    assert gets(store, "packs/ds/shard-") == 0 and gets(store, "ds/") == 0
    assert disk.stats.misses == misses and disk.stats.hits >= 8
    await disk.close()


async def test_a_member_the_tier_lost_is_fetched_alone_not_with_its_group_again(
    tmp_path: Path,
) -> None:
    """A group fetched to the disk tier (no room in memory) is not fetched again as a group:
    a member the tier no longer has (refused, evicted, damaged) costs its own bytes only. (A
    whole group per such member re-read half of a dataset twice the cache every epoch.)"""
    files = group_tree()
    store, members = seeded(files)
    group = groups_of(members)[0]
    disk = await DiskStore.open(tmp_path / "c", DiskConfig(budget=256 * MiB, min_free=0))
    assert disk is not None
    w = Worker(store, disk, budget=256 * KiB)
    await w.packed.load()
    store.reset_counts()
    assert bytes(await w.read(store, group[0])) == files[group[0]]
    await disk.drain()
    assert gets(store, "packs/ds/shard-") == 1
    group_bytes = w.packed.stats.range_bytes
    lost = group[len(group) // 2]
    o = store._objects[lost.encode()]
    entry = disk.path(disk_key(w.packed.name, lost, o.etag, 0, len(o.data)))
    await asyncio.to_thread(os.unlink, entry)
    w.packed._recent.clear()  # later: the group is no longer among the last ones fetched
    assert bytes(await w.read(store, lost)) == files[lost]
    assert gets(store, "packs/ds/shard-") == 2
    assert w.packed.stats.range_bytes - group_bytes == len(files[lost])
    await disk.close()


async def test_a_group_is_not_fetched_for_a_disk_tier_whose_write_backlog_is_full(
    tmp_path: Path,
) -> None:
    """Neighbours the tier would refuse (its write backlog full) would be fetched for nothing:
    the member alone is."""
    files = group_tree()
    store, members = seeded(files)
    group = groups_of(members)[0]
    cfg = DiskConfig(budget=256 * MiB, min_free=0, max_pending_write_bytes=64 * KiB)
    disk = await DiskStore.open(tmp_path / "c", cfg)
    assert disk is not None
    w = Worker(store, disk, budget=256 * KiB)
    await w.packed.load()
    store.reset_counts()
    assert bytes(await w.read(store, group[0])) == files[group[0]]
    assert w.packed.stats.range_bytes == len(files[group[0]])
    await disk.close()


async def test_one_worker_with_room_keeps_the_group_in_memory_only(tmp_path: Path) -> None:
    """One worker (the disk tier not shared), room in memory: neither the member a READ
    fetched nor its neighbours are written to the disk tier (a write costs more CPU than the
    rest of a member's cold path); every member is then a memory hit. A member memory does not
    keep goes to the disk tier (``test_neighbours_go_to_the_disk_tier_when_memory_has_no_room``)."""
    files = group_tree()
    store, members = seeded(files)
    group = groups_of(members)[0]
    disk = await DiskStore.open(tmp_path / "c", DiskConfig(budget=256 * MiB, min_free=0))
    assert disk is not None and not disk.shared
    w = Worker(store, disk)
    await w.packed.load()
    store.reset_counts()
    assert bytes(await w.read(store, group[0])) == files[group[0]]
    await disk.drain()
    assert disk.stats.writes == 0
    assert all(isinstance(w.cached(store, k), memoryview) for k in group)
    for key in group:
        assert bytes(await w.read(store, key)) == files[key]
    assert gets(store, "packs/ds/shard-") == 1 and gets(store, "ds/") == 0
    assert disk.stats.writes == 0
    await disk.close()


class NoRoom(ReaderTiers):
    """No room in memory for a group (and no disk tier): members alone."""

    def memory_room(self, n: int) -> bool:
        return False


async def prefetched(w: Worker, store: MemoryStore, files: Mapping[str, bytes]) -> DataPrefetcher:
    """A data prefetcher over ``w``'s packed export, told of the folder ``ds/c0/`` as the
    server wires it, run until it has nothing left to do."""
    p = DataPrefetcher(w.reader)
    names = [k.removeprefix("ds/c0/") for k in sorted(files)]
    objs = [store._objects[k.encode()] for k in sorted(files)]
    cols = Columns(
        names, bytes(len(names)), [len(o.data) for o in objs], [0] * len(names),
        [o.etag for o in objs],
    )  # fmt: skip
    p.add_dir(w.packed, "ds/c0/", cols, w.packed.covered)
    p.start()
    async with asyncio.timeout(10):
        while not p.idle or w.reader.stats.pending_fetch_bytes:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    return p


async def test_the_prefetcher_fetches_whole_groups_and_walks_on_by_group() -> None:
    files = group_tree()
    store, members = seeded(files)
    groups = groups_of(members)
    w = Worker(store, None)
    await w.packed.load()
    store.reset_counts()
    p = await prefetched(w, store, files)
    # One GET per group: prefetches of its members join its fetch while it runs (the walk
    # skips those it covers) or take their slice of it after (the last groups' buffers);
    # every member in memory as a slice of its group's buffer.
    assert gets(store, "packs/ds/shard-") == len(groups) and gets(store, "ds/") == 0
    for g in groups:
        bodies = [w.cached(store, k) for k in g]
        assert all(isinstance(x, memoryview) for x in bodies)
        assert len({id(x.obj) for x in bodies if isinstance(x, memoryview)}) == 1
        assert [bytes(x or b"") for x in bodies] == [files[k] for k in g]
    await p.close()


async def test_without_room_for_groups_every_member_is_prefetched_alone() -> None:
    """No room in memory for a group: members are fetched alone, none is skipped."""
    files = group_tree(30)
    store, _ = seeded(files)
    w = Worker(store, None, tiers=NoRoom)
    await w.packed.load()
    store.reset_counts()
    p = await prefetched(w, store, files)
    assert all(w.cached(store, k) is not None for k in files)
    assert gets(store, "packs/ds/shard-") == len(files)  # each alone
    await p.close()


async def test_a_member_asked_for_just_after_its_group_arrived_takes_its_slice() -> None:
    """A member whose group was just fetched but which did not reach the cache (its reader's
    own fetch was in flight, so the neighbour was not deposited) is a slice of that buffer,
    not a second GET of the group; a group that is no longer among the last ones is fetched
    again."""
    files = group_tree()
    store, members = seeded(files)
    group = groups_of(members)[0]
    w = Worker(store, None)
    await w.packed.load()
    store.reset_counts()
    await w.read(store, group[0])
    o = store._objects[group[3].encode()]
    got = await w.packed.get(group[3], if_match=o.etag)  # straight to the store: no cache
    assert bytes(got.data) == files[group[3]] and gets(store, "packs/ds/shard-") == 1
    assert w.packed.stats.recent_hits == 1
    w.packed._recent.clear()
    await w.packed.get(group[3], if_match=o.etag)
    assert gets(store, "packs/ds/shard-") == 2


async def test_without_tiers_a_group_is_one_get_and_nothing_is_deposited() -> None:
    """``NO_TIERS`` (no data layer): the group is fetched whole, no neighbour is kept or
    counted, and a member of the group asked for next takes its slice of that buffer."""
    files = group_tree()
    store, members = seeded(files)
    first = groups_of(members)[0]
    packed = PackedStore(
        store, store, "packs/ds/", "ds/", PACK, "s3://b/ds/",
        small_file_max=4 * MiB, config=PackConfig(range_bytes=1 * MiB), tiers=NO_TIERS,
    )  # fmt: skip
    await packed.load()
    store.reset_counts()
    for key in first[:2]:
        got = await packed.get(key)
        assert bytes(got.data) == files[key]
    assert gets(store, "packs/ds/shard-") == 1 and gets(store, "ds/") == 0
    assert packed.stats.deposited == 0 and packed.stats.recent_hits == 1
