"""``nfsgw-loadgen``: make-dataset, epochs, compare, proxy, demo.

Exit codes: 0 success; 1 a target failed (a wrong byte, an NFS error, a dead node); 2 bad
arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from loadgen.progress import say
from loadgen.runner import exit_status, report, run

if TYPE_CHECKING:
    from loadgen.report import RunReport
    from loadgen.workload import WorkloadSpec

__all__ = ["build_parser", "main"]

MB = 1_000_000


_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def _size(text: str) -> int:
    """'65536', '64K', '1M', '1.5m', '16MiB' -> bytes (binary multiples)."""
    t = text.strip().lower().removesuffix("ib").removesuffix("b")
    unit = t[-1:] if t[-1:] in ("k", "m", "g") else ""
    try:
        value = float(t[: len(t) - len(unit)])
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 65536, 64K, 1M)") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"negative size: {text!r}")
    return int(value * _UNITS[unit])


def _add_s3(p: argparse.ArgumentParser) -> None:
    p.add_argument("--s3-endpoint-url", help="S3 endpoint (SeaweedFS, MinIO, ...); default AWS")
    p.add_argument("--s3-region", default=None, help="region used for signing")
    p.add_argument(
        "--s3-access-key",
        default=os.environ.get("AWS_ACCESS_KEY_ID"),
        help="default $AWS_ACCESS_KEY_ID (else the AWS credential chain)",
    )
    p.add_argument(
        "--s3-secret-key",
        default=os.environ.get("AWS_SECRET_ACCESS_KEY"),
        help="default $AWS_SECRET_ACCESS_KEY",
    )


def _add_workload(p: argparse.ArgumentParser, *, target: bool) -> None:
    if target:
        p.add_argument(
            "--target",
            required=True,
            help="nfs://HOST[:PORT]/EXPORT[?mountport=N] (any NFSv3 server over TCP), or "
            "local:DIR (the same tree on local disk, the yardstick)",
        )
    p.add_argument("--manifest", required=True, help="the dataset's manifest (make-dataset)")
    p.add_argument(
        "--pattern",
        choices=["kernel", "cv2", "manifest"],
        default="kernel",
        help="per-file RPC pattern (see docs/benchmarks.md)",
    )
    p.add_argument("--nodes", type=int, default=1, help="simulated training nodes (processes)")
    p.add_argument("--workers", type=int, default=8, help="data-loader workers per node")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--seed", type=int, default=0, help="shuffle seed")
    p.add_argument("--rsize", type=_size, default=0, help="READ size (default: server's rtpref)")
    p.add_argument("--cv2-read", type=_size, default=16384, help="read size of the cv2 pattern")
    p.add_argument("--nconnect", type=int, default=1, help="TCP connections per node")
    p.add_argument("--readdir-bytes", type=_size, default=65536, help="READDIRPLUS maxcount")
    p.add_argument("--rpc-timeout", type=float, default=60.0, help="seconds per RPC")
    p.add_argument("--max-files", type=int, default=0, help="read only the first N files")
    p.add_argument(
        "--compute-time",
        type=float,
        default=0.103,
        help="accelerator compute seconds per batch for the AU estimate (DLIO ResNet-50)",
    )
    p.add_argument("--out", default="loadgen-results", help="directory for report.json/md/PNGs")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--in-process", action="store_true", help="run nodes as tasks, not processes")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def _peers(text: str) -> list[str]:
    from loadgen.peers import PEERS

    names = [p.strip() for p in text.split(",") if p.strip()]
    for n in names:
        if n not in PEERS:
            raise argparse.ArgumentTypeError(f"unknown peer {n!r} (known: {', '.join(PEERS)})")
    return names


def _add_peers(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--peers",
        type=_peers,
        default=[],
        help="other S3-to-NFS servers over the same bucket behind the same proxy: rclone "
        "(rclone serve nfs; pip install 'nfsgw[rclone]')",
    )
    p.add_argument(
        "--peer-max-files",
        type=int,
        default=2000,
        help="peers read only the first N files (0: all); rclone's cold epoch runs at ~200 files/s",
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="nfsgw-loadgen",
        description="ImageNet-epoch load generator for NFSv3 servers (nfsgw or any other).",
    )
    sub = p.add_subparsers(dest="command", required=True)
    fmt = argparse.ArgumentDefaultsHelpFormatter

    m = sub.add_parser(
        "make-dataset", help="build a synthetic ImageFolder tree + manifest", formatter_class=fmt
    )
    m.add_argument("--classes", type=int, default=1000)
    m.add_argument("--files-per-class", default="1281", help="N or MIN-MAX (ImageNet: 732-1300)")
    m.add_argument("--mean-size", type=_size, default=114_660, help="bytes (ImageNet mean)")
    m.add_argument("--sd-size", type=_size, default=136_076, help="bytes (0: all the same size)")
    m.add_argument("--min-size", type=_size, default=1024)
    m.add_argument("--max-size", type=_size, default=16 << 20)
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--out", help="write the tree into this local directory")
    m.add_argument("--s3", help="upload under s3://BUCKET/PREFIX")
    m.add_argument("--create-bucket", action="store_true", help="create the bucket first")
    m.add_argument("--concurrency", type=int, default=64, help="uploads in flight")
    m.add_argument("--manifest", default="manifest.tsv", help="where to write the manifest")
    m.add_argument("--quiet", action="store_true")
    _add_s3(m)

    e = sub.add_parser(
        "epochs", help="run training-like epochs against one NFS target", formatter_class=fmt
    )
    _add_workload(e, target=True)
    e.add_argument("--name", default="target", help="the target's name in the report")
    e.add_argument("--metrics-url", help="the gateway's /metrics (backend counts, cache hits)")
    e.add_argument("--proxy-url", help="a running `nfsgw-loadgen proxy` (backend counts)")

    c = sub.add_parser(
        "compare",
        help="the same workload against nfsgw configurations and other NFS servers",
        formatter_class=fmt,
    )
    _add_workload(c, target=False)
    c.add_argument("--s3", help="the dataset's s3://BUCKET/PREFIX (for nfsgw configurations)")
    _add_s3(c)
    c.add_argument(
        "--configs",
        default="off,prefetch,both,data",
        help="nfsgw configurations: off (no prefetch, no coalescing, no data prefetch), "
        "prefetch (metadata), both (metadata prefetch + coalescing), data (both + data "
        "prefetch); '' for none",
    )
    c.add_argument(
        "--target",
        action="append",
        default=[],
        metavar="[NAME=]nfs://HOST:PORT/EXPORT|local:DIR",
        help="another NFSv3 server serving the same tree, or the tree on local disk; repeatable",
    )
    _add_peers(c)
    c.add_argument("--backend-latency-ms", type=float, default=10.0)
    c.add_argument("--backend-bandwidth-mbps", type=float, default=None, help="MB/s cap")
    c.add_argument(
        "--gateway-arg",
        action="append",
        default=[],
        help="extra `nfsgw serve` argument for every configuration (e.g. --cache-memory=1G)",
    )
    c.add_argument("--work-dir", help="keep gateway logs and state here")

    x = sub.add_parser(
        "proxy", help="run the backend delay proxy in the foreground", formatter_class=fmt
    )
    x.add_argument("--upstream", required=True, help="the S3 server, e.g. http://127.0.0.1:8333")
    x.add_argument("--listen", default="127.0.0.1:0", help="HOST:PORT")
    x.add_argument("--backend-latency-ms", type=float, default=10.0)
    x.add_argument("--backend-bandwidth-mbps", type=float, default=None)

    d = sub.add_parser(
        "demo",
        help="SeaweedFS + ImageNet-mini + nfsgw configurations + report, all local",
        formatter_class=fmt,
    )
    d.add_argument("--out", default="demo-results")
    d.add_argument("--classes", type=int, default=50)
    d.add_argument("--files-per-class", default="200")
    d.add_argument("--epochs", type=int, default=2)
    d.add_argument("--nodes", type=int, default=2)
    d.add_argument("--workers", type=int, default=8)
    d.add_argument("--pattern", choices=["kernel", "cv2", "manifest"], default="kernel")
    d.add_argument("--backend-latency-ms", type=float, default=10.0)
    d.add_argument(
        "--configs",
        default="off,prefetch,both,data",
        help="nfsgw configurations, as for compare",
    )
    d.add_argument(
        "--target",
        action="append",
        default=[],
        metavar="[NAME=]nfs://HOST:PORT/EXPORT",
        help="also run against another NFSv3 server serving the same tree (make-dataset "
        "--classes/--files-per-class/--seed as here, --out DIR); repeatable",
    )
    d.add_argument(
        "--no-local",
        action="store_true",
        help="skip the local-disk yardstick (the same tree written to a local directory)",
    )
    _add_peers(d)
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--quiet", action="store_true")
    return p


def _spec(a: argparse.Namespace, target: str) -> WorkloadSpec:
    from loadgen.workload import WorkloadSpec

    return WorkloadSpec(
        target=target,
        manifest=a.manifest,
        pattern=a.pattern,
        nodes=a.nodes,
        workers=a.workers,
        batch_size=a.batch_size,
        seed=a.seed,
        rsize=a.rsize,
        cv2_read=a.cv2_read,
        nconnect=a.nconnect,
        readdir_bytes=a.readdir_bytes,
        timeout_s=a.rpc_timeout,
        max_files=a.max_files,
    )


def _finish(result: RunReport, a: argparse.Namespace) -> int:
    paths = report(result, a.out, plots=not a.no_plots)
    say("wrote " + ", ".join(str(p) for p in paths))
    return exit_status(result)


async def _make_dataset(a: argparse.Namespace) -> int:
    from loadgen.dataset import DatasetSpec, make_dataset, parse_per_class
    from loadgen.progress import fmt_bytes

    lo, hi = parse_per_class(a.files_per_class)
    spec = DatasetSpec(
        classes=a.classes,
        per_class_min=lo,
        per_class_max=hi,
        mean_size=a.mean_size,
        sd_size=a.sd_size,
        min_size=a.min_size,
        max_size=a.max_size,
        seed=a.seed,
    )
    if a.create_bucket and a.s3:
        await asyncio.to_thread(_create_bucket, a)
    m = await make_dataset(
        spec,
        out_dir=a.out,
        s3_url=a.s3,
        s3_endpoint_url=a.s3_endpoint_url,
        s3_region=a.s3_region,
        access_key=a.s3_access_key,
        secret_key=a.s3_secret_key,
        concurrency=a.concurrency,
        manifest_path=a.manifest,
        progress=not a.quiet,
    )
    say(
        f"{len(m.entries)} files in {len(m.classes)} classes, {fmt_bytes(m.total_bytes)}; "
        f"manifest {a.manifest}"
    )
    return 0


def _create_bucket(a: argparse.Namespace) -> None:
    import boto3
    from botocore.config import Config

    from gateway.backend import parse_store_url

    bucket = parse_store_url(a.s3).location
    s3 = boto3.client(
        "s3",
        endpoint_url=a.s3_endpoint_url,
        region_name=a.s3_region or "us-east-1",
        aws_access_key_id=a.s3_access_key,
        aws_secret_access_key=a.s3_secret_key,
        config=Config(s3={"addressing_style": "path"}),
    )
    with contextlib.suppress(s3.exceptions.BucketAlreadyOwnedByYou):
        s3.create_bucket(Bucket=bucket)


async def _epochs(a: argparse.Namespace) -> int:
    from loadgen.bench import Counters, dataset_info, run_target
    from loadgen.dataset import Manifest
    from loadgen.report import RunReport

    spec = _spec(a, a.target)
    manifest = Manifest.read(a.manifest)
    run = RunReport(
        command=shlex.join(["nfsgw-loadgen", *sys.argv[1:]]),
        workload=spec.to_json() | {"epochs": a.epochs},
        dataset=dataset_info(manifest, spec),
        compute_s=a.compute_time,
        backend_latency_ms=None,
        backend_bandwidth_mbps=None,
    )
    tr = await run_target(
        spec,
        a.name,
        a.target,
        epochs=a.epochs,
        compute_s=a.compute_time,
        counters=Counters(proxy_url=a.proxy_url, metrics_url=a.metrics_url),
        in_process=a.in_process,
        show_progress=not a.quiet,
    )
    run.targets.append(tr)
    return _finish(run, a)


async def _compare(a: argparse.Namespace) -> int:
    from loadgen.bench import compare, parse_targets

    env = dict(os.environ)
    if a.s3_access_key and a.s3_secret_key:
        env["AWS_ACCESS_KEY_ID"] = a.s3_access_key
        env["AWS_SECRET_ACCESS_KEY"] = a.s3_secret_key
    if a.s3_region:
        env["AWS_REGION"] = a.s3_region
    configs = [c.strip() for c in a.configs.split(",") if c.strip()]
    run = await compare(
        _spec(a, ""),
        s3_url=a.s3,
        s3_endpoint_url=a.s3_endpoint_url,
        configs=configs,
        extra_targets=parse_targets(a.target),
        epochs=a.epochs,
        backend_latency_ms=a.backend_latency_ms,
        backend_bandwidth_mbps=a.backend_bandwidth_mbps,
        compute_s=a.compute_time,
        gateway_env=env,
        gateway_args=a.gateway_arg,
        work_dir=Path(a.work_dir) if a.work_dir else None,
        in_process=a.in_process,
        show_progress=not a.quiet,
        command=shlex.join(["nfsgw-loadgen", *sys.argv[1:]]),
        peers=a.peers,
        peer_max_files=a.peer_max_files,
    )
    return _finish(run, a)


async def _proxy(a: argparse.Namespace) -> int:
    from loadgen.proxy import COUNTS_PATH, DelayProxy

    host, _, port = a.listen.rpartition(":")
    bw = a.backend_bandwidth_mbps * MB if a.backend_bandwidth_mbps else None
    async with DelayProxy(
        a.upstream,
        latency_s=a.backend_latency_ms / 1000,
        bandwidth_bps=bw,
        host=host or "127.0.0.1",
        port=int(port or 0),
    ) as p:
        say(f"proxy {p.endpoint_url} -> {a.upstream} (+{a.backend_latency_ms:g} ms)")
        say(f"counts: {p.endpoint_url}{COUNTS_PATH}")
        print(p.endpoint_url, flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        import signal

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    try:
        if a.command == "make-dataset":
            return run(_make_dataset(a))
        if a.command == "epochs":
            return run(_epochs(a))
        if a.command == "compare":
            return run(_compare(a))
        if a.command == "proxy":
            return run(_proxy(a))
        if a.command == "demo":
            from loadgen.demo import run_demo

            return run_demo(a)
    except ValueError as e:
        print(f"nfsgw-loadgen: {e}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, asyncio.CancelledError):
        return 130
    return 2


if __name__ == "__main__":
    sys.exit(main())
