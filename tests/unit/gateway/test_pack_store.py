"""Serving a pack (issue 16) in-process: a pack written into a ``MemoryStore`` in the documented
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
import random
import tarfile
import zlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from gateway.backend.memory import MemoryStore
from gateway.exports import ExportConfig
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
from gateway.pack.store import PackedStore
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
