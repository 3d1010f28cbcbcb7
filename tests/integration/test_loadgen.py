"""loadgen end to end: a tiny dataset uploaded to SeaweedFS, ``nfsgw serve`` in a subprocess
behind the delay proxy, two node processes running ImageFolder-like epochs with every byte
checked. Asserts request counts (cold epoch: one GET per file plus the scan's LISTs; warm
epoch: no backend request; prefetch off: a LIST per file; data prefetch: still one GET per
file, nothing wasted) and that a corrupted byte fails the run. No timing assertions."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gateway.backend.s3 import S3Store
from loadgen.bench import CONFIGS, Counters, run_target
from loadgen.dataset import DatasetSpec, make_dataset
from loadgen.gwprocess import GatewayProcess
from loadgen.proxy import DelayProxy
from loadgen.report import TargetReport
from loadgen.seaweed import SeaweedServer
from loadgen.workload import WorkloadSpec

pytestmark = pytest.mark.s3

CLASSES, PER_CLASS = 3, 8
FILES = CLASSES * PER_CLASS


async def dataset(seaweed: SeaweedServer, bucket: str, tmp_path: Path) -> Path:
    manifest = tmp_path / "manifest.tsv"
    spec = DatasetSpec(
        classes=CLASSES,
        per_class_min=PER_CLASS,
        per_class_max=PER_CLASS,
        mean_size=40_000,
        sd_size=30_000,
        seed=3,
    )
    creds = seaweed.store_kwargs()
    await make_dataset(
        spec,
        s3_url=f"s3://{bucket}/train",
        s3_endpoint_url=creds["endpoint_url"],
        s3_region=creds["region"],
        access_key=creds["access_key"],
        secret_key=creds["secret_key"],
        concurrency=8,
        manifest_path=manifest,
        progress=False,
    )
    return manifest


async def run(
    seaweed: SeaweedServer,
    bucket: str,
    manifest: Path,
    work: Path,
    *,
    name: str,
    flags: list[str],
    epochs: int,
    nodes: int = 2,
    in_process: bool = False,
) -> tuple[TargetReport, str]:
    """The target's report and the tail of the gateway's log (for failure messages)."""
    export = {
        "path": "/data",
        "backend": f"s3://{bucket}/train",
        "read_only": True,
        "immutable": True,
        "insecure": True,
    }
    async with DelayProxy(seaweed.endpoint_url, latency_s=0.001) as proxy:
        gw = GatewayProcess(
            work,
            [export],
            name=name,
            sections={"s3": {"endpoint_url": proxy.endpoint_url}},
            flags=flags,
            s3=seaweed,
        )
        await asyncio.to_thread(gw.start)
        try:
            spec = WorkloadSpec(
                target="", manifest=str(manifest), nodes=nodes, workers=3, batch_size=4
            )
            tr = await run_target(
                spec,
                name,
                gw.url,
                kind="nfsgw",
                epochs=epochs,
                counters=Counters(proxy=proxy, metrics_url=gw.metrics_url),
                in_process=in_process,
                show_progress=False,
            )
        finally:
            await asyncio.to_thread(gw.stop)
        return tr, gw.log_tail()


async def test_cold_warm_request_counts_and_prefetch_off(
    seaweed: SeaweedServer, s3_bucket: str, tmp_path: Path
) -> None:
    manifest = await dataset(seaweed, s3_bucket, tmp_path)

    tr, log = await run(
        seaweed,
        s3_bucket,
        manifest,
        tmp_path / "gw",
        name="both",
        flags=CONFIGS["nfsgw-both"],
        epochs=2,
    )
    assert tr.error is None, log
    assert tr.setup is not None and tr.setup.files == FILES
    cold, warm = tr.epochs
    assert cold.files == warm.files == FILES
    assert cold.rpc == {"GETATTR": FILES, "ACCESS": FILES, "READ": FILES}
    # Cold (the tree scan included): one GET per file, one LIST page per directory, no HEAD.
    assert cold.backend is not None and cold.gateway_backend is not None
    assert cold.backend.get("GET") == FILES
    assert cold.backend.get("LIST", 0) <= 1 + CLASSES
    assert cold.backend.get("HEAD", 0) == 0
    assert cold.gateway_backend == cold.backend  # the gateway counts what the store saw
    assert cold.requests_per_image is not None
    assert cold.requests_per_image["total"] <= 1.0 + (1 + CLASSES) / FILES
    # Warm: served from the gateway's caches.
    assert warm.backend == {} and warm.gateway_backend == {}
    assert warm.cache is not None and warm.cache["data"] == 1.0
    assert warm.requests_per_image is not None and warm.requests_per_image["total"] == 0.0

    off, log = await run(
        seaweed,
        s3_bucket,
        manifest,
        tmp_path / "gw",
        name="off",
        flags=CONFIGS["nfsgw-off"],
        epochs=2,
        nodes=1,
        in_process=True,
    )
    assert off.error is None, log
    cold, warm = off.epochs
    assert cold.backend is not None
    # No prefetch: each file's name is resolved with its own (targeted) LIST.
    assert cold.backend.get("LIST", 0) >= FILES and cold.backend.get("GET") == FILES
    assert warm.backend == {}
    assert all(e.waste is None for e in off.epochs)  # data prefetch off: nothing prefetched

    data, log = await run(
        seaweed,
        s3_bucket,
        manifest,
        tmp_path / "gw",
        name="data",
        flags=CONFIGS["nfsgw-data"],
        epochs=2,
        nodes=1,
        in_process=True,
    )
    assert data.error is None, log
    cold, warm = data.epochs
    # Data prefetch: the READs find (or join) what was prefetched; never more than one GET
    # per file. Prefetch GETs run in the background from the first listing on, so some may
    # land before the first snapshot: the epochs count at most one GET per file.
    assert cold.backend is not None and warm.backend is not None
    assert 0 < cold.backend.get("GET", 0) + warm.backend.get("GET", 0) <= FILES
    assert warm.cache is not None and warm.cache["data"] == 1.0
    assert cold.prefetch is not None and cold.prefetch["objects"] > 0
    assert cold.prefetch["wasted"] == 0 and cold.waste == 0.0


async def test_a_corrupted_byte_fails_the_run(
    seaweed: SeaweedServer, s3_bucket: str, tmp_path: Path
) -> None:
    manifest = await dataset(seaweed, s3_bucket, tmp_path)
    victim = "n00000001/n00000001_00004.JPEG"
    store = S3Store(s3_bucket, **seaweed.store_kwargs())
    try:
        got = await store.get(f"train/{victim}")
        body = bytearray(got.data)
        body[len(body) // 3] ^= 0x40
        await store.put(f"train/{victim}", bytes(body))
    finally:
        await store.close()
    tr, _ = await run(
        seaweed,
        s3_bucket,
        manifest,
        tmp_path / "gw",
        name="both",
        flags=[],
        epochs=1,
        nodes=1,
        in_process=True,
    )
    assert tr.error is not None and "DataMismatch" in tr.error and victim in tr.error
    assert tr.epochs == []
