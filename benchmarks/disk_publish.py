"""CPU per entry of the disk tier's publish (and, with ``--read``, of a disk hit), measured
through ``gateway.data.disk.DiskStore`` in a fresh directory: the cost of writing what a cold
epoch fetches.

    PYTHONPATH=<tree> .venv/bin/python benchmarks/disk_publish.py [--entries 3000]
        [--size 110000] [--rate 1000] [--dir /tmp] [--read] [--bundle-entries N]
        [--bundle-window S]

It publishes ``--entries`` entries of ``--size`` bytes (``admit`` then ``publish``, as the
reader does for every fetched object), ``--rate`` of them a second in steps of 5 ms (a cold
epoch's pace: the batches then fill as they would in the gateway), waits for the writes, and
reports the process's CPU time (user + system, all threads: ``resource.getrusage``) per
entry, the files (inodes) the tier made, and the wall time. Run it with ``PYTHONPATH`` on
another tree (e.g. a ``git archive`` of ``main``) to compare layouts: it only uses
``DiskStore.open/admit/publish/drain/read/close`` and sets the bundle options only when the
tree's ``DiskConfig`` has them. The machine is shared and noisy: alternate the trees, repeat.

Must not: write outside a fresh directory under ``--dir`` (removed at the end).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import random
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def inodes(root: Path) -> tuple[int, int]:
    """(names, distinct inodes) under the tier's layout directory."""
    names, seen = 0, set()
    for sub in root.iterdir():
        if not sub.is_dir() or sub.name == "locks":
            continue
        for p in sub.iterdir():
            if not p.name.startswith("."):
                names += 1
                seen.add(p.stat().st_ino)
    return names, len(seen)


async def run(a: argparse.Namespace, work: Path) -> None:
    from gateway.data.config import DiskConfig
    from gateway.data.disk import DiskStore, disk_key, fileformat

    fields = {f.name for f in dataclasses.fields(DiskConfig)}
    kw: dict[str, Any] = {}
    if a.bundle_entries is not None and "bundle_entries" in fields:
        kw["bundle_entries"] = a.bundle_entries
    if a.bundle_window is not None and "bundle_window_s" in fields:
        kw["bundle_window_s"] = a.bundle_window
    cfg = DiskConfig(budget=4 * a.entries * a.size + (64 << 20), min_free=0, **kw)
    disk = await DiskStore.open(work, cfg)
    assert disk is not None
    body = random.Random(0).randbytes(a.size)
    keys = [disk_key("bench", f"train/{i:07d}.jpg", '"e"', 0, a.size) for i in range(a.entries)]
    step = 0.005
    per_step = max(1, round(a.rate * step))
    tasks: list[asyncio.Task[bool]] = []
    t0, c0 = time.monotonic(), cpu_s()
    for i in range(0, a.entries, per_step):
        for k in keys[i : i + per_step]:
            if disk.admit(k):
                tasks.append(disk.publish(k, body))
        await asyncio.sleep(step)
    await disk.drain()
    c1, t1 = cpu_s(), time.monotonic()
    written = sum(1 for t in tasks if t.result())
    names, files = inodes(Path(disk.root))
    layout = getattr(fileformat, "LAYOUT", "?")
    print(
        f"layout {layout} {kw or ''}: {written} of {a.entries} entries written as {files} "
        f"files ({names} names) in {t1 - t0:.2f} s; publish CPU {1e6 * (c1 - c0) / a.entries:.0f}"
        f" us per entry (process total {c1 - c0:.2f} s)"
    )
    if a.read:
        c0 = cpu_s()
        for k in keys:
            got = await disk.read(k, mapped=False)
            assert got is not None and len(got) == a.size
        c1 = cpu_s()
        print(f"  read (disk hit, copy) CPU {1e6 * (c1 - c0) / a.entries:.0f} us per entry")
    await disk.close()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--entries", type=int, default=3000)
    p.add_argument("--size", type=int, default=110_000)
    p.add_argument("--rate", type=float, default=1000.0, help="entries published per second")
    p.add_argument("--dir", default="/tmp", help="a fresh directory is made (and removed) here")
    p.add_argument("--read", action="store_true", help="then read every entry back (a hit)")
    p.add_argument("--bundle-entries", type=int, default=None)
    p.add_argument("--bundle-window", type=float, default=None)
    a = p.parse_args(argv)
    import gateway

    print(f"gateway from {Path(gateway.__file__).parent}", file=sys.stderr)
    work = Path(tempfile.mkdtemp(prefix="nfsgw-disk-publish-", dir=a.dir))
    try:
        asyncio.run(run(a, work))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
