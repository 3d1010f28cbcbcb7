"""The disk tier end to end: SeaweedFS <- counting proxy <- gateway <- libnfs.

- In-process gateway (``tests.harness.thread``): a dataset 8x the memory budget and within the
  disk budget: epoch 1 fetches each file once, epoch 2 makes 0 GETs (counted at the proxy,
  i.e. what reached S3); a gateway restarted on the same cache directory serves its first
  epoch with 0 GETs; cache files damaged on disk (a flipped byte, a truncation) are detected,
  dropped and fetched again.
- ``nfsgw serve --workers 2`` (``GatewayProcess``): a data warm-up (run by worker 0) fills the
  shared disk tier; connections served by either worker then read every file with 0 GETs, and
  so does the first epoch after the service restarts.

Every byte is checked against the uploaded bodies every time.
"""

from __future__ import annotations

import json
import random
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gateway.exports import ExportConfig
from loadgen.gwprocess import GatewayProcess
from loadgen.seaweed import SeaweedServer
from tests.datasets import md5
from tests.harness.buckets import MakeBucket
from tests.harness.proxy import ThreadProxy
from tests.harness.thread import GatewayThread
from tests.libnfs import LibNfs, libnfs_available

pytestmark = [
    pytest.mark.s3,
    pytest.mark.libnfs,
    pytest.mark.skipif(not libnfs_available(), reason="libnfs (libnfs.so.13) is not installed"),
]

KiB = 1024
MiB = 1024 * KiB


def make_files(n: int = 160, seed: int = 12) -> dict[str, bytes]:
    rng = random.Random(seed)
    files = {
        f"c{i % 4}/img_{i:04d}.jpg": rng.randbytes(rng.randrange(8 * KiB, 40 * KiB))
        for i in range(n)
    }
    files["large/block.bin"] = rng.randbytes(3 * MiB + 5)  # read in 1 MiB blocks
    files["empty.bin"] = b""
    return files


@pytest.fixture
def bucket(make_bucket: MakeBucket) -> tuple[str, dict[str, bytes]]:
    files = make_files()
    return make_bucket("dc", {"ds/" + k: v for k, v in files.items()}), files


def gateway(
    tmp_path: Path, seaweed: SeaweedServer, proxy: ThreadProxy, bucket: str, memory: int
) -> GatewayThread:
    s3 = dict(seaweed.store_kwargs())
    s3["endpoint_url"] = proxy.endpoint_url
    return GatewayThread(
        [
            ExportConfig(
                "/data", f"s3://{bucket}/ds/", read_only=True, immutable=True, insecure=True
            )
        ],
        state_dir=tmp_path / "state",
        s3=s3,
        server_cache_dir=tmp_path / "cache",
        cache_memory=memory,
        cache_disk=256 * MiB,
        cache_disk_min_free=0,
        cache_small_file_max=1 * MiB,
    )


def epoch(gw: GatewayThread, files: dict[str, bytes], seed: int) -> None:
    """Read every file once in a shuffled order and check its bytes; then let the disk
    tier's writes land."""
    order = sorted(files)
    random.Random(seed).shuffle(order)
    with LibNfs(gw.libnfs_url("/data")) as nfs:
        for path in order:
            got = nfs.read_file("/" + path)
            assert md5(got) == md5(files[path]), path
    disk = gw.server.gateway.reader.disk if gw.server.gateway else None
    assert disk is not None
    gw.run(disk.drain())


def disk_stats(gw: GatewayThread) -> dict[str, int]:
    def snap() -> dict[str, int]:
        gateway = gw.server.gateway
        assert gateway is not None and gateway.reader.disk is not None
        s = gateway.reader.disk.stats
        return {k: getattr(s, k) for k in s.__slots__}

    return gw.call(snap)


def test_dataset_eight_times_memory_costs_no_get_in_epoch_two_and_after_restarts(
    tmp_path: Path,
    seaweed: SeaweedServer,
    thread_proxy: ThreadProxy,
    bucket: tuple[str, dict[str, bytes]],
) -> None:
    name, files = bucket
    total = sum(len(v) for v in files.values())
    memory = total // 8
    small = sum(1 for v in files.values() if 0 < len(v) <= MiB)
    with gateway(tmp_path, seaweed, thread_proxy, name, memory) as gw:
        before = thread_proxy.kinds()
        epoch(gw, files, seed=1)
        gets1 = thread_proxy.kinds()["GET"] - before["GET"]
        assert small <= gets1 <= small + 4  # one GET per small file; the 3 MiB file in blocks
        assert disk_stats(gw)["writes"] == small + 4  # every small file and the four blocks
        before = thread_proxy.kinds()
        epoch(gw, files, seed=2)
        assert thread_proxy.kinds()["GET"] == before["GET"]  # epoch 2: 0 GETs
        s = disk_stats(gw)
        assert s["hits"] > 0 and s["corrupt"] == 0 and s["used_bytes"] <= s["budget_bytes"]
    before = thread_proxy.kinds()
    with gateway(tmp_path, seaweed, thread_proxy, name, memory) as gw:  # restarted, memory empty
        epoch(gw, files, seed=3)
        assert thread_proxy.kinds()["GET"] == before["GET"]  # first epoch after a restart: 0 GETs
        assert disk_stats(gw)["hits"] == small + 4
    entries = sorted((tmp_path / "cache" / "v2").glob("*/[0-9a-f]*"))
    assert len(entries) == small + 4
    damage_two_entries(entries)
    before = thread_proxy.kinds()
    with gateway(tmp_path, seaweed, thread_proxy, name, memory) as gw:
        epoch(gw, files, seed=4)  # bytes still right: the bad entries are never served
        assert thread_proxy.kinds()["GET"] - before["GET"] == 2
        s = disk_stats(gw)
        assert s["corrupt"] == 2 and s["writes"] == 2  # dropped, fetched, published again


def damage_two_entries(names: list[Path]) -> None:
    """Flip the last byte of one entry's body, and cut the last 1000 bytes of another,
    the last entry of a bundle (``gateway.data.disk.fileformat``) that holds neither the first."""
    from gateway.data.disk.fileformat import find_in_table

    def span(p: Path) -> tuple[int, int]:
        why, off, nbytes = find_in_table(p.read_bytes()[:4096], p.name)
        assert not why
        return off, nbytes

    flipped = names[0]
    off, nbytes = span(flipped)
    raw = bytearray(flipped.read_bytes())
    raw[off + nbytes - 1] ^= 0x40
    flipped.write_bytes(raw)  # in place: the same inode, whatever names it has
    ino = flipped.stat().st_ino
    cut = next(
        p
        for p in names[1:]
        if p.stat().st_ino != ino and sum(span(p)) == p.stat().st_size and span(p)[1] > 1000
    )
    cut.write_bytes(cut.read_bytes()[:-1000])


@dataclass(frozen=True, slots=True)
class Account:
    endpoint_url: str
    access_key: str
    secret_key: str


def _metric(gw: GatewayProcess, name: str) -> float:
    return sum(v for k, v in gw.metrics().items() if k == name or k.startswith(name + "{"))


def _post(gw: GatewayProcess, path: str, body: Any) -> tuple[int, Any]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{gw.admin_port}{path}",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json", **gw.admin_headers()},
    )
    with urllib.request.urlopen(req, timeout=120) as r:
        return r.status, json.loads(r.read())


def _connections_on_both_workers(gw: GatewayProcess) -> list[LibNfs]:
    clients: list[LibNfs] = []
    for _ in range(64):
        c = LibNfs(gw.libnfs_url("/data"))
        c.stat("/c0")
        clients.append(c)
        per_worker = [
            v for k, v in gw.metrics().items() if k.startswith("nfsgw_worker_rpc_requests_total{")
        ]
        if len(per_worker) == 2 and all(v > 0 for v in per_worker):
            return clients
    raise AssertionError("64 connections all went to one worker")


def _epoch_over(clients: list[LibNfs], files: dict[str, bytes], seed: int) -> None:
    order = sorted(files)
    random.Random(seed).shuffle(order)
    for i, path in enumerate(order):
        assert md5(clients[i % len(clients)].read_file("/" + path)) == md5(files[path]), path


def _served_from_the_shared_tier(gw: GatewayProcess, small: int) -> None:
    hits = _metric(gw, "nfsgw_disk_cache_hits_total")
    prefetched = _metric(gw, "nfsgw_prefetch_objects_total")
    assert hits + prefetched >= small, (hits, prefetched)
    assert _metric(gw, "nfsgw_data_cache_mapped_bytes") > 0


def test_two_workers_share_the_disk_tier_a_warm_up_fills_and_restarts_keep(
    tmp_path: Path,
    seaweed: SeaweedServer,
    thread_proxy: ThreadProxy,
    bucket: tuple[str, dict[str, bytes]],
) -> None:
    name, files = bucket
    total = sum(len(v) for v in files.values())
    small = sum(1 for v in files.values() if 0 < len(v) <= MiB)
    gw = GatewayProcess(
        tmp_path,
        [
            {
                "path": "/data",
                "backend": f"s3://{name}/ds/",
                "read_only": True,
                "immutable": True,
                "insecure": True,
            }
        ],
        admin_token=True,  # POST /v1/warmup on TCP needs one
        sections={
            "server": {"cache_dir": str(tmp_path / "cache")},
            "cache": {
                "memory": total // 8,
                "disk": 256 * MiB,
                "disk_min_free": 0,
                "small_file_max": MiB,
            },
        },
        s3=Account(thread_proxy.endpoint_url, seaweed.access_key, seaweed.secret_key),
        workers=2,
    )
    with gw:
        before = thread_proxy.kinds()["GET"]
        status, job = _post(gw, "/v1/warmup", {"path": "/data", "data": True, "wait": True})
        assert status == 200 and job["state"] == "done" and job["tier"] == "disk", job
        # The data prefetcher (on by default; with workers it fills the disk tier) may have
        # written some first: the warm-up then finds them cached. Either way one GET each.
        assert job["files_read"] + job["files_cached"] == len(files)  # the empty one too
        assert job["stopped"] is None
        assert thread_proxy.kinds()["GET"] - before == small + 1  # the 3 MiB file in one ranged GET
        clients = _connections_on_both_workers(gw)
        try:
            before = thread_proxy.kinds()["GET"]
            _epoch_over(clients, files, seed=5)
            assert thread_proxy.kinds()["GET"] == before  # either worker: 0 GETs
            # Served from the shared tier: every file a READ's disk hit or mapped into memory
            # ahead of the READs by its worker's prefetcher (the warm-up filled the disk tier
            # only, so a memory hit must have been prefetched).
            _served_from_the_shared_tier(gw, small)
            assert _metric(gw, "nfsgw_disk_cache_corrupt_total") == 0
        finally:
            for c in clients:
                c.close()
        gw.stop()
        gw.start()  # the whole service restarts on the same cache directory
        deadline = time.monotonic() + 30
        while _metric(gw, "nfsgw_disk_cache_enabled") < 1:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        clients = _connections_on_both_workers(gw)
        try:
            before = thread_proxy.kinds()["GET"]
            _epoch_over(clients, files, seed=6)
            assert thread_proxy.kinds()["GET"] == before
            _served_from_the_shared_tier(gw, small)
        finally:
            for c in clients:
                c.close()
