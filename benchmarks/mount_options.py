"""The Linux client's mount options, measured: for each option set, a fresh nfsgw over SeaweedFS
serving an ImageNet-shaped tree (``loadgen.dataset``, ImageNet's size distribution), and the
Linux 6.1 client in a QEMU guest (``tests/e2e/guest.py``) that mounts it with those options,
scans the tree like ImageFolder (``find``), then reads every file once per epoch in a shuffled
order with 4 readers (``xargs -P 4 cat``), for two epochs. The client's own per-procedure
counts (``/proc/self/mountstats``) after each phase give the RPCs per file; ``/proc/uptime``
the times; every epoch's byte count is checked against the tree's.

    flock /tmp/nfsgw-heavy.lock .venv/bin/python benchmarks/mount_options.py \\
        [--classes 10 --per-class 50] [--only nocto]

The guest runs under TCG (no KVM here), one vCPU: its files/s measure the emulated client's
CPU as much as the options; compare them between rows, not with other tables. RPC counts do
not depend on that. Prints a Markdown table (docs/operations.md, "Mounting from Linux clients").
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/: _common
import _common  # noqa: F401 (puts the repository on sys.path)

from loadgen.dataset import DatasetSpec, make_dataset
from loadgen.gwprocess import GatewayProcess
from loadgen.seaweed import SeaweedServer
from tests.e2e.guest import Guest, GuestImage

OPTION_SETS: dict[str, str] = {
    "default": "",
    "nocto": "nocto",
    "actimeo=600": "actimeo=600",
    "nconnect=4": "nconnect=4",
    "rsize=1048576": "rsize=1048576",
    "recommended": "ro,nocto,actimeo=600,nconnect=4",
}
PHASES = ("scan", "epoch1", "epoch2")
PROCS = ("LOOKUP", "GETATTR", "ACCESS", "READ", "READDIRPLUS")

SCRIPT = r"""
nfs_mount /data /mnt/data "$EXTRA" || exit 3
stats() {
    echo "@@STATS $1"
    sed -n '/mounted on \/mnt\/data /,/^device /p' /proc/self/mountstats \
        | grep -E '^[[:space:]]+[A-Z_]+: [0-9]'
    echo "@@END"
}
now() { cut -d' ' -f1 /proc/uptime; }
stats mount
s=$(now); find /mnt/data -type f > /tmp/list; e=$(now); echo "@@TIME scan $s $e"; stats scan
for ep in 1 2; do
    shuf /tmp/list > /tmp/order
    s=$(now)
    n=$(xargs -P 4 -n 16 cat < /tmp/order | wc -c)
    e=$(now)
    echo "@@TIME epoch$ep $s $e $n"
    stats epoch$ep
done
umount /mnt/data
"""


def parse(output: str) -> tuple[dict[str, dict[str, int]], dict[str, tuple[float, int]]]:
    """Per phase: cumulative calls per procedure; (seconds, bytes) per timed phase."""
    stats: dict[str, dict[str, int]] = {}
    times: dict[str, tuple[float, int]] = {}
    current: str | None = None
    for line in output.splitlines():
        line = line.strip()
        if line.startswith("@@STATS "):
            current = line.split()[1]
            stats[current] = {}
        elif line == "@@END":
            current = None
        elif line.startswith("@@TIME "):
            parts = line.split()
            nbytes = int(parts[4]) if len(parts) > 4 else 0
            times[parts[1]] = (float(parts[3]) - float(parts[2]), nbytes)
        elif current is not None:
            m = re.match(r"([A-Z_]+): (\d+)", line)
            if m:
                stats[current][m.group(1)] = int(m.group(2))
    return stats, times


def delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}


async def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--per-class", type=int, default=50)
    ap.add_argument("--only", action="append", help="option set name(s) to run")
    a = ap.parse_args()
    sets = {k: v for k, v in OPTION_SETS.items() if not a.only or k in a.only}
    work = Path(tempfile.mkdtemp(prefix="nfsgw-mountopts-"))
    guest = Guest(GuestImage.ensure())
    rows: list[str] = []
    with SeaweedServer() as sw:
        sw.create_bucket("train")
        spec = DatasetSpec(
            classes=a.classes, per_class_min=a.per_class, per_class_max=a.per_class, seed=7
        )
        m = await make_dataset(
            spec,
            s3_url="s3://train/imagenet",
            s3_endpoint_url=sw.endpoint_url,
            s3_region=sw.region,
            access_key=sw.access_key,
            secret_key=sw.secret_key,
            concurrency=16,
            progress=False,
        )
        files, total = len(m.entries), m.total_bytes
        print(f"{files} files, {total / 1e6:.1f} MB", flush=True)
        for name, opts in sets.items():
            export = {
                "path": "/data",
                "backend": "s3://train/imagenet",
                "read_only": True,
                "insecure": True,
            }
            with GatewayProcess(work, [export], name=name.replace("=", "-"), s3=sw) as gw:
                t0 = time.monotonic()
                res = await asyncio.to_thread(
                    guest.run, SCRIPT, nfs_port=gw.port, timeout_s=900, env={"EXTRA": opts}
                )
                if res.rc != 0:
                    print(res.describe(), file=sys.stderr)
                    return 1
                stats, times = parse(res.output)
            prev = stats["mount"]
            cells = [f"`{opts or '(defaults)'}`"]
            for phase in PHASES:
                d = delta(stats[phase], prev)
                prev = stats[phase]
                secs, nbytes = times[phase]
                if phase != "scan" and nbytes != total:
                    print(f"{name} {phase}: read {nbytes} bytes, the tree has {total}")
                    return 1
                per = ", ".join(f"{p} {d.get(p, 0) / files:.2f}" for p in PROCS if d.get(p))
                rate = f"{files / secs:.0f}" if phase != "scan" and secs > 0 else f"{secs:.2f} s"
                cells += [per or "none", rate]
            rows.append("| " + " | ".join(cells) + " |")
            print(rows[-1], f"({time.monotonic() - t0:.0f} s)", flush=True)
    print()
    print(
        "| options | scan: RPCs per file | scan time | epoch 1: RPCs per file | files/s "
        "| epoch 2: RPCs per file | files/s |"
    )
    print("| --- | --- | ---: | --- | ---: | --- | ---: |")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
