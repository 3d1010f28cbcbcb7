"""The two-level data cache (memory -> local disk, ``gateway.data.disk``): GETs and files/s per
epoch for a dataset 8x the memory budget and within the disk budget, including the first
epoch after a restart; and the two tiers' hit ratio in shuffled epochs over a dataset twice
their total.

    .venv/bin/python benchmarks/disk_cache.py [--classes 20 --per-class 100] [--workers 8]
                                              [--sim-objects 3000] [--skip-gateway]

Part 1 (needs the `weed` binary): SeaweedFS <- counting proxy (this process) <- `nfsgw serve`
(a child process: memory budget = dataset / 8, disk budget = 2 x dataset, `cache_dir` in a
temporary directory) <- the loadgen ImageFolder workload (``kernel`` pattern, ``--workers``
data-loader workers, every byte checked against the manifest). Epoch 1 (cold), epoch 2, then
the gateway is stopped and started again on the same cache directory and epoch 3 runs. GETs are
counted at the proxy, i.e. what reached S3. The OS page cache is not dropped between epochs
(the host-wide memory tier stays warm, as it does in production across a gateway restart).

Part 2 (no network): ``ObjectReader`` + ``DataCache`` + ``DiskStore`` over an in-memory store,
ImageNet-like object sizes (lognormal, mean ~110 kB), memory 1/5 and disk 4/5 of a total cache
of half the dataset; four shuffled epochs; hit ratio = 1 - GETs / objects. The optimum for
uniform access is total / dataset = 0.5; plain LRU of the same total size is shown alongside.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/: _common
from _common import wait_until

from gateway.backend.base import GetResult
from gateway.data import (
    DataCache,
    DataConfig,
    DataStats,
    DiskConfig,
    DiskStore,
    ObjectReader,
)
from gateway.data.cache import BLOCK_ENTRY_CHARGE_BYTES
from gateway.data.disk import disk_key
from loadgen.dataset import DatasetSpec, make_dataset
from loadgen.gwprocess import GatewayProcess
from loadgen.proxy import DelayProxy
from loadgen.seaweed import SeaweedServer
from loadgen.workload import NodeGroup, WorkloadSpec

MiB = 1 << 20


@dataclass(frozen=True, slots=True)
class Account:
    endpoint_url: str
    access_key: str
    secret_key: str


def wait_for_disk_writes(gw: GatewayProcess, timeout_s: float = 120.0) -> float:
    """Until no write is pending and the count of writes stops moving; the count."""
    last = -1.0

    def settled() -> float | None:
        nonlocal last
        m = gw.metrics()
        writes, seen = m.get("nfsgw_disk_cache_writes_total", 0.0), last
        last = writes
        if m.get("nfsgw_disk_cache_pending_write_bytes", 0.0) == 0 and writes == seen:
            return writes
        return None

    return wait_until(
        settled, timeout_s=timeout_s, what="disk writes", interval_s=0.5, error=TimeoutError
    )


async def gateway_part(a: argparse.Namespace, work: Path) -> None:
    spec = DatasetSpec(classes=a.classes, per_class_min=a.per_class, per_class_max=a.per_class)
    sw = SeaweedServer().start()
    proxy = await DelayProxy(sw.endpoint_url).start()
    try:
        sw.create_bucket("diskcache")
        t0 = time.monotonic()
        manifest = await make_dataset(
            spec,
            s3_url="s3://diskcache/train/",
            s3_endpoint_url=sw.endpoint_url,
            access_key=sw.access_key,
            secret_key=sw.secret_key,
            manifest_path=work / "manifest.json",
            progress=False,
        )
        total = sum(e.size for e in manifest.entries)
        n = len(manifest.entries)
        memory = total // 8
        print(
            f"dataset: {n} files, {total / MiB:.1f} MiB (uploaded in "
            f"{time.monotonic() - t0:.1f} s); memory budget {memory / MiB:.1f} MiB (1/8), "
            f"disk budget {2 * total / MiB:.1f} MiB"
        )
        gw = GatewayProcess(
            work,
            [
                {
                    "path": "/data",
                    "backend": "s3://diskcache/train/",
                    "read_only": True,
                    "immutable": True,
                    "insecure": True,
                }
            ],
            sections={
                "server": {"cache_dir": str(work / "cache")},
                "cache": {"memory": memory, "disk": 2 * total, "disk_min_free": 0},
            },
            s3=Account(proxy.endpoint_url, sw.access_key, sw.secret_key),
        )
        rows: list[tuple[str, int, float, float, float]] = []

        async def run_epoch(label: str, epoch: int) -> None:
            wl = WorkloadSpec(
                target=gw.url,
                manifest=str(work / "manifest.json"),
                workers=a.workers,
                seed=a.seed,
            )
            before = proxy.counts["GET"]
            m0 = await asyncio.to_thread(gw.metrics)
            async with NodeGroup(wl) as group:
                await group.setup()
                t = time.monotonic()
                parts = await group.epoch(epoch)
                secs = time.monotonic() - t
            assert sum(p.files for p in parts) == n
            await asyncio.to_thread(wait_for_disk_writes, gw)
            m1 = await asyncio.to_thread(gw.metrics)

            def d(name: str) -> float:
                return m1.get(name, 0.0) - m0.get(name, 0.0)

            mem_hits = d("nfsgw_data_cache_hits_total")
            mem_look = mem_hits + d("nfsgw_data_cache_misses_total")
            disk_hits = d("nfsgw_disk_cache_hits_total")
            disk_look = disk_hits + d("nfsgw_disk_cache_misses_total")
            rows.append(
                (
                    label,
                    proxy.counts["GET"] - before,
                    n / secs,
                    mem_hits / mem_look if mem_look else 0.0,
                    disk_hits / disk_look if disk_look else 0.0,
                )
            )

        await asyncio.to_thread(gw.start)
        try:
            await run_epoch("epoch 1 (cold)", 0)
            await run_epoch("epoch 2", 1)
            await asyncio.to_thread(gw.stop)
            await asyncio.to_thread(gw.start)
            await run_epoch("epoch 3, after a restart", 2)
        finally:
            await asyncio.to_thread(gw.stop)
        print(
            "\n| epoch | GETs at S3 | GETs per file | files/s | memory hit ratio | disk hit "
            "ratio (of memory misses) |"
        )
        print("| --- | ---: | ---: | ---: | ---: | ---: |")
        for label, gets, fps, mh, dh in rows:
            print(f"| {label} | {gets} | {gets / n:.3f} | {fps:,.0f} | {mh:.3f} | {dh:.3f} |")
    finally:
        await proxy.close()
        sw.stop()


class SimStore:
    """An in-memory object store of ``sizes`` (bodies are views of one buffer); counts GETs."""

    name = "sim"

    def __init__(self, sizes: list[int]) -> None:
        self.sizes = sizes
        self.blob = bytes(max(sizes))
        self.gets = 0

    async def get(
        self, key: str, start: int = 0, end: int | None = None, *, if_match: str | None = None
    ) -> GetResult:
        self.gets += 1
        size = self.sizes[int(key)]
        stop = size if end is None else end
        return GetResult(self.blob[start:stop], '"e"', size, 0)


def lru_ratios(sizes: list[int], budget: int, epochs: int, seed: int) -> list[float]:
    rng = random.Random(seed)
    lru: OrderedDict[int, int] = OrderedDict()
    used = 0
    out = []
    for _ in range(epochs):
        order = list(range(len(sizes)))
        rng.shuffle(order)
        hits = 0
        for i in order:
            if i in lru:
                lru.move_to_end(i)
                hits += 1
                continue
            lru[i] = sizes[i]
            used += sizes[i]
            while used > budget:
                used -= lru.popitem(last=False)[1]
        out.append(hits / len(sizes))
    return out


async def simulation_part(a: argparse.Namespace) -> None:
    rng = random.Random(a.seed)
    sizes = [max(1000, int(rng.lognormvariate(11.3, 0.8))) for _ in range(a.sim_objects)]
    total = sum(sizes)
    half = total // 2
    store = SimStore(sizes)
    with tempfile.TemporaryDirectory(prefix="nfsgw-dc-sim-") as d:
        disk_charge = sum(disk_key("sim", str(i), '"e"', 0, s).charge for i, s in enumerate(sizes))
        overhead = disk_charge / total  # header + 4 KiB rounding, per byte of body
        disk_budget = int(half * 4 / 5 * overhead)
        mem_budget = half // 5 + len(sizes) // 10 * BLOCK_ENTRY_CHARGE_BYTES
        disk = await DiskStore.open(Path(d), DiskConfig(budget=disk_budget, min_free=0))
        assert disk is not None
        stats = DataStats()
        reader = ObjectReader(DataCache(mem_budget, stats=stats), DataConfig(), stats, disk)
        ratios = []
        cpu = time.process_time()
        for _ in range(4):
            order = list(range(len(sizes)))
            rng.shuffle(order)
            before = store.gets
            for i in order:
                await reader.read(store, str(i), '"e"', sizes[i], 0, sizes[i])  # type: ignore[arg-type]
            await disk.drain()
            await disk.rescan()
            ratios.append(1 - (store.gets - before) / len(sizes))
        cpu = time.process_time() - cpu
        await disk.close()
    lru = lru_ratios(sizes, half, 4, a.seed)
    print(
        f"\ntwo tiers, shuffled epochs: {len(sizes)} objects, {total / MiB:.0f} MiB; memory "
        f"{mem_budget / MiB:.0f} MiB + disk {disk_budget / MiB:.0f} MiB (bodies: half the "
        f"dataset; disk files carry {100 * (overhead - 1):.1f} % header and 4 KiB rounding)"
    )
    print("| epoch | two tiers | plain LRU, same total |")
    print("| --- | ---: | ---: |")
    for e, (r, lr) in enumerate(zip(ratios, lru, strict=True), 1):
        print(f"| {e} | {r:.3f} | {lr:.3f} |")
    print(f"optimum (total / dataset): 0.500; simulation CPU {cpu:.1f} s")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--classes", type=int, default=20)
    ap.add_argument("--per-class", type=int, default=100)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--sim-objects", type=int, default=3000)
    ap.add_argument("--skip-gateway", action="store_true", help="only the simulation")
    a = ap.parse_args()
    if not a.skip_gateway:
        with tempfile.TemporaryDirectory(prefix="nfsgw-dc-") as work:
            asyncio.run(gateway_part(a, Path(work)))
    asyncio.run(simulation_part(a))
    return 0


if __name__ == "__main__":
    sys.exit(main())
