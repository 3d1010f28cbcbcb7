"""Serving a packed dataset end to end: SeaweedFS <- counting proxy <- gateway (in
process, ``tests.harness.thread``) <- libnfs, the pack made by the real ``nfsgw pack`` (a
child process, as in ``tests/integration/test_pack.py``). The in-process versions over a
``MemoryStore`` are in ``tests/unit/gateway/test_pack_store.py``.

- A tree with awkward keys (unicode, spaces, ``%``, a tab if SeaweedFS takes it, a ``dir/``
  marker, an unpathable key, empty files, a 64 MiB file over ``small_file_max``), packed and
  served ``immutable``: once the index is loaded, a cold pass in shuffled order reads every
  byte right with exactly one shard range GET per group of members (those whose data starts
  in the same aligned 8 MiB window of a shard), the 64 MiB file from its own object in
  blocks, no GET of any other object and 0 LIST of the tree (listings from the index). The
  ``dir/`` marker's empty directory is still in the tree (``unpacked.tsv.gz`` lists it).
- Not immutable: an object replaced after packing and a new one are served from the bucket
  (their bytes), every other file from the pack; ``fallbacks`` counts the replaced one.
- A bad pack (index missing, cut short, without its ``end`` line, of another version; a
  shard missing): the export starts, ``/readyz`` says why under ``packs``, every byte comes
  from the objects (one GET each, none of the pack's shards), one load error.
- A member damaged in its shard (one byte flipped, same size): read from its object, counted.
- Data prefetch on, a cache that fits: after the ImageFolder-like scan and once the
  prefetcher is idle, reading every small file costs 0 GETs; the prefetch cost at most one GET
  per group (plus a few).

Requests are counted at the proxy per kind and per key (what reached S3). Nothing here asserts
a duration: the waits are bounded polls.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import random
import subprocess
import sys
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import pytest

from gateway.backend.s3 import S3Store
from gateway.exports import ExportConfig
from gateway.pack.format import PackIndex, parse_index
from gateway.pack.store import PackedStore
from loadgen.seaweed import SeaweedServer
from tests.datasets import put_objects
from tests.harness.buckets import Buckets
from tests.harness.proxy import ThreadProxy
from tests.harness.thread import GatewayThread
from tests.libnfs import LibNfs, libnfs_available

pytestmark = [
    pytest.mark.s3,
    pytest.mark.libnfs,
    pytest.mark.skipif(not libnfs_available(), reason="libnfs (libnfs.so.13) is not installed"),
]

T = TypeVar("T")

REPO = Path(__file__).resolve().parents[2]
KiB = 1024
MiB = 1024 * KiB
SMALL_MAX = 4 * MiB  # the default small_file_max: larger objects are read in blocks
RANGE = 8 * MiB  # PackConfig.range_bytes
WAIT_S = 60.0  # bound of every poll
BIG = "big/blob.bin"
MARKER = "train/empty-dir/"
LONG = "long/" + "n" * 300 + "/f.jpg"  # a segment over NAME_MAX: not a file of the tree


# ---------------------------------------------------------------------------------- trees


def awkward_tree(seed: int = 16) -> dict[str, bytes]:
    """Key (relative to the source prefix) -> body."""
    rng = random.Random(seed)
    files = {
        f"train/c{i % 7}/img_{i:04d}.jpg": rng.randbytes(rng.randrange(1, 64 * KiB))
        for i in range(560)
    }
    files.update(
        {
            "train/cls a/img 1.jpg": rng.randbytes(3000),  # spaces
            "train/ünï/ß.jpg": rng.randbytes(5000),  # unicode
            "train/日本/画像.png": rng.randbytes(700),
            "train/100%/done%09.txt": b"percent signs",
            "train/tab\there.txt": b"a tab in the name",
            "train/empty0.bin": b"",
            "zz/empty1.bin": b"",
            BIG: rng.randbytes(64 * MiB),
            MARKER: b"",
            LONG: b"not servable",
        }
    )
    return files


def small_tree(seed: int, n: int = 60) -> dict[str, bytes]:
    rng = random.Random(seed)
    files = {f"d{i % 3}/f {i:03d}.jpg": rng.randbytes(rng.randrange(1, 40 * KiB)) for i in range(n)}
    files["d0/empty.bin"] = b""
    return files


def served(files: Mapping[str, bytes]) -> dict[str, bytes]:
    """The files of the tree a client sees (not markers, not unpathable keys)."""
    return {k: v for k, v in files.items() if not k.endswith("/") and k != LONG}


# ---------------------------------------------------------------------------------- S3


async def _put_all(sw: SeaweedServer, bucket: str, objects: Mapping[str, bytes]) -> set[str]:
    """PUT every object; the keys the store refused (a tab in the name) are returned."""
    store = S3Store(bucket, **sw.store_kwargs())
    try:
        return await put_objects(store, objects, refusable=lambda k: "\t" in k)
    finally:
        await store.close()


def put_all(sw: SeaweedServer, bucket: str, objects: Mapping[str, bytes]) -> set[str]:
    return asyncio.run(_put_all(sw, bucket, objects))


async def _get(sw: SeaweedServer, bucket: str, key: str) -> bytes:
    store = S3Store(bucket, **sw.store_kwargs())
    try:
        return bytes((await store.get(key)).data)
    finally:
        await store.close()


def get(sw: SeaweedServer, bucket: str, key: str) -> bytes:
    return asyncio.run(_get(sw, bucket, key))


async def _delete(sw: SeaweedServer, bucket: str, key: str) -> None:
    store = S3Store(bucket, **sw.store_kwargs())
    try:
        await store.delete(key)
    finally:
        await store.close()


def delete(sw: SeaweedServer, bucket: str, key: str) -> None:
    asyncio.run(_delete(sw, bucket, key))


def pack(sw: SeaweedServer, src: str, dst: str, *args: str) -> PackIndex:
    """``nfsgw pack SRC --to DST`` as a child process; the index it wrote."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        AWS_ACCESS_KEY_ID=sw.access_key,
        AWS_SECRET_ACCESS_KEY=sw.secret_key,
        AWS_CONFIG_FILE="/nonexistent",
        AWS_SHARED_CREDENTIALS_FILE="/nonexistent",
        NFSGW_CONFIG="",
        PYTHONPATH=str(REPO),
    )
    cmd = [sys.executable, "-m", "gateway.ops.cli", "pack", src, "--to", dst, "--quiet", *args]
    cmd += ["--s3-endpoint-url", sw.endpoint_url, "--s3-region", sw.region]
    r = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    u = urlsplit(dst)
    return parse_index(gzip.decompress(get(sw, u.netloc, u.path.strip("/") + "/index.tsv.gz")))


def since(after: Counter[str], before: Counter[str]) -> Counter[str]:
    return Counter({k: n - before[k] for k, n in after.items() if n - before[k]})


# ---------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def bucket(seaweed: SeaweedServer) -> Iterator[str]:
    with Buckets(seaweed) as buckets:
        yield buckets.make("ps")


@pytest.fixture(scope="module")
def awkward(seaweed: SeaweedServer, bucket: str) -> tuple[dict[str, bytes], PackIndex]:
    """``awkward_tree`` under ds/, packed into packs/ds/ in 12 MiB shards (the 64 MiB file
    alone in the first): (the tree, the index). No test changes either."""
    files = awkward_tree()
    for k in put_all(seaweed, bucket, {"ds/" + k: v for k, v in files.items()}):
        del files[k.removeprefix("ds/")]  # a store that refuses tabs in keys
    index = pack(seaweed, f"s3://{bucket}/ds", f"s3://{bucket}/packs/ds", "--shard-size", "12M")
    assert len(index) == len(served(files)) and len(index.shards) >= 3
    return files, index


@pytest.fixture
def proxy(seaweed: SeaweedServer) -> Iterator[ThreadProxy]:
    with ThreadProxy(seaweed.endpoint_url) as p:
        yield p


def gateway(
    tmp_path: Path,
    seaweed: SeaweedServer,
    proxy: ThreadProxy,
    backend: str,
    pack_url: str,
    *,
    immutable: bool = True,
    **settings: Any,
) -> GatewayThread:
    s3 = dict(seaweed.store_kwargs())
    s3["endpoint_url"] = proxy.endpoint_url
    ec = ExportConfig(
        "/data", backend, read_only=True, immutable=immutable, pack=pack_url, insecure=True
    )
    settings.setdefault("admin_listen", "127.0.0.1:0")
    return GatewayThread([ec], state_dir=tmp_path / "state", s3=s3, **settings)


# ---------------------------------------------------------------------------------- helpers


def wait_for(probe: Callable[[], T], ok: Callable[[T], bool], what: str) -> T:
    deadline = time.monotonic() + WAIT_S
    while True:
        v = probe()
        if ok(v):
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not reached in {WAIT_S} s; last {v!r}")
        time.sleep(0.02)


def metrics(gw: GatewayThread, prefix: str) -> dict[str, float]:
    """The unlabelled samples of the metric families named ``prefix*``, as a scrape sees
    them."""

    def scrape() -> dict[str, float]:
        if prefix.startswith("nfsgw_prefetch") and gw.server.prefetcher is not None:
            gw.server.prefetcher.snapshot()
        out: dict[str, float] = {}
        for fam in gw.server.metrics.families():
            if fam.name.startswith(prefix):
                for s in fam.samples:
                    if not s.labels:
                        out[s.name] = s.value
        return out

    return gw.call(scrape)


def loaded(gw: GatewayThread) -> str:
    """Until the export's pack index is loaded or refused; its status then."""
    store = gw.export("/data").store
    assert isinstance(store, PackedStore)
    return wait_for(lambda: gw.call(lambda: store.status), lambda s: s != "loading", "pack load")


def readyz(gw: GatewayThread) -> dict[str, Any]:
    url = f"http://127.0.0.1:{gw.server.metrics_port}/readyz"
    with urllib.request.urlopen(url, timeout=30) as r:
        body: dict[str, Any] = json.loads(r.read())
    return body


def not_in_memory(gw: GatewayThread, paths: list[str]) -> list[str]:
    """Of ``paths``, those whose current version is neither in the gateway's memory tier
    nor being fetched."""

    async def check() -> list[str]:
        exp = gw.export("/data")
        reader = gw.server.gateway.reader if gw.server.gateway else None
        assert reader is not None
        out = []
        for p in paths:
            etag = (await exp.ns.getattr(p)).etag
            if not reader.cached(exp.store.name, exp.prefix + p, etag):
                out.append(p)
        return out

    return gw.run(check())


def shuffled(paths: list[str], seed: int) -> list[str]:
    out = sorted(paths)
    random.Random(seed).shuffle(out)
    return out


def read_all(nfs: LibNfs, files: Mapping[str, bytes], order: list[str]) -> None:
    for p in order:
        got = nfs.read_file("/" + p)
        assert got == files[p], (p, len(got), len(files[p]))


def scan(nfs: LibNfs, keys: Iterable[str]) -> None:
    """List every directory of the tree (ImageFolder's scan) and check the names against the
    bucket's ``keys``: as a bucket listing shows them (a ``dir/`` marker is a directory; a
    segment that cannot be a name, and what is under it, is not shown)."""
    dirs: dict[str, set[str]] = {"": set()}
    files: set[str] = set()
    for k in keys:
        parts = k.split("/")
        for i, name in enumerate(parts):
            parent = "/".join(parts[:i])
            if not name:
                break  # a marker's trailing "/"
            if len(name.encode()) > 255:
                break  # not a name: neither it nor what is under it
            dirs.setdefault(parent, set()).add(name)
            if i == len(parts) - 1:
                files.add(k)
            else:
                dirs.setdefault("/".join(parts[: i + 1]), set())
    for d, names in sorted(dirs.items()):
        if d not in files:
            assert set(nfs.listdir("/" + d)) == names, d


def packed_small(index: PackIndex, path: str) -> int:
    """Member number of ``path`` when its reads come from the pack (non-empty, at most
    ``small_file_max``), else -1."""
    i = index.find(path)
    return i if i >= 0 and 0 < index.sizes[i] <= SMALL_MAX else -1


def groups(index: PackIndex, skip: frozenset[str] = frozenset()) -> int:
    """Shard range GETs a cold pass over the whole tree costs (``PackedStore``): one per
    *group*, the members of a shard whose data starts in the same aligned 8 MiB window (a
    member over ``small_file_max`` ends one), that holds a non-empty member read from the
    pack (not in ``skip``). Groups do not overlap: whatever the order, each is fetched once."""
    fetched: set[tuple[int, int, int]] = set()
    cut = 0  # rows of large members so far: a group never spans one
    for i in range(index.n):
        if index.sizes[i] > SMALL_MAX:
            cut += 1
        elif index.sizes[i] > 0 and index.path(i) not in skip:
            fetched.add((index.shard_of[i], index.data_at[i] // RANGE, cut))
    return len(fetched)


def copy_pack(sw: SeaweedServer, bucket: str, src: str, dst: str, index: PackIndex) -> None:
    """Copy the pack under ``src`` to ``dst`` (shards and index)."""

    async def run() -> None:
        store = S3Store(bucket, **sw.store_kwargs())
        try:
            for name in [s.name for s in index.shards.values()] + ["index.tsv.gz"]:
                await store.copy(src + name, dst + name)
        finally:
            await store.close()

    asyncio.run(run())


# ---------------------------------------------------------------------------------- tests


def test_a_packed_awkward_tree_is_served_from_its_shards_with_index_listings(
    tmp_path: Path,
    seaweed: SeaweedServer,
    bucket: str,
    awkward: tuple[dict[str, bytes], PackIndex],
    proxy: ThreadProxy,
) -> None:
    files, index = awkward
    tree = served(files)
    order = shuffled(list(tree), seed=1)
    want_ranges = groups(index)
    n_small = sum(1 for p in tree if packed_small(index, p) >= 0)
    assert n_small == len(tree) - 1 - sum(1 for v in tree.values() if not v)
    with gateway(tmp_path, seaweed, proxy, f"s3://{bucket}/ds/", f"s3://{bucket}/packs/ds") as gw:
        assert loaded(gw) == "ok"
        m = metrics(gw, "nfsgw_pack")
        assert m["nfsgw_pack_loaded"] == 1 and m["nfsgw_pack_entries"] == len(index)
        assert readyz(gw)["packs"] == {"/data": "ok"}
        gets0, lists0 = proxy.gets(), proxy.lists()
        with LibNfs(gw.libnfs_url()) as nfs:
            scan(nfs, files)  # "long" is listed, with nothing in it; the marker's directory
            assert nfs.listdir("/" + LONG.partition("/")[0]) == []  # its child is no name
            read_all(nfs, tree, order)
        gets, lists = since(proxy.gets(), gets0), since(proxy.lists(), lists0)
        m = metrics(gw, "nfsgw_pack")
    assert not lists, lists  # the listings came from the index
    shard_gets = sum(n for k, n in gets.items() if k.startswith("packs/ds/shard-"))
    assert shard_gets == want_ranges
    big = gets.pop("ds/" + BIG)
    assert 64 * MiB // (8 * MiB) <= big <= 64  # in blocks, coalesced up to 8 MiB a GET
    with_small = {
        index.shard_of[packed_small(index, p)] for p in tree if packed_small(index, p) >= 0
    }
    assert set(gets) == {f"packs/ds/{index.shards[no].name}" for no in with_small}
    assert sum(gets.values()) + big <= 0.1 * len(tree)
    assert m["nfsgw_pack_ranges_total"] == m["nfsgw_pack_members_total"] == want_ranges
    assert m["nfsgw_pack_deposited_total"] == n_small - want_ranges
    assert m["nfsgw_pack_corrupt_total"] == 0
    assert m["nfsgw_pack_fallbacks_total"] == 1  # the 64 MiB file's first block (offset 0)
    assert m["nfsgw_pack_load_errors_total"] == 0


def test_an_empty_directory_marker_is_still_seen_with_index_listings(
    tmp_path: Path,
    seaweed: SeaweedServer,
    bucket: str,
    awkward: tuple[dict[str, bytes], PackIndex],
    proxy: ThreadProxy,
) -> None:
    """The bucket's ``train/empty-dir/`` marker is an empty directory of the tree without a
    pack (immutable or not) and with a pack not immutable; the tree must not change when an
    immutable export's listings come from the index."""
    with gateway(tmp_path, seaweed, proxy, f"s3://{bucket}/ds/", f"s3://{bucket}/packs/ds") as gw:
        assert loaded(gw) == "ok"
        with LibNfs(gw.libnfs_url()) as nfs:
            assert "empty-dir" in nfs.listdir("/train")
            assert nfs.listdir("/" + MARKER.rstrip("/")) == []


def test_replaced_and_new_objects_are_served_from_the_bucket(
    tmp_path: Path, seaweed: SeaweedServer, bucket: str, proxy: ThreadProxy
) -> None:
    tag = uuid.uuid4().hex[:8]
    src, dst = f"mut-{tag}/", f"packs/mut-{tag}/"
    files = small_tree(seed=2)
    put_all(seaweed, bucket, {src + k: v for k, v in files.items()})
    index = pack(seaweed, f"s3://{bucket}/{src}", f"s3://{bucket}/{dst}", "--shard-size", "256K")
    assert len(index) == len(files) and len(index.shards) >= 3
    replaced, new = "d1/f 004.jpg", "d2/new one.jpg"
    assert index.find(replaced) >= 0
    files[replaced] = b"new bytes, new ETag " * 100
    files[new] = b"added after packing" * 50
    put_all(seaweed, bucket, {src + replaced: files[replaced], src + new: files[new]})
    order = shuffled(list(files), seed=3)
    want_ranges = groups(index, skip=frozenset({replaced}))
    with gateway(
        tmp_path, seaweed, proxy, f"s3://{bucket}/{src}", f"s3://{bucket}/{dst}", immutable=False
    ) as gw:
        assert loaded(gw) == "ok"
        gets0, lists0 = proxy.gets(), proxy.lists()
        with LibNfs(gw.libnfs_url()) as nfs:
            scan(nfs, files)
            read_all(nfs, files, order)
        gets, lists = since(proxy.gets(), gets0), since(proxy.lists(), lists0)
        m = metrics(gw, "nfsgw_pack")
    assert sum(n for p, n in lists.items() if p.startswith(src)) >= 4  # the bucket's listings
    assert {k: n for k, n in gets.items() if k.startswith(src)} == {src + replaced: 1, src + new: 1}
    assert sum(n for k, n in gets.items() if k.startswith(dst)) == want_ranges
    assert m["nfsgw_pack_fallbacks_total"] == 1
    assert m["nfsgw_pack_members_total"] == want_ranges
    assert m["nfsgw_pack_corrupt_total"] == 0


@pytest.fixture(scope="module")
def small(seaweed: SeaweedServer, bucket: str) -> tuple[str, dict[str, bytes], PackIndex]:
    """``small_tree`` under sm/, packed into packs/sm/ (no test changes either)."""
    files = small_tree(seed=4)
    put_all(seaweed, bucket, {"sm/" + k: v for k, v in files.items()})
    index = pack(seaweed, f"s3://{bucket}/sm", f"s3://{bucket}/packs/sm", "--shard-size", "256K")
    return "sm/", files, index


@pytest.mark.parametrize("damage", ["missing", "truncated", "no-end", "version", "no-shard"])
def test_a_bad_index_leaves_the_export_serving_the_bucket(
    tmp_path: Path,
    seaweed: SeaweedServer,
    bucket: str,
    small: tuple[str, dict[str, bytes], PackIndex],
    proxy: ThreadProxy,
    damage: str,
) -> None:
    src, files, index = small
    dst = f"packs/bad-{uuid.uuid4().hex[:8]}/"
    copy_pack(seaweed, bucket, "packs/sm/", dst, index)
    raw = get(seaweed, bucket, dst + "index.tsv.gz")
    if damage == "missing":
        delete(seaweed, bucket, dst + "index.tsv.gz")
        why = "cannot read the index"
    elif damage == "truncated":  # an upload cut short: not a whole gzip stream
        put_all(seaweed, bucket, {dst + "index.tsv.gz": raw[: len(raw) // 2]})
        why = "pack not used: "
    elif damage == "no-end":  # a whole gzip stream of half the text: no "end" line
        text = gzip.decompress(raw)
        put_all(seaweed, bucket, {dst + "index.tsv.gz": gzip.compress(text[: len(text) // 2])})
        why = "pack not used: "
    elif damage == "no-shard":
        delete(seaweed, bucket, dst + index.shards[1].name)
        why = f"shard {index.shards[1].name}: missing"
    else:
        text = gzip.decompress(raw).replace(b"nfsgw-pack\t1\t", b"nfsgw-pack\t2\t", 1)
        put_all(seaweed, bucket, {dst + "index.tsv.gz": gzip.compress(text)})
        why = "version"
    with gateway(tmp_path, seaweed, proxy, f"s3://{bucket}/{src}", f"s3://{bucket}/{dst}") as gw:
        status = loaded(gw)
        assert status.startswith("pack not used: ") and why in status, status
        ready = readyz(gw)
        assert ready["ready"] is True and ready["packs"] == {"/data": status}
        gets0 = proxy.gets()
        with LibNfs(gw.libnfs_url()) as nfs:
            scan(nfs, files)
            read_all(nfs, files, shuffled(list(files), seed=5))
        gets = since(proxy.gets(), gets0)
        m = metrics(gw, "nfsgw_pack")
    assert gets == {src + k: 1 for k, v in files.items() if v}  # each object once, no shard
    assert m["nfsgw_pack_load_errors_total"] == 1
    assert m["nfsgw_pack_loaded"] == 0
    assert m["nfsgw_pack_members_total"] == m["nfsgw_pack_fallbacks_total"] == 0


def test_a_damaged_member_is_served_from_its_object(
    tmp_path: Path,
    seaweed: SeaweedServer,
    bucket: str,
    small: tuple[str, dict[str, bytes], PackIndex],
    proxy: ThreadProxy,
) -> None:
    src, files, index = small
    dst = f"packs/dmg-{uuid.uuid4().hex[:8]}/"
    copy_pack(seaweed, bucket, "packs/sm/", dst, index)
    victim = "d2/f 011.jpg"
    i = index.find(victim)
    assert i >= 0 and index.sizes[i] > 100
    shard = index.shards[index.shard_of[i]].name
    raw = bytearray(get(seaweed, bucket, dst + shard))
    raw[index.data_at[i] + 50] ^= 0x01
    put_all(seaweed, bucket, {dst + shard: bytes(raw)})  # same size: the index still loads
    with gateway(tmp_path, seaweed, proxy, f"s3://{bucket}/{src}", f"s3://{bucket}/{dst}") as gw:
        assert loaded(gw) == "ok"
        gets0 = proxy.gets()
        with LibNfs(gw.libnfs_url()) as nfs:
            read_all(nfs, files, shuffled(list(files), seed=6))
        gets = since(proxy.gets(), gets0)
        m = metrics(gw, "nfsgw_pack")
    assert {k: n for k, n in gets.items() if k.startswith(src)} == {src + victim: 1}
    assert m["nfsgw_pack_corrupt_total"] >= 1
    assert m["nfsgw_pack_fallbacks_total"] == 1


def test_with_data_prefetch_a_scanned_tree_is_read_with_no_get(
    tmp_path: Path,
    seaweed: SeaweedServer,
    bucket: str,
    awkward: tuple[dict[str, bytes], PackIndex],
    proxy: ThreadProxy,
) -> None:
    files, index = awkward
    tree = served(files)
    small = [p for p in tree if packed_small(index, p) >= 0]
    with gateway(
        tmp_path,
        seaweed,
        proxy,
        f"s3://{bucket}/ds/",
        f"s3://{bucket}/packs/ds",
        cache_data_prefetch=True,
    ) as gw:
        assert loaded(gw) == "ok"
        gets0 = proxy.gets()
        with LibNfs(gw.libnfs_url()) as nfs:
            scan(nfs, files)

            def idle(m: dict[str, float]) -> bool:
                return m["nfsgw_prefetch_queued_files"] == 0 and m["nfsgw_prefetch_inflight"] == 0

            wait_for(lambda: not_in_memory(gw, small), lambda x: not x, "all prefetched")
            wait_for(lambda: metrics(gw, "nfsgw_prefetch"), idle, "prefetch queue empty")
            ahead = since(proxy.gets(), gets0)
            read_all(nfs, tree, shuffled(small, seed=7))
            assert since(proxy.gets(), gets0) == ahead  # 0 GETs while reading
            read_all(nfs, tree, [p for p in tree if p not in small])  # the 64 MiB and empties
        m = metrics(gw, "nfsgw_pack")
    assert set(ahead) <= {f"packs/ds/{s.name}" for s in index.shards.values()}
    assert groups(index) <= sum(ahead.values()) <= groups(index) + 2
    assert m["nfsgw_pack_corrupt_total"] == 0 and m["nfsgw_pack_fallbacks_total"] == 1


def test_a_second_gateway_of_a_fleet_takes_the_groups_from_the_shared_tier(
    tmp_path: Path,
    seaweed: SeaweedServer,
    bucket: str,
    awkward: tuple[dict[str, bytes], PackIndex],
    proxy: ThreadProxy,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two gateways one after another with a shared tier (reached directly, not through the
    counting proxy): the first fetches each group's range from its shard and puts it in the
    shared tier; the second reads every packed member byte-exact with no shard GET."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", seaweed.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", seaweed.secret_key)
    files, index = awkward
    tree = served(files)
    small = [p for p in tree if packed_small(index, p) >= 0]
    shared = {
        "cache_shared": f"s3://{bucket}/fleet-{tmp_path.name[-8:]}/",
        "cache_shared_endpoint_url": seaweed.endpoint_url,
        "cache_shared_region": seaweed.region,
        "cache_disk": 0,
    }
    shard_gets = []
    for n, seed in ((1, 3), (2, 4)):
        before = proxy.gets()
        with gateway(
            tmp_path / f"gw{n}", seaweed, proxy, f"s3://{bucket}/ds/",
            f"s3://{bucket}/packs/ds", **shared,
        ) as gw:  # fmt: skip
            assert loaded(gw) == "ok"
            with LibNfs(gw.libnfs_url()) as nfs:
                read_all(nfs, tree, shuffled(small, seed=seed))
            tier = gw.server.shared
            assert tier is not None
            gw.run(tier.drain())
            st = tier.stats
            assert st.errors == 0 and st.bad_checksum == st.bad_metadata == st.bad_length == 0
            m = metrics(gw, "nfsgw_pack")
            assert m["nfsgw_pack_corrupt_total"] == 0
        got = since(proxy.gets(), before)
        shard_gets.append(sum(v for k, v in got.items() if k.startswith("packs/ds/shard")))
        if n == 1:
            assert st.fills == shard_gets[0] and st.hits == 0
        else:
            assert st.hits >= groups(index) and st.fills == 0
    assert shard_gets[0] >= groups(index) and shard_gets[1] == 0
