"""What it costs the gateway to keep a local export's directory current once its TTL has passed
(a local export lists in a lister process; inotify can say nothing changed): a re-list
(``scandir`` + a ``stat`` per file in the lister process, the comparison with the index) against
asking inotify whether anything changed (``gateway.backend.dirwatch``).

    .venv/bin/python benchmarks/local_relist.py [--files 1281] [--repeat 30] [--dir DIR]

A ``Namespace`` over ``LocalStore`` (as ``nfsgw serve`` opens it: ``list_process`` on) lists
a folder of ``--files`` small files once; then, ``--repeat`` times, the fake clock passes the
TTL and one LOOKUP makes the namespace bring the folder up to date, and ``quiesce`` waits for
it. CPU per round: this process's (``time.process_time``) plus the lister process's
(``/proc/PID/stat``, clock ticks: its part is the total over the rounds divided by their
number). Two ways in the same run, alternating:

- ``inotify``: the store's ``watch_listing``/``unchanged_since`` (nothing changed: no
  re-list; checked with ``relists_avoided``);
- ``re-list``: the same store behind a ``StoreWrapper``, which hides those (every round a
  re-list: the mechanism before).

A last round touches one file between two rounds and checks that the inotify way re-lists.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import structlog

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/: _common
import _common  # noqa: F401 (puts the repository on sys.path)

from gateway.backend import open_store
from gateway.backend.base import ObjectStore, StoreWrapper
from gateway.clock import FakeClock
from gateway.namespace import Namespace
from gateway.namespace.config import NamespaceConfig

DIR = "n01440764"
TICK = os.sysconf("SC_CLK_TCK")


def children_cpu() -> float:
    """CPU seconds of this process's live children (the lister), from /proc."""
    total = 0.0
    me = os.getpid()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == me:  # ppid
            total += (int(fields[11]) + int(fields[12])) / TICK
    return total


def build(root: Path, files: int) -> None:
    d = root / DIR
    d.mkdir(parents=True, exist_ok=True)
    for i in range(files):
        (d / f"{DIR}_{i:08d}.JPEG").write_bytes(b"x" * (100 + i % 50))


async def rounds(store: ObjectStore, repeat: int) -> tuple[list[float], float, Namespace]:
    clock = FakeClock()
    ns = Namespace(store, "", clock=clock, config=NamespaceConfig())
    name = f"{DIR}_00000001.JPEG"
    await ns.lookup(DIR, name)
    await ns.quiesce()
    own: list[float] = []
    kids0 = children_cpu()
    for _ in range(repeat):
        clock.advance(100_000.0)
        gc.collect()
        gc.disable()
        t0 = time.process_time()
        await ns.lookup(DIR, name)
        await ns.quiesce()
        own.append(time.process_time() - t0)
        gc.enable()
    return own, (children_cpu() - kids0) / repeat, ns


async def main_async(root: Path, files: int, repeat: int) -> None:
    store = open_store(f"file://{root}")
    try:
        table: dict[str, tuple[list[float], list[float]]] = {
            "inotify": ([], []),
            "re-list": ([], []),
        }
        for i in range(4):
            for way in ("inotify", "re-list") if i % 2 == 0 else ("re-list", "inotify"):
                s: ObjectStore = store if way == "inotify" else StoreWrapper(store)
                own, kids, ns = await rounds(s, repeat)
                if way == "inotify":
                    assert ns.stats.relists_avoided == repeat, ns.stats
                    assert ns.stats.relists == 0, ns.stats
                else:
                    assert ns.stats.relists == repeat and ns.stats.relists_avoided == 0
                await ns.close()
                table[way][0].extend(own)
                table[way][1].append(kids)
        # A change is seen: one file rewritten, the next round re-lists.
        clock = FakeClock()
        ns = Namespace(store, "", clock=clock, config=NamespaceConfig())
        await ns.lookup(DIR, f"{DIR}_00000001.JPEG")
        await ns.quiesce()
        (root / DIR / f"{DIR}_00000002.JPEG").write_bytes(b"changed")
        clock.advance(100_000.0)
        await ns.lookup(DIR, f"{DIR}_00000001.JPEG")
        await ns.quiesce()
        assert ns.stats.relists == 1, ns.stats
        e = await ns.lookup(DIR, f"{DIR}_00000002.JPEG")
        assert e is not None and e.size == len(b"changed"), e
        await ns.close()
        (root / DIR / f"{DIR}_00000002.JPEG").write_bytes(b"x" * 102)
    finally:
        await store.close()
    print(f"bringing a local folder of {files} files up to date after its TTL (ms of CPU)")
    print(f"  {'way':<10} {'own best':>9} {'own median':>11} {'lister':>8} {'total':>8}")
    for way, (owns, lister) in table.items():
        k = statistics.mean(lister)
        mid = statistics.median(owns)
        print(
            f"  {way:<10} {min(owns) * 1e3:9.3f} {mid * 1e3:11.3f} {k * 1e3:8.3f} "
            f"{(mid + k) * 1e3:8.3f}"
        )
    print("  a file changed between two rounds: re-listed, the new size seen (checked)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=1281)
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--dir", type=Path, default=None, help="where to build the folder")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp)
        build(root, args.files)
        asyncio.run(main_async(root, args.files, args.repeat))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
