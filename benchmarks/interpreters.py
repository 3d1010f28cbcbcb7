"""The same nfsgw under two Python interpreters: server CPU per warm file, pinned.

    .venv/bin/python benchmarks/interpreters.py \\
        --python pyenv=.venv/bin/python --python debian=/var/tmp/debvenv/bin/python \\
        [--files 3000] [--rounds 3] [--epochs 6]

Each ``--python NAME=PATH`` is an interpreter with nfsgw installed (a venv:
``/usr/bin/python3 -m venv /var/tmp/debvenv && /var/tmp/debvenv/bin/pip install . psutil``
gives Debian's PGO + LTO build). ``nfsgw serve --workers 1`` runs under each in turn (the
order alternates across ``--rounds``), from a directory outside the checkout so each imports
its own installed copy, pinned to CPU 1, over the ``benchmarks/workers.py`` tree; the C reader
(``benchmarks/nfsread.c``, 4 connections) runs on CPU 0. Epoch 1 of each start warms; the
median server CPU per file (``/proc/PID/stat``) and the best files/s of the rest are printed.

Must not: import the gateway, or leave a process running.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/: _common, siblings
import _common  # noqa: F401 (puts the repository on sys.path)
from nfsreader import NfsReader
from workers import CACHE, build_tree, cpu_seconds

from loadgen.gwprocess import GatewayProcess


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--python", action="append", required=True, metavar="NAME=PATH")
    p.add_argument("--files", type=int, default=3000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--epochs", type=int, default=6)
    args = p.parse_args()
    pythons = {n: str(Path(x).absolute()) for n, x in (a.split("=", 1) for a in args.python)}
    tree = build_tree(CACHE / f"{args.files}x110000", args.files, 110000)
    work = Path("/var/tmp/nfsgw-interpreters")
    os.chdir("/tmp")  # each interpreter imports the nfsgw installed in its own environment
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in pythons}
    names = list(pythons)
    for rnd in range(args.rounds):
        for name in names if rnd % 2 == 0 else names[::-1]:
            sys.executable = pythons[name]  # what GatewayProcess runs
            gw = GatewayProcess(
                work,
                [
                    {
                        "path": "/data",
                        "backend": f"file://{tree.root}",
                        "read_only": True,
                        "insecure": True,
                    }
                ],
                name=f"nfsgw-{name}",
            )
            gw.start()
            reader: NfsReader | None = None
            try:
                subprocess.run(
                    ["taskset", "-a", "-p", "-c", "1", str(gw.pid)],
                    check=True,
                    stdout=subprocess.DEVNULL,
                )
                reader = NfsReader(gw.libnfs_url("/data"), tree.root, 4)
                os.sched_setaffinity(reader.proc.pid, {0})
                reader.open_all()
                paths = ["/" + tree.rel(k) for k in range(args.files)]
                for ep in range(args.epochs):
                    random.Random(ep).shuffle(paths)
                    c0 = cpu_seconds(gw.pid)
                    r = reader.epoch(paths)
                    c1 = cpu_seconds(gw.pid)
                    if r["errors"]:
                        raise RuntimeError(f"{name}: {r['errors']} files read wrong")
                    if ep:
                        results[name].append(
                            ((c1 - c0) / r["files"] * 1e6, r["files"] / r["seconds"])
                        )
            finally:
                if reader is not None:
                    reader.close()
                gw.stop()
    for name, v in results.items():
        cpu = statistics.median(a for a, _ in v)
        best = max(b for _, b in v)
        print(f"{name:10s} server CPU per file {cpu:6.1f} µs (median)  best {best:7.0f} files/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
