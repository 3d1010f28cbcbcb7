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
from loadgen.nfsclient import NfsError, RpcError
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

# nfsgw configurations compared by default: name -> extra ``nfsgw serve`` flags.
CONFIGS: dict[str, list[str]] = {
    "nfsgw-off": ["--no-prefetch", "--no-coalesce"],
    "nfsgw-prefetch": ["--no-coalesce"],
    "nfsgw-both": [],
}
CONFIG_ALIASES = {"off": "nfsgw-off", "prefetch": "nfsgw-prefetch", "both": "nfsgw-both"}


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
        }
        if pa is not None and pb is not None:
            out["backend"] = {k: v - pb.get(k, 0) for k, v in pa.items() if v - pb.get(k, 0)}
        if ma is not None and mb is not None:
            d = gwmetrics.delta(ma, mb)
            out["gateway_backend"] = gwmetrics.backend_ops(d)
            out["gateway_rpc"] = gwmetrics.rpc_ops(d)
            out["cache"] = gwmetrics.cache_ratios(d)
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
    """Set-up (mount + scan) and ``epochs`` epochs against one NFS URL. A failure (a wrong
    byte included) is recorded in ``TargetReport.error`` after the processes are stopped."""
    spec = replace(spec, target=url)
    counters = counters or Counters()
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
            parts, dt, backend=d["backend"], gateway_backend=d["gateway_backend"]
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
                setup=tr.setup if e == 1 else None,
            )
            tr.epochs.append(er)
            rpi = er.requests_per_image
            extra = f", {rpi['total']:.3f} backend req/image" if rpi else ""
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
    """``--target [NAME=]nfs://...`` values -> (name, url); unnamed ones are nfs-1, nfs-2..."""
    out = []
    for i, s in enumerate(specs):
        name, sep, url = s.partition("=")
        if not sep or name.startswith("nfs:"):
            name, url = f"nfs-{i + 1}", s
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
) -> RunReport:
    """The same workload against each nfsgw configuration (each a fresh gateway behind the
    delay proxy, started one after the other) and each extra NFS URL."""
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
        if configs:
            if not s3_url:
                raise ValueError("nfsgw configurations need --s3 s3://BUCKET/PREFIX")
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
                [{"path": "/data", "backend": s3_url, "read_only": True, "immutable": True}],
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
