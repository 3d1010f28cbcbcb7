"""CPU per disk-tier look-up that misses (``DiskStore.read`` of an entry that is not there),
the look-up every fetch of a cold epoch makes first: answered by the tier's sole user from its
name filter, or by a round trip to the tier's threads and a failed ``open`` (a shared tier, or
an owner that sees a guest).

    PYTHONPATH=<tree> .venv/bin/python benchmarks/disk_miss.py [--lookups 5000]
        [--rounds 5] [--dir /var/tmp] [--asyncio]

It opens a fresh tier under ``--dir`` (this process its owner), then looks up ``--lookups``
absent entries at once (``asyncio.gather``, as the reader asks for a fetch's blocks), best of
``--rounds``, and prints the process's CPU time (user + system, all threads) per look-up;
then opens a second store on the same directory (a guest: the owner stops trusting its filter)
and measures the same look-ups again. On uvloop (the gateway's loop) unless ``--asyncio``.
On a tree without the name filter both rows measure the round trip.

Must not: write outside a fresh directory under ``--dir`` (removed at the end).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from pathlib import Path

from gateway.data.config import DiskConfig
from gateway.data.disk import DiskStore, disk_key
from gateway.data.stats import DiskStats


async def measure(a: argparse.Namespace, root: Path) -> None:
    cfg = DiskConfig(min_free=0)
    owner = await DiskStore.open(root, cfg, DiskStats())
    assert owner is not None
    keys = [disk_key("bench", f"img/{i}.jpg", "etag", 0, 110_000) for i in range(a.lookups)]
    guest = None
    for label in ("sole user (name filter)", "owner with a guest (opens)"):
        if guest is None and label.startswith("owner"):
            guest = await DiskStore.open(root, cfg, DiskStats())
        best = float("inf")
        skipped = getattr(owner.stats, "lookups_skipped", 0)
        for _ in range(a.rounds):
            t = time.process_time()
            found = await asyncio.gather(*(owner.read(k) for k in keys))
            best = min(best, (time.process_time() - t) / len(keys))
            assert not any(found)
        skipped = getattr(owner.stats, "lookups_skipped", 0) - skipped
        print(f"{label:30s} {best * 1e6:6.1f} us CPU per missed look-up (skipped: {skipped})")
    if guest is not None:
        await guest.close()
    await owner.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lookups", type=int, default=5000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--dir", type=Path, default=Path("/var/tmp"))
    p.add_argument("--asyncio", action="store_true", help="asyncio's loop instead of uvloop")
    a = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="nfsgw-disk-miss-", dir=a.dir))
    try:
        if a.asyncio:
            asyncio.run(measure(a, root))
        else:
            import uvloop

            uvloop.run(measure(a, root))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
