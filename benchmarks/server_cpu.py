"""Server CPU per call served from the gateway's caches -- GETATTR, LOOKUP (hit and miss),
ACCESS, a 16 KiB READ of a cached file and a READ of a whole cached 128 KiB file -- for the
fast path's compiled mechanics, for its Python twin (``NFSGW_PURE_PYTHON=1``) and for the
ordinary path alone (``--no-fast-path``), in one run.

    .venv/bin/python benchmarks/server_cpu.py [--calls 50000] [--inflight 32] [--pin]
        [--modes native,python,no-fast-path] [--no-uvloop] [--out FILE]

Per mode: ``nfsgw serve --workers 1`` in a subprocess over a file:// export (1,000 files of
100 B, one of 110,000 B, one of 128 KiB, in one folder), the caches warmed (every name and
offset used below, once), then ``--calls`` calls of each kind over one TCP connection with
``--inflight`` outstanding; the server's CPU (``/proc/PID/stat`` utime + stime, its process
tree) before and after each kind: µs of server CPU per call, and calls/s. The client runs in
this process (its CPU is not counted) and checks every reply (status, READ length). From the
gateway's ``/metrics``: the share of each kind's calls the fast path answered. ``--pin``: the
server is started under ``taskset -c 1`` and this process (the client) keeps to CPU 0.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/: _common, siblings
from _common import ROOT, free_port
from workers import cpu_seconds

from gateway import fastwire
from gateway.rpcclient import RpcClient
from loadgen.gwmetrics import parse_metrics
from nfsproto import nfs3
from nfsproto.nfs3 import Nfs3Proc, NfsStat3

MODES = ("native", "python", "no-fast-path")
SMALL, MID, WHOLE = 100, 110_000, 128 * 1024
FAST = "nfsgw_fast_path_calls_total{outcome=answered}"
SLOW = "nfsgw_fast_path_calls_total{outcome=declined}"


@dataclass(slots=True)
class Result:
    mode: str
    call: str
    calls: int
    server_us_per_call: float
    calls_per_s: float
    fast_share: float | None  # of the calls the fast path saw, the share it answered
    wrong: int  # replies that were not what the call must get


def fast_counters(admin: int) -> tuple[float, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{admin}/metrics", timeout=30) as r:
        m = parse_metrics(r.read().decode())
    return m.get(FAST, 0.0), m.get(SLOW, 0.0)


async def connect(port: int, srv: subprocess.Popen[bytes], timeout_s: float) -> RpcClient:
    deadline = time.monotonic() + timeout_s
    while True:
        if srv.poll() is not None:
            raise RuntimeError(f"nfsgw exited with {srv.returncode}")
        try:
            return await RpcClient.connect("127.0.0.1", port)
        except OSError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


async def bench(
    mode: str,
    port: int,
    admin: int,
    srv: subprocess.Popen[bytes],
    calls: int,
    inflight: int,
) -> list[Result]:
    c = await connect(port, srv, 60.0)
    root = (await c.mnt(b"/data")).fhandle
    nfs = c.nfs  # any NFSv3 procedure of the call table (nfsproto.client.NFS3)

    d = await nfs(Nfs3Proc.LOOKUP, nfs3.Lookup3Args(nfs3.Diropargs3(root, b"class0")))
    dh = d.object
    fh = (await nfs(Nfs3Proc.LOOKUP, nfs3.Lookup3Args(nfs3.Diropargs3(dh, b"f00001.jpg")))).object
    wh = (await nfs(Nfs3Proc.LOOKUP, nfs3.Lookup3Args(nfs3.Diropargs3(dh, b"w128k.bin")))).object

    def ok(r: Any) -> bool:
        return bool(r.status == NfsStat3.NFS3_OK)

    def read_len(offset: int, count: int, size: int) -> Callable[[Any], bool]:
        want = max(0, min(count, size - offset))
        return lambda r: ok(r) and r.count == want and len(r.data) == want

    # name -> (the i-th call, whether its reply is right)
    kinds: dict[str, Callable[[int], tuple[Awaitable[Any], Callable[[Any], bool]]]] = {
        "GETATTR": lambda i: (nfs(Nfs3Proc.GETATTR, nfs3.Getattr3Args(fh)), ok),
        "LOOKUP (hit)": lambda i: (
            nfs(
                Nfs3Proc.LOOKUP,
                nfs3.Lookup3Args(nfs3.Diropargs3(dh, b"f%05d.jpg" % (i % 1000))),
            ),
            ok,
        ),
        "LOOKUP (miss)": lambda i: (
            nfs(Nfs3Proc.LOOKUP, nfs3.Lookup3Args(nfs3.Diropargs3(dh, b"missing%d" % i))),
            lambda r: r.status == NfsStat3.NFS3ERR_NOENT,
        ),
        "ACCESS": lambda i: (nfs(Nfs3Proc.ACCESS, nfs3.Access3Args(fh, 0x1F)), ok),
        "READ 16 KiB": lambda i: (
            nfs(Nfs3Proc.READ, nfs3.Read3Args(fh, (i % 7) * 16384, 16384)),
            read_len((i % 7) * 16384, 16384, MID),
        ),
        "READ whole 128 KiB file": lambda i: (
            nfs(Nfs3Proc.READ, nfs3.Read3Args(wh, 0, WHOLE)),
            lambda r: read_len(0, WHOLE, WHOLE)(r) and bool(r.eof),
        ),
    }
    out = []
    for name, make in kinds.items():
        wrong = [0]

        async def one(
            i: int,
            sem: asyncio.Semaphore,
            make: Callable[[int], tuple[Awaitable[Any], Callable[[Any], bool]]] = make,
            wrong: list[int] = wrong,
        ) -> None:
            async with sem:
                aw, check = make(i)
                if not check(await aw):
                    wrong[0] += 1

        warm = asyncio.Semaphore(inflight)
        await asyncio.gather(*(one(i, warm) for i in range(1000)))  # every name and offset
        wrong[0] = 0
        f0 = fast_counters(admin)
        sem = asyncio.Semaphore(inflight)
        cpu0 = cpu_seconds(srv.pid)
        t0 = time.perf_counter()
        # Names of misses not used in the warm-up: each miss is a new name, as in a real
        # workload probing for files that are not there.
        base = 1000 if name == "LOOKUP (miss)" else 0
        await asyncio.gather(*(one(base + i, sem) for i in range(calls)))
        wall = time.perf_counter() - t0
        cpu = cpu_seconds(srv.pid) - cpu0
        f1 = fast_counters(admin)
        seen = (f1[0] - f0[0]) + (f1[1] - f0[1])
        r = Result(
            mode=mode,
            call=name,
            calls=calls,
            server_us_per_call=round(cpu / calls * 1e6, 2),
            calls_per_s=round(calls / wall, 0),
            fast_share=round((f1[0] - f0[0]) / seen, 4) if seen else None,
            wrong=wrong[0],
        )
        share = "-" if r.fast_share is None else f"{r.fast_share:.1%}"
        print(
            f"  {mode:<13} {name:<24} {r.server_us_per_call:8.1f} µs/call "
            f"{r.calls_per_s:9,.0f} calls/s  fast path {share}  wrong {r.wrong}",
            flush=True,
        )
        out.append(r)
    await c.close()
    return out


def serve(
    mode: str, tmp: Path, pin: bool, no_uvloop: bool
) -> tuple[subprocess.Popen[bytes], int, int, Path]:
    port, admin = free_port(), free_port()
    cmd = [
        str(ROOT / ".venv/bin/nfsgw"),
        "serve",
        "--port",
        str(port),
        "--admin-listen",
        f"127.0.0.1:{admin}",
        "--workers",
        "1",
        "--export",
        f"/data=file://{tmp}/src",
        "--state-dir",
        f"{tmp}/state-{mode}",
        "--read-only",
        "--insecure",  # its client binds no reserved port
        "--log-level",
        "warning",
    ]
    if no_uvloop:
        cmd.append("--no-uvloop")
    if mode == "no-fast-path":
        cmd.append("--no-fast-path")
    if pin:
        cmd = ["taskset", "-c", "1", *cmd]
    env = {k: v for k, v in os.environ.items() if k != "NFSGW_PURE_PYTHON"}
    if mode == "python":
        env["NFSGW_PURE_PYTHON"] = "1"
    log = tmp / f"nfsgw-{mode}.log"
    with log.open("wb") as f:
        srv = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=f, stderr=f, env=env)
    return srv, port, admin, log


def table(results: list[Result], modes: list[str]) -> str:
    head = "| call | " + " | ".join(f"{m} µs/call | {m} calls/s" for m in modes) + " |"
    rows = [head, "|" + "|".join(" --- " for _ in range(head.count("|") - 1)) + "|"]
    for call in dict.fromkeys(r.call for r in results):
        cells = []
        for m in modes:
            r = next((r for r in results if r.call == call and r.mode == m), None)
            if r is None:
                cells += ["-", "-"]
                continue
            share = "" if r.fast_share is None else f" ({r.fast_share:.0%} fast)"
            bad = f" **{r.wrong} wrong**" if r.wrong else ""
            cells += [f"{r.server_us_per_call:.1f}{share}{bad}", f"{r.calls_per_s:,.0f}"]
        rows.append(f"| {call} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--calls", type=int, default=50000, help="per kind and mode")
    ap.add_argument("--inflight", type=int, default=32)
    ap.add_argument("--pin", action="store_true", help="server on CPU 1, client on CPU 0")
    ap.add_argument("--modes", default=",".join(MODES), help=f"of {', '.join(MODES)}")
    ap.add_argument("--no-uvloop", action="store_true")
    ap.add_argument("--out", type=Path, default=None, help="also write the results as JSON")
    a = ap.parse_args()
    modes = list(dict.fromkeys(m.strip() for m in a.modes.split(",") if m.strip()))
    if any(m not in MODES for m in modes):
        ap.error(f"--modes: choose from {', '.join(MODES)}")
    if a.pin:
        os.sched_setaffinity(0, {0})
    native = fastwire.compiled() is not None
    print(
        f"nfsgw on Python {sys.version.split()[0]}, compiled fast path "
        f"{'available' if native else 'NOT built: native = the Python twin'}"
        + (", pinned: server CPU 1, client CPU 0" if a.pin else ", unpinned"),
        flush=True,
    )
    results: list[Result] = []
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        src = tmp / "src" / "class0"
        src.mkdir(parents=True)
        for i in range(1000):
            (src / f"f{i:05d}.jpg").write_bytes(os.urandom(MID if i == 1 else SMALL))
        (src / "w128k.bin").write_bytes(os.urandom(WHOLE))
        for mode in modes:
            srv, port, admin, log = serve(mode, tmp, a.pin, a.no_uvloop)
            try:
                results += asyncio.run(bench(mode, port, admin, srv, a.calls, a.inflight))
            except Exception:
                print(f"!! {mode}: server log tail:\n{log.read_text(errors='replace')[-3000:]}")
                raise
            finally:
                srv.terminate()
                try:
                    srv.wait(30)
                except subprocess.TimeoutExpired:
                    srv.kill()
                    srv.wait(30)
    print()
    print(table(results, modes))
    if a.out is not None:
        a.out.write_text(
            json.dumps(
                {
                    "args": {k: str(v) for k, v in vars(a).items()},
                    "python": sys.version,
                    "native_built": native,
                    "results": [asdict(r) for r in results],
                },
                indent=2,
            )
        )
    return 1 if any(r.wrong for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
