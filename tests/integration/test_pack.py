"""``nfsgw pack SRC --to DST`` end to end: the command as a child process against SeaweedFS.

- A tree with awkward keys (unicode, spaces, ``%``, a tab, a ``dir/`` marker, an unpathable
  key (a 300-byte segment), empty files, a 64 MiB file read in ranges) packed into 1 MiB
  shards: every shard read back with Python's ``tarfile`` holds exactly the packable objects
  with their bytes; every index row (size, ETag, mtime, offset, CRC-32) is right; ``--verify``
  passes; the skipped keys are counted; SRC is unchanged (same keys, same ETags); a copy of
  the pack with one byte flipped fails ``--verify-only`` (exit 1, the member named).
- An interrupted pack (stopped after 2 shards by the hidden ``--stop-after-shards``, then
  killed with SIGKILL while a later shard is being written) resumed gives a correct pack, and
  no finished shard was rewritten (same ETag and Last-Modified before and after).
- SIGTERM mid-shard aborts the shard's multipart upload (exit 130); the next run completes.
- A missing SRC bucket, a DST that cannot be written (a missing bucket), DST inside SRC and an
  empty SRC: exit 2 with one clear line, nothing created.
"""

from __future__ import annotations

import asyncio
import io
import os
import random
import signal
import subprocess
import sys
import tarfile
import time
import uuid
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.backend.base import ObjectInfo
from gateway.backend.s3 import S3Store
from gateway.pack.format import PackIndex, parse_index
from loadgen.seaweed import SeaweedServer
from tests.datasets import put_objects

pytestmark = [pytest.mark.s3]

REPO = Path(__file__).resolve().parents[2]
KiB = 1024
MiB = 1024 * KiB
SRC_PREFIX = "ds/"

# A dir marker, and a key with a segment over NAME_MAX bytes the gateway cannot serve
# (SeaweedFS stores ``a//b.jpg`` as ``a/b.jpg`` and refuses ``.``/``..`` segments and NUL).
LONG = "long/" + "n" * 300 + "/f.jpg"
UNPACKABLE = {"train/empty-dir/", LONG}


def make_tree(seed: int = 16) -> dict[str, bytes]:
    rng = random.Random(seed)
    files = {
        f"train/c{i % 7}/img_{i:04d}.jpg": rng.randbytes(rng.randrange(1, 48 * KiB))
        for i in range(400)
    }
    files.update(
        {
            "train/cls a/img 1.jpg": rng.randbytes(3000),  # spaces
            "train/ünï/ß.jpg": rng.randbytes(5000),  # unicode
            "train/日本/画像.png": rng.randbytes(700),
            "train/100%/done%09.txt": b"percent signs",  # '%' is escaped in the index
            "train/tab\there.txt": b"a tab in the name",
            "train/empty0.bin": b"",
            "zz/empty1.bin": b"",
            "big/blob.bin": rng.randbytes(64 * MiB),  # four 16 MiB ranged GETs
            "train/empty-dir/": b"",
            LONG: b"not servable",
        }
    )
    return files


async def _listing(sw: SeaweedServer, bucket: str, prefix: str) -> dict[str, ObjectInfo]:
    store = S3Store(bucket, **sw.store_kwargs())
    try:
        out: dict[str, ObjectInfo] = {}
        token: str | None = None
        while True:
            page = await store.list_page(prefix, delimiter=None, token=token)
            out.update({o.key: o for o in page.objects})
            token = page.next_token
            if token is None:
                return out
    finally:
        await store.close()


def listing(sw: SeaweedServer, bucket: str, prefix: str = "") -> dict[str, ObjectInfo]:
    return asyncio.run(_listing(sw, bucket, prefix))


async def _get_all(sw: SeaweedServer, bucket: str, keys: list[str]) -> dict[str, bytes]:
    store = S3Store(bucket, **sw.store_kwargs())
    try:
        sem = asyncio.Semaphore(8)

        async def get(k: str) -> tuple[str, bytes]:
            async with sem:
                return k, (await store.get(k)).data

        return dict(await asyncio.gather(*(get(k) for k in keys)))
    finally:
        await store.close()


def get_all(sw: SeaweedServer, bucket: str, keys: list[str]) -> dict[str, bytes]:
    return asyncio.run(_get_all(sw, bucket, keys))


@pytest.fixture(scope="module")
def tree(seaweed: SeaweedServer) -> Iterator[tuple[str, dict[str, bytes]]]:
    """A bucket with ``make_tree`` under ds/ (keys S3 refuses are left out), shared by the
    tests of this module: none of them may change it."""
    name = f"pk-{uuid.uuid4().hex[:12]}"
    seaweed.create_bucket(name)
    files = make_tree()

    async def fill() -> None:
        store = S3Store(name, **seaweed.store_kwargs())
        try:
            objects = {SRC_PREFIX + k: v for k, v in files.items()}
            for key in await put_objects(store, objects, refusable=lambda k: "\t" in k):
                del files[key.removeprefix(SRC_PREFIX)]  # a store that refuses tabs in keys
        finally:
            await store.close()

    try:
        asyncio.run(fill())
        yield name, files
    finally:
        seaweed.delete_bucket(name)


@pytest.fixture
def dst_bucket(seaweed: SeaweedServer) -> Iterator[str]:
    name = f"pd-{uuid.uuid4().hex[:12]}"
    seaweed.create_bucket(name)
    try:
        yield name
    finally:
        seaweed.delete_bucket(name)


def pack_cmd(sw: SeaweedServer, *args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "gateway.ops.cli",
        "pack",
        *args,
        "--s3-endpoint-url",
        sw.endpoint_url,
        "--s3-region",
        sw.region,
    ]


def pack_env(sw: SeaweedServer) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        AWS_ACCESS_KEY_ID=sw.access_key,
        AWS_SECRET_ACCESS_KEY=sw.secret_key,
        AWS_CONFIG_FILE="/nonexistent",
        AWS_SHARED_CREDENTIALS_FILE="/nonexistent",
        NFSGW_CONFIG="",
        PYTHONPATH=str(REPO),
    )
    return env


def pack(sw: SeaweedServer, *args: str, timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        pack_cmd(sw, *args),
        env=pack_env(sw),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def packable(files: dict[str, bytes]) -> dict[str, bytes]:
    return {k: v for k, v in files.items() if k not in UNPACKABLE}


def load_index(sw: SeaweedServer, bucket: str, prefix: str) -> PackIndex:
    import gzip

    raw = get_all(sw, bucket, [prefix + "index.tsv.gz"])[prefix + "index.tsv.gz"]
    return parse_index(gzip.decompress(raw))


def check_pack(
    sw: SeaweedServer,
    src_bucket: str,
    files: dict[str, bytes],
    bucket: str,
    prefix: str,
    min_shards: int = 4,
) -> PackIndex:
    """Every shard read back with ``tarfile`` and every index row checked against SRC."""
    want = packable(files)
    src = listing(sw, src_bucket, SRC_PREFIX)
    index = load_index(sw, bucket, prefix)
    assert index.source == f"s3://{src_bucket}/{SRC_PREFIX}"
    assert sorted(index.shards) == list(range(len(index.shards)))
    dst = listing(sw, bucket, prefix)
    shard_keys = sorted(k for k in dst if k.startswith(prefix + "shard-"))
    assert shard_keys == [prefix + s.name for _, s in sorted(index.shards.items())]
    assert len(shard_keys) >= min_shards
    shards = get_all(sw, bucket, shard_keys)
    for s in index.shards.values():
        assert len(shards[prefix + s.name]) == s.size == dst[prefix + s.name].size
        assert dst[prefix + "parts/" + s.name.replace(".tar", ".tsv")].size > 0
    # The tar view: each member once, in key order, with its bytes.
    seen: list[str] = []
    for key in shard_keys:
        with tarfile.open(fileobj=io.BytesIO(shards[key]), mode="r:") as tar:
            for m in tar:
                assert m.isfile()
                f = tar.extractfile(m)
                assert f is not None
                assert f.read() == want[m.name], m.name
                seen.append(m.name)
    assert seen == sorted(want, key=lambda k: k.encode())
    # The index view: every row's size, ETag, mtime, offset and CRC.
    assert len(index) == len(want)
    for i in range(len(index)):
        path = index.path(i)
        body = want[path]
        info = src[SRC_PREFIX + path]
        shard = shards[prefix + index.shards[index.shard_of[i]].name]
        at = index.data_at[i]
        assert index.sizes[i] == len(body) == info.size
        assert index.etag(i).strip('"') == info.etag.strip('"')
        assert index.mtimes[i] == info.mtime_ns
        assert shard[at : at + len(body)] == body, path
        assert index.crcs[i] == zlib.crc32(body)
    return index


def snapshot_src(sw: SeaweedServer, bucket: str) -> dict[str, str]:
    return {k: o.etag for k, o in listing(sw, bucket).items()}


def test_pack_awkward_tree(
    seaweed: SeaweedServer, tree: tuple[str, dict[str, bytes]], dst_bucket: str
) -> None:
    bucket, files = tree
    before = snapshot_src(seaweed, bucket)
    src_url = f"s3://{bucket}/ds"
    dst_url = f"s3://{dst_bucket}/packs/p1"
    r = pack(seaweed, src_url, "--to", dst_url, "--shard-size", "1M", "--verify", "--quiet")
    assert r.returncode == 0, r.stderr
    n = len(packable(files))
    assert f"packed {n} files" in r.stdout
    assert "skipped 2 (dir markers 1, unservable names 1, changed 0, deleted 0)" in r.stdout
    assert f"index: {dst_url}/index.tsv.gz ({n} files in " in r.stdout
    assert f"verify: {n} files in " in r.stdout and r.stdout.rstrip().endswith("OK")
    index = check_pack(seaweed, bucket, files, dst_bucket, "packs/p1/")
    big = index.find("big/blob.bin")
    assert big >= 0 and index.sizes[big] == 64 * MiB
    assert snapshot_src(seaweed, bucket) == before
    # Nothing but the pack under DST (the access probe is gone).
    names = {k.removeprefix("packs/p1/") for k in listing(seaweed, dst_bucket)}
    assert names == (
        {"index.tsv.gz", "unpacked.tsv.gz", "parts/source.url"}
        | {s.name for s in index.shards.values()}
        | {"parts/" + s.name.replace(".tar", ".tsv") for s in index.shards.values()}
    )

    # A damaged shard (one byte flipped in a copy of the pack): --verify-only fails.
    shard0 = index.shards[0].name
    raw = bytearray(get_all(seaweed, dst_bucket, [f"packs/p1/{shard0}"])[f"packs/p1/{shard0}"])
    raw[index.data_at[0]] ^= 0xFF  # row 0 is the first member of shard 0
    copy = {
        k.removeprefix("packs/p1/"): v
        for k, v in get_all(
            seaweed,
            dst_bucket,
            ["packs/p1/index.tsv.gz"] + [f"packs/p1/{s.name}" for s in index.shards.values()],
        ).items()
    }
    copy[shard0] = bytes(raw)

    async def put_copy() -> None:
        store = S3Store(dst_bucket, **seaweed.store_kwargs())
        try:
            for k, v in copy.items():
                await store.put("bad/" + k, v)
        finally:
            await store.close()

    asyncio.run(put_copy())
    bad = pack(seaweed, src_url, "--to", f"s3://{dst_bucket}/bad", "--verify-only", "--quiet")
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert f"{shard0}: {index.path(0)!r}: CRC-32" in bad.stderr
    assert "1 errors" in bad.stdout


def _wait_for(pred: object, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError("timed out")


def test_interrupted_pack_resumes(
    seaweed: SeaweedServer, tree: tuple[str, dict[str, bytes]], dst_bucket: str
) -> None:
    bucket, files = tree
    before = snapshot_src(seaweed, bucket)
    src_url = f"s3://{bucket}/ds/"
    dst_url = f"s3://{dst_bucket}/p2"
    args = (src_url, "--to", dst_url, "--shard-size", "1M", "--quiet", "--concurrency", "4")

    # 1. Stopped after two shards, as if killed between shards: no index yet.
    r = pack(seaweed, *args, "--stop-after-shards", "2")
    assert r.returncode == 0, r.stderr
    assert "stopped after 2 shards" in r.stdout
    dst = listing(seaweed, dst_bucket)
    assert "p2/index.tsv.gz" not in dst
    assert {k for k in dst if k.startswith("p2/parts/shard-")} == {
        "p2/parts/shard-000000.tsv",
        "p2/parts/shard-000001.tsv",
    }

    # 2. Killed (SIGKILL: no clean-up at all) once a third shard is finished, mid-way.
    slow = (*args[:-2], "--concurrency", "1")  # one GET at a time: shards take a while
    proc = subprocess.Popen(pack_cmd(seaweed, *slow), env=pack_env(seaweed), cwd=REPO)
    try:
        _wait_for(
            lambda: "p2/parts/shard-000003.tsv" in listing(seaweed, dst_bucket, "p2/parts/"),
            120,
        )
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    assert proc.returncode == -signal.SIGKILL  # killed, not finished
    dst = listing(seaweed, dst_bucket, "p2/")
    finished = {
        k: (o.etag, o.mtime_ns)
        for k, o in dst.items()
        if k.startswith("p2/shard-") and f"p2/parts/{k[3:].replace('.tar', '.tsv')}" in dst
    }
    assert len(finished) >= 4
    assert "p2/index.tsv.gz" not in listing(seaweed, dst_bucket)

    # 3. Resumed: the finished shards are kept as they are, the rest is packed.
    time.sleep(1.1)  # a rewritten shard would get a later Last-Modified
    r = pack(seaweed, *args, "--verify")
    assert r.returncode == 0, r.stderr
    assert f"kept {len(finished)} finished shards" in r.stdout
    assert r.stdout.rstrip().endswith("OK")
    after = listing(seaweed, dst_bucket, "p2/")
    for k, v in finished.items():
        assert (after[k].etag, after[k].mtime_ns) == v, k
    check_pack(seaweed, bucket, files, dst_bucket, "p2/")

    # 4. Run again on a complete pack: nothing new is packed, the same index is written.
    r = pack(seaweed, *args)
    assert r.returncode == 0, r.stderr
    assert "packed 0 files" in r.stdout
    check_pack(seaweed, bucket, files, dst_bucket, "p2/")
    assert snapshot_src(seaweed, bucket) == before


def test_refused_before_any_work(
    seaweed: SeaweedServer, tree: tuple[str, dict[str, bytes]], dst_bucket: str
) -> None:
    bucket, _ = tree
    before = snapshot_src(seaweed, bucket)
    missing = f"nx-{uuid.uuid4().hex[:12]}"

    def refused(*args: str, msg: str) -> None:
        r = pack(seaweed, *args, "--quiet", timeout_s=120)
        assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("nfsgw pack: "), r.stderr
        assert msg in lines[0], lines[0]
        assert r.stdout == ""

    refused(f"s3://{missing}/ds", "--to", f"s3://{dst_bucket}/p3", msg="cannot list")
    refused(f"s3://{bucket}/ds", "--to", f"s3://{missing}/p3", msg="cannot write")
    refused(f"s3://{bucket}/ds", "--to", f"s3://{bucket}/ds/packed", msg="overlap")
    refused(f"s3://{bucket}/ds/train", "--to", f"s3://{bucket}/ds", msg="overlap")
    refused(f"s3://{bucket}/nothing-here", "--to", f"s3://{dst_bucket}/p3", msg="no objects")
    refused(
        f"s3://{bucket}/ds", "--to", f"s3://{dst_bucket}/p3", "--verify-only", msg="no pack index"
    )
    assert listing(seaweed, dst_bucket) == {}
    assert snapshot_src(seaweed, bucket) == before
    status, _ = seaweed.request("HEAD", f"/{missing}")
    assert status == 404  # the missing bucket was not created


def test_sigterm_aborts_the_open_upload(
    seaweed: SeaweedServer, tree: tuple[str, dict[str, bytes]], dst_bucket: str
) -> None:
    """SIGTERM (like Ctrl-C) mid-shard: the shard's multipart upload is aborted, exit 130, no
    shard and no part file left; the next run packs everything."""
    bucket, files = tree
    args = (f"s3://{bucket}/ds", "--to", f"s3://{dst_bucket}/p4", "--quiet")
    # One 1 GiB shard, one GET at a time: big/blob.bin (first in key order) is being uploaded
    # in 16 MiB parts for a while.
    proc = subprocess.Popen(
        pack_cmd(seaweed, *args, "--shard-size", "1G", "--concurrency", "1"),
        env=pack_env(seaweed),
        cwd=REPO,
        stderr=subprocess.PIPE,
        text=True,
    )
    s3 = seaweed.boto3_client()
    try:
        _wait_for(
            lambda: s3.list_multipart_uploads(Bucket=dst_bucket).get("Uploads"), timeout_s=120
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted; run the same command again to resume" in err
    assert not s3.list_multipart_uploads(Bucket=dst_bucket).get("Uploads")
    assert set(listing(seaweed, dst_bucket)) == {"p4/parts/source.url"}
    r = pack(seaweed, *args, "--shard-size", "1G")
    assert r.returncode == 0, r.stderr
    index = check_pack(seaweed, bucket, files, dst_bucket, "p4/", min_shards=1)
    assert len(index.shards) == 1
