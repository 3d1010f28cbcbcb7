"""Server CPU per call served from the gateway's caches: GETATTR, LOOKUP (hit and miss),
ACCESS and a 16 KiB READ of a cached small file.

    .venv/bin/python benchmarks/server_cpu.py [--calls 20000] [--inflight 32] [--no-uvloop]

Starts `nfsgw serve` in a subprocess over a file:// export, warms the caches, then sends
``--calls`` calls of each kind over one TCP connection with ``--inflight`` outstanding, and
reads the server process's CPU time (user + system, psutil) before and after: µs of server CPU
per call, and calls/s. The client runs in this process (its CPU is not counted).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gateway.rpcclient import RpcClient  # noqa: E402
from nfsproto import mount3, nfs3  # noqa: E402
from nfsproto.nfs3 import Nfs3Proc  # noqa: E402

P = nfs3.PROCS


async def bench(port: int, proc: psutil.Process, calls: int, inflight: int) -> None:
    c = await RpcClient.connect("127.0.0.1", port)
    m = await c.call(
        mount3.PROGRAM,
        3,
        mount3.MountProc.MNT,
        mount3.pack_mnt3args,
        mount3.Mnt3Args(b"/data"),
        mount3.unpack_mnt3res,
    )
    root = m.fhandle

    async def nfs(p: Nfs3Proc, args: object) -> object:
        return await c.call(nfs3.PROGRAM, 3, p, P[p].pack_args, args, P[p].unpack_res)  # type: ignore[arg-type]

    d = await nfs(Nfs3Proc.LOOKUP, nfs3.Lookup3Args(nfs3.Diropargs3(root, b"class0")))
    dh = d.object  # type: ignore[attr-defined]
    f = await nfs(Nfs3Proc.LOOKUP, nfs3.Lookup3Args(nfs3.Diropargs3(dh, b"f00001.jpg")))
    fh = f.object  # type: ignore[attr-defined]
    await nfs(Nfs3Proc.READ, nfs3.Read3Args(fh, 0, 16384))

    kinds: dict[str, Callable[[int], Awaitable[object]]] = {
        "GETATTR": lambda i: nfs(Nfs3Proc.GETATTR, nfs3.Getattr3Args(fh)),
        "LOOKUP (hit)": lambda i: nfs(
            Nfs3Proc.LOOKUP,
            nfs3.Lookup3Args(nfs3.Diropargs3(dh, b"f%05d.jpg" % (i % 1000))),
        ),
        "LOOKUP (miss)": lambda i: nfs(
            Nfs3Proc.LOOKUP, nfs3.Lookup3Args(nfs3.Diropargs3(dh, b"missing%d" % i))
        ),
        "ACCESS": lambda i: nfs(Nfs3Proc.ACCESS, nfs3.Access3Args(fh, 0x1F)),
        "READ 16 KiB (cached)": lambda i: nfs(
            Nfs3Proc.READ, nfs3.Read3Args(fh, (i % 7) * 16384, 16384)
        ),
    }
    print(f"{'call':<22} {'server CPU µs/call':>18} {'calls/s':>10}")
    for name, fn in kinds.items():
        await asyncio.gather(*(fn(i) for i in range(200)))  # warm
        sem = asyncio.Semaphore(inflight)

        async def one(
            i: int,
            fn: Callable[[int], Awaitable[object]] = fn,
            sem: asyncio.Semaphore = sem,
        ) -> None:
            async with sem:
                await fn(i)

        cpu0 = proc.cpu_times()
        t0 = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(calls)))
        wall = time.perf_counter() - t0
        cpu1 = proc.cpu_times()
        cpu = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
        print(f"{name:<22} {cpu / calls * 1e6:18.1f} {calls / wall:10.0f}")
    await c.close()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--inflight", type=int, default=32)
    ap.add_argument("--no-uvloop", action="store_true")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src" / "class0"
        src.mkdir(parents=True)
        for i in range(1000):
            (src / f"f{i:05d}.jpg").write_bytes(os.urandom(110_000 if i == 1 else 100))
        port = 20493
        cmd = [
            str(ROOT / ".venv/bin/nfsgw"),
            "serve",
            "--port",
            str(port),
            "--export",
            f"/data=file://{tmp}/src",
            "--state-dir",
            f"{tmp}/state",
            "--read-only",
            "--log-level",
            "warning",
        ]
        if a.no_uvloop:
            cmd.append("--no-uvloop")
        srv = subprocess.Popen(cmd)
        try:
            time.sleep(1.5)
            asyncio.run(bench(port, psutil.Process(srv.pid), a.calls, a.inflight))
        finally:
            srv.terminate()
            srv.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
