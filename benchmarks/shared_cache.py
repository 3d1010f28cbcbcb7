"""One cache for all workers (issue 24): the default gateway (``--workers auto``, no
``--cache-dir``) next to ``--workers 1`` and nfs-ganesha, over the same files, in one run.

    .venv/bin/python benchmarks/shared_cache.py [--files 10000] [--size 110000]
        [--clients 8] [--rounds 1] [--latency-ms 0] [--no-ganesha] [--pin-workers]

The files: ``benchmarks/workers.py``'s deterministic tree (``--files`` of about ``--size``
bytes in 100 folders, cached under /var/tmp/nfsgw-workers), uploaded once per run to a
throw-away SeaweedFS behind a request-counting proxy (``nfsgw-loadgen proxy``; no added
latency unless ``--latency-ms``: the cold epoch with data prefetch against a remote store).
Each gateway serves ``s3://BUCKET/ds/`` with nothing but the export, the endpoint
and (for the second) ``--workers 1``: its state directory is fresh, so its disk tier (by
default under it) starts empty. nfs-ganesha (FSAL_VFS) serves the same files from the local
folder. The client is the C reader (``benchmarks/nfsread.c``), ``--clients`` connections
spread evenly over the workers (``workers.place``).

Per server: epoch 1 is cold (listing and fetching, through the proxy), epochs 2 and 3 warm, in
fresh random orders. Reported per server: files/s per epoch, the GETs and LISTs the proxy saw
in the cold and in the warm epochs, GETs per file over all, the server's CPU per file in the
best warm epoch (its whole process tree, utime + stime), and the gateway's PSS after the
epochs (all its processes: the supervisor and workers; shared pages split between them, so
the sum counts a page once). Then the issue's ratios: defaults / ``--workers 1`` and
defaults / ganesha, warm. ``--rounds`` repeats the three servers in alternating order.

Must not: import the gateway (it runs ``nfsgw serve`` through ``loadgen.gwprocess``) or leave
a process running.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/: _common, siblings
import _common  # noqa: F401 (puts the repository on sys.path)
import netns
from data_prefetch import ProxyProcess
from scale_index import Ganesha, log
from workers import (
    CACHE,
    CClients,
    Nfsgw,
    Server,
    Tree,
    build_tree,
    cpu_seconds,
    place,
)

from loadgen.gwprocess import GatewayProcess
from loadgen.seaweed import SeaweedServer

BUCKET = "shared-cache"
MiB = 1 << 20


@dataclass(slots=True)
class Result:
    name: str
    files_per_s: list[float] = field(default_factory=list)
    cpu_us_per_file: list[float] = field(default_factory=list)
    errors: int = 0
    cold_gets: int = 0
    cold_lists: int = 0
    warm_gets: int = 0
    warm_lists: int = 0
    gets_per_file: float = 0.0
    pss_mib: float = 0.0
    ctx_per_file: list[float] = field(default_factory=list)

    @property
    def warm(self) -> float:
        return max(self.files_per_s[1:] or self.files_per_s)

    @property
    def warm_cpu_us(self) -> float:
        best = max(range(1, len(self.files_per_s)), key=lambda i: self.files_per_s[i])
        return self.cpu_us_per_file[best]


class S3Gateway(Nfsgw):
    """``nfsgw serve`` over the bucket, defaults but for the worker count (0: "auto", the
    default); ``workers.Nfsgw``'s life cycle and probes."""

    def __init__(
        self, work: Path, proxy: ProxyProcess, sw: SeaweedServer, name: str, workers: int
    ) -> None:
        self.name = name
        self.workers = workers if workers else len(psutil.Process().cpu_affinity() or [1])
        work.mkdir(parents=True, exist_ok=True)
        self.gw = GatewayProcess(
            work,
            [
                {
                    "path": "/data",
                    "backend": f"s3://{BUCKET}/ds/",
                    "read_only": True,
                    "insecure": True,
                }
            ],
            name=name.replace(" ", "").replace("-", ""),
            s3=sw,
            sections={
                "s3": {"endpoint_url": proxy.endpoint_url},
                "server": {"workers": workers or "auto"},
            },
            workers=self.workers,
        )


def pss_mib(pid: int) -> float:
    """PSS of ``pid`` and its descendants, MiB (shared pages split between them)."""
    procs = [psutil.Process(pid)]
    procs += procs[0].children(recursive=True)
    total = 0
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            total += p.memory_full_info().pss
    return total / MiB


def ctx_switches(pid: int) -> int:
    """Context switches (voluntary + involuntary) of ``pid`` and its descendants' threads."""
    procs = [psutil.Process(pid)]
    procs += procs[0].children(recursive=True)
    total = 0
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            c = p.num_ctx_switches()
            total += c.voluntary + c.involuntary
    return total


def pin_workers(pid: int) -> None:
    """``--pin-workers``: worker I on CPU I (of this process's CPUs), the supervisor free."""
    cpus = sorted(psutil.Process().cpu_affinity() or [0])
    for child in psutil.Process(pid).children():
        args = child.cmdline()
        if "--worker" in args:
            i = int(args[args.index("--worker") + 1].split("/")[0])
            for t in [child, *child.children(recursive=True)]:
                t.cpu_affinity([cpus[i % len(cpus)]])
            for th in child.threads():
                os.sched_setaffinity(th.id, {cpus[i % len(cpus)]})


def upload(sw: SeaweedServer, tree: Tree) -> None:
    sw.create_bucket(BUCKET)
    t0 = time.monotonic()

    def put(k: int) -> None:
        status, body = sw.request("PUT", f"/{BUCKET}/ds/{tree.rel(k)}", tree.content(k))
        if status != 200:
            raise RuntimeError(f"PUT {tree.rel(k)}: {status} {body[:200]!r}")

    with ThreadPoolExecutor(8) as ex:
        list(ex.map(put, range(tree.files)))
    log(f"uploaded {tree.files:,} files in {time.monotonic() - t0:.0f} s")


def measure(
    server: Server, tree: Tree, a: argparse.Namespace, proxy: ProxyProcess | None
) -> Result:
    srv = server
    res = Result(srv.name)
    srv.start()
    try:
        clients = CClients(srv.url, tree, a.clients)
        try:
            place(clients, srv, a.clients)
            if a.pin_workers and isinstance(srv, S3Gateway) and srv.workers > 1:
                pin_workers(srv.pid)
            before = proxy.counts() if proxy else {}
            for e in range(3):
                order = list(range(tree.files))
                random.Random(a.seed + e).shuffle(order)
                cpu0, x0 = cpu_seconds(srv.pid), ctx_switches(srv.pid)
                c0 = proxy.counts() if proxy else {}
                ep, _ = clients.epoch(tree, order)
                cpu = cpu_seconds(srv.pid) - cpu0
                res.ctx_per_file.append(
                    round((ctx_switches(srv.pid) - x0) / ep.files, 2) if ep.files else 0.0
                )
                c1 = proxy.counts() if proxy else {}
                gets, lists = (
                    c1.get("GET", 0) - c0.get("GET", 0),
                    c1.get("LIST", 0) - c0.get("LIST", 0),
                )
                if e == 0:
                    res.cold_gets, res.cold_lists = gets, lists
                else:
                    res.warm_gets += gets
                    res.warm_lists += lists
                res.files_per_s.append(ep.files_per_s)
                res.cpu_us_per_file.append(round(cpu / ep.files * 1e6, 1) if ep.files else 0.0)
                res.errors += ep.errors
                log(
                    f"  {res.name} epoch {e + 1}: {ep.files_per_s:,.0f} files/s, p99 "
                    f"{ep.p99_ms} ms, {res.cpu_us_per_file[-1]} us CPU/file, "
                    f"{res.ctx_per_file[-1]} context switches/file, GETs {gets}, "
                    f"LISTs {lists}, errors {ep.errors}"
                )
            if proxy:
                after = proxy.counts()
                res.gets_per_file = round(
                    (after.get("GET", 0) - before.get("GET", 0)) / tree.files, 4
                )
                res.pss_mib = round(pss_mib(srv.pid), 1)
        finally:
            clients.close()
    finally:
        srv.stop()
    return res


def run(a: argparse.Namespace, ganesha: bool, note: str) -> int:
    tree = build_tree(CACHE / f"{a.files}x{a.size}", a.files, a.size)
    dataset_mib = sum(len(tree.content(k)) for k in range(tree.files)) / MiB
    results: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="nfsgw-sc-", dir="/var/tmp") as tmp:
        work = Path(tmp)
        sw = SeaweedServer(data_dir=work / "seaweed").start()
        proxy = ProxyProcess(sw.endpoint_url, a.latency_ms, work / "proxy.log")
        try:
            upload(sw, tree)
            for rnd in range(a.rounds):
                servers: list[Server] = [
                    S3Gateway(work / f"r{rnd}-auto", proxy, sw, "nfsgw defaults", 0),
                    S3Gateway(work / f"r{rnd}-w1", proxy, sw, "nfsgw --workers 1", 1),
                ]
                if ganesha:
                    servers.append(Ganesha(work / f"r{rnd}-ganesha", tree))  # type: ignore[arg-type]
                if rnd % 2:
                    servers.reverse()
                for s in servers:
                    log(f"round {rnd + 1}: {s.name}")
                    results.append(measure(s, tree, a, proxy if isinstance(s, S3Gateway) else None))
        finally:
            proxy.stop()
            sw.stop()
    print()
    print(
        f"dataset: {tree.files:,} files, {dataset_mib:,.0f} MiB; {a.clients} connections, C reader"
    )
    print(
        f"{'server':<20} {'cold f/s':>9} {'warm f/s':>9} {'warm us CPU/file':>17} "
        f"{'cold GET/LIST':>14} {'warm GET/LIST':>14} {'GET/file':>9} {'PSS MiB':>8}"
    )
    for r in results:
        print(
            f"{r.name:<20} {r.files_per_s[0]:>9,.0f} {r.warm:>9,.0f} {r.warm_cpu_us:>17.1f} "
            f"{f'{r.cold_gets}/{r.cold_lists}':>14} {f'{r.warm_gets}/{r.warm_lists}':>14} "
            f"{r.gets_per_file:>9.4f} {r.pss_mib:>8,.0f}"
        )
    limit = 1.25 * dataset_mib + 512
    print(f"PSS target (defaults): <= 1.25 x dataset + 512 MiB = {limit:,.0f} MiB")
    by: dict[str, list[Result]] = {}
    for r in results:
        by.setdefault(r.name, []).append(r)
    for i in range(a.rounds):
        d, one = by["nfsgw defaults"][i], by["nfsgw --workers 1"][i]
        line = f"round {i + 1}: defaults / --workers 1 = {d.warm / one.warm:.2f} (target >= 0.95)"
        if "ganesha" in by:
            g = by["ganesha"][i]
            line += f", defaults / ganesha = {d.warm / g.warm:.2f} (target >= 0.9)"
            line += f", CPU/file defaults / ganesha = {d.warm_cpu_us / g.warm_cpu_us:.2f}"
        print(line)
    if not ganesha:
        print(f"nfs-ganesha {note}")
    out = {
        "args": {k: str(v) for k, v in vars(a).items()},
        "dataset_mib": dataset_mib,
        "results": [asdict(r) for r in results],
    }
    (CACHE / "shared_cache.json").write_text(json.dumps(out, indent=2))
    return 1 if any(r.errors for r in results) else 0


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--files", type=int, default=10_000)
    p.add_argument("--size", type=int, default=110_000, help="average file size, bytes")
    p.add_argument("--clients", type=int, default=8, help="connections (C reader threads)")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument(
        "--latency-ms", type=float, default=0.0, help="added to every backend request (proxy)"
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--no-ganesha", action="store_true")
    p.add_argument(
        "--pin-workers", action="store_true", help="pin worker I of the defaults to CPU I"
    )
    p.add_argument("--inside-namespace", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    return netns.main_beside_ganesha(__file__, argv, args, run, 3600.0, log)


if __name__ == "__main__":
    sys.exit(main())
