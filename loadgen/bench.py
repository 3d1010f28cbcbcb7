"""Running the workload against targets: one target (``run_target``), and the side-by-side
comparison (``compare``) of nfsgw gateways started as subprocesses in chosen configurations
behind the delay proxy (``loadgen.gwprocess.GatewayProcess``) and of other NFS servers.

Owns: the order of operations of a benchmark run (counters read before and after each phase,
one target at a time so they do not compete for the machine's cores, every process stopped
on the way out) and writing the outputs (report.json, report.md, PNGs). Must not: compute
report figures (``report``) or speak NFS (``workload``).
"""

from __future__ import annotations

import asyncio
import shlex
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from loadgen import gwmetrics
from loadgen.dataset import Manifest
from loadgen.gwprocess import GatewayProcess
from loadgen.localfs import drop_page_cache, is_local, local_dir
from loadgen.nfsclient import NfsError, RpcError
from loadgen.peers import PEERS, PeerError, RclonePeer
from loadgen.progress import Progress, say
from loadgen.proxy import COUNTS_PATH, DelayProxy
from loadgen.report import (
    DEFAULT_COMPUTE_S,
    RunReport,
    TargetReport,
    build_epoch,
    build_setup,
    to_markdown,
)
from loadgen.workload import DataMismatch, NodeFailed, NodeGroup, WorkloadSpec

__all__ = [
    "CONFIGS",
    "Counters",
    "compare",
    "dataset_info",
    "parse_targets",
    "run_target",
    "write_outputs",
]

# nfsgw configurations compared by default: name -> extra ``nfsgw serve`` flags. off: no
# metadata prefetch, no read coalescing, no data prefetch; prefetch: metadata prefetch only;
# both: metadata prefetch + coalescing; data: both + data prefetch (the gateway's defaults).
CONFIGS: dict[str, list[str]] = {
    "nfsgw-off": ["--no-prefetch", "--no-coalesce", "--no-data-prefetch"],
    "nfsgw-prefetch": ["--no-coalesce", "--no-data-prefetch"],
    "nfsgw-both": ["--no-data-prefetch"],
    "nfsgw-data": [],
}
CONFIG_ALIASES = {
    "off": "nfsgw-off",
    "prefetch": "nfsgw-prefetch",
    "both": "nfsgw-both",
    "data": "nfsgw-data",
}


class Counters:
    """Where backend counts come from for one target: the in-process proxy, a standalone
    proxy's counts URL, and/or the gateway's /metrics URL (any may be missing)."""

    def __init__(
        self,
        *,
        proxy: DelayProxy | None = None,
        proxy_url: str | None = None,
        metrics_url: str | None = None,
    ) -> None:
        self.proxy = proxy
        self.proxy_url = proxy_url.rstrip("/") + COUNTS_PATH if proxy_url else None
        self.metrics_url = metrics_url

    async def snapshot(self) -> tuple[dict[str, int] | None, gwmetrics.Samples | None]:
        p: dict[str, int] | None = None
        if self.proxy is not None:
            p = self.proxy.snapshot()
        elif self.proxy_url is not None:
            p = {str(k): int(v) for k, v in (await gwmetrics.fetch_json(self.proxy_url)).items()}
        m = await gwmetrics.scrape(self.metrics_url) if self.metrics_url else None
        return p, m

    @staticmethod
    def diff(
        after: tuple[dict[str, int] | None, gwmetrics.Samples | None],
        before: tuple[dict[str, int] | None, gwmetrics.Samples | None],
    ) -> dict[str, Any]:
        pa, ma = after
        pb, mb = before
        out: dict[str, Any] = {
            "backend": None,
            "gateway_backend": None,
            "gateway_rpc": None,
            "cache": None,
            "prefetch": None,
        }
        if pa is not None and pb is not None:
            out["backend"] = {k: v - pb.get(k, 0) for k, v in pa.items() if v - pb.get(k, 0)}
        if ma is not None and mb is not None:
            d = gwmetrics.delta(ma, mb)
            out["gateway_backend"] = gwmetrics.backend_ops(d)
            out["gateway_rpc"] = gwmetrics.rpc_ops(d)
            out["cache"] = gwmetrics.cache_ratios(d)
            out["prefetch"] = gwmetrics.prefetch_counts(d)
        return out


async def run_target(
    spec: WorkloadSpec,
    name: str,
    url: str,
    *,
    kind: str = "nfs",
    options: list[str] | None = None,
    epochs: int = 2,
    compute_s: float = DEFAULT_COMPUTE_S,
    counters: Counters | None = None,
    in_process: bool = False,
    show_progress: bool = True,
    total_files: int | None = None,
) -> TargetReport:
    """Set-up (mount + scan) and ``epochs`` epochs against one NFS URL or ``local:DIR``. A
    failure (a wrong byte included) is recorded in ``TargetReport.error`` after the processes
    are stopped. A local tree is first evicted from the page cache, so that its epoch 1 reads
    the disk as a cold NFS epoch reads the backend, and epoch 2 the page cache."""
    spec = replace(spec, target=url)
    counters = counters or Counters()
    if is_local(url):
        kind = "local"
        dropped = await asyncio.to_thread(drop_page_cache, local_dir(url))
        say(f"{name}: {dropped} files evicted from the page cache (epoch 1 reads the disk)")
    tr = TargetReport(name, url, kind, list(options or []))
    if total_files is None:
        total_files = len(Manifest.read(spec.manifest).entries)
        if spec.max_files:
            total_files = min(total_files, spec.max_files)
    group = NodeGroup(spec, in_process=in_process)
    try:
        await group.start()
        say(f"{name}: mounting {url} with {spec.nodes} node(s) x {spec.workers} worker(s)")
        before = await counters.snapshot()
        t0 = time.perf_counter()
        parts = await group.setup()
        dt = time.perf_counter() - t0
        d = Counters.diff(await counters.snapshot(), before)
        tr.setup = build_setup(
            parts,
            dt,
            backend=d["backend"],
            gateway_backend=d["gateway_backend"],
            prefetch=d["prefetch"],
        )
        say(f"{name}: set-up {dt:.2f} s, {tr.setup.files} files")
        for e in range(1, epochs + 1):
            bar = Progress(total_files, f"{name} epoch {e}", enabled=show_progress)
            before = await counters.snapshot()
            t0 = time.perf_counter()
            try:
                eparts = await group.epoch(e, bar.update)
            finally:
                bar.close()
            dt = time.perf_counter() - t0
            d = Counters.diff(await counters.snapshot(), before)
            er = build_epoch(
                e,
                eparts,
                dt,
                compute_s=compute_s,
                backend=d["backend"],
                gateway_backend=d["gateway_backend"],
                gateway_rpc=d["gateway_rpc"],
                cache=d["cache"],
                prefetch=d["prefetch"],
                setup=tr.setup if e == 1 else None,
            )
            tr.epochs.append(er)
            rpi = er.requests_per_image
            extra = f", {rpi['total']:.3f} backend req/image" if rpi else ""
            if er.waste is not None:
                extra += f", {er.waste * 100:.1f} % of prefetches wasted"
            say(
                f"{name}: epoch {e}: {er.images_per_s:.0f} images/s, {er.mb_per_s:.1f} MB/s, "
                f"p99 {er.latency_ms['p99']:.1f} ms{extra}"
            )
    except (DataMismatch, NodeFailed, NfsError, RpcError, OSError, TimeoutError) as ex:
        tr.error = f"{type(ex).__name__}: {ex}"
        say(f"{name}: FAILED: {tr.error}")
    finally:
        await group.close(abort=tr.error is not None)
    return tr


# --------------------------------------------------------------------------- compare


async def _run_rclone(
    spec: WorkloadSpec,
    proxy: DelayProxy,
    s3_url: str,
    env: dict[str, str],
    work_dir: Path,
    *,
    max_files: int,
    epochs: int,
    compute_s: float,
    in_process: bool,
    show_progress: bool,
) -> TargetReport:
    """``rclone serve nfs`` over the bucket behind ``proxy`` (its requests counted like the
    gateway's), on the first ``max_files`` files when not 0."""
    from gateway.backend import parse_store_url

    u = parse_store_url(s3_url)
    key, secret = env.get("AWS_ACCESS_KEY_ID"), env.get("AWS_SECRET_ACCESS_KEY")
    if not key or not secret:
        raise ValueError("--peers rclone needs the S3 credentials in AWS_ACCESS_KEY_ID/..._KEY")
    every = len(Manifest.read(spec.manifest).entries)
    total = min(every, spec.max_files or every, max_files or every)
    spec = replace(spec, max_files=0 if total == every else total)
    name = "rclone" if total == every else f"rclone ({total} files)"
    try:
        peer = RclonePeer(
            work_dir,
            endpoint_url=proxy.endpoint_url,
            bucket=u.location,
            prefix=u.prefix,
            access_key=key,
            secret_key=secret,
            region=env.get("AWS_REGION", "us-east-1"),
        )
        await asyncio.to_thread(peer.start)
    except PeerError as e:
        say(f"{name}: FAILED: {e}")
        return TargetReport(name, "rclone serve nfs", "peer", error=f"PeerError: {e}")
    say(f"{name}: {' '.join(peer.argv[1:4])} on {peer.url}, {total} files, log {peer.log_path}")
    try:
        return await run_target(
            spec,
            name,
            peer.url,
            kind="peer",
            options=peer.options,
            epochs=epochs,
            compute_s=compute_s,
            counters=Counters(proxy=proxy),
            in_process=in_process,
            show_progress=show_progress,
            total_files=total,
        )
    finally:
        await asyncio.to_thread(peer.stop)


def write_outputs(run: RunReport, out_dir: str | Path, *, plots: bool = True) -> list[Path]:
    """report.json, report.md and (with matplotlib) the PNGs; returns the paths written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "report.json", out / "report.md"]
    run.write_json(paths[0])
    paths[1].write_text(to_markdown(run))
    if plots:
        from loadgen.plots import write_plots

        paths += write_plots(run, out)
    return paths


def dataset_info(manifest: Manifest, spec: WorkloadSpec) -> dict[str, Any]:
    entries = manifest.entries[: spec.max_files] if spec.max_files else manifest.entries
    return {
        "files": len(entries),
        "bytes": sum(e.size for e in entries),
        "classes": len({e.path.split("/", 1)[0] for e in entries}),
        "spec": manifest.spec,
    }


def parse_targets(specs: list[str]) -> list[tuple[str, str]]:
    """``--target [NAME=]nfs://...`` or ``[NAME=]local:DIR`` values -> (name, url); unnamed
    ones are nfs-1, nfs-2... and local; a local DIR must exist (``ValueError``)."""
    out = []
    for i, s in enumerate(specs):
        name, sep, url = s.partition("=")
        if not sep or name.startswith(("nfs:", "local:")):
            name, url = ("local" if is_local(s) else f"nfs-{i + 1}"), s
        if is_local(url):
            local_dir(url)
        elif not url.startswith("nfs://"):
            raise ValueError(
                f"--target {s!r}: expected [NAME=]nfs://HOST[:PORT]/EXPORT or local:DIR"
            )
        out.append((name, url))
    return out


async def compare(
    spec: WorkloadSpec,
    *,
    s3_url: str | None,
    s3_endpoint_url: str | None,
    configs: list[str],
    extra_targets: list[tuple[str, str]],
    epochs: int = 2,
    backend_latency_ms: float = 10.0,
    backend_bandwidth_mbps: float | None = None,
    compute_s: float = DEFAULT_COMPUTE_S,
    gateway_env: dict[str, str] | None = None,
    gateway_args: list[str] | None = None,
    work_dir: Path | None = None,
    in_process: bool = False,
    show_progress: bool = True,
    command: str = "",
    peers: list[str] | None = None,
    peer_max_files: int = 0,
) -> RunReport:
    """The same workload against each nfsgw configuration (each a fresh gateway behind the
    delay proxy, started one after the other), each peer (``PEERS``: another S3-to-NFS server
    behind the same proxy, on the first ``peer_max_files`` files when not 0, its S3
    credentials from ``gateway_env``) and each extra target (NFS URL or ``local:DIR``)."""
    peers = list(peers or [])
    for peer in peers:
        if peer not in PEERS:
            raise ValueError(f"unknown peer {peer!r} ({', '.join(PEERS)})")
    manifest = Manifest.read(spec.manifest)
    run = RunReport(
        command=command or shlex.join(sys.argv),
        workload=spec.to_json() | {"epochs": epochs},
        dataset=dataset_info(manifest, spec),
        compute_s=compute_s,
        backend_latency_ms=backend_latency_ms if configs else None,
        backend_bandwidth_mbps=backend_bandwidth_mbps,
    )
    total = run.dataset["files"]
    tmp: tempfile.TemporaryDirectory[str] | None = None
    if work_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="nfsgw-loadgen-")
        work_dir = Path(tmp.name)
    proxy: DelayProxy | None = None
    try:
        if configs or peers:
            if not s3_url:
                raise ValueError("nfsgw configurations and peers need --s3 s3://BUCKET/PREFIX")
            if not s3_endpoint_url:
                raise ValueError("the delay proxy needs --s3-endpoint-url (the S3 server)")
            bw = backend_bandwidth_mbps * 1e6 if backend_bandwidth_mbps else None
            proxy = await DelayProxy(
                s3_endpoint_url, latency_s=backend_latency_ms / 1000, bandwidth_bps=bw
            ).start()
            say(
                f"delay proxy {proxy.endpoint_url} -> {s3_endpoint_url}, +{backend_latency_ms:g} ms"
            )
        for cfg in configs:
            name = CONFIG_ALIASES.get(cfg, cfg)
            if name not in CONFIGS:
                raise ValueError(f"unknown nfsgw configuration {cfg!r} ({', '.join(CONFIGS)})")
            assert proxy is not None and s3_url is not None
            flags = CONFIGS[name] + list(gateway_args or [])
            gw = GatewayProcess(
                work_dir,
                [
                    {
                        "path": "/data",
                        "backend": s3_url,
                        "read_only": True,
                        "immutable": True,
                        "insecure": True,
                    }
                ],
                name=name,
                sections={"s3": {"endpoint_url": proxy.endpoint_url}},
                flags=flags,
                env=gateway_env,
            )
            await asyncio.to_thread(gw.start)
            say(f"{name}: gateway on {gw.url} ({' '.join(flags) or 'defaults'}), log {gw.log_path}")
            try:
                tr = await run_target(
                    spec,
                    name,
                    gw.url,
                    kind="nfsgw",
                    options=flags,
                    epochs=epochs,
                    compute_s=compute_s,
                    counters=Counters(proxy=proxy, metrics_url=gw.metrics_url),
                    in_process=in_process,
                    show_progress=show_progress,
                    total_files=total,
                )
            finally:
                await asyncio.to_thread(gw.stop, 15.0)
            run.targets.append(tr)
        for peer in peers:
            assert proxy is not None and s3_url is not None
            run.targets.append(
                await _run_rclone(
                    spec,
                    proxy,
                    s3_url,
                    gateway_env or {},
                    work_dir / peer,
                    max_files=peer_max_files,
                    epochs=epochs,
                    compute_s=compute_s,
                    in_process=in_process,
                    show_progress=show_progress,
                )
            )
        for name, url in extra_targets:
            run.targets.append(
                await run_target(
                    spec,
                    name,
                    url,
                    epochs=epochs,
                    compute_s=compute_s,
                    in_process=in_process,
                    show_progress=show_progress,
                    total_files=total,
                )
            )
    finally:
        if proxy is not None:
            await proxy.close()
        if tmp is not None:
            tmp.cleanup()
    return run
