"""The read path end to end, with an independent client: SeaweedFS <- counting proxy <- gateway
(``tests.harness.thread``, its own thread and loop) <- libnfs (``tests.libnfs``, blocking calls
on the test's threads).

One bucket per module holds a synthetic ImageFolder tree (``tests.datasets``); one gateway
serves it read-only as ``/data`` with a long attribute TTL, so the request counts below are
exact. Every counting test works on directories and files no other test touches, and takes
deltas of the gateway's own counters (``metrics.backend``, ``metrics.calls``); the LOOKUP test
also checks them once against the proxy's count of what actually reached S3.

How libnfs 4.0 turns calls into RPCs (see ``tests/libnfs.py``): ``stat("/d/f")`` is LOOKUP d,
LOOKUP f (it resolves from the root each time; the gateway answers both from its index), plus
whatever GETATTR it needs; ``opendir`` pages READDIRPLUS at 8 KiB per reply.
"""

from __future__ import annotations

import asyncio
import os
import random
import stat as statmod
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Literal

import pytest

from gateway.backend.base import ObjectStore
from gateway.backend.s3 import S3Store
from gateway.exports import ExportConfig
from loadgen.seaweed import SeaweedServer
from nfsproto import mount3, nfs3
from nfsproto.nfs3 import (
    Diropargs3,
    Getattr3Args,
    Lookup3Args,
    Nfs3Proc,
    NfsStat3,
    Readdirplus3Args,
    StableHow,
    Write3Args,
)
from nfsproto.rpc import AcceptStat
from tests.datasets import Dataset, Expected, build_imagefolder, md5, upload
from tests.harness.buckets import Buckets
from tests.harness.proxy import ThreadProxy
from tests.harness.stores import SpyStore
from tests.harness.thread import GatewayThread, OffsetClock, delta
from tests.libnfs import NF3DIR, NF3REG, SEEK_CUR, SEEK_END, SEEK_SET, LibNfs, libnfs_available
from tests.rpcclient import BlockingRpcClient

pytestmark = [
    pytest.mark.s3,
    pytest.mark.libnfs,
    pytest.mark.skipif(not libnfs_available(), reason="libnfs (libnfs.so.13) is not installed"),
]

MiB = 1024 * 1024
SMALL_FILE_MAX = 4 * MiB
BIG_CLASS = "n01440764"
WIDE = "wide"
ONLY_UNPATHABLE = ("weird/a", "weird/x")  # directories that exist only through bad keys
ZERO_VERF = bytes(nfs3.NFS3_COOKIEVERFSIZE)


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def dataset() -> Dataset:
    return build_imagefolder()


@pytest.fixture(scope="module")
def bucket(seaweed: SeaweedServer, dataset: Dataset) -> Iterator[str]:
    async def fill(name: str) -> None:
        store = S3Store(name, **seaweed.store_kwargs())
        try:
            await upload(dataset, store)  # directory markers too
        finally:
            await store.close()

    with Buckets(seaweed) as buckets:
        name = buckets.make("rp")
        asyncio.run(fill(name))
        yield name


@pytest.fixture(scope="module")
def proxy(seaweed: SeaweedServer) -> Iterator[ThreadProxy]:
    with ThreadProxy(seaweed.endpoint_url) as p:
        yield p


def _export(bucket: str, ds: Dataset, attr_ttl_s: float) -> ExportConfig:
    return ExportConfig(
        "/data", f"s3://{bucket}/{ds.prefix}", read_only=True, attr_ttl_s=attr_ttl_s, insecure=True
    )


@pytest.fixture(scope="module")
def gw(
    tmp_path_factory: pytest.TempPathFactory,
    seaweed: SeaweedServer,
    bucket: str,
    dataset: Dataset,
    proxy: ThreadProxy,
) -> Iterator[GatewayThread]:
    s3 = dict(seaweed.store_kwargs())
    s3["endpoint_url"] = proxy.endpoint_url
    injected = [dataset.prefix + k for k in dataset.unstorable]

    def wrap(ec: ExportConfig, store: ObjectStore) -> ObjectStore:
        return SpyStore(store, injected)

    g = GatewayThread(
        [_export(bucket, dataset, attr_ttl_s=3600.0)],
        state_dir=tmp_path_factory.mktemp("gw-state"),
        s3=s3,
        wrap_store=wrap,
        cache_memory=512 * MiB,
        # These tests count every request and keep the big directories cold: no folder is
        # listed ahead of the client here (test_folders_read_in_order_are_listed_ahead).
        cache_list_ahead=0,
    )
    with g:
        yield g


@pytest.fixture(scope="module")
def nfs(gw: GatewayThread) -> Iterator[LibNfs]:
    with LibNfs(gw.libnfs_url("/data")) as client:
        yield client


def spy(g: GatewayThread) -> SpyStore:
    s = g.stores["/data"]
    assert isinstance(s, SpyStore)
    return s


def _kind(t: int) -> str:
    return {NF3REG: "file", NF3DIR: "dir"}.get(t, f"ftype{t}")


def _listing(nfs: LibNfs, rel_dir: str) -> dict[str, Expected]:
    entries = nfs.scandir("/" + rel_dir)
    names = [e.name for e in entries]
    assert len(names) == len(set(names)), f"duplicate names in {rel_dir!r}"
    return {e.name: Expected(_kind(e.type), e.size) for e in entries}


# --------------------------------------------------------------------------- listings


def test_folders_read_in_order_are_listed_ahead(
    tmp_path: Path, seaweed: SeaweedServer, bucket: str, dataset: Dataset
) -> None:
    """``ls -R``'s order with the default ``list_ahead``: each folder read from the top has
    the next ones listed in the background; every listing is still exactly the source tree,
    every directory is listed once (no LIST twice, no HEAD, no GET)."""
    injected = [dataset.prefix + k for k in dataset.unstorable]
    g = GatewayThread(
        [_export(bucket, dataset, attr_ttl_s=3600.0)],
        state_dir=tmp_path / "state",
        s3=seaweed.store_kwargs(),
        wrap_store=lambda _ec, store: SpyStore(store, injected),
        cache_memory=64 * MiB,
    )
    with g, LibNfs(g.libnfs_url("/data")) as client:
        top = sorted(e.name for e in client.scandir("/") if e.type == NF3DIR)
        for d in top:
            assert _listing(client, d) == dataset.expected_dir(d), d
        st = g.stats(lambda _s: g.export().ns.stats)
        cost = g.backend_counts()
    assert st["listed_ahead"] >= len(top) // 2, st
    assert st["prefetches"] <= len(dataset.dirs()) and st["relists"] == 0, st
    assert set(cost) <= {"list"}, cost


def test_listings_equal_the_source_tree(gw: GatewayThread, nfs: LibNfs, dataset: Dataset) -> None:
    """Every directory (but the two big ones, kept cold for their own tests) lists exactly the
    names, types and sizes the keys imply, with the export's modes; listing costs LISTs only."""
    before = gw.backend_counts()
    dirs = [d for d in dataset.dirs() if d not in (BIG_CLASS, WIDE, *ONLY_UNPATHABLE)]
    assert len(dirs) >= 12
    for d in dirs:
        assert _listing(nfs, d) == dataset.expected_dir(d), d
        for e in nfs.scandir("/" + d):
            assert e.mode == (0o040755 if e.type == NF3DIR else 0o100644), (d, e)
    st = nfs.stat("/classes/cat/img_0000.jpg")
    assert statmod.S_ISREG(st.mode) and st.size == len(dataset.files["classes/cat/img_0000.jpg"])
    cost = delta(gw.backend_counts(), before)
    assert set(cost) <= {"list"}, cost  # no HEAD, no GET: attributes come from the listing
    assert cost["list"] <= len(dirs)  # at most one LIST per (single-page) directory


def test_awkward_keys(gw: GatewayThread, nfs: LibNfs, dataset: Dataset) -> None:
    # An object that is also a prefix shows as the directory; its object is unreachable.
    assert statmod.S_ISDIR(nfs.stat("/both").mode)
    assert nfs.listdir("/both") == ["x"]
    assert nfs.read_file("/both/x") == dataset.files["both/x"]
    # A zero-byte marker makes an empty directory.
    assert statmod.S_ISDIR(nfs.stat("/empty").mode)
    assert nfs.listdir("/empty") == []
    # Keys that cannot be paths (a//b, ./x, x/../y; injected, SeaweedFS cannot store them) are
    # skipped and counted; the listings around them are intact.
    assert _listing(nfs, "weird") == {
        "ok.txt": Expected("file", 3),
        "a": Expected("dir", 4096),
        "x": Expected("dir", 4096),
    }
    for d in ONLY_UNPATHABLE:
        assert statmod.S_ISDIR(nfs.stat("/" + d).mode)
    assert nfs.read_file("/weird/ok.txt") == b"ok\n"
    with pytest.raises(FileNotFoundError):
        nfs.stat("/both/missing")


def test_directory_of_only_unpathable_keys_lists_empty(gw: GatewayThread, nfs: LibNfs) -> None:
    """weird/a exists only through the key weird/a//b: its parent lists it as a directory, and
    its own listing holds nothing but the skipped prefix weird/a//: it must list as empty."""
    for d in ONLY_UNPATHABLE:
        assert nfs.listdir("/" + d) == [], d
    # weird/./ (in weird), weird/a// (in a), weird/x/../ (in x)
    assert gw.namespace_stats()["skipped_keys"] == 3


# --------------------------------------------------------------------------- reads


def test_small_files_byte_exact_one_get_each(
    gw: GatewayThread, nfs: LibNfs, dataset: Dataset
) -> None:
    """Cold: one GET per non-empty file, none for empty files, no HEAD. Warm: no request."""
    paths = [p for p in dataset.files if p.startswith("classes/")]
    paths += ["with space/file name.jpg", "ünï cødé/файл.jpg"]
    assert all(len(dataset.files[p]) <= SMALL_FILE_MAX for p in paths)
    before, data_before = gw.backend_counts(), gw.data_stats()
    for p in paths:
        got = nfs.read_file("/" + p)
        assert len(got) == len(dataset.files[p]) and md5(got) == md5(dataset.files[p]), p
    d = delta(gw.backend_counts(), before)
    nonempty = [p for p in paths if dataset.files[p]]
    assert len(nonempty) < len(paths)  # there are empty files in the set
    assert d["get"] == len(nonempty)
    assert d["head"] == 0
    fetched = gw.data_stats()["bytes_fetched"] - data_before["bytes_fetched"]
    assert fetched == sum(len(dataset.files[p]) for p in paths)

    warm = gw.backend_counts()
    for p in paths:
        assert md5(nfs.read_file("/" + p)) == md5(dataset.files[p]), p
    assert delta(gw.backend_counts(), warm) == Counter()


def _check_ranges(ranges: list[tuple[int, int | None]], size: int) -> list[tuple[int, int]]:
    """The GET ranges of one object cover [0, size) exactly once (no overlap, no gap)."""
    spans = sorted((s, size if e is None else e) for s, e in ranges)
    pos = 0
    for s, e in spans:
        assert s == pos, f"gap or overlap at {pos}: next GET covers [{s}, {e})"
        assert e > s
        pos = e
    assert pos == size
    return spans


def test_block_path_file(gw: GatewayThread, nfs: LibNfs, dataset: Dataset) -> None:
    """An object over small_file_max is read in 1 MiB blocks with read-ahead: every byte
    fetched once, in at most one GET per block."""
    key = "large/block.bin"
    body = dataset.files[key]
    assert len(body) > SMALL_FILE_MAX
    before, data_before = gw.backend_counts(), gw.data_stats()
    got = nfs.read_file("/" + key)
    assert md5(got) == md5(body)
    d = delta(gw.backend_counts(), before)
    blocks = -(-len(body) // MiB)
    assert 1 <= d["get"] <= blocks and d["head"] == 0
    assert gw.data_stats()["bytes_fetched"] - data_before["bytes_fetched"] == len(body)
    full = dataset.prefix + key
    gets = [(s, e) for k, s, e in gw.call(lambda: list(spy(gw).gets)) if k == full]
    assert len(gets) == d["get"]
    _check_ranges(gets, len(body))
    # Warm random reads, across a block boundary too: no request.
    warm = gw.backend_counts()
    fh = nfs.open("/" + key)
    try:
        for off, n in ((MiB - 100, 200), (3 * MiB + 7, 65536), (len(body) - 10, 4096)):
            assert nfs.pread(fh, off, n) == body[off : off + n]
    finally:
        nfs.close_file(fh)
    assert delta(gw.backend_counts(), warm) == Counter()


def test_cv2_imread_pattern_costs_one_get(gw: GatewayThread, nfs: LibNfs, dataset: Dataset) -> None:
    """cv2.imread of a ~110 KB JPEG: 9 seeks and 11 reads of 4-16 KiB. The first READ fetches
    the whole object; the rest come from memory: one GET in all."""
    key = "cv2/sample.jpg"
    body = dataset.files[key]
    size = len(body)
    # The directory listing that LOOKUP prefetches is not the file's cost (whichever test
    # lists cv2/ first pays it).
    assert nfs.stat("/" + key).size == size
    before, calls_before = gw.backend_counts(), gw.call_counts()
    ops: list[tuple[str, int, int]] = [  # (kind, offset or count, whence)
        ("read", 4096, 0),
        ("seek", 0, SEEK_END),
        ("seek", 0, SEEK_SET),
        ("read", 4096, 0),
        ("seek", 2, SEEK_SET),
        ("read", 16384, 0),
        ("read", 16384, 0),
        ("seek", -8192, SEEK_CUR),
        ("read", 8192, 0),
        ("seek", 40960, SEEK_SET),
        ("read", 16384, 0),
        ("read", 16384, 0),
        ("seek", 65536, SEEK_SET),
        ("read", 16384, 0),
        ("seek", size - 12288, SEEK_SET),
        ("read", 8192, 0),
        ("read", 16384, 0),  # short: reaches EOF
        ("seek", 0, SEEK_SET),
        ("read", 4096, 0),
        ("seek", size - 2, SEEK_SET),
    ]
    assert sum(op[0] == "read" for op in ops) == 11 and sum(op[0] == "seek" for op in ops) == 9
    fh = nfs.open("/" + key)
    pos = 0
    try:
        for kind, arg, whence in ops:
            if kind == "seek":
                base = {SEEK_SET: 0, SEEK_CUR: pos, SEEK_END: size}[whence]
                pos = nfs.lseek(fh, arg, whence)
                assert pos == base + arg
            else:
                got = nfs.read(fh, arg)
                assert got == body[pos : pos + arg], (pos, arg)
                pos += len(got)
    finally:
        nfs.close_file(fh)
    d = delta(gw.backend_counts(), before)
    assert d == Counter({"get": 1}), d
    calls = delta(gw.call_counts(), calls_before)
    assert calls["NFS3.READ"] == 11, calls


def test_16_concurrent_readers_fetch_every_block_once(gw: GatewayThread, dataset: Dataset) -> None:
    """16 threads, each with its own libnfs context (connection), read one 64 MiB object
    1 MiB at a time, each starting at a different block: every block is fetched once (single-
    flight across readers, read-ahead never duplicates a demand fetch)."""
    key = "large/blob64.bin"
    body = dataset.files[key]
    size = len(body)
    nblocks = size // MiB
    digests = [md5(body[i * MiB : (i + 1) * MiB]) for i in range(nblocks)]
    readers = 16
    barrier = threading.Barrier(readers)
    url = gw.libnfs_url("/data")
    before, data_before = gw.backend_counts(), gw.data_stats()

    def read_all(i: int) -> int:
        with LibNfs(url) as c:
            fh = c.open("/" + key)
            barrier.wait(60)
            bad = 0
            for j in range(nblocks):
                b = (i * (nblocks // readers) + j) % nblocks
                if md5(c.pread(fh, b * MiB, MiB)) != digests[b]:
                    bad += 1
            c.close_file(fh)
            return bad

    with ThreadPoolExecutor(readers) as pool:
        assert list(pool.map(read_all, range(readers))) == [0] * readers
    d = delta(gw.backend_counts(), before)
    full = dataset.prefix + key
    gets = [(s, e) for k, s, e in gw.call(lambda: list(spy(gw).gets)) if k == full]
    assert d["get"] == len(gets) and d["head"] == 0
    assert 1 <= len(gets) <= nblocks
    _check_ranges(gets, size)
    assert gw.data_stats()["bytes_fetched"] - data_before["bytes_fetched"] == size


# --------------------------------------------------------------------------- metadata counts


def test_1300_lookups_cost_two_lists_and_no_head(
    gw: GatewayThread, nfs: LibNfs, dataset: Dataset, proxy: ThreadProxy
) -> None:
    """A 1,300-file class folder stat'ed in shuffled order: the first LOOKUP prefetches the
    whole directory (2 LIST pages), every other LOOKUP, hit or miss, is answered from memory.
    Cross-checked against what reached S3 through the proxy."""
    names = sorted(p for p in dataset.files if p.startswith(BIG_CLASS + "/"))
    assert len(names) == 1300
    random.Random(7).shuffle(names)
    assert statmod.S_ISDIR(nfs.stat("/" + BIG_CLASS).mode)  # lists the root if needed
    before, pbefore, cbefore = gw.backend_counts(), proxy.kinds(), gw.call_counts()
    for p in names:
        st = nfs.stat("/" + p)
        assert statmod.S_ISREG(st.mode) and st.size == len(dataset.files[p]), p
    d, pd = delta(gw.backend_counts(), before), delta(proxy.kinds(), pbefore)
    assert d == Counter({"list": 2}), d
    assert pd == Counter({"LIST": d["list"]}), (pd, d)
    calls = delta(gw.call_counts(), cbefore)
    assert calls["NFS3.LOOKUP"] == 2 * len(names), calls  # libnfs: LOOKUP dir, LOOKUP file

    # A miss in a completely listed directory: answered from memory too.
    before, pbefore = gw.backend_counts(), proxy.kinds()
    with pytest.raises(FileNotFoundError):
        nfs.stat(f"/{BIG_CLASS}/{BIG_CLASS}_99999.JPEG")
    assert delta(gw.backend_counts(), before) == Counter()
    assert delta(proxy.kinds(), pbefore) == Counter()


def test_readdirplus_5000_entries_libnfs(gw: GatewayThread, nfs: LibNfs, dataset: Dataset) -> None:
    """libnfs lists the 5,000-entry directory with 8 KiB READDIRPLUS replies: many cookies,
    every entry exactly once, one LIST sequence."""
    nfs.stat("/" + WIDE)
    before, cbefore = gw.backend_counts(), gw.call_counts()
    got = _listing(nfs, WIDE)  # asserts no duplicates
    assert got == dataset.expected_dir(WIDE)
    assert len(got) == 5000
    d = delta(gw.backend_counts(), before)
    assert set(d) == {"list"} and d["list"] == 5, d  # 1,000 keys per page
    calls = delta(gw.call_counts(), cbefore)
    assert calls["NFS3.READDIRPLUS"] > 50, calls  # 8 KiB replies: ~45 entries each


# --------------------------------------------------------------------------- re-list mid-way


@pytest.fixture
def ttl_gw(
    tmp_path: Path, seaweed: SeaweedServer, bucket: str, dataset: Dataset
) -> Iterator[tuple[GatewayThread, OffsetClock]]:
    clock = OffsetClock()
    g = GatewayThread(
        [_export(bucket, dataset, attr_ttl_s=600.0)],
        state_dir=tmp_path / "state",
        s3=seaweed.store_kwargs(),
        clock=clock,
        cache_memory=64 * MiB,
        cache_list_ahead=0,
    )
    with g:
        yield g, clock


def _readdirplus_all(
    c: BlockingRpcClient, dirfh: bytes, midway: Callable[[], None], half: int
) -> tuple[list[bytes], int]:
    """READDIRPLUS at libnfs's 8 KiB cap, cookie by cookie; ``midway()`` runs once after at
    least ``half`` entries. Returns the names (without . and ..) and the number of calls."""
    names: list[bytes] = []
    cookie, verf, calls, done_midway = 0, ZERO_VERF, 0, False
    while True:
        res = c.nfs(Nfs3Proc.READDIRPLUS, Readdirplus3Args(dirfh, cookie, verf, 8192, 8192))
        assert res.status == NfsStat3.NFS3_OK, res.status
        calls += 1
        for e in res.entries:
            assert e.name_handle and e.name_attributes is not None
            names.append(bytes(e.name))
        if res.eof:
            break
        assert res.entries
        cookie, verf = res.entries[-1].cookie, bytes(res.cookieverf)
        if not done_midway and len(names) >= half:
            done_midway = True
            midway()
    assert done_midway
    return [n for n in names if n not in (b".", b"..")], calls


@pytest.mark.parametrize("how", ["invalidate", "ttl", "mutate"])
def test_readdirplus_cookies_survive_relist(
    ttl_gw: tuple[GatewayThread, OffsetClock],
    seaweed: SeaweedServer,
    bucket: str,
    dataset: Dataset,
    how: str,
) -> None:
    """A READDIRPLUS sequence over 5,000 entries that spans a re-list of the directory returns
    every entry exactly once. ``invalidate``: the index drops its view half-way (the next call
    waits for a fresh listing); ``ttl``: the view expires half-way (served stale while it is
    re-listed in the background); ``mutate``: the bucket changes behind the cursor and ahead
    of it, then the directory is re-listed."""
    g, clock = ttl_gw
    ns = g.export().ns
    expected = {n.encode() for n in dataset.expected_dir(WIDE)}
    added, gone_ahead, gone_behind = (
        f"{WIDE}/img_99999.jpg",
        f"{WIDE}/img_04000.jpg",
        f"{WIDE}/img_00010.jpg",
    )

    async def s3(op: Literal["put", "delete"], keys: list[str]) -> None:
        store = S3Store(bucket, **seaweed.store_kwargs())
        try:
            for k in keys:
                if op == "put":
                    await store.put(dataset.prefix + k, dataset.files.get(k, b"new"))
                else:
                    await store.delete(dataset.prefix + k)
        finally:
            await store.close()

    marks: dict[str, Counter[str]] = {}

    def midway() -> None:
        marks["before"] = g.backend_counts()
        if how == "invalidate":
            g.call(ns.invalidate, WIDE)
        elif how == "ttl":
            clock.advance(601.0)
        else:
            asyncio.run(s3("put", [added]))
            asyncio.run(s3("delete", [gone_ahead, gone_behind]))
            g.call(ns.invalidate, WIDE)

    with BlockingRpcClient("127.0.0.1", g.port) as c:
        root = c.mnt(b"/data")
        assert root.status == mount3.MountStat3.MNT3_OK
        look = c.nfs(Nfs3Proc.LOOKUP, Lookup3Args(Diropargs3(root.fhandle, WIDE.encode())))
        assert look.status == NfsStat3.NFS3_OK
        first = g.backend_counts()
        try:
            names, calls = _readdirplus_all(c, look.object, midway, 2500)
            if how == "ttl":
                g.run(ns.quiesce())  # the background re-list has finished
        finally:
            if how == "mutate":
                asyncio.run(s3("delete", [added]))
                asyncio.run(s3("put", [gone_ahead, gone_behind]))
    assert len(names) == len(set(names)), "an entry came twice"
    if how == "mutate":
        want = (expected | {added.split("/")[1].encode()}) - {gone_ahead.split("/")[1].encode()}
    else:
        want = expected
    assert set(names) == want
    assert calls > 50
    pages = delta(marks["before"], first)["list"]
    assert pages == 5
    # Half-way, the directory was re-listed once (5 pages) and so was its parent, the root
    # (1 page): invalidate() expires both, and the clock expired both; every call resolves the
    # directory's handle through the root. No HEAD, no GET.
    assert delta(g.backend_counts(), marks["before"]) == Counter({"list": pages + 1})
    assert g.namespace_stats()["relists"] == 2


# --------------------------------------------------------------------------- bad input


def test_bad_input(gw: GatewayThread, nfs: LibNfs, dataset: Dataset) -> None:
    before = gw.backend_counts()
    with BlockingRpcClient("127.0.0.1", gw.port) as c:
        # MOUNT of an unknown export
        assert (
            c.mnt(b"/nope").status == mount3.MountStat3.MNT3ERR_ACCES
        )  # no export: answered as a refused one
        root = c.mnt(b"/data")
        assert root.status == mount3.MountStat3.MNT3_OK
        fh = bytes(root.fhandle)
        ok = c.nfs(Nfs3Proc.GETATTR, Getattr3Args(fh))
        assert ok.status == NfsStat3.NFS3_OK
        # forged handles: a flipped MAC bit, random bytes, an empty handle
        forged = fh[:-1] + bytes([fh[-1] ^ 1])
        for bad in (forged, os.urandom(len(fh)), os.urandom(64), b""):
            res = c.nfs(Nfs3Proc.GETATTR, Getattr3Args(bad))
            assert res.status == NfsStat3.NFS3ERR_BADHANDLE, (bad.hex(), res.status)
        # NFSACL is not offered: the Linux client then stops asking for ACLs
        h, _ = c.call_raw(100227, 3, 0)
        assert h.accept_stat == AcceptStat.PROG_UNAVAIL
        # a read-only export refuses WRITE with ROFS (and the file is unchanged)
        look = c.nfs(Nfs3Proc.LOOKUP, Lookup3Args(Diropargs3(fh, b"README.txt")))
        assert look.status == NfsStat3.NFS3_OK
        w = c.nfs(Nfs3Proc.WRITE, Write3Args(look.object, 0, 5, StableHow.FILE_SYNC, b"HELLO"))
        assert w.status == NfsStat3.NFS3ERR_ROFS
    with pytest.raises(OSError):
        LibNfs(gw.libnfs_url("/nope"))
    with pytest.raises(OSError):
        nfs.open("/README.txt", os.O_WRONLY)
    assert nfs.read_file("/README.txt") == dataset.files["README.txt"]
    d = delta(gw.backend_counts(), before)
    assert set(d) <= {"list", "get"}, d  # nothing written, no HEAD
