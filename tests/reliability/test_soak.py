"""Soak: loadgen nodes (separate processes) read shuffled ImageFolder epochs at high
concurrency through the gateway (``nfsgw serve``, a child process, so its memory, descriptors
and threads are its own) from a dataset about three times its data cache, every byte checked.

What must hold:

- RSS stays within the configured budgets (data cache + metadata) plus a stated overhead
  (``OVERHEAD``: the interpreter, libraries, buffers of calls in flight), at every sample;
- RSS does not grow from the end of the first epoch (caches full) to the end of the last
  (``GROWTH``), nor do threads; open file descriptors stay within the idle ones plus the
  client connections plus the backend connection pool (which may keep filling up to its
  configured size);
- when the clients are gone: no connection, no call in flight, the cache within its budget.

CI runs a short soak (``NFSGW_SOAK_EPOCHS``, default 4). The longer one is documented in
docs/reliability.md, e.g.::

    NFSGW_SOAK_EPOCHS=30 NFSGW_SOAK_CLASSES=100 NFSGW_SOAK_NODES=8 \\
        .venv/bin/python -m pytest tests/reliability/test_soak.py -s
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from loadgen.dataset import DatasetSpec, make_dataset
from loadgen.gwprocess import GatewayProcess
from loadgen.seaweed import SeaweedServer
from loadgen.workload import NodeGroup, WorkloadSpec

pytestmark = [pytest.mark.s3]

MiB = 1 << 20
EPOCHS = int(os.environ.get("NFSGW_SOAK_EPOCHS", "4"))
CLASSES = int(os.environ.get("NFSGW_SOAK_CLASSES", "12"))
PER_CLASS = int(os.environ.get("NFSGW_SOAK_PER_CLASS", "100"))
NODES = int(os.environ.get("NFSGW_SOAK_NODES", "4"))
WORKERS = int(os.environ.get("NFSGW_SOAK_WORKERS", "16"))
CACHE = 16 * MiB
METADATA = 4 * MiB
S3_CONNECTIONS = 32  # the backend connection pool: descriptors grow up to it, not past
OVERHEAD = 64 * MiB  # over the idle process, besides the budgets (see docs/reliability.md)
# From the first epoch to the last, each kind of resident memory on its own. Anonymous memory
# (the heap: private copies, calls, the index) must not grow: GROWTH. File-backed memory may:
# the memory tier's entries start as private copies (the first epoch's GETs) and become
# read-only mappings of the disk tier's files (its hits), whose resident pages are the data
# cache's, within its budget (CACHE).
GROWTH = 16 * MiB


class Sampler:
    """RSS of a process every 100 ms on a thread; the maximum and the last value."""

    def __init__(self, pid: int) -> None:
        self.p = psutil.Process(pid)
        self.max = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            try:
                self.max = max(self.max, self.p.memory_info().rss)
            except psutil.Error:
                return

    def __enter__(self) -> Sampler:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join(5)

    def now(self) -> tuple[int, int, int]:
        """(RSS, open descriptors, threads)."""
        return self.p.memory_info().rss, self.p.num_fds(), self.p.num_threads()

    def rss_kinds(self) -> tuple[int, int]:
        """(anonymous, file-backed) resident bytes, from /proc/PID/status."""
        kb = {}
        for line in Path(f"/proc/{self.p.pid}/status").read_text().splitlines():
            name, _, value = line.partition(":")
            if name in ("RssAnon", "RssFile"):
                kb[name] = int(value.split()[0])
        return kb["RssAnon"] * 1024, kb["RssFile"] * 1024


@pytest.fixture
def dataset(seaweed: SeaweedServer, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    bucket = f"soak-{uuid.uuid4().hex[:12]}"
    seaweed.create_bucket(bucket)
    manifest = tmp_path / "manifest.tsv"
    spec = DatasetSpec(
        classes=CLASSES,
        per_class_min=PER_CLASS,
        per_class_max=PER_CLASS,
        mean_size=40_000,
        sd_size=30_000,
        max_size=1 * MiB,
        seed=11,
    )
    try:
        asyncio.run(
            make_dataset(
                spec,
                s3_url=f"s3://{bucket}/soak/",
                s3_endpoint_url=seaweed.endpoint_url,
                access_key=seaweed.access_key,
                secret_key=seaweed.secret_key,
                manifest_path=manifest,
                progress=False,
            )
        )
        yield bucket, manifest
    finally:
        seaweed.delete_bucket(bucket)


def test_soak(seaweed: SeaweedServer, dataset: tuple[str, Path], tmp_path: Path) -> None:
    bucket, manifest = dataset
    gw = GatewayProcess(
        tmp_path / "gw",
        [{"path": "/soak", "backend": f"s3://{bucket}/soak/", "read_only": True, "insecure": True}],
        s3=seaweed,
        sections={
            "cache": {"memory": CACHE, "metadata_memory": METADATA},
            "s3": {"max_connections": S3_CONNECTIONS},
        },
    )
    gw.start()
    try:
        time.sleep(0.5)
        with Sampler(gw.pid) as s:
            idle = s.now()
            spec = WorkloadSpec(
                target=f"nfs://127.0.0.1:{gw.port}/soak",
                manifest=str(manifest),
                nodes=NODES,
                workers=WORKERS,
                batch_size=16,
                timeout_s=60.0,
                seed=1,
            )
            marks: list[tuple[int, int, int]] = []
            kinds: list[tuple[int, int]] = []

            async def run() -> int:
                files = 0
                group = NodeGroup(spec, deadline_s=1800.0)
                await group.start()
                try:
                    await group.setup()
                    for e in range(EPOCHS):
                        parts = await group.epoch(e)
                        files += sum(p.files for p in parts)
                        marks.append(s.now())
                        kinds.append(s.rss_kinds())
                finally:
                    await group.close()
                return files

            files = asyncio.run(run())
            time.sleep(0.5)
            after = s.now()
            peak = s.max
        m = gw.metrics()
    finally:
        gw.stop()

    mb = [round(x[0] / MiB, 1) for x in marks]
    anon = [round(k[0] / MiB, 1) for k in kinds]
    mapped = [round(k[1] / MiB, 1) for k in kinds]
    print(
        f"\nsoak: {EPOCHS} epochs, {files} files read by {NODES}x{WORKERS} workers; RSS idle "
        f"{idle[0] / MiB:.1f} MiB, after each epoch {mb} (anonymous {anon}, file-backed "
        f"{mapped}), peak {peak / MiB:.1f} MiB; fds "
        f"{idle[1]} idle, {[x[1] for x in marks]}, {after[1]} after; threads {idle[2]}, "
        f"{[x[2] for x in marks]}, {after[2]}"
    )
    assert files == EPOCHS * CLASSES * PER_CLASS
    assert peak <= idle[0] + CACHE + METADATA + OVERHEAD, peak
    assert kinds[-1][0] - kinds[0][0] <= GROWTH, anon
    assert kinds[-1][1] - kinds[0][1] <= CACHE, mapped
    assert max(x[1] for x in marks) <= idle[1] + NODES + S3_CONNECTIONS + 4, "descriptors"
    assert marks[-1][2] <= marks[0][2] + 1, "threads grew"
    assert after[1] <= marks[-1][1] - NODES, "descriptors of closed client connections kept"
    assert m["nfsgw_connections"] == 0
    assert m["nfsgw_rpc_inflight"] == 0
    assert m["nfsgw_data_cache_bytes"] <= CACHE
    assert m["nfsgw_data_cache_evictions_total"] > 0  # the dataset did not fit: churn
