"""Data prefetch (issue 13): cold and shuffled epochs over a slow S3 with the gateway's data
prefetch on and off, side by side in one run.

    .venv/bin/python benchmarks/data_prefetch.py [--files 5000] [--size 110000] [--epochs 3]
        [--latency-ms 20] [--clients 4] [--scenario a|b|both] [--prefetch-concurrency 24]
        [--disk SIZE] [--reader c|python] [--out DIR]

Set-up: a throw-away SeaweedFS (``loadgen.seaweed``) holding a deterministic ImageNet-like tree
(``loadgen.dataset``: ``--files`` files in folders of 100, lognormal sizes of mean ``--size``
and sd a quarter of it, seed 0), uploaded straight to SeaweedFS; the delay proxy
(``loadgen.proxy.DelayProxy``, run as ``nfsgw-loadgen proxy`` in its own process so its event
loop does not share this process's GIL) adding ``--latency-ms`` to every request and counting
them; then for each configuration a fresh ``nfsgw serve`` (``loadgen.gwprocess``: one process,
read-only, immutable export, the default data cache: memory and the disk tier under the
process's fresh state directory; ``--disk 0``: memory only) whose S3 endpoint is the proxy.

Client: libnfs, independent of the gateway. First an ImageFolder-like scan from one connection
(list the root, then every class folder, in order; not part of the epoch's time), always from
the Python client (``tests/libnfs.py``); then ``--clients`` connections read the epoch's files
(a fresh random order per epoch, the same orders for every configuration; file k of the order
on connection k mod ``--clients``), each whole: open (LOOKUP, ACCESS), READ to EOF, close.
``--reader c`` (the default): the lean C reader (``benchmarks/nfsread.c`` via
``nfsreader.NfsReader``, one C thread per connection) checks every body against a local copy
of the tree written with the upload (``local_copy``); its CPU is the client's.
``--reader python``: threads of this process over ``tests/libnfs.py`` (ctypes, one GIL) check
every body against the uploaded file's sha256; this process's CPU is the client's. That was the
method before the C reader: the client took about a core of the 2-core machine, which the
gateway did not get.

Scenarios (each runs prefetch ON, then OFF = ``--no-data-prefetch``):

- **A**, the dataset fits the cache (``--cache-memory`` = 1.5 x dataset + 64 MiB): one cold epoch.
  Reported: files/s (epoch only, and scan + epoch), the latency bound ``clients / latency``
  (200 files/s at 4 clients and 20 ms), the ratio to it (target >= 4), GETs per file at the
  proxy (target <= 1.02), wasted prefetches (target 0). GETs are counted from before the scan
  (prefetching starts with the first listing) until the gateway has nothing in flight after
  the epoch.
- **B**, the dataset is twice the cache (``--cache-memory`` = dataset / 2): ``--epochs``
  shuffled epochs. Reported per epoch and for the steady state (epochs >= 2: their files over
  their seconds): files/s, the ratio ON / OFF (target >= 3), GETs per file (<= 1.05), waste =
  wasted / prefetched objects (<= 5 %), memory hit ratio (READ block lookups served from memory).

For every epoch: the gateway's CPU seconds (its process tree, psutil) per 1,000 files, those of
the proxy, SeaweedFS and the client (the machine's cores are shared by all four), p50/p99
per-file latency, the gateway's mean backend GET time (``nfsgw_s3_request_duration_seconds``),
the prefetch passes that ended (epoch detection) and the prefetcher's gauges sampled every
0.5 s (objects in flight, concurrency limit, share of the time it waited for room).
Results: a table on stdout and ``DIR/results.json`` (default /var/tmp/nfsgw-data-prefetch).
The machine is shared and noisy: compare the ratios of one run.

Must not: import the gateway (it runs ``nfsgw serve`` through ``loadgen.gwprocess``) or leave
a process running.
"""

from __future__ import annotations

import argparse
import array
import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/: _common
from _common import ROOT, metric, results_dir, settle, wait_until, write_results
from nfsreader import NfsReader

from loadgen.dataset import DatasetSpec, Manifest, make_dataset
from loadgen.gwmetrics import Samples
from loadgen.gwprocess import GatewayProcess, free_port
from loadgen.proxy import COUNTS_PATH
from loadgen.seaweed import SeaweedServer
from tests.libnfs import LibNfs

OUT = results_dir("data-prefetch")
PER_CLASS = 100
BUCKET = "prefetch"
PREFIX = "train/"
MiB = 1 << 20


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


@dataclass(frozen=True, slots=True)
class Account:
    endpoint_url: str
    access_key: str
    secret_key: str


class ProxyProcess:
    """``nfsgw-loadgen proxy`` (``loadgen.proxy.DelayProxy``) as a child process; its counts
    are read over HTTP (``COUNTS_PATH``)."""

    def __init__(self, upstream: str, latency_ms: float, log_path: Path) -> None:
        self.port = free_port()
        self.endpoint_url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        argv = [sys.executable, "-m", "loadgen.cli", "proxy", "--upstream", upstream]
        argv += ["--listen", f"127.0.0.1:{self.port}", "--backend-latency-ms", str(latency_ms)]
        with log_path.open("ab") as f:
            self.proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT
            )
        proc = self.proc
        try:
            wait_until(
                self.counts,
                timeout_s=30,
                what="the proxy",
                interval_s=0.1,
                alive=lambda: None if proc.poll() is None else f"exited with {proc.returncode}",
                log_tail=lambda: f"log: {log_path}",
            )
        except RuntimeError:
            self.stop()
            raise

    def counts(self) -> dict[str, int]:
        with urllib.request.urlopen(self.endpoint_url + COUNTS_PATH, timeout=10) as r:
            return {str(k): int(v) for k, v in json.loads(r.read()).items()}

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def cpu_seconds(pid: int) -> float:
    """CPU time of ``pid`` and its descendants."""
    try:
        procs = [psutil.Process(pid)]
        procs += procs[0].children(recursive=True)
    except psutil.NoSuchProcess:
        return 0.0
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


@dataclass(slots=True)
class Epoch:
    epoch: int
    files: int
    seconds: float
    files_per_s: float
    mb_per_s: float
    p50_ms: float
    p99_ms: float
    errors: int
    gets: int
    gets_per_file: float
    lists: int
    memory_hit_ratio: float
    prefetched: int
    useful: int
    joined: int
    wasted: int
    dropped: int
    gateway_cpu_s: float
    gateway_cpu_s_per_1k: float
    proxy_cpu_s: float
    seaweed_cpu_s: float
    client_cpu_s: float
    client_cpu_s_per_1k: float
    passes: int
    pass_read_at_end: int
    started_at: float
    s3_get_ms: float
    gauges: dict[str, float] = field(default_factory=dict)


@dataclass(slots=True)
class Run:
    scenario: str
    config: str
    reader: str
    cache_memory: int
    scan_s: float = 0.0
    epochs: list[Epoch] = field(default_factory=list)
    totals: dict[str, float] = field(default_factory=dict)


def get_seconds(m: Samples) -> tuple[float, float]:
    """(sum, count) of the gateway's backend GET durations, every outcome."""
    total = count = 0.0
    for k, v in m.items():
        if "op=get" in k.lower():
            if k.startswith("nfsgw_s3_request_duration_seconds_sum"):
                total += v
            elif k.startswith("nfsgw_s3_request_duration_seconds_count"):
                count += v
    return total, count


class Sampler:
    """Polls the prefetcher's gauges every ``interval_s`` while an epoch runs: how many objects
    it had in flight, its concurrency limit, and how often it waited for room."""

    GAUGES = (
        "nfsgw_prefetch_inflight",
        "nfsgw_prefetch_concurrency",
        "nfsgw_prefetch_waiting_room",
        "nfsgw_data_fetches_inflight",
    )

    def __init__(self, gw: GatewayProcess, interval_s: float = 0.5) -> None:
        self.gw = gw
        self.interval_s = interval_s
        self.samples: list[tuple[float, ...]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                m = self.gw.metrics()
            except OSError:
                continue
            self.samples.append(tuple(metric(m, g) for g in self.GAUGES))

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def means(self) -> dict[str, float]:
        if not self.samples:
            return {}
        n = len(self.samples)
        return {
            g.removeprefix("nfsgw_") + "_mean": round(sum(s[i] for s in self.samples) / n, 2)
            for i, g in enumerate(self.GAUGES)
        }


def scan(nfs: LibNfs, manifest: Manifest) -> float:
    """ImageFolder's scan: the root, then every class folder in order; its seconds."""
    t0 = time.perf_counter()
    classes = sorted(nfs.listdir("/"))
    assert classes == manifest.classes, "the root does not list the classes"
    n = sum(len(nfs.listdir("/" + c)) for c in classes)
    assert n == len(manifest.entries), f"listed {n} files, expected {len(manifest.entries)}"
    return time.perf_counter() - t0


def read_epoch(
    clients: Sequence[LibNfs], manifest: Manifest, order: Sequence[int]
) -> tuple[float, list[float], int, int]:
    """Every file of ``order`` read whole by the clients (client ``w`` takes ``order[w::n]``);
    (seconds, latencies, bytes, errors)."""
    n = len(clients)
    lat = [array.array("d") for _ in range(n)]
    nbytes = [0] * n
    errors = [0] * n
    first_error: list[str] = []
    barrier = threading.Barrier(n + 1)

    def worker(w: int) -> None:
        nfs = clients[w]
        barrier.wait()
        for k in order[w::n]:
            path = manifest.entries[k].path
            t0 = time.perf_counter()
            try:
                data = nfs.read_file("/" + path)
            except OSError as e:
                problem: str | None = f"{path}: {e}"
                data = b""
            else:
                problem = None
            lat[w].append(time.perf_counter() - t0)
            problem = problem or manifest.check(path, data)
            if problem:
                errors[w] += 1
                if not first_error:
                    first_error.append(problem)
            nbytes[w] += len(data)

    threads = [threading.Thread(target=worker, args=(w,), daemon=True) for w in range(n)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if first_error:
        log(f"  first error: {first_error[0]}")
    return wall, sorted(x for a in lat for x in a), sum(nbytes), sum(errors)


@dataclass(frozen=True, slots=True)
class EpochRead:
    """One epoch as the client saw it."""

    seconds: float
    files: int
    bytes: int
    errors: int
    p50_ms: float
    p99_ms: float
    client_cpu_s: float


class CReaders:
    """``n`` connections of the C reader (``benchmarks/nfsread.c``), every body checked
    against the local copy ``tree``; the client's CPU is the reader process's."""

    def __init__(self, url: str, tree: Path, n: int) -> None:
        self.url = url
        self.reader = NfsReader(url, tree, n)
        try:
            self.reader.open_all()
        except BaseException:
            self.reader.close()
            raise

    def scan(self, manifest: Manifest) -> float:
        """``scan`` from a Python connection of its own (the C reader does not list)."""
        nfs = LibNfs(self.url, timeout_ms=120_000)
        try:
            return scan(nfs, manifest)
        finally:
            nfs.close()

    def epoch(self, manifest: Manifest, order: Sequence[int]) -> EpochRead:
        cpu0 = self.reader.cpu_seconds()
        r = self.reader.epoch(["/" + manifest.entries[k].path for k in order])
        cpu = self.reader.cpu_seconds() - cpu0
        if r["errors"]:
            log(f"  the C reader saw {r['errors']} wrong or unreadable files (its stderr: which)")
        return EpochRead(
            seconds=r["seconds"],
            files=r["files"],
            bytes=r["bytes"],
            errors=r["errors"],
            p50_ms=r["p50_ms"],
            p99_ms=r["p99_ms"],
            client_cpu_s=cpu,
        )

    def close(self) -> None:
        self.reader.close()


class PyReaders:
    """``n`` connections of ``tests/libnfs.py``, one Python thread each (``--reader python``,
    the method before the C reader); the client's CPU is this process's."""

    def __init__(self, url: str, n: int) -> None:
        self.clients: list[LibNfs] = []
        try:
            for _ in range(n):
                self.clients.append(LibNfs(url, timeout_ms=120_000))
        except BaseException:
            self.close()
            raise

    def scan(self, manifest: Manifest) -> float:
        return scan(self.clients[0], manifest)

    def epoch(self, manifest: Manifest, order: Sequence[int]) -> EpochRead:
        cpu0 = time.process_time()
        wall, lat, nbytes, errors = read_epoch(self.clients, manifest, order)
        n = len(lat)
        return EpochRead(
            seconds=wall,
            files=n,
            bytes=nbytes,
            errors=errors,
            p50_ms=lat[n // 2] * 1e3 if lat else 0.0,
            p99_ms=lat[min(n - 1, int(0.99 * n))] * 1e3 if lat else 0.0,
            client_cpu_s=time.process_time() - cpu0,
        )

    def close(self) -> None:
        for c in self.clients:
            c.close()


def open_readers(kind: str, url: str, tree: Path | None, n: int) -> CReaders | PyReaders:
    """The epoch's ``n`` connections to ``url``: ``kind`` "c" (checking against the local
    copy ``tree``) or "python" (``--reader``)."""
    if kind == "c":
        assert tree is not None, "the C reader needs the local copy of the tree"
        return CReaders(url, tree, n)
    return PyReaders(url, n)


@contextlib.contextmanager
def local_copy(reader: str) -> Iterator[Path | None]:
    """A fresh directory for the C reader's copy of the tree (None for ``--reader python``),
    removed afterwards. On /dev/shm when there is one, not beside the gateway's state: this
    VM's ext4 has no journal, and there every file created after thousands were deleted costs
    more (docs/benchmarks.md, "More GETs in flight"), so deleting a 10,000-file copy would
    slow the next run's disk tier."""
    if reader != "c":
        yield None
        return
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(prefix="nfsgw-tree-", dir=shm) as d:
        yield Path(d)


def run_config(
    a: argparse.Namespace,
    scenario: str,
    prefetch: bool,
    memory: int,
    epochs: int,
    manifest: Manifest,
    proxy: ProxyProcess,
    sw: SeaweedServer,
    work: Path,
    local: Path | None,
) -> Run:
    config = "on" if prefetch else "off"
    name = f"gw-{scenario}-{config}"
    shutil.rmtree(work / f"{name}-state", ignore_errors=True)
    # Not systemd's cache directory: its disk tier goes under its fresh state directory.
    env = {k: v for k, v in os.environ.items() if k != "CACHE_DIRECTORY"}
    gw = GatewayProcess(
        work,
        [
            {
                "path": "/data",
                "backend": f"s3://{BUCKET}/{PREFIX}",
                "read_only": True,
                "immutable": True,
                "insecure": True,
            }
        ],
        name=name,
        sections={
            "cache": {"memory": memory}
            | (
                {}
                if a.prefetch_concurrency is None
                else {"prefetch_concurrency": a.prefetch_concurrency}
            )
            | ({} if a.disk is None else {"disk": a.disk}),
        },
        flags=[] if prefetch else ["--no-data-prefetch"],
        s3=Account(proxy.endpoint_url, sw.access_key, sw.secret_key),
        env=env,
    )
    run = Run(scenario, config, a.reader, memory)
    gw.start()
    try:
        proxy_pid = proxy.proc.pid
        seaweed_pid = sw.proc.pid if sw.proc is not None else 0
        readers = open_readers(a.reader, gw.libnfs_url("/data"), local, a.clients)
        try:
            m_prev, p_prev = gw.metrics(), proxy.counts()  # epoch 1 counts the scan's too
            run.scan_s = round(readers.scan(manifest), 3)
            log(f"  {scenario.upper()} {config}: scan {run.scan_s:.2f} s")
            for e in range(epochs):
                order = list(range(len(manifest.entries)))
                random.Random(a.seed + e).shuffle(order)
                cpu0, pcpu0 = cpu_seconds(gw.pid), cpu_seconds(proxy_pid)
                scpu0 = cpu_seconds(seaweed_pid)
                started = time.time()
                with Sampler(gw) as sampler:
                    r = readers.epoch(manifest, order)
                cpu = cpu_seconds(gw.pid) - cpu0
                pcpu = cpu_seconds(proxy_pid) - pcpu0
                scpu = cpu_seconds(seaweed_pid) - scpu0
                wall, ccpu = r.seconds, r.client_cpu_s
                if scenario == "a":
                    settle(gw)  # every GET the epoch caused, prefetch included
                m, p = gw.metrics(), proxy.counts()

                def d(key: str, m: Samples = m, m0: Samples = m_prev) -> float:
                    return metric(m, key) - metric(m0, key)

                n = r.files
                g_sum, g_n = get_seconds(m)
                g_sum0, g_n0 = get_seconds(m_prev)
                hits = d("nfsgw_data_cache_hits_total")
                looks = hits + d("nfsgw_data_cache_misses_total")
                gets = p.get("GET", 0) - p_prev.get("GET", 0)
                ep = Epoch(
                    epoch=e + 1,
                    files=n,
                    seconds=round(wall, 3),
                    files_per_s=round(n / wall, 1),
                    mb_per_s=round(r.bytes / wall / 1e6, 1),
                    p50_ms=round(r.p50_ms, 2),
                    p99_ms=round(r.p99_ms, 2),
                    errors=r.errors,
                    gets=gets,
                    gets_per_file=round(gets / n, 4) if n else 0.0,
                    lists=p.get("LIST", 0) - p_prev.get("LIST", 0),
                    memory_hit_ratio=round(hits / looks, 4) if looks else 0.0,
                    prefetched=round(d("nfsgw_prefetch_objects_total")),
                    useful=round(d("nfsgw_prefetch_useful_total")),
                    joined=round(d("nfsgw_prefetch_joined_total")),
                    wasted=round(d("nfsgw_prefetch_wasted_total")),
                    dropped=round(d("nfsgw_prefetch_dropped_total")),
                    gateway_cpu_s=round(cpu, 2),
                    gateway_cpu_s_per_1k=round(cpu / n * 1000, 3) if n else 0.0,
                    proxy_cpu_s=round(pcpu, 2),
                    seaweed_cpu_s=round(scpu, 2),
                    client_cpu_s=round(ccpu, 2),
                    client_cpu_s_per_1k=round(ccpu / n * 1000, 3) if n else 0.0,
                    passes=round(d("nfsgw_prefetch_passes_total")),
                    pass_read_at_end=round(metric(m, "nfsgw_prefetch_pass_read_files")),
                    started_at=round(started, 3),
                    s3_get_ms=round((g_sum - g_sum0) / (g_n - g_n0) * 1e3, 2) if g_n > g_n0 else 0,
                    gauges=sampler.means(),
                )
                m_prev, p_prev = m, p
                run.epochs.append(ep)
                log(
                    f"  {scenario.upper()} {config} epoch {ep.epoch}: {ep.files_per_s:,.0f} "
                    f"files/s, p99 {ep.p99_ms} ms, GET/file {ep.gets_per_file:.3f}, memory hit "
                    f"{ep.memory_hit_ratio:.3f}, prefetched {ep.prefetched} (useful "
                    f"{ep.useful}, joined {ep.joined}, wasted {ep.wasted}, dropped "
                    f"{ep.dropped}), passes ended {ep.passes} (files read in the pass at the "
                    f"end: {ep.pass_read_at_end}), errors {ep.errors}; CPU s: gateway "
                    f"{ep.gateway_cpu_s}, proxy {ep.proxy_cpu_s}, SeaweedFS {ep.seaweed_cpu_s}, "
                    f"client ({run.reader}) {ep.client_cpu_s}; mean S3 GET seen by the gateway "
                    f"{ep.s3_get_ms} ms; gauges {ep.gauges}"
                )
            run.totals = {
                k: v
                for k, v in gw.metrics().items()
                if k.startswith(("nfsgw_prefetch_", "nfsgw_data_"))
            }
        finally:
            readers.close()
    finally:
        gw.stop()
    return run


def steady(run: Run) -> dict[str, float]:
    """Epochs >= 2 (or the only one) pooled: files/s, GETs/file, waste, hit ratio, CPU/1k."""
    eps = run.epochs[1:] or run.epochs
    files = sum(e.files for e in eps)
    secs = sum(e.seconds for e in eps)
    pre = sum(e.prefetched for e in eps)
    looks = [(e.memory_hit_ratio, e.files) for e in eps]
    return {
        "files_per_s": round(files / secs, 1) if secs else 0.0,
        "gets_per_file": round(sum(e.gets for e in eps) / files, 4) if files else 0.0,
        "prefetched": pre,
        "wasted": sum(e.wasted for e in eps),
        "waste_ratio": round(sum(e.wasted for e in eps) / pre, 4) if pre else 0.0,
        "memory_hit_ratio": round(sum(r * f for r, f in looks) / files, 4) if files else 0.0,
        "gateway_cpu_s_per_1k": round(sum(e.gateway_cpu_s for e in eps) / files * 1000, 3)
        if files
        else 0.0,
        "errors": sum(e.errors for e in eps),
    }


def table(runs: Sequence[Run]) -> None:
    print(
        "\n| scenario | prefetch | epoch | files/s | p50 ms | p99 ms | GET/file | memory hit | "
        "prefetched | useful | joined | wasted | gw CPU s/1k files | errors |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
          "| ---: | ---: |")  # fmt: skip
    for r in runs:
        for e in r.epochs:
            print(
                f"| {r.scenario.upper()} | {r.config} | {e.epoch} | {e.files_per_s:,.0f} | "
                f"{e.p50_ms} | {e.p99_ms} | {e.gets_per_file:.3f} | {e.memory_hit_ratio:.3f} | "
                f"{e.prefetched} | {e.useful} | {e.joined} | {e.wasted} | "
                f"{e.gateway_cpu_s_per_1k:.2f} | {e.errors} |"
            )


def verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def summarize(a: argparse.Namespace, runs: Sequence[Run]) -> dict[str, object]:
    by = {(r.scenario, r.config): r for r in runs}
    out: dict[str, object] = {}
    bound = a.clients / (a.latency_ms / 1000)
    print()
    if ("a", "on") in by:
        on = by[("a", "on")]
        e = on.epochs[0]
        wasted_total = on.totals.get("nfsgw_prefetch_wasted_total", 0.0)
        with_scan = e.files / (e.seconds + on.scan_s)
        res: dict[str, object] = {
            "bound_files_per_s": bound,
            "on_files_per_s": e.files_per_s,
            "on_files_per_s_with_scan": round(with_scan, 1),
            "ratio_to_bound": round(e.files_per_s / bound, 2),
            "gets_per_file": e.gets_per_file,
            "wasted": wasted_total,
            "on_cpu_s_per_1k": e.gateway_cpu_s_per_1k,
            "on_client_cpu_s_per_1k": e.client_cpu_s_per_1k,
        }
        print(
            f"A (fits the cache), latency bound {a.clients} / {a.latency_ms:g} ms = "
            f"{bound:,.0f} files/s:"
        )
        print(
            f"  prefetch ON : {e.files_per_s:,.0f} files/s = {e.files_per_s / bound:.2f}x the "
            f"bound (target >= 4: {verdict(e.files_per_s >= 4 * bound)}); with the scan "
            f"{with_scan:,.0f} files/s"
        )
        print(
            f"  GET/file {e.gets_per_file:.3f} (target <= 1.02: "
            f"{verdict(e.gets_per_file <= 1.02)}), wasted {wasted_total:.0f} (target 0: "
            f"{verdict(wasted_total == 0)})"
        )
        if ("a", "off") in by:
            off = by[("a", "off")].epochs[0]
            res["off_files_per_s"] = off.files_per_s
            res["off_gets_per_file"] = off.gets_per_file
            res["on_over_off"] = round(e.files_per_s / off.files_per_s, 2)
            res["off_cpu_s_per_1k"] = off.gateway_cpu_s_per_1k
            res["off_client_cpu_s_per_1k"] = off.client_cpu_s_per_1k
            print(
                f"  prefetch OFF: {off.files_per_s:,.0f} files/s = {off.files_per_s / bound:.2f}x "
                f"the bound, GET/file {off.gets_per_file:.3f}; ON / OFF = "
                f"{e.files_per_s / off.files_per_s:.2f}"
            )
            print(
                f"  gateway CPU s per 1,000 files: ON {e.gateway_cpu_s_per_1k:.2f}, OFF "
                f"{off.gateway_cpu_s_per_1k:.2f}; the client's ({a.reader} reader): ON "
                f"{e.client_cpu_s_per_1k:.2f}, OFF {off.client_cpu_s_per_1k:.2f}"
            )
        out["a"] = res
    if ("b", "on") in by and ("b", "off") in by:
        on_s, off_s = steady(by[("b", "on")]), steady(by[("b", "off")])
        ratio = on_s["files_per_s"] / off_s["files_per_s"] if off_s["files_per_s"] else 0.0
        print(f"B (dataset 2x the cache), steady state (epochs 2..{a.epochs}):")
        for label, s in (("ON ", on_s), ("OFF", off_s)):
            print(
                f"  prefetch {label}: {s['files_per_s']:,.0f} files/s, GET/file "
                f"{s['gets_per_file']:.3f}, memory hit {s['memory_hit_ratio']:.3f}, waste "
                f"{s['wasted']:.0f}/{s['prefetched']:.0f} = {100 * s['waste_ratio']:.1f} %, "
                f"gateway CPU {s['gateway_cpu_s_per_1k']:.2f} s/1k files"
            )
        print(f"  ON / OFF = {ratio:.2f} (target >= 3: {verdict(ratio >= 3)})")
        print(
            f"  ON GET/file {on_s['gets_per_file']:.3f} (target <= 1.05: "
            f"{verdict(on_s['gets_per_file'] <= 1.05)}), waste "
            f"{100 * on_s['waste_ratio']:.1f} % (target <= 5 %: "
            f"{verdict(on_s['waste_ratio'] <= 0.05)})"
        )
        out["b"] = {"on": on_s, "off": off_s, "on_over_off": round(ratio, 2)}
    return out


def git_state() -> str:
    """The commit the gateway ran from, ``+dirty`` when gateway/ had uncommitted changes."""
    try:
        head = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--", "gateway"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def upload_tree(
    sw: SeaweedServer, bucket: str, files: int, size: int, work: Path, local: Path | None = None
) -> Manifest:
    """The benchmark tree in a new ``bucket`` under ``PREFIX``: ``files`` files in folders of
    ``PER_CLASS``, lognormal sizes of mean ``size`` (sd a quarter of it), seed 0; also written
    under ``local`` when given (the C reader's copy to check against)."""
    spec = DatasetSpec(
        classes=-(-files // PER_CLASS),
        per_class_min=PER_CLASS,
        per_class_max=PER_CLASS,
        mean_size=size,
        sd_size=size // 4,
        min_size=1024,
        max_size=4 * size,
    )
    sw.create_bucket(bucket)
    t0 = time.monotonic()
    manifest = asyncio.run(
        make_dataset(
            spec,
            out_dir=local,
            s3_url=f"s3://{bucket}/{PREFIX}",
            s3_endpoint_url=sw.endpoint_url,
            access_key=sw.access_key,
            secret_key=sw.secret_key,
            manifest_path=work / "manifest.tsv",
            progress=False,
        )
    )
    log(
        f"dataset: {len(manifest.entries):,} files in {len(manifest.classes)} folders, "
        f"{manifest.total_bytes / MiB:.1f} MiB, uploaded in {time.monotonic() - t0:.1f} s"
    )
    return manifest


def run(a: argparse.Namespace) -> int:
    a.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="nfsgw-dp-") as tmp, local_copy(a.reader) as local:
        work = Path(tmp)
        sw = SeaweedServer().start()
        proxy: ProxyProcess | None = None
        try:
            manifest = upload_tree(sw, BUCKET, a.files, a.size, work, local)
            total = manifest.total_bytes
            proxy = ProxyProcess(sw.endpoint_url, a.latency_ms, a.out / "proxy.log")
            log(f"delay proxy {proxy.endpoint_url} -> {sw.endpoint_url}, +{a.latency_ms:g} ms")
            runs: list[Run] = []
            plan: list[tuple[str, int, int]] = []
            if a.scenario in ("a", "both"):
                plan.append(("a", total * 3 // 2 + 64 * MiB, 1))
            if a.scenario in ("b", "both"):
                plan.append(("b", total // 2, a.epochs))
            for scenario, memory, epochs in plan:
                for prefetch in (True, False):
                    log(
                        f"{scenario.upper()} prefetch {'on' if prefetch else 'off'}: cache "
                        f"memory {memory / MiB:.0f} MiB, {epochs} epoch(s), {a.clients} clients"
                    )
                    runs.append(
                        run_config(
                            a, scenario, prefetch, memory, epochs, manifest, proxy, sw, work, local
                        )
                    )
        finally:
            if proxy is not None:
                proxy.stop()
            sw.stop()
            for log_file in work.glob("gw-*.log"):  # the gateways' logs outlive the run
                shutil.copy(log_file, a.out / log_file.name)
    table(runs)
    summary = summarize(a, runs)
    result = {
        "args": {k: str(v) for k, v in vars(a).items()},
        "cpus": len(os.sched_getaffinity(0)),
        "commit": git_state(),
        "reader": a.reader,
        "dataset": {"files": len(manifest.entries), "bytes": total},
        "runs": [asdict(r) for r in runs],
        "summary": summary,
    }
    log(f"results: {write_results(a.out, result)}")
    errors = sum(e.errors for r in runs for e in r.epochs)
    return 1 if errors else 0


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--files", type=int, default=5000, help="files, in folders of 100 (rounded up)")
    p.add_argument("--size", type=int, default=110_000, help="mean file size, bytes")
    p.add_argument("--epochs", type=int, default=3, help="scenario B's shuffled epochs")
    p.add_argument("--latency-ms", type=float, default=20.0, help="added to every S3 request")
    p.add_argument("--clients", type=int, default=4, help="client threads (connections)")
    p.add_argument("--scenario", choices=["a", "b", "both"], default="both")
    p.add_argument(
        "--prefetch-concurrency", type=int, default=None, help="default: the gateway's (32)"
    )
    p.add_argument(
        "--disk",
        default=None,
        help="cache.disk (the disk tier's budget, 0: off); default: the gateway's (on, under "
        "its state directory)",
    )
    p.add_argument(
        "--reader",
        choices=["c", "python"],
        default="c",
        help="the epochs' client: the C reader (benchmarks/nfsread.c) or tests/libnfs.py from "
        "Python threads (the method before the C reader)",
    )
    p.add_argument("--seed", type=int, default=1, help="epoch orders")
    p.add_argument("--out", type=Path, default=OUT, help="results.json and the logs")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    return run(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
