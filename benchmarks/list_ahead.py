"""Listing ahead (issue 11): an ImageFolder-like scan of a tree on a slow S3, with the gateway
listing the next sibling folders while the client reads one (``--list-ahead``) and without.

    .venv/bin/python benchmarks/list_ahead.py [--folders 300] [--size 2048]
        [--latency-ms 20] [--ahead 0,2,4,8] [--runs 2] [--out DIR]

Set-up (the pieces of benchmarks/data_prefetch.py): a throw-away SeaweedFS holding
``--folders`` x 100 small objects (``upload_tree``: lognormal sizes of mean ``--size``), the delay
proxy adding ``--latency-ms`` to every request and counting them, and for each ``--ahead``
value a fresh ``nfsgw serve --list-ahead N`` (read-only, defaults otherwise: not immutable)
whose S3 endpoint is the proxy. The same ``--runs`` times each, alternating the
configurations, so that the machine's noise falls on all of them alike.

Client: libnfs (``tests/libnfs.py``), one connection, like ImageFolder's scan and ``ls -R``:
READDIRPLUS of the root, then of every folder in name order; every folder's names are
checked against the upload. Reported per configuration: the scan's seconds (best and all
runs), folders/s, LIST requests at the proxy, and the ratio to ``--ahead 0``. The time
without listing ahead is about folders x (latency + LIST service + READDIRPLUS replies);
listing ahead hides the first two behind the previous folder's replies.

Must not: import the gateway or leave a process running.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/: _common, siblings
from _common import results_dir, write_results
from data_prefetch import (
    BUCKET,
    PER_CLASS,
    PREFIX,
    Account,
    ProxyProcess,
    git_state,
    log,
    upload_tree,
)

from loadgen.dataset import Manifest
from loadgen.gwprocess import GatewayProcess
from loadgen.seaweed import SeaweedServer
from tests.libnfs import LibNfs

OUT = results_dir("list-ahead")


def scan(nfs: LibNfs, manifest: Manifest) -> float:
    """The root, then every folder in name order (names checked); seconds."""
    want: dict[str, set[str]] = {}
    for e in manifest.entries:
        folder, _, name = e.path.rpartition("/")
        want.setdefault(folder, set()).add(name)
    t0 = time.perf_counter()
    classes = sorted(nfs.listdir("/"))
    got = {c: set(nfs.listdir("/" + c)) for c in classes}
    spent = time.perf_counter() - t0
    if got != want:
        raise RuntimeError(f"the scan saw {len(got)} folders, not {len(want)}, or other names")
    return spent


def run(a: argparse.Namespace) -> int:
    a.out.mkdir(parents=True, exist_ok=True)
    aheads = [int(x) for x in a.ahead.split(",")]
    results: dict[int, list[dict[str, float]]] = {n: [] for n in aheads}
    with tempfile.TemporaryDirectory(prefix="nfsgw-la-") as tmp:
        work = Path(tmp)
        sw = SeaweedServer().start()
        proxy: ProxyProcess | None = None
        try:
            manifest = upload_tree(sw, BUCKET, a.folders * PER_CLASS, a.size, work)
            proxy = ProxyProcess(sw.endpoint_url, a.latency_ms, a.out / "proxy.log")
            log(f"delay proxy {proxy.endpoint_url} -> {sw.endpoint_url}, +{a.latency_ms:g} ms")
            for r in range(a.runs):
                for n in aheads:
                    name = f"gw-ahead{n}-run{r}"
                    gw = GatewayProcess(
                        work,
                        [{"path": "/data", "backend": f"s3://{BUCKET}/{PREFIX}", "insecure": True}],
                        name=name,
                        flags=["--read-only", "--list-ahead", str(n), "--no-data-prefetch"],
                        s3=Account(proxy.endpoint_url, sw.access_key, sw.secret_key),
                    )
                    gw.start()
                    try:
                        lists0 = proxy.counts().get("LIST", 0)
                        with LibNfs(gw.libnfs_url("/data"), timeout_ms=120_000) as nfs:
                            seconds = scan(nfs, manifest)
                        lists = proxy.counts().get("LIST", 0) - lists0
                    finally:
                        gw.stop()
                        if gw.log_path is not None and gw.log_path.exists():
                            shutil.copy(gw.log_path, a.out / f"{name}.log")
                    results[n].append({"seconds": seconds, "lists": lists})
                    log(f"--list-ahead {n} run {r + 1}: scan {seconds:.2f} s, {lists} LISTs")
        finally:
            if proxy is not None:
                proxy.stop()
            sw.stop()
    base = min(x["seconds"] for x in results[aheads[0]])
    print()
    print(
        f"| `--list-ahead` | scan s (best) | runs | folders/s | LIST requests "
        f"| time / `--list-ahead {aheads[0]}` |"
    )
    print("|---:|---:|---|---:|---:|---:|")
    for n in aheads:
        best = min(x["seconds"] for x in results[n])
        runs = ", ".join(f"{x['seconds']:.2f}" for x in results[n])
        print(
            f"| {n} | {best:.2f} | {runs} | {a.folders / best:,.0f} "
            f"| {results[n][0]['lists']:.0f} | {best / base:.2f} |"
        )
    out = {
        "args": {k: str(v) for k, v in vars(a).items()},
        "commit": git_state(),
        "results": {str(n): v for n, v in results.items()},
    }
    log(f"results: {write_results(a.out, out)}")
    return 0


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--folders", type=int, default=300)
    p.add_argument("--size", type=int, default=2048, help="mean object size, bytes")
    p.add_argument("--latency-ms", type=float, default=20.0)
    p.add_argument("--ahead", default="0,2,4,8", help="--list-ahead values, the first the base")
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--out", type=Path, default=OUT)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    return run(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
