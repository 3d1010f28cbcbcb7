"""The fast path against nfs-ganesha, one core each: a warm epoch served by nfs-ganesha
(FSAL_VFS), by ``nfsgw --workers 1`` with the fast path's compiled mechanics, the same with
``NFSGW_PURE_PYTHON=1`` (the Python twin), the same with ``--no-fast-path`` (the ordinary path
only, as before the fast path) and, unpinned, by nfsgw with its default workers (one per CPU),
all from the same local tree, in one run.

    .venv/bin/python benchmarks/fastpath_pinned.py [--files 10000] [--size 110000]
        [--clients 4] [--epochs 3] [--rounds 2] [--pin] [--servers LIST] [--no-auto]
        [--tree DIR] [--out FILE] [--epoch-timeout 300] [--deadline 3600]

The tree, the nfsgw exports and the client are ``benchmarks/workers.py``'s: ``--files`` files
of about ``--size`` bytes in 100 folders (built once, reused), exported read-only; the C
reader (``benchmarks/nfsread.c``) with ``--clients`` connections reads every file whole
(LOOKUP, LOOKUP, ACCESS, READ until EOF) and checks every byte against the local tree.

``--pin``: every server is started with CPU 1 as its only CPU (this process's thread narrows
its own affinity around the start, so the server's process tree inherits it from its first
instruction, as under ``taskset -c 1``; ``taskset -a -p -c 1`` is then applied to every
thread of every process of the tree, and the affinity every thread has is checked again after
the last epoch), and the reader is started with CPU 0 only. nfsgw's default workers would
then be one: that row is left out when pinned.

``--rounds N``: every server is started N times, in the order of ``--servers`` in odd rounds
and reversed in even ones (ABCD, DCBA, ...), so a drift of the shared machine does not favour
one server. Per start: ``--epochs`` epochs, each over every file in a fresh random order (the
same orders for every server); epoch 1 warms the caches, the later ones are measured.

Reported per server (over all rounds): epoch 1's files/s; the best measured epoch's files/s
(the warm figure: a shared machine is noisy, the best is the stable statistic) and their
median; the server's CPU (``/proc/PID/stat`` utime + stime of its whole process tree) and the
reader's, per file, over all measured epochs; p99 and the maximum per-file latency (the worst
measured epoch's); the ratios to ganesha; for nfsgw the share of NFS calls the fast path
answered (its ``/metrics``); how much of a CPU everything else on the machine used during
the measured epochs (``/proc/stat`` busy time less the server's and the reader's: on a
shared machine, the noise to read the rest against; tick accounting makes a few percent
either side of 0 mean nothing). A table on stdout (Markdown) and everything in ``--out``
(JSON), with the Python that ran nfsgw (version, PGO or not), which fast-path mechanics each
nfsgw used (probed with that nfsgw's environment), and the commit (and uncommitted changes
under ``gateway/``) at the start and at the end of the run.

nfs-ganesha runs in private namespaces with its own rpcbind (``benchmarks/netns.py``; this
script re-executes itself inside them, as ``workers.py`` does). Without root it is skipped.

Must not: import the gateway (nfsgw runs through ``loadgen.gwprocess``), leave a process
running (servers and readers are stopped in ``finally``; an epoch past ``--epoch-timeout``
kills its reader, the whole run past ``--deadline`` stops), or wait on a stalled server
forever.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import signal
import statistics
import subprocess
import sys
import sysconfig
import threading
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/: _common, siblings
import netns
import workers
from _common import ROOT
from nfsreader import NfsReader
from scale_index import Ganesha, log
from workers import CACHE as TREES
from workers import Server, Tree, build_tree, cpu_seconds

CACHE = Path("/var/tmp/nfsgw-fastpath")
SERVER_CPU = 1  # --pin: the server's core
CLIENT_CPU = 0  # --pin: the reader's core
KINDS = ("ganesha", "native", "python", "no-fast-path", "auto")
FAST = "nfsgw_fast_path_calls_total{outcome=answered}"
SLOW = "nfsgw_fast_path_calls_total{outcome=declined}"
WORKER = "nfsgw_worker_rpc_requests_total{"


# ------------------------------------------------------------------------------ the servers


class Nfsgw(workers.Nfsgw):
    """``nfsgw serve`` exporting the tree read-only, in one of the kinds above."""

    def __init__(self, work: Path, tree: Tree, kind: str) -> None:
        self.kind = kind
        # "auto": one worker per CPU under a supervisor (2 tells GatewayProcess to wait for
        # the supervisor's start line; the file's "auto" wins).
        env = {k: v for k, v in os.environ.items() if k != "NFSGW_PURE_PYTHON"}
        if kind == "python":
            env["NFSGW_PURE_PYTHON"] = "1"
        self.env = env
        super().__init__(
            work,
            tree,
            2 if kind == "auto" else 1,
            False,
            name="nfsgw auto workers" if kind == "auto" else f"nfsgw w1 {kind}",
            sections={"server": {"workers": "auto"}} if kind == "auto" else {},
            flags=["--no-fast-path"] if kind == "no-fast-path" else [],
            env=env,
        )

    def mechanics(self) -> str:
        """The fast path's mechanics this gateway's environment gets: native or python."""
        if self.kind == "no-fast-path":
            return "off"
        probe = (
            "from gateway import fastwire; "
            "print('native' if fastwire.compiled() is not None else 'python')"
        )
        r = subprocess.run(
            [sys.executable, "-c", probe],
            env=self.env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        return r.stdout.strip() or f"probe failed: {r.stderr.strip()[-200:]}"

    def counters(self) -> dict[str, float]:
        """The fast path's answered and declined calls so far, and with workers the calls
        each worker served (``nfsgw_worker_rpc_requests_total``); {} without metrics."""
        try:
            m = self.gw.metrics()
        except OSError:
            return {}
        keep = (FAST, SLOW, WORKER)
        return {k: v for k, v in m.items() if k.startswith(keep)}

    def tail(self) -> str:
        return self.gw.log_tail(40)


def make_server(kind: str, work: Path, tree: Tree) -> Server:
    if kind == "ganesha":
        return Ganesha(work / "ganesha", tree)  # type: ignore[arg-type]
    return Nfsgw(work, tree, kind)


def server_tail(s: Server) -> str:
    if isinstance(s, Nfsgw):
        return s.tail()
    tail = getattr(s, "tail", None)
    return str(tail(40)) if callable(tail) else "(no log)"


# ------------------------------------------------------------------------------ pinning


@contextlib.contextmanager
def on_cpus(cpus: set[int] | None) -> Iterator[None]:
    """This thread on ``cpus`` only while inside (what it starts inherits that affinity)."""
    if cpus is None:
        yield
        return
    old = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, old)


def tree_pids(pid: int) -> list[int]:
    """``pid`` and its descendants (from /proc: parent links)."""
    parents: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        parents.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += parents.get(p, [])
    return out


def pin_tree(pid: int, cpu: int) -> None:
    """``taskset -a -p -c CPU`` on every process of ``pid``'s tree (all their threads)."""
    for p in tree_pids(pid):
        subprocess.run(
            ["taskset", "-a", "-p", "-c", str(cpu), str(p)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=30,
            check=False,
        )


def affinity_seen(pid: int) -> list[str]:
    """The distinct ``Cpus_allowed_list`` of every thread of ``pid``'s tree."""
    seen: set[str] = set()
    for p in tree_pids(pid):
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tasks:
            try:
                with open(f"/proc/{p}/task/{t}/status") as f:
                    for line in f:
                        if line.startswith("Cpus_allowed_list:"):
                            seen.add(line.split(":", 1)[1].strip())
            except OSError:
                pass
    return sorted(seen)


# ------------------------------------------------------------------------------ measuring


@dataclass(slots=True)
class Epoch:
    files: int
    seconds: float
    files_per_s: float
    mb_per_s: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    errors: int
    server_cpu_s: float
    client_cpu_s: float
    others_cpu_s: float  # the machine's busy CPU time less the server's and the reader's
    fast_answered: float = 0.0
    fast_declined: float = 0.0
    worker_calls: list[float] = field(default_factory=list)  # per worker (auto), this epoch


@dataclass(slots=True)
class Start:
    """One start of one server: its epochs, or what went wrong."""

    round: int
    epochs: list[Epoch] = field(default_factory=list)
    affinity: list[str] = field(default_factory=list)
    failure: str = ""
    log_tail: str = ""


def machine_busy_s() -> float:
    """CPU seconds every CPU of the machine has been busy (``/proc/stat``: all but idle and
    iowait), to tell how much of the machine others used during an epoch."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (sum(v[:8]) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


def git_state() -> dict[str, str]:
    def git(*a: str) -> str:
        r = subprocess.run(
            ["git", "-C", str(ROOT), *a], capture_output=True, text=True, timeout=30, check=False
        )
        return r.stdout.strip()

    return {"head": git("rev-parse", "HEAD"), "dirty": git("status", "--porcelain", "gateway")}


class Deadline(Exception):
    pass


def _deadline(signum: int, frame: FrameType | None) -> None:
    raise Deadline("the run went past --deadline")


def timed_epoch(reader: NfsReader, paths: Sequence[str], timeout_s: float) -> dict[str, Any]:
    """``reader.epoch``, the reader killed past ``timeout_s`` (a stalled server)."""
    timer = threading.Timer(timeout_s, reader.proc.kill)
    timer.start()
    try:
        return reader.epoch(paths)
    except RuntimeError as e:
        if not timer.is_alive():
            raise RuntimeError(f"epoch stalled: not done after {timeout_s:.0f} s") from e
        raise
    finally:
        timer.cancel()


def orders(tree: Tree, epochs: int, seed: int) -> list[list[str]]:
    """Every file in a fresh random order per epoch (the same for every server)."""
    out = []
    for e in range(epochs):
        order = list(range(tree.files))
        random.Random(seed + e).shuffle(order)
        out.append(["/" + tree.rel(k) for k in order])
    return out


def measure(
    s: Server, tree: Tree, args: argparse.Namespace, paths: list[list[str]], rnd: int
) -> Start:
    out = Start(rnd)
    server_cpus = {SERVER_CPU} if args.pin else None
    client_cpus = {CLIENT_CPU} if args.pin else None
    try:
        with on_cpus(server_cpus):
            s.start()
        if args.pin:
            pin_tree(s.pid, SERVER_CPU)
        with on_cpus(client_cpus):
            reader = NfsReader(s.url, tree.root, args.clients)
        try:
            reader.open_all()
            for e, order in enumerate(paths):
                m0 = s.counters() if isinstance(s, Nfsgw) else {}
                cpu0, ccpu0, busy0 = cpu_seconds(s.pid), reader.cpu_seconds(), machine_busy_s()
                r = timed_epoch(reader, order, args.epoch_timeout)
                cpu1, ccpu1, busy1 = cpu_seconds(s.pid), reader.cpu_seconds(), machine_busy_s()
                m1 = s.counters() if isinstance(s, Nfsgw) else {}
                d = {k: v - m0.get(k, 0.0) for k, v in m1.items()}
                ep = Epoch(
                    files=r["files"],
                    seconds=round(r["seconds"], 3),
                    files_per_s=round(r["files"] / r["seconds"], 1),
                    mb_per_s=round(r["bytes"] / r["seconds"] / 1e6, 1),
                    p50_ms=round(r["p50_ms"], 3),
                    p99_ms=round(r["p99_ms"], 3),
                    max_ms=round(r["max_ms"], 3),
                    errors=r["errors"],
                    server_cpu_s=round(cpu1 - cpu0, 3),
                    client_cpu_s=round(ccpu1 - ccpu0, 3),
                    others_cpu_s=round((busy1 - busy0) - (cpu1 - cpu0) - (ccpu1 - ccpu0), 3),
                    fast_answered=d.get(FAST, 0.0),
                    fast_declined=d.get(SLOW, 0.0),
                    worker_calls=[d[k] for k in sorted(d) if k.startswith(WORKER)],
                )
                out.epochs.append(ep)
                fast = ep.fast_answered + ep.fast_declined
                share = f", fast path {ep.fast_answered / fast:.1%}" if fast else ""
                if len(ep.worker_calls) > 1:
                    share += f", calls per worker {[int(c) for c in ep.worker_calls]}"
                log(
                    f"  {s.name} round {rnd} epoch {e + 1}: {ep.files_per_s:,.0f} files/s, "
                    f"p99 {ep.p99_ms} ms, max {ep.max_ms} ms, errors {ep.errors}, server "
                    f"{ep.server_cpu_s / ep.files * 1e6:.0f} us/file, client "
                    f"{ep.client_cpu_s / ep.files * 1e6:.0f} us/file, others "
                    f"{ep.others_cpu_s / ep.seconds:.0%} of a CPU{share}"
                )
                if ep.errors:
                    out.failure = f"epoch {e + 1}: the reader saw {ep.errors} wrong files"
                    out.log_tail = server_tail(s)
                    log(f"  !! {out.failure}; server log tail:\n{out.log_tail}")
            out.affinity = affinity_seen(s.pid)
        finally:
            reader.close()
    except (RuntimeError, OSError) as e:
        out.failure = f"{type(e).__name__}: {e}"
        out.log_tail = server_tail(s)
        log(f"  !! {s.name} round {rnd}: {out.failure}; server log tail:\n{out.log_tail}")
    finally:
        s.stop()
    return out


# ------------------------------------------------------------------------------ the report


def summary(starts: list[Start]) -> dict[str, Any]:
    cold = [st.epochs[0] for st in starts if st.epochs]
    warm = [e for st in starts for e in st.epochs[1:]] or cold
    if not warm:
        return {}
    files = sum(e.files for e in warm)
    fast = sum(e.fast_answered for e in warm)
    calls = fast + sum(e.fast_declined for e in warm)
    return {
        "cold_files_per_s": max(e.files_per_s for e in cold),
        "warm_files_per_s": max(e.files_per_s for e in warm),
        "warm_median_files_per_s": statistics.median(e.files_per_s for e in warm),
        "server_us_per_file": round(sum(e.server_cpu_s for e in warm) / files * 1e6, 1),
        "client_us_per_file": round(sum(e.client_cpu_s for e in warm) / files * 1e6, 1),
        "p99_ms": max(e.p99_ms for e in warm),
        "max_ms": max(e.max_ms for e in warm),
        "cold_max_ms": max(e.max_ms for e in cold),
        "errors": sum(e.errors for st in starts for e in st.epochs),
        "failures": [st.failure for st in starts if st.failure],
        "fast_path_share": round(fast / calls, 4) if calls else None,
        "others_cpu_share": round(
            sum(e.others_cpu_s for e in warm) / sum(e.seconds for e in warm), 3
        ),
        "measured_epochs": len(warm),
    }


def table(names: dict[str, str], mech: dict[str, str], sums: dict[str, dict[str, Any]]) -> str:
    g = sums.get("ganesha", {})
    head = (
        "| server | mechanics | epoch 1 files/s | warm files/s (best) | warm median | "
        "server µs/file | client µs/file | p99 ms | max ms | files/s vs ganesha | "
        "CPU vs ganesha | fast path share | others' CPU | errors |"
    )
    rows = [head, "|" + "|".join(" --- " for _ in range(head.count("|") - 1)) + "|"]
    for kind, s in sums.items():
        if not s:
            rows.append(f"| {names[kind]} | {mech[kind]} | failed |" + " |" * 11)
            continue
        fr = cr = "-"
        if g and kind != "ganesha":
            fr = f"{s['warm_files_per_s'] / g['warm_files_per_s']:.2f}x"
            cr = f"{s['server_us_per_file'] / g['server_us_per_file']:.2f}x"
        share = "-" if s["fast_path_share"] is None else f"{s['fast_path_share']:.1%}"
        rows.append(
            f"| {names[kind]} | {mech[kind]} | {s['cold_files_per_s']:,.0f} | "
            f"{s['warm_files_per_s']:,.0f} | {s['warm_median_files_per_s']:,.0f} | "
            f"{s['server_us_per_file']:.0f} | {s['client_us_per_file']:.0f} | "
            f"{s['p99_ms']:.2f} | {s['max_ms']:.2f} | {fr} | {cr} | {share} | "
            f"{s['others_cpu_share']:.0%} | "
            f"{s['errors']}{' + ' + str(len(s['failures'])) + ' failed' if s['failures'] else ''} |"
        )
    return "\n".join(rows)


def interpreter() -> dict[str, Any]:
    """The Python that runs nfsgw (``GatewayProcess`` starts it with this executable)."""
    config_args = str(sysconfig.get_config_var("CONFIG_ARGS") or "")
    return {
        "executable": sys.executable,
        "version": sys.version,
        "pgo": "--enable-optimizations" in config_args,
        "lto": "--with-lto" in config_args,
        "config_args": config_args,
    }


def run(args: argparse.Namespace, ganesha: bool, note: str) -> int:
    kinds = [k.strip() for k in args.servers.split(",") if k.strip()]
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        raise SystemExit(f"unknown --servers {bad}: choose from {', '.join(KINDS)}")
    if not ganesha:
        kinds = [k for k in kinds if k != "ganesha"]
    if "auto" in kinds and (args.pin or args.no_auto):
        kinds.remove("auto")
        log(
            "nfsgw auto workers: left out ("
            + ("--pin: one CPU, one worker" if args.pin else "--no-auto")
            + ")"
        )
    if "auto" in kinds and len(os.sched_getaffinity(0)) < 2:
        kinds.remove("auto")
        log("nfsgw auto workers: left out (one CPU: one worker)")
    if args.pin and len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("--pin needs CPUs 0 and 1")
    signal.signal(signal.SIGALRM, _deadline)
    signal.alarm(int(args.deadline))
    tree = build_tree(args.tree or TREES / f"{args.files}x{args.size}", args.files, args.size)
    work = CACHE / "work"
    if work.exists():
        subprocess.run(["rm", "-rf", str(work)], check=True, timeout=120)
    work.mkdir(parents=True)
    git0 = git_state()
    servers = {k: make_server(k, work, tree) for k in kinds}
    mech = {k: (s.mechanics() if isinstance(s, Nfsgw) else "C") for k, s in servers.items()}
    names = {k: s.name for k, s in servers.items()}
    for k in kinds:
        log(f"{names[k]}: fast path mechanics {mech[k]}")
    paths = orders(tree, args.epochs, args.seed)
    starts: dict[str, list[Start]] = {k: [] for k in kinds}
    try:
        for rnd in range(1, args.rounds + 1):
            seq = kinds if rnd % 2 else kinds[::-1]
            log(f"round {rnd}: {' -> '.join(names[k] for k in seq)}")
            for k in seq:
                starts[k].append(measure(servers[k], tree, args, paths, rnd))
    except Deadline as e:
        log(f"!! {e}")
    finally:
        signal.alarm(0)
    sums = {k: summary(v) for k, v in starts.items()}
    py = interpreter()
    print()
    print(
        f"{args.files:,} files of ~{args.size:,} B, {args.clients} reader connections, "
        f"{args.rounds} round(s) x {args.epochs} epochs, "
        + ("pinned: server CPU 1, reader CPU 0" if args.pin else "unpinned")
        + f"; nfsgw on Python {py['version'].split()[0]} "
        + ("(PGO)" if py["pgo"] else "(not a PGO build)")
    )
    dirty = " + uncommitted changes" if git0["dirty"] else ""
    print(f"gateway at {git0['head'][:12]}{dirty}")
    if git_state() != git0:
        print("!! the gateway's code changed during the run (see git_after in the JSON)")
    print()
    print(table(names, mech, sums))
    g, n = sums.get("ganesha"), sums.get("native")
    if g and n:
        print()
        fr = n["warm_files_per_s"] / g["warm_files_per_s"]
        cr = n["server_us_per_file"] / g["server_us_per_file"]
        print(f"w1 native / ganesha files/s = {fr:.2f} (target >= 1.0)")
        if args.pin:
            print(f"w1 native / ganesha CPU per file = {cr:.2f} (target <= 0.8)")
            print(f"w1 native max per-file latency = {n['max_ms']:.1f} ms (target <= 20)")
    elif note:
        print(f"nfs-ganesha {note}")
    out = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "host": {
            "cpus": os.cpu_count(),
            "kernel": platform.release(),
            "machine": platform.machine(),
        },
        "interpreter": py,
        "git": git0,
        "git_after": git_state(),
        "mechanics": mech,
        "names": names,
        "summary": sums,
        "starts": {k: [asdict(st) for st in v] for k, v in starts.items()},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2))
    log(f"wrote {args.out}")
    failed = any(s.get("errors") or s.get("failures") or not s for s in sums.values())
    return 1 if failed else 0


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--files", type=int, default=10_000)
    p.add_argument("--size", type=int, default=110_000, help="average file size, bytes")
    p.add_argument("--clients", type=int, default=4, help="reader connections")
    p.add_argument("--epochs", type=int, default=3, help="per server start; epoch 1 warms")
    p.add_argument("--rounds", type=int, default=1, help="server starts, order alternating")
    p.add_argument("--pin", action="store_true", help="server on CPU 1, reader on CPU 0")
    p.add_argument(
        "--servers",
        default=",".join(KINDS),
        help=f"comma-separated, of {', '.join(KINDS)} (default: all)",
    )
    p.add_argument("--no-auto", action="store_true", help="leave out nfsgw's default workers")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--tree", type=Path, default=None)
    p.add_argument("--out", type=Path, default=CACHE / "results.json")
    p.add_argument("--no-ganesha", action="store_true")
    p.add_argument("--epoch-timeout", type=float, default=300.0, help="seconds; then stalled")
    p.add_argument("--deadline", type=float, default=3600.0, help="seconds for the whole run")
    p.add_argument("--inside-namespace", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.epochs < 2 or args.rounds < 1:
        p.error("--epochs must be >= 2 (epoch 1 warms) and --rounds >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    return netns.main_beside_ganesha(__file__, argv, args, run, args.deadline + 120.0, log)


if __name__ == "__main__":
    sys.exit(main())
