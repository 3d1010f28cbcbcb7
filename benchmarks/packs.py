"""Packed datasets (issue 16): ``nfsgw pack`` on an ImageNet-like tree, then cold and warm
epochs over the same tree served unpacked and packed, side by side in one run.

    .venv/bin/python benchmarks/packs.py [--files 10000] [--size 110000] [--latency-ms 20]
        [--clients 4] [--epochs-2x 3] [--workers 1] [--reader c|python] [--out DIR]

Set-up as ``benchmarks/data_prefetch.py`` (whose helpers this script reuses): a throw-away
SeaweedFS holding ``--files`` files in folders of 100 (lognormal sizes of mean ``--size``),
the delay proxy in its own process adding ``--latency-ms`` to every request and counting them,
a fresh ``nfsgw serve`` per configuration (``--workers`` processes, one by default; read-only,
immutable export; the default data cache: the memory tier plus the disk tier under the
gateway's state directory, fresh for each configuration; data prefetch on), and libnfs
clients: an ImageFolder-like scan (from the Python client, not timed), then ``--clients``
connections each reading whole files in a fresh random order, every byte checked: by default
the C reader (``benchmarks/nfsread.c``, against a local copy of the tree written with the
upload, ``data_prefetch.local_copy``), ``--reader python`` the threads over
``tests/libnfs.py`` that were the method before it (their ctypes client took about a core of
the 2-core machine). Each epoch also reports the disk tier's hits and writes (a packed
group's neighbours are written there too), its look-ups that missed, and the CPU of the
gateway, the proxy, SeaweedFS and the client.

1. **Pack**: ``nfsgw pack s3://bench/train --to s3://bench/packs/train`` straight against
   SeaweedFS (no added latency): seconds and MB/s, and the time projected for ImageNet's
   148 GB at that rate.
2. **Unpacked**: the tree as objects, cache larger than the dataset: a cold and a warm epoch.
3. **Packed**: the same export with ``pack = s3://bench/packs/train``: a cold and a warm
   epoch. Targets: GET per image <= 0.02 (cold), cold images/s >= 3x the unpacked cold epoch
   and >= 0.8x the unpacked warm epoch.
4. **Packed, dataset twice the cache**: ``--epochs-2x`` shuffled epochs; bytes fetched from S3
   per epoch (shard ranges, ``nfsgw_pack_range_bytes_total``, plus any GET of an object:
   ``nfsgw_pack_fallbacks_total`` counts those) against the dataset's size (target <= 1.1x).

Results on stdout and in ``DIR/results.json`` (default /var/tmp/nfsgw-packs). Must not import
the gateway or leave a process running.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/: _common, siblings
from _common import ROOT, metric, results_dir, settle, wait_until, write_results
from data_prefetch import (
    PREFIX,
    Account,
    ProxyProcess,
    cpu_seconds,
    git_state,
    local_copy,
    log,
    open_readers,
    upload_tree,
)

from loadgen.dataset import Manifest
from loadgen.gwprocess import GatewayProcess
from loadgen.seaweed import SeaweedServer

OUT = results_dir("packs")
BUCKET = "bench"
PACK = f"s3://{BUCKET}/packs/train"
MiB = 1024 * 1024
IMAGENET_BYTES = 148e9


@dataclass(slots=True)
class Epoch:
    epoch: int
    files_per_s: float
    seconds: float
    gets: int
    gets_per_file: float
    lists: int
    s3_bytes: int
    s3_bytes_per_dataset: float
    pack_members: int
    pack_ranges: int
    pack_fallbacks: int
    memory_hit_ratio: float
    disk_hits: int
    disk_misses: int  # look-ups of the disk tier that found nothing (a thread round trip each)
    disk_writes: int
    gateway_cpu_s_per_1k: float
    client_cpu_s_per_1k: float
    cpu_share: dict[str, float]  # of the epoch's wall time, per process (1.0 = one core)
    errors: int


@dataclass(slots=True)
class Run:
    name: str
    memory: int
    reader: str
    epochs: list[Epoch] = field(default_factory=list)


def pack(sw: SeaweedServer, work: Path, out: Path) -> dict[str, float]:
    env = dict(os.environ)
    env |= {"AWS_ACCESS_KEY_ID": sw.access_key, "AWS_SECRET_ACCESS_KEY": sw.secret_key}
    env["AWS_REGION"] = sw.region
    argv = [sys.executable, "-m", "gateway.ops.cli", "pack", f"s3://{BUCKET}/{PREFIX}"]
    argv += ["--to", PACK, "--s3-endpoint-url", sw.endpoint_url, "--quiet"]
    t0 = time.perf_counter()
    with (out / "pack.log").open("wb") as f:
        subprocess.run(argv, env=env, check=True, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT)
    return {"seconds": round(time.perf_counter() - t0, 2)}


def run_gateway(
    a: argparse.Namespace,
    name: str,
    memory: int,
    epochs: int,
    packed: bool,
    manifest: Manifest,
    proxy: ProxyProcess,
    sw: SeaweedServer,
    work: Path,
    local: Path | None,
) -> Run:
    export: dict[str, object] = {
        "path": "/data",
        "backend": f"s3://{BUCKET}/{PREFIX}",
        "read_only": True,
        "immutable": True,
        "insecure": True,
    }
    if packed:
        export["pack"] = PACK
    env = {k: v for k, v in os.environ.items() if k != "CACHE_DIRECTORY"}
    gw = GatewayProcess(
        work,
        [export],
        name=name,
        sections={"cache": {"memory": memory}},
        s3=Account(proxy.endpoint_url, sw.access_key, sw.secret_key),
        env=env,
        workers=a.workers,
    )
    run = Run(name, memory, a.reader)
    total = manifest.total_bytes
    gw.start()
    try:
        if packed:  # the index loads in the background: wait for it
            wait_until(
                lambda: metric(gw.metrics(), "nfsgw_pack_loaded") >= a.workers,  # summed
                timeout_s=120,
                what="the pack index",
                interval_s=0.1,
                log_tail=lambda: f"log: {gw.log_path}",
            )
        readers = open_readers(a.reader, gw.libnfs_url("/data"), local, a.clients)
        try:
            m0, p0 = gw.metrics(), proxy.counts()
            readers.scan(manifest)
            for e in range(epochs):
                order = list(range(len(manifest.entries)))
                random.Random(a.seed + e).shuffle(order)
                pids = {"gateway": gw.pid, "proxy": proxy.proc.pid}
                if sw.proc is not None:
                    pids["seaweedfs"] = sw.proc.pid
                cpu0s = {k: cpu_seconds(v) for k, v in pids.items()}
                r = readers.epoch(manifest, order)
                wall = r.seconds
                shares = {k: (cpu_seconds(v) - cpu0s[k]) / wall for k, v in pids.items()}
                shares["client"] = r.client_cpu_s / wall
                cpu = shares["gateway"] * wall
                settle(gw)
                m, p = gw.metrics(), proxy.counts()

                def d(key: str, m: dict[str, float] = m, m0: dict[str, float] = m0) -> float:
                    return metric(m, key) - metric(m0, key)

                n = r.files
                gets = p.get("GET", 0) - p0.get("GET", 0)
                ranges = round(d("nfsgw_pack_ranges_total"))
                object_bytes = d("nfsgw_backend_received_bytes_total")
                # an object GET's bytes are counted by the data layer; a member served from
                # a shard is too, so with a pack count the ranges instead
                s3_bytes = (
                    round(d("nfsgw_pack_range_bytes_total"))
                    + round(d("nfsgw_pack_fallbacks_total")) * total // len(manifest.entries)
                    if packed
                    else round(object_bytes)
                )
                hits = d("nfsgw_data_cache_hits_total")
                looks = hits + d("nfsgw_data_cache_misses_total")
                ep = Epoch(
                    epoch=e + 1,
                    files_per_s=round(n / wall, 1),
                    seconds=round(wall, 2),
                    gets=gets,
                    gets_per_file=round(gets / n, 4),
                    lists=p.get("LIST", 0) - p0.get("LIST", 0),
                    s3_bytes=s3_bytes,
                    s3_bytes_per_dataset=round(s3_bytes / total, 3),
                    pack_members=round(d("nfsgw_pack_members_total")),
                    pack_ranges=ranges,
                    pack_fallbacks=round(d("nfsgw_pack_fallbacks_total")),
                    memory_hit_ratio=round(hits / looks, 4) if looks else 0.0,
                    disk_hits=round(d("nfsgw_disk_cache_hits_total")),
                    disk_misses=round(d("nfsgw_disk_cache_misses_total")),
                    disk_writes=round(d("nfsgw_disk_cache_writes_total")),
                    gateway_cpu_s_per_1k=round(cpu / n * 1000, 3),
                    client_cpu_s_per_1k=round(r.client_cpu_s / n * 1000, 3),
                    cpu_share={k: round(v, 2) for k, v in shares.items()},
                    errors=r.errors,
                )
                m0, p0 = m, p
                run.epochs.append(ep)
                log(f"  {name} epoch {ep.epoch}: {asdict(ep)}")
        finally:
            readers.close()
    finally:
        gw.stop()
    return run


def run(a: argparse.Namespace) -> int:
    a.out.mkdir(parents=True, exist_ok=True)
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="nfsgw-packs-") as tmp, local_copy(a.reader) as local:
        work = Path(tmp)
        sw = SeaweedServer().start()
        proxy: ProxyProcess | None = None
        try:
            manifest = upload_tree(sw, BUCKET, a.files, a.size, work, local)
            total = manifest.total_bytes
            packing = pack(sw, work, a.out)
            packing["mb_per_s"] = round(total / packing["seconds"] / 1e6, 1)
            packing["files_per_s"] = round(len(manifest.entries) / packing["seconds"], 1)
            packing["imagenet_hours"] = round(
                IMAGENET_BYTES / (packing["mb_per_s"] * 1e6) / 3600, 2
            )
            log(f"pack: {packing}")
            proxy = ProxyProcess(sw.endpoint_url, a.latency_ms, a.out / "proxy.log")
            big = total * 3 // 2 + 64 * MiB
            plan = [
                ("unpacked", big, 2, False),
                ("packed", big, 2, True),
                ("packed-2x", total // 2, a.epochs_2x, True),
            ][: 2 if a.skip_2x else 3]
            for name, memory, epochs, packed in plan:
                log(f"{name}: cache {memory / MiB:.0f} MiB, {epochs} epochs")
                runs.append(
                    run_gateway(a, name, memory, epochs, packed, manifest, proxy, sw, work, local)
                )
        finally:
            if proxy is not None:
                proxy.stop()
            sw.stop()
            for log_file in work.glob("*.log"):
                shutil.copy(log_file, a.out / log_file.name)
    by = {r.name: r for r in runs}
    u_cold, u_warm = by["unpacked"].epochs[0], by["unpacked"].epochs[-1]
    p_cold = by["packed"].epochs[0]
    two = (by["packed-2x"].epochs[1:] or by["packed-2x"].epochs) if "packed-2x" in by else []
    summary = {
        "pack": packing,
        "packed_cold_gets_per_image": p_cold.gets_per_file,
        "packed_cold_over_unpacked_cold": round(p_cold.files_per_s / u_cold.files_per_s, 2),
        "packed_cold_over_unpacked_warm": round(p_cold.files_per_s / u_warm.files_per_s, 2),
        "two_x_s3_bytes_per_dataset": max((e.s3_bytes_per_dataset for e in two), default=None),
        "two_x_gets_per_image": max((e.gets_per_file for e in two), default=None),
    }
    print(json.dumps(summary, indent=1))
    result = {
        "args": {k: str(v) for k, v in vars(a).items()},
        "commit": git_state(),
        "reader": a.reader,
        "dataset": {"files": len(manifest.entries), "bytes": total},
        "runs": [asdict(r) for r in runs],
        "summary": summary,
    }
    log(f"results: {write_results(a.out, result)}")
    return 1 if any(e.errors for r in runs for e in r.epochs) else 0


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--files", type=int, default=10_000, help="files, in folders of 100")
    p.add_argument("--size", type=int, default=110_000, help="mean file size, bytes")
    p.add_argument("--epochs-2x", type=int, default=3, help="epochs with twice the cache")
    p.add_argument("--latency-ms", type=float, default=20.0, help="added to every S3 request")
    p.add_argument("--clients", type=int, default=4, help="client threads (connections)")
    p.add_argument("--seed", type=int, default=1, help="epoch orders")
    p.add_argument("--workers", type=int, default=1, help="nfsgw serve --workers")
    p.add_argument(
        "--reader",
        choices=["c", "python"],
        default="c",
        help="the epochs' client: the C reader (benchmarks/nfsread.c) or tests/libnfs.py from "
        "Python threads (the method before the C reader)",
    )
    p.add_argument("--out", type=Path, default=OUT, help="results.json and the logs")
    p.add_argument("--skip-2x", action="store_true", help="leave out the twice-the-cache run")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    return run(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
