"""ImageNet at full scale (issue 11): 1,000 folders x 1,281 tiny files served by nfsgw with its
default settings, by nfsgw with ``--immutable`` and by nfs-ganesha (FSAL_VFS) in the same run,
read by an independent client (libnfs, through ``tests/libnfs.py``).

    .venv/bin/python benchmarks/scale_index.py [--folders 1000 --per-folder 1281]
        [--epoch-files 200000] [--ttl 5] [--tree DIR] [--out DIR] [--no-ganesha]
        [--no-immutable] [--small-folders 8] [--listing-runs 3]

Owns: the tree (built once with a bounded thread pool under ``--tree``, reused while its
``complete.json`` marker matches), the servers' life cycle, the client workload, the table and
``results.json``. Must not: import the gateway (it runs ``nfsgw serve`` as a user would, through
``loadgen.gwprocess``), leave a process running (every server is stopped in ``finally``; an
alarm bounds the whole run) or touch the host's rpcbind.

Per server: (a) the whole tree listed with READDIRPLUS (libnfs ``opendir`` of the root and of
every folder, one connection, one directory after another, like ``ls -lR``), names, types and
sizes checked; (b) the server's RSS after the listing (psutil, process tree); (c) two epochs
over the same random subset (``--epoch-files``), each in a fresh order, with 4 worker threads,
each its own libnfs connection; per file: libnfs ``open`` + one ``pread`` + ``close``, which
sends LOOKUP (folder), LOOKUP (file), ACCESS and READ (counted at the gateway; the kernel sends
LOOKUP, ACCESS and READ, its dentry cache holding the folder), every byte checked; (d) for
nfsgw, the backend requests and index counters of each phase from its ``/metrics``.

The same gateway with its default settings is measured the same way on a small tree of
``--small-folders`` folders (default 8 x 1,281 = 10,248 files, every file in each epoch), so
the run also gives the warm epoch at 1.28M entries against the gateway's own figure at about
10,000 files (issue 11's second target), in a second table.

nfs-ganesha needs rpcbind. So that nothing reaches the host's, the run re-executes itself in
private network, mount and PID namespaces (``unshare``, as root) with its own loopback, its own
``/run`` (tmpfs) and its own rpcbind; when the script ends, the kernel ends every process left
in the namespace. Without root or ``unshare``, ganesha is skipped and said so.

One file although past 600 lines: tree, servers, client, metrics and table are the steps of the
one measurement, each read once, top to bottom; split, no part would run or read alone.
"""

from __future__ import annotations

import argparse
import array
import contextlib
import datetime as dt
import json
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, Protocol

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/: _common, siblings
import netns
from _common import ROOT, wait_until

from loadgen.gwmetrics import Samples
from loadgen.gwprocess import GatewayProcess, S3Account, free_port
from tests.libnfs import NF3DIR, NF3REG, LibNfs

CACHE = Path("/var/tmp/nfsgw-scale-index")
LAYOUT = 1  # bump when names or contents change: a cached tree of another layout is rebuilt
WORKERS = 4
PROGRESS_S = 60.0  # an epoch logs its progress this often
MAX_ERRORS = 100  # per epoch: past this the epoch stops (a broken server must not take hours)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ------------------------------------------------------------------------------------ the tree


@dataclass(frozen=True, slots=True)
class Tree:
    """``root/nFFFFFFFF/nFFFFFFFF_I.JPEG`` holding ``b"F/I\\n"``: a few bytes, unique. The
    first ``extra`` folders hold one file more (``per_folder + 1``): 1,000 x 1,281 with
    ``extra=167`` is ImageNet's 1,281,167 training images."""

    root: Path
    folders: int
    per_folder: int
    extra: int = 0

    def count(self, f: int) -> int:
        """Files in folder ``f``."""
        return self.per_folder + 1 if f < self.extra else self.per_folder

    @property
    def files(self) -> int:
        return self.folders * self.per_folder + min(self.extra, self.folders)

    @property
    def entries(self) -> int:
        return self.folders + self.files

    @staticmethod
    def folder(f: int) -> str:
        return f"n{f:08d}"

    @staticmethod
    def file(f: int, i: int) -> str:
        return f"n{f:08d}_{i}.JPEG"

    @staticmethod
    def content(f: int, i: int) -> bytes:
        return b"%d/%d\n" % (f, i)

    def path(self, k: int) -> tuple[str, bytes]:
        """File number ``k`` (0 <= k < files): its path under the export and its bytes."""
        big = min(self.extra, self.folders) * (self.per_folder + 1)
        if k < big:
            f, i = divmod(k, self.per_folder + 1)
        else:
            f, i = divmod(k - big, self.per_folder)
            f += min(self.extra, self.folders)
        return f"/{self.folder(f)}/{self.file(f, i)}", self.content(f, i)


def _write_folder(tree: Tree, f: int) -> None:
    d = tree.root / tree.folder(f)
    d.mkdir(exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    for i in range(tree.count(f)):
        fd = os.open(d / tree.file(f, i), flags, 0o644)
        try:
            os.write(fd, tree.content(f, i))
        finally:
            os.close(fd)


def build_tree(cache: Path, folders: int, per_folder: int, threads: int, extra: int = 0) -> Tree:
    """The tree under ``cache/data``, built unless ``cache/complete.json`` says it is there."""
    params: dict[str, int] = {"layout": LAYOUT, "folders": folders, "per_folder": per_folder}
    if extra:
        params["extra"] = extra
    tree = Tree(cache / "data", folders, per_folder, extra)
    marker, started = cache / "complete.json", cache / "building.json"
    if marker.exists() and json.loads(marker.read_text()) == params:
        log(f"tree: {tree.root} is complete ({folders:,} x {per_folder:,}), reused")
        return tree
    cache.mkdir(parents=True, exist_ok=True)
    marker.unlink(missing_ok=True)
    if tree.root.exists() and (not started.exists() or json.loads(started.read_text()) != params):
        log(f"tree: removing {tree.root} (another shape)")
        shutil.rmtree(tree.root)
    started.write_text(json.dumps(params))
    tree.root.mkdir(exist_ok=True)
    log(f"tree: creating {folders:,} x {per_folder:,} files in {tree.root} ({threads} threads)")
    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="mktree") as pool:
        futures = [pool.submit(_write_folder, tree, f) for f in range(folders)]
        for n, fut in enumerate(as_completed(futures), 1):
            fut.result()
            if n % max(1, folders // 10) == 0:
                log(f"tree: {n:,}/{folders:,} folders, {time.monotonic() - t0:.0f} s")
    marker.write_text(json.dumps(params))
    started.unlink()
    log(f"tree: created in {time.monotonic() - t0:.0f} s")
    return tree


def warm_os_caches(tree: Tree) -> float:
    """stat every entry once, so no server pays for cold inodes the one before it warmed."""
    t0 = time.monotonic()
    for f in range(tree.folders):
        with os.scandir(tree.root / tree.folder(f)) as it:
            for e in it:
                e.stat()
    return time.monotonic() - t0


# ------------------------------------------------------------------------------------ servers


class Server(Protocol):
    name: str

    def start(self) -> None: ...

    def stop(self) -> None: ...

    @property
    def pid(self) -> int: ...

    @property
    def url(self) -> str: ...

    def metrics(self) -> Samples | None: ...

    def log_path(self) -> Path | None: ...


class Nfsgw:
    """``nfsgw serve --export /data=file://TREE --read-only [FLAGS]``: defaults otherwise (the
    config file loadgen.gwprocess writes holds only the addresses, state dir and log format).
    ``backend`` (e.g. ``s3://BUCKET/``, with ``s3`` saying where that S3 is) replaces the
    tree's ``file://`` URL (``benchmarks/scale_s3.py``)."""

    def __init__(
        self,
        name: str,
        work: Path,
        tree: Tree,
        flags: Sequence[str],
        env: dict[str, str],
        backend: str | None = None,
        s3: S3Account | None = None,
    ) -> None:
        self.name = name
        self.flags = ["--read-only", *flags]
        self.gw = GatewayProcess(
            work,
            [{"path": "/data", "backend": backend or f"file://{tree.root}", "insecure": True}],
            name=name,
            flags=self.flags,
            env=env,
            s3=s3,
        )

    def start(self) -> None:
        self.gw.start()

    def stop(self) -> None:
        self.gw.stop()

    @property
    def pid(self) -> int:
        return self.gw.pid

    @property
    def url(self) -> str:
        return self.gw.libnfs_url("/data")

    def metrics(self) -> Samples | None:
        return self.gw.metrics()

    def log_path(self) -> Path | None:
        return self.gw.log_path


class Ganesha:
    """nfs-ganesha (FSAL_VFS, NFSv3 over TCP only, its own ports) exporting the tree, with a
    private rpcbind: only inside the namespaces ``main`` sets up (it binds every address of
    the namespace, which has only its loopback)."""

    def __init__(self, work: Path, tree: Tree, startup_timeout_s: float = 90.0) -> None:
        self.name = "ganesha"
        self.work = work
        self.tree = tree
        self.nfs_port = free_port()
        self.mnt_port = free_port()
        self.startup_timeout_s = startup_timeout_s
        self.proc: subprocess.Popen[bytes] | None = None
        self._procs: list[subprocess.Popen[bytes]] = []
        self._log = work / "ganesha.log"

    def start(self) -> None:
        self._procs = netns.start_ganesha(
            self.work, self.tree.root, self.nfs_port, self.mnt_port, access="RO"
        )
        self.proc = self._procs[0]
        proc = self.proc

        def serves() -> bool:
            LibNfs(self.url, timeout_ms=5_000).close()
            return True

        wait_until(
            serves,
            timeout_s=self.startup_timeout_s,
            what="ganesha",
            interval_s=0.5,
            alive=lambda: None if proc.poll() is None else f"exited with {proc.returncode}",
            log_tail=self.tail,
        )

    def stop(self) -> None:
        netns.stop(self._procs)

    @property
    def pid(self) -> int:
        assert self.proc is not None, "not started"
        return self.proc.pid

    @property
    def url(self) -> str:
        return (
            f"nfs://127.0.0.1{self.tree.root}?nfsport={self.nfs_port}&mountport={self.mnt_port}"
            "&version=3&auto-traverse-mounts=0"
        )

    def metrics(self) -> Samples | None:
        return None

    def log_path(self) -> Path | None:
        return self._log

    def tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self._log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


# ------------------------------------------------------------------------------------ client


@dataclass(slots=True)
class Listing:
    seconds: float
    entries: int
    errors: list[str]


def list_tree(url: str, tree: Tree) -> Listing:
    """READDIRPLUS of the root and of every folder over one connection; only the ``scandir``
    calls are timed (the checks of names, types and sizes are not)."""
    errors: list[str] = []
    spent = 0.0
    with LibNfs(url) as nfs:
        t0 = time.perf_counter()
        top = nfs.scandir("/")
        spent += time.perf_counter() - t0
        seen = len(top)
        want = {tree.folder(f) for f in range(tree.folders)}
        names = {e.name for e in top if e.type == NF3DIR}
        if names != want or len(top) != tree.folders:
            errors.append(f"/: {len(top)} entries, {len(want - names)} folders missing")
        for name in sorted(names & want):
            t0 = time.perf_counter()
            ents = nfs.scandir("/" + name)
            spent += time.perf_counter() - t0
            seen += len(ents)
            f = int(name[1:])
            got = {e.name: e.size for e in ents if e.type == NF3REG}
            expect = {tree.file(f, i): len(tree.content(f, i)) for i in range(tree.count(f))}
            if got != expect or len(ents) != tree.count(f):
                errors.append(f"/{name}: {len(ents)} entries, names or sizes differ")
    return Listing(spent, seen, errors[:20])


@dataclass(slots=True)
class Epoch:
    files: int
    seconds: float
    files_per_s: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    errors: int
    first_errors: list[str] = field(default_factory=list)


def _pct(s: Sequence[float], q: float) -> float:
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


def run_epoch(clients: Sequence[LibNfs], tree: Tree, order: Sequence[int]) -> Epoch:
    """``order`` split across the clients like DataLoader workers (file k to worker k mod n),
    one thread per client, started together; per file: open, one READ, close, bytes checked."""
    n = len(clients)
    lat = [array.array("d") for _ in range(n)]
    errs: list[str] = []
    nerr = [0]
    lock = threading.Lock()
    stop = threading.Event()
    barrier = threading.Barrier(n + 1)

    def worker(w: int) -> None:
        nfs, out = clients[w], lat[w]
        clock = time.perf_counter
        barrier.wait()
        for k in order[w::n]:
            if stop.is_set():
                return
            path, want = tree.path(k)
            t0 = clock()
            try:
                fh = nfs.open(path)
                try:
                    data = nfs.pread(fh, 0, 4096)
                finally:
                    nfs.close_file(fh)
            except OSError as e:
                data, problem = b"", f"{path}: {e}"
            else:
                problem = "" if data == want else f"{path}: {len(data)} bytes, not {len(want)}"
            out.append(clock() - t0)
            if problem:
                with lock:
                    nerr[0] += 1
                    if len(errs) < 10:
                        errs.append(problem)
                    if nerr[0] >= MAX_ERRORS:
                        stop.set()

    threads = [threading.Thread(target=worker, args=(w,), daemon=True) for w in range(n)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    try:
        for t in threads:
            while t.is_alive():
                t.join(PROGRESS_S)
                if t.is_alive():
                    done = sum(len(a) for a in lat)
                    spent = time.perf_counter() - t0
                    log(f"  {done:,}/{len(order):,} files, {done / spent:,.0f} files/s so far")
    finally:
        stop.set()  # also when the alarm ends the run: the workers stop at their next file
    wall = time.perf_counter() - t0
    s = sorted(x for a in lat for x in a)
    return Epoch(
        files=len(s),
        seconds=wall,
        files_per_s=len(s) / wall if wall else 0.0,
        p50_ms=_pct(s, 0.50) * 1e3,
        p99_ms=_pct(s, 0.99) * 1e3,
        max_ms=(s[-1] if s else float("nan")) * 1e3,
        errors=nerr[0],
        first_errors=errs,
    )


# ------------------------------------------------------------------------------------ metrics


def _labels(key: str) -> tuple[str, dict[str, str]]:
    name, _, rest = key.partition("{")
    pairs = (p.split("=", 1) for p in rest.rstrip("}").split(",") if "=" in p)
    return name, {k: v for k, v in pairs}


def counters(before: Samples, after: Samples) -> dict[str, float]:
    """What a phase cost at the gateway: backend requests by op, index counters, RPCs."""
    out: dict[str, float] = {}
    for key, v in after.items():
        d = v - before.get(key, 0.0)
        name, lab = _labels(key)
        if name == "nfsgw_s3_requests_total":
            k = f"backend_{lab.get('op', '?')}"
        elif name == "nfsgw_rpc_requests_total":
            k = f"rpc_{lab.get('proc', '?')}"
        elif name == "nfsgw_metadata_prefetches_total":
            k = f"listings_{lab.get('kind', '?')}"
        elif name in (
            "nfsgw_metadata_list_pages_total",
            "nfsgw_metadata_heads_total",
            "nfsgw_metadata_targeted_lookups_total",
            "nfsgw_metadata_cache_evictions_total",
            "nfsgw_data_cache_hits_total",
            "nfsgw_data_cache_misses_total",
            "nfsgw_gc_full_collections_total",
            "nfsgw_gc_seconds_total",
        ):
            k = name.removeprefix("nfsgw_").removesuffix("_total")
        elif name in (
            "nfsgw_metadata_cache_bytes",
            "nfsgw_metadata_cache_entries",
            "nfsgw_gc_longest_pause_seconds",
        ):
            out[name.removeprefix("nfsgw_")] = v  # gauges: the value now
            continue
        else:
            continue
        out[k] = out.get(k, 0.0) + d
    return out


def rss_cpu(pid: int) -> tuple[int, float]:
    """RSS (bytes) and CPU seconds (user + system) of ``pid`` and its children."""
    procs = [psutil.Process(pid)]
    procs += procs[0].children(recursive=True)
    rss, cpu = 0, 0.0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            rss += p.memory_info().rss
            t = p.cpu_times()
            cpu += t.user + t.system
    return rss, cpu


# ------------------------------------------------------------------------------------ one server


def extra_listings(server: Server, tree: Tree, runs: int) -> list[float]:
    """Seconds of ``runs`` more first listings, each by a freshly started server: a listing
    is one first touch per folder, so it is repeated only by starting again. On this shared
    machine one listing moved 30-45 % between runs (and between two gateways doing the same
    work), so the table shows the best of all runs."""
    out = []
    for i in range(runs):
        server.start()
        try:
            listing = list_tree(server.url, tree)
        finally:
            server.stop()
        log(f"{server.name}: extra listing {i + 1}/{runs}: {listing.seconds:.1f} s")
        out.append(listing.seconds)
    return out


def measure(
    server: Server, tree: Tree, subset: Sequence[int], seed: int, listing_runs: int = 1
) -> dict[str, Any]:
    r: dict[str, Any] = {"name": server.name}
    log(f"{server.name}: starting")
    clients: list[LibNfs] = []
    extra = extra_listings(server, tree, listing_runs - 1)
    try:
        server.start()
        rss0, cpu0 = rss_cpu(server.pid)
        m0 = server.metrics()
        r["rss_start_bytes"] = rss0
        log(f"{server.name}: listing {tree.entries:,} entries (READDIRPLUS)")
        listing = list_tree(server.url, tree)
        rss1, cpu1 = rss_cpu(server.pid)
        m1 = server.metrics()
        r["listing"] = {
            "seconds": min([listing.seconds, *extra]),
            "runs_s": [*extra, listing.seconds],
            "entries": listing.entries,
            "complete": listing.entries == tree.entries and not listing.errors,
            "errors": listing.errors,
            "server_cpu_s": cpu1 - cpu0,
        }
        r["rss_after_listing_bytes"] = rss1
        r["rss_per_entry_bytes"] = rss1 / max(1, listing.entries)
        r["rss_growth_per_entry_bytes"] = (rss1 - rss0) / max(1, listing.entries)
        if m0 is not None and m1 is not None:
            r["listing"]["gateway"] = counters(m0, m1)
        log(
            f"{server.name}: listed {listing.entries:,} entries in {listing.seconds:.1f} s, "
            f"RSS {rss1 / 2**20:.0f} MiB ({rss1 / max(1, listing.entries):.0f} B/entry)"
            + (f", ERRORS: {listing.errors[:3]}" if listing.errors else "")
        )
        clients = [LibNfs(server.url) for _ in range(WORKERS)]
        r["epochs"] = []
        m_prev, cpu_prev = m1, cpu1
        for e in (1, 2):
            order = list(subset)
            random.Random(seed * 1000 + e).shuffle(order)
            log(f"{server.name}: epoch {e}, {len(order):,} files, {WORKERS} workers")
            ep = run_epoch(clients, tree, order)
            rss, cpu = rss_cpu(server.pid)
            m = server.metrics()
            er: dict[str, Any] = {
                "epoch": e,
                "files": ep.files,
                "seconds": ep.seconds,
                "files_per_s": ep.files_per_s,
                "p50_ms": ep.p50_ms,
                "p99_ms": ep.p99_ms,
                "max_ms": ep.max_ms,
                "errors": ep.errors,
                "first_errors": ep.first_errors,
                "rss_bytes": rss,
                "server_cpu_s": cpu - cpu_prev,
            }
            if m_prev is not None and m is not None:
                er["gateway"] = counters(m_prev, m)
            r["epochs"].append(er)
            m_prev, cpu_prev = m, cpu
            log(
                f"{server.name}: epoch {e}: {ep.files_per_s:,.0f} files/s, p50 "
                f"{ep.p50_ms:.2f} ms, p99 {ep.p99_ms:.2f} ms, max {ep.max_ms:.0f} ms, "
                f"{ep.errors} errors" + (f" {ep.first_errors[:3]}" if ep.errors else "")
            )
    finally:
        for c in clients:
            with contextlib.suppress(OSError):
                c.close()
        server.stop()
    return r


# ------------------------------------------------------------------------------------ the table


def _num(v: float | None, digits: int = 0) -> str:
    if v is None or v != v:
        return "—"
    return f"{v:,.{digits}f}"


def _ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or a != a or b != b or b == 0:
        return "—"
    return f"{a / b:.2f}x"


def _get(r: dict[str, Any] | None, *path: str | int) -> Any:
    cur: Any = r
    for p in path:
        if cur is None:
            return None
        try:
            cur = cur[p]
        except (KeyError, IndexError, TypeError):
            return None
    return cur


def _backend(r: dict[str, Any] | None, phase: str) -> str:
    """'LIST / GET / HEAD' of a phase ('listing' or 'epochs', both epochs summed)."""
    if r is None:
        return "—"
    parts: list[dict[str, float]] = []
    if phase == "listing":
        parts = [_get(r, "listing", "gateway") or {}]
    else:
        parts = [e.get("gateway") or {} for e in r.get("epochs", [])]
    if not any(parts):
        return "—"
    tot = {k: sum(p.get(f"backend_{k}", 0.0) for p in parts) for k in ("list", "get", "head")}
    return " / ".join(_num(tot[k]) for k in ("list", "get", "head"))


def _relists(r: dict[str, Any] | None) -> str:
    if r is None or not r.get("epochs") or "gateway" not in r["epochs"][0]:
        return "—"
    gw = [e["gateway"] for e in r["epochs"]]
    relists = sum(g.get("listings_relist", 0.0) for g in gw)
    lists = sum(g.get("backend_list", 0.0) for g in gw)
    per = f", {lists / relists:.2f} LIST per re-list" if relists else ""
    return f"{relists:,.0f}{per}"


def _gc(r: dict[str, Any] | None) -> str:
    """Full collections in the epochs, and the longest collection of the run (ms)."""
    if r is None:
        return "—"
    gw = [e["gateway"] for e in r["epochs"]]
    full = sum(g.get("gc_full_collections", 0.0) for g in gw)
    longest = max((g.get("gc_longest_pause_seconds", 0.0) for g in gw), default=0.0)
    return f"{full:,.0f}, {longest * 1e3:.0f} ms"


def scale_table(
    results: dict[str, dict[str, Any] | None], tree: Tree, small: Tree, subset: int
) -> str:
    """The default gateway on the small tree against the same on the big one."""
    a, b = results.get("nfsgw-default-small"), results.get("nfsgw-default")
    rows: list[tuple[str, Any, int]] = [
        ("list the tree (READDIRPLUS), us per entry", ("listing", "us_per_entry"), 1),
        ("RSS per entry after the listing, B", ("rss_per_entry_bytes",), 0),
        ("epoch 1: files/s", ("epochs", 0, "files_per_s"), 0),
        ("epoch 2 (warm): files/s", ("epochs", 1, "files_per_s"), 0),
        ("epoch 2: p50 ms", ("epochs", 1, "p50_ms"), 2),
        ("epoch 2: p99 ms", ("epochs", 1, "p99_ms"), 2),
        ("epoch 2: max ms", ("epochs", 1, "max_ms"), 0),
    ]
    for r, t in ((a, small), (b, tree)):
        if r is not None:
            r["listing"]["us_per_entry"] = r["listing"]["seconds"] / max(1, t.entries) * 1e6
    small_files = _get(a, "epochs", 0, "files")
    head = (
        f"| nfsgw, defaults | {small.folders:,} x {small.per_folder:,} tree "
        f"({_num(small_files)} files an epoch) | {tree.folders:,} x {tree.per_folder:,} tree "
        f"({subset:,} files an epoch) | big / small |"
    )
    out = [head, "|---|---:|---:|---:|"]
    for label, path, digits in rows:
        x, y = _get(a, *path), _get(b, *path)
        out.append(f"| {label} | {_num(x, digits)} | {_num(y, digits)} | {_ratio(y, x)} |")
    return "\n".join(out)


def table(results: dict[str, dict[str, Any] | None], tree: Tree, subset: int) -> str:
    d, i, g = results.get("nfsgw-default"), results.get("nfsgw-immutable"), results.get("ganesha")
    rows: list[tuple[str, Any, int]] = [
        (
            f"list all {tree.entries:,} entries (READDIRPLUS), best run, s",
            ("listing", "seconds"),
            1,
        ),
        ("entries seen", ("listing", "entries"), 0),
        ("RSS after the listing, MiB", ("rss_after_listing_mib",), 0),
        ("RSS per entry, B", ("rss_per_entry_bytes",), 0),
        ("RSS growth in the listing per entry, B", ("rss_growth_per_entry_bytes",), 0),
        ("server CPU in the listing, s", ("listing", "server_cpu_s"), 1),
    ]
    for e in (0, 1):
        name = f"epoch {e + 1}"
        first = f"epoch 1 over {subset:,} files" if e == 0 else "epoch 2 (warm)"
        rows += [
            (f"{first}: files/s", ("epochs", e, "files_per_s"), 0),
            (f"{name}: p50 ms", ("epochs", e, "p50_ms"), 2),
            (f"{name}: p99 ms", ("epochs", e, "p99_ms"), 2),
            (f"{name}: max ms", ("epochs", e, "max_ms"), 0),
            (f"{name}: server CPU, s", ("epochs", e, "server_cpu_s"), 1),
        ]
    for r in (d, i, g):
        if r is not None:
            r["rss_after_listing_mib"] = r["rss_after_listing_bytes"] / 2**20
    head = (
        "| | nfsgw, defaults | nfsgw, `--immutable` | nfs-ganesha "
        "| default / ganesha | immutable / ganesha | default / immutable |"
    )
    out = [head, "|---|---:|---:|---:|---:|---:|---:|"]
    for label, path, digits in rows:
        a, b, c = (_get(r, *path) for r in (d, i, g))
        cells = [_num(x, digits) for x in (a, b, c)]
        if label != "entries seen":
            cells += [_ratio(a, c), _ratio(b, c), _ratio(a, b)]
        else:
            cells += ["", "", ""]
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    out.append(
        f"| backend LIST / GET / HEAD, listing | {_backend(d, 'listing')} "
        f"| {_backend(i, 'listing')} | — | | | |"
    )
    out.append(
        f"| backend LIST / GET / HEAD, both epochs | {_backend(d, 'epochs')} "
        f"| {_backend(i, 'epochs')} | — | | | |"
    )
    out.append(f"| re-lists during the epochs | {_relists(d)} | {_relists(i)} | — | | | |")
    gcs = [_gc(r) for r in (d, i)]
    out.append(
        f"| full GCs in the epochs, longest GC pause in the run | {gcs[0]} | {gcs[1]} | — | | | |"
    )
    idx = [_get(r, "listing", "gateway", "metadata_cache_bytes") for r in (d, i)]
    per = [None if b is None else b / tree.entries for b in idx]
    out.append(
        f"| index estimate (`nfsgw_metadata_cache_bytes`) per entry, B | {_num(per[0])} "
        f"| {_num(per[1])} | — | | | |"
    )
    return "\n".join(out)


# ------------------------------------------------------------------------------------ main


def _git(*argv: str) -> str:
    try:
        return subprocess.run(
            ["git", "-C", str(ROOT), *argv], capture_output=True, text=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def gateway_source(rev: str | None, work: Path) -> tuple[Path, str]:
    """Where ``nfsgw serve`` is run from, and which code that is: this checkout as it is on
    disk, or ``git archive REV`` unpacked in ``work`` (so that edits in progress in the
    checkout do not reach a run that started before them)."""
    if rev is None:
        dirty = len(_git("status", "--porcelain").splitlines())
        return ROOT, f"working tree at {_git('rev-parse', '--short', 'HEAD')} ({dirty} changed)"
    commit = _git("rev-parse", "--short", f"{rev}^{{commit}}")
    if not commit:
        raise SystemExit(f"--gateway-rev {rev}: not a commit")
    src = work / "src"
    src.mkdir()
    with subprocess.Popen(["git", "-C", str(ROOT), "archive", commit], stdout=subprocess.PIPE) as g:
        subprocess.run(["tar", "-x", "-C", str(src)], stdin=g.stdout, check=True, timeout=120)
    if g.returncode != 0:
        raise SystemExit(f"git archive {commit} failed")
    return src, f"commit {commit} (git archive)"


def _on_alarm(signum: int, frame: FrameType | None) -> None:
    raise TimeoutError("the run took longer than --timeout")


def run(args: argparse.Namespace, with_ganesha: bool, ganesha_note: str) -> int:
    t_start = time.monotonic()
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.alarm(int(args.timeout))
    cache = (args.tree or CACHE / f"{args.folders}x{args.per_folder}").resolve()
    out_dir: Path = (args.out or CACHE / "results").resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": " ".join(sys.argv),
        "machine": {
            "cpus": os.cpu_count(),
            "memory_bytes": psutil.virtual_memory().total,
            "python": platform.python_version(),
            "load_average_start": os.getloadavg(),
        },
        "client": (
            f"libnfs {WORKERS} threads, one connection each; per file open + pread + close "
            "(LOOKUP folder, LOOKUP file, ACCESS, READ)"
        ),
        "ganesha": ganesha_note,
        "results": {},
    }
    json_path = out_dir / "results.json"
    try:
        t0 = time.monotonic()
        tree = build_tree(cache, args.folders, args.per_folder, args.build_threads)
        report["tree"] = {
            "root": str(tree.root),
            "folders": tree.folders,
            "per_folder": tree.per_folder,
            "entries": tree.entries,
            "build_or_check_s": time.monotonic() - t0,
        }
        small: Tree | None = None
        if args.small_folders:
            small_cache = CACHE / f"{args.small_folders}x{args.per_folder}"
            small = build_tree(small_cache, args.small_folders, args.per_folder, args.build_threads)
            report["small_tree"] = {
                "root": str(small.root),
                "folders": small.folders,
                "per_folder": small.per_folder,
                "entries": small.entries,
            }
        warm = warm_os_caches(tree) + (warm_os_caches(small) if small is not None else 0.0)
        report["tree"]["os_cache_warm_s"] = warm
        log(f"tree: stat of every entry (OS caches warm for every server) in {warm:.1f} s")
        n = min(args.epoch_files, tree.files)
        subset = random.Random(args.seed).sample(range(tree.files), n)
        ttl = ["--attr-ttl", str(args.ttl)] if args.ttl is not None else []
        report["epoch_files"] = n
        report["attr_ttl_s"] = args.ttl if args.ttl is not None else "default (60)"
        with tempfile.TemporaryDirectory(prefix="nfsgw-scale-") as tmp:
            work = Path(tmp)
            src, report["gateway_code"] = gateway_source(args.gateway_rev, work)
            log(f"nfsgw: {report['gateway_code']}, run from {src}")
            env = dict(os.environ, PYTHONPATH=str(src))
            os.chdir(src)  # `python -m gateway.ops.cli` finds the package in its cwd first
            # (server, its tree, the files of each epoch)
            runs: list[tuple[Server, Tree, Sequence[int]]] = []
            if small is not None:
                small_server = Nfsgw("nfsgw-default-small", work, small, ttl, env)
                runs.append((small_server, small, range(small.files)))
            runs.append((Nfsgw("nfsgw-default", work, tree, ttl, env), tree, subset))
            if not args.no_immutable:
                immutable = Nfsgw("nfsgw-immutable", work, tree, ["--immutable"], env)
                runs.append((immutable, tree, subset))
            if with_ganesha:
                runs.append((Ganesha(work / "ganesha", tree), tree, subset))
            servers = [r[0] for r in runs]
            results: dict[str, dict[str, Any] | None] = {}
            try:
                for s, s_tree, s_subset in runs:
                    try:
                        lruns = args.listing_runs if s_tree is tree else 1
                        results[s.name] = measure(s, s_tree, s_subset, args.seed, lruns)
                    except RuntimeError as e:
                        if s.name != "ganesha":
                            raise
                        log(f"ganesha could not be measured, continuing without it: {e}")
                        report["ganesha"] = f"failed: {e}"
                        results[s.name] = None
                    report["results"] = results
                    json_path.write_text(json.dumps(report, indent=2, default=str))
            finally:
                os.chdir(ROOT)
                logs = out_dir / "logs"
                logs.mkdir(exist_ok=True)
                for s in servers:
                    p = s.log_path()
                    if p is not None and p.exists():
                        shutil.copy(p, logs / p.name)
        text = table(results, tree, n)
        if small is not None:
            text += "\n\n" + scale_table(results, tree, small, n)
        report["runtime_s"] = time.monotonic() - t_start
        report["machine"]["load_average_end"] = os.getloadavg()
        report["table"] = text
        json_path.write_text(json.dumps(report, indent=2, default=str))
        (out_dir / "table.md").write_text(text + "\n")
        print()
        print(text)
        print()
        if report["ganesha"]:
            print(f"nfs-ganesha: {report['ganesha']}")
        print(
            f"{tree.folders:,} x {tree.per_folder:,} tree, {n:,} files per epoch, attr TTL "
            f"{report['attr_ttl_s']}; run took {report['runtime_s']:.0f} s; "
            f"{json_path} and {out_dir / 'table.md'}"
        )
        return failed_checks(results)
    finally:
        signal.alarm(0)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--folders", type=int, default=1000)
    p.add_argument("--per-folder", type=int, default=1281)
    p.add_argument("--epoch-files", type=int, default=200_000, help="random subset per epoch")
    p.add_argument(
        "--listing-runs",
        type=int,
        default=3,
        help="first listings of the big tree per server, each after a fresh start (best shown)",
    )
    p.add_argument(
        "--ttl", type=float, default=None, help="nfsgw --attr-ttl for the default gateway"
    )
    p.add_argument("--tree", type=Path, default=None, help=f"tree cache (default {CACHE}/FxP)")
    p.add_argument("--out", type=Path, default=None, help=f"results (default {CACHE}/results)")
    p.add_argument("--no-ganesha", action="store_true", help="measure nfsgw only")
    p.add_argument("--no-immutable", action="store_true", help="skip nfsgw --immutable")
    p.add_argument(
        "--small-folders",
        type=int,
        default=8,
        help="also the default gateway on a tree of this many folders (0: skip)",
    )
    p.add_argument(
        "--gateway-rev",
        default=None,
        help="serve with this commit's code (git archive) instead of the checkout as it is",
    )
    p.add_argument("--build-threads", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=4 * 3600.0, help="whole run, seconds")
    p.add_argument("--inside-namespace", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def failed_checks(results: dict[str, dict[str, Any] | None]) -> int:
    """1 (and the servers named) when a listing was incomplete or an epoch saw a wrong entry
    or byte, else 0: the run's exit status."""
    bad = [
        k
        for k, r in results.items()
        if r is not None and (not r["listing"]["complete"] or any(e["errors"] for e in r["epochs"]))
    ]
    if bad:
        print(f"FAILED checks (entries or bytes) on: {', '.join(bad)}")
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    return netns.main_beside_ganesha(__file__, argv, args, run, args.timeout + 120, log)


if __name__ == "__main__":
    sys.exit(main())
