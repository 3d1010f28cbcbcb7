"""``nfsgw pack``'s pipeline in-process over a ``MemoryStore`` (the command itself, against
SeaweedFS, is in ``tests/integration/test_pack.py``): a ``PackJob`` and the older positional
form give the same pack, an interrupted pack resumes with its finished shards, and the
index it writes serves every member."""

from __future__ import annotations

import asyncio
import dataclasses
import gzip
import io
import random

from gateway.backend.memory import MemoryStore
from gateway.pack.format import INDEX_NAME, UNPACKED_NAME, parse_index
from gateway.pack.packer import Packer, PackJob, PackOptions
from gateway.pack.store import PackedStore
from gateway.progress import Progress

KiB = 1024


def source(n: int = 40) -> MemoryStore:
    rng = random.Random(3)
    store = MemoryStore("mem")
    for i in range(n):
        data = rng.randbytes(rng.randrange(1, 20 * KiB))
        store.seed(f"ds/d{i % 3}/f{i:03d}", data, mtime_ns=i * 10**9)
    store.seed("ds/d0/", b"", mtime_ns=0)  # a directory marker: not packed, listed as unpacked
    return store


OPTS = PackOptions(shard_size=64 * KiB, part_size=16 * KiB, range_size=8 * KiB)


def test_the_same_job_writes_the_same_pack() -> None:
    async def run() -> None:
        a, b = source(), source()
        ra = await Packer(PackJob(a, "ds/", a, "packs/ds/", "s3://b/ds/"), OPTS).run()
        rb = await Packer(PackJob(b, "ds/", b, "packs/ds/", "s3://b/ds/"), OPTS, None).run()
        assert (ra.files, ra.shards, ra.unpacked) == (rb.files, rb.shards, rb.unpacked)
        assert ra.files == 40 and ra.shards > 2 and ra.unpacked == 1
        for key in (INDEX_NAME, UNPACKED_NAME):
            got_a = (await a.get("packs/ds/" + key)).data
            got_b = (await b.get("packs/ds/" + key)).data
            assert gzip.decompress(got_a) == gzip.decompress(got_b)

    asyncio.run(run())


def test_an_interrupted_pack_resumes_and_its_index_serves_every_member() -> None:
    async def run() -> None:
        store = source()
        job = PackJob(store, "ds/", store, "packs/ds/", "s3://b/ds/")
        first = await Packer(job, dataclasses.replace(OPTS, stop_after_shards=2)).run()
        assert first.stopped and first.shards == 2 and first.index_key == ""
        out = io.StringIO()
        second = await Packer(job, OPTS, Progress("pack", out, interval_s=0)).run()
        assert second.resumed_shards == 2 and second.rewritten == ""
        assert second.resumed_files + second.files == 40
        assert "files," in out.getvalue()
        raw = (await store.get("packs/ds/" + INDEX_NAME)).data
        index = parse_index(gzip.decompress(raw))
        assert len(index) == 40
        packed = PackedStore(
            store, store, "packs/ds/", "ds/", "s3://b/packs/ds/", "s3://b/ds/",
            small_file_max=1 << 20,
        )  # fmt: skip
        await packed.load()
        assert packed.status == "ok"
        for i in range(40):
            key = f"ds/d{i % 3}/f{i:03d}"
            want = (await store.get(key)).data
            assert (await packed.get(key)).data == want
        assert packed.stats.members == 40

    asyncio.run(run())
