"""The CPU floor of one S3 GET for a Python client on this machine, by mechanism: what a GET
costs the client with nothing of ours in it (no signing per request, no retries, no checksum,
no cache), so a target for ``S3Store.get`` (issue 25: <= 60 µs for 110 kB) can be compared
with what the wire alone costs.

    .venv/bin/python benchmarks/get_floor.py [--size 112640] [--requests 2000] [--rounds 2]

Starts a throw-away SeaweedFS (``loadgen.seaweed``), uploads one object, signs one GET
(valid for minutes: the same request bytes are sent each time) and measures this process's
CPU (``time.process_time``: user + system, every thread; the server's is not counted) per
GET, best of three passes of ``--requests``, one request at a time on one keep-alive
connection unless said otherwise, for:

- **asyncio, bare protocol**: a ``BufferedProtocol`` that finds the head's end and
  Content-Length and receives the body into a ``bytearray`` of that size; the waiter is a
  Future (the shape of ``gateway/backend/http1.py`` without anything else);
- **blocking socket, caller's thread**: ``sendall`` + ``recv_into`` (no event loop at all);
- **blocking socket in a thread**: the same, one GET per ``run_in_executor`` (a GET done off
  the loop, as a compiled client on a thread would be);
- **bare protocol, N in flight**: the same on N connections, N GETs outstanding
  (``--inflight``, default 8);
- **C engine** (``benchmarks/_get_floor_engine.c``, built here with the system ``cc`` into a
  temporary shared library and loaded with ctypes): a thread of its own, no Python on it,
  sends the request and receives head and body into a preallocated buffer per connection
  (epoll over its connections); the loop submits a GET by id into a ring (waking the engine's
  eventfd only when it sleeps) and awaits a Future; completions come back in a ring, the
  loop woken by an eventfd it watches with ``add_reader``, written once per batch (only if the
  loop has drained since the last one) or once per GET; 1 and N GETs in flight on as many
  connections; plus the engine alone (each completed GET re-sent by the engine itself, no
  hand-off: what the thread costs without the loop);
- each under asyncio's default loop and uvloop (the gateway's);
- and, for reference, **C, blocking socket, no Python**: the same GETs from a C loop on the
  caller's thread (no thread, no loop): the wire's own floor for any client here.

Printed with each row: of its best pass, the kernel's share (``getrusage``: tick-sampled, so
noisy for short passes) and, for the engine, its thread's share (its CPU clock).

Measured here (2 cores, SeaweedFS on the same machine, 110 kB): bare protocol 68-110 µs
(uvloop 68-85), of which the kernel (loopback TCP receive, the copies) ~40 %; blocking
122-146 µs (more wake-ups: each ``recv`` returns what has arrived so far; ``MSG_WAITALL`` on
the body changed nothing); in a thread 127-186 µs (the hand-off costs more than the loop). So
no mechanism open to a Python client reaches 60 µs on this machine one GET at a time; see
docs/benchmarks.md "A lean GET".

Later, with the C engine (same machine, load average ~1-2, two runs of 2 x 3 x 2,000): C alone
35-55 µs (blocking loop 36-49, the engine with no hand-off 35-55: the wire's floor here); the
engine handing GETs to the loop 98-142 µs at 1 in flight (two thread crossings per GET), 62-93
at 8 in flight (batch or per-GET alike); the bare protocol with 8 in flight 50-69 (uvloop),
57-90 (asyncio). A C engine on its own thread does not reach 60 µs here; 8 GETs in flight on
the loop itself did in the quieter run, with nothing of a product in them.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import ctypes
import gc
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/: _common
import _common  # noqa: F401 (puts the repository on sys.path)

from gateway.backend.sigv4 import EMPTY_SHA256, Credentials
from loadgen.seaweed import SeaweedServer

BUCKET = "get-floor"
PASSES = 3
ENGINE_SOURCE = Path(__file__).with_name("_get_floor_engine.c")
# of each row's best pass over all rounds: (µs per GET, the kernel's share (getrusage), the C
# engine thread's share or None)
BEST: dict[str, tuple[float, float, float | None]] = {}


def record(key: str, us: float, system_s: float, n: int, thread_s: float | None) -> None:
    if key not in BEST or us < BEST[key][0]:
        spent = us * 1e-6 * n
        BEST[key] = (us, system_s / spent, None if thread_s is None else thread_s / spent)


def signed_get(sw: SeaweedServer, path: str) -> bytes:
    headers = {"host": f"127.0.0.1:{sw.s3_port}"}
    creds = Credentials(sw.access_key, sw.secret_key)
    sw._signer.sign(creds, "GET", path, "", headers, EMPTY_SHA256)
    lines = [f"GET {path} HTTP/1.1", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def content_length(head: bytearray, end: int) -> int:
    i = head.lower().find(b"\r\ncontent-length:", 0, end)
    if i < 0:
        raise RuntimeError("no Content-Length")
    j = head.find(b"\r\n", i + 2)
    return int(head[i + 17 : j])


def blocking_get(sock: socket.socket, req: bytes) -> bytearray:
    head = bytearray(8192)
    view = memoryview(head)
    n = 0
    while (end := head.find(b"\r\n\r\n", 0, n)) < 0:
        if n == 0:
            sock.sendall(req)
        k = sock.recv_into(view[n:])
        if k == 0:
            raise RuntimeError("connection closed")
        n += k
    size = content_length(head, end)
    body = bytearray(size)
    got = n - (end + 4)
    body[:got] = head[end + 4 : n]
    bv = memoryview(body)
    while got < size:
        k = sock.recv_into(bv[got:], size - got)
        if k == 0:
            raise RuntimeError("connection closed")
        got += k
    return body


class Bare(asyncio.BufferedProtocol):
    """Head into a fixed buffer, body into a ``bytearray(Content-Length)``."""

    def __init__(self) -> None:
        self.head = bytearray(8192)
        self.n = 0
        self.body: bytearray | None = None
        self.got = 0
        self.size = 0
        self.waiter: asyncio.Future[bytearray] | None = None

    def get_buffer(self, sizehint: int) -> memoryview:
        if self.body is None:
            return memoryview(self.head)[self.n :]
        return memoryview(self.body)[self.got :]

    def buffer_updated(self, nbytes: int) -> None:
        if self.body is None:
            self.n += nbytes
            end = self.head.find(b"\r\n\r\n", 0, self.n)
            if end < 0:
                return
            self.size = content_length(self.head, end)
            self.body = bytearray(self.size)
            self.got = self.n - end - 4
            self.body[: self.got] = self.head[end + 4 : self.n]
        else:
            self.got += nbytes
        if self.got >= self.size and self.waiter is not None:
            body, self.body, self.n = self.body, None, 0
            self.waiter.set_result(body)


def best_of(run: Callable[[int], object], n: int, key: str) -> float:
    best = float("inf")
    for _ in range(PASSES):
        gc.collect()
        gc.disable()
        t = time.process_time()
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        run(n)
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        us = (time.process_time() - t) / n * 1e6
        best = min(best, us)
        record(key, us, r1.ru_stime - r0.ru_stime, n, None)
        gc.enable()
    return best


async def abest_of(
    run: Callable[[int], Awaitable[object]],
    n: int,
    key: str,
    thread_cpu: Callable[[], float] | None = None,
) -> float:
    best = float("inf")
    for _ in range(PASSES):
        gc.collect()
        gc.disable()
        c0 = thread_cpu() if thread_cpu else 0.0
        t = time.process_time()
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        await run(n)
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        us = (time.process_time() - t) / n * 1e6
        c1 = thread_cpu() if thread_cpu else 0.0
        best = min(best, us)
        record(key, us, r1.ru_stime - r0.ru_stime, n, c1 - c0 if thread_cpu else None)
        gc.enable()
    return best


def connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def build_engine(tmp: str) -> ctypes.PyDLL:
    """``_get_floor_engine.c`` compiled with the system cc into a shared library in tmp."""
    cc = shutil.which("cc")
    if cc is None:
        raise SystemExit("get_floor: the C engine rows need a C compiler ('cc' not found)")
    lib_path = os.path.join(tmp, "get_floor_engine.so")
    flags = ["-O2", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", "-pthread"]
    built = subprocess.run(
        [cc, *flags, "-o", lib_path, str(ENGINE_SOURCE)], capture_output=True, text=True
    )
    if built.returncode != 0:
        raise SystemExit(f"get_floor: building {ENGINE_SOURCE.name} failed:\n{built.stderr}")
    # PyDLL: the calls keep the GIL (each is a few atomics and at most one syscall)
    lib = ctypes.PyDLL(lib_path)
    vp, i64, i32, size = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_size_t
    for name, res, args in (
        ("eng_start", vp, [ctypes.POINTER(i32), i32, ctypes.c_char_p, size, size, i32]),
        ("eng_notify_fd", i32, [vp]),
        ("eng_submit", i32, [vp, i64]),
        ("eng_drain", i32, [vp, vp, i32]),
        ("eng_error", ctypes.c_char_p, [vp]),
        ("eng_notifies", ctypes.c_uint64, [vp]),
        ("eng_thread_cpu_ns", i64, [vp]),
        ("eng_stop", None, [vp]),
        ("eng_repeat", None, [vp, i64]),
        ("blocking_gets", i64, [i32, ctypes.c_char_p, size, vp, size, i32]),
    ):
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args
    return lib


def c_blocking(lib: ctypes.PyDLL, sock: socket.socket, req: bytes, k: int, size: int) -> None:
    """k GETs by ``blocking_gets``: C on this thread, no loop, no Python per GET."""
    buf = ctypes.create_string_buffer(size + 16384)
    if lib.blocking_gets(sock.fileno(), req, len(req), buf, len(buf), k) != k * size:
        raise RuntimeError("C blocking GETs: an error, or a short body")


class Engine:
    """The loop's side of the C engine: a Future per GET, submitted by id; completions drained
    (in batches of up to ``BATCH``) when the engine's eventfd wakes the loop (``add_reader``)."""

    BATCH = 128

    def __init__(
        self, lib: ctypes.PyDLL, port: int, req: bytes, size: int, nconn: int, per_get: bool
    ) -> None:
        self.lib = lib
        self.loop = asyncio.get_running_loop()
        self.socks = [connect(port) for _ in range(nconn)]
        for s in self.socks:
            s.setblocking(False)
        fds = (ctypes.c_int * nconn)(*(s.fileno() for s in self.socks))
        handle = lib.eng_start(fds, nconn, req, len(req), size + 16384, int(per_get))
        if not handle:
            raise RuntimeError("C engine: eng_start failed")
        self.h = ctypes.c_void_p(handle)
        self.out = (ctypes.c_int64 * (2 * self.BATCH))()
        self.view = memoryview(self.out).cast("B").cast("q")
        self.futures: dict[int, asyncio.Future[int]] = {}
        self.next_id = 0
        self.notify_fd = lib.eng_notify_fd(self.h)
        self.loop.add_reader(self.notify_fd, self.on_notify)

    def on_notify(self) -> None:
        drain, h, out, view, futures = self.lib.eng_drain, self.h, self.out, self.view, self.futures
        while True:
            k = drain(h, out, self.BATCH)
            if k < 0:
                err = RuntimeError(f"C engine failed: {self.lib.eng_error(h).decode()}")
                for f in futures.values():
                    f.set_exception(err)
                futures.clear()
                return
            for j in range(k):
                futures.pop(view[2 * j]).set_result(view[2 * j + 1])
            if k < self.BATCH:
                return

    async def get(self) -> int:
        i = self.next_id
        self.next_id = i + 1
        fut = self.futures[i] = self.loop.create_future()
        if self.lib.eng_submit(self.h, i) != 0:
            raise RuntimeError("C engine: submission ring full, or its eventfd failed")
        return int(await fut)

    def thread_cpu(self) -> float:
        return float(self.lib.eng_thread_cpu_ns(self.h)) * 1e-9

    def close(self) -> None:
        self.loop.remove_reader(self.notify_fd)
        self.lib.eng_stop(self.h)
        for s in self.socks:
            s.close()


async def in_flight(get: Callable[[int], Awaitable[int]], k: int, n: int, size: int) -> None:
    """k GETs, n at a time: n workers, worker j calling get(j) one GET after another."""

    async def worker(j: int, m: int) -> None:
        for _ in range(m):
            if await get(j) != size:
                raise RuntimeError("short body")

    jobs = [worker(j, k // n + (j < k % n)) for j in range(n)]
    await asyncio.wait_for(asyncio.gather(*jobs), 300)


async def on_a_loop(
    loop_name: str, port: int, req: bytes, size: int, n: int, inflight: int, lib: ctypes.PyDLL
) -> dict[str, float]:
    loop = asyncio.get_running_loop()
    protos: list[Bare] = []
    transports: list[asyncio.BaseTransport] = []
    for _ in range(inflight):
        transport, proto = await loop.create_connection(Bare, "127.0.0.1", port)
        transports.append(transport)
        protos.append(proto)
    sock = connect(port)
    pool = concurrent.futures.ThreadPoolExecutor(1)

    async def bare_get(j: int) -> int:
        proto = protos[j]
        proto.waiter = loop.create_future()
        transports[j].write(req)  # type: ignore[attr-defined]
        return len(await proto.waiter)

    async def threaded(k: int) -> None:
        for _ in range(k):
            if len(await loop.run_in_executor(pool, blocking_get, sock, req)) != size:
                raise RuntimeError("short body")

    rows: dict[str, float] = {}

    async def bare(k: int) -> None:
        proto, transport = protos[0], transports[0]
        for _ in range(k):
            proto.waiter = loop.create_future()
            transport.write(req)  # type: ignore[attr-defined]
            if len(await proto.waiter) != size:
                raise RuntimeError("short body")

    async def row(
        what: str, run: Callable[[int], Awaitable[object]], eng: Engine | None = None
    ) -> None:
        key = f"{loop_name}, {what}"
        rows[key] = await abest_of(run, n, key, eng.thread_cpu if eng else None)

    try:
        await row("bare protocol", bare)
        await row("in a thread", threaded)
        await row(
            f"bare protocol, {inflight} in flight", lambda k: in_flight(bare_get, k, inflight, size)
        )
        for conns in (1, inflight):
            for per_get in (False, True):
                eng = Engine(lib, port, req, size, conns, per_get)
                try:
                    what = f"C engine, {conns} in flight, {'per-GET' if per_get else 'batch'}"

                    async def engine_gets(k: int, eng: Engine = eng, conns: int = conns) -> None:
                        await in_flight(lambda _: eng.get(), k, conns, size)

                    await row(what, engine_gets, eng)
                finally:
                    eng.close()
            eng = Engine(lib, port, req, size, conns, False)
            try:

                async def engine_alone(k: int, eng: Engine = eng, conns: int = conns) -> None:
                    eng.lib.eng_repeat(eng.h, k - conns)
                    await in_flight(lambda _: eng.get(), conns, conns, size)

                what = f"C engine, {conns} in flight, engine alone, no hand-off"
                await row(what, engine_alone, eng)
            finally:
                eng.close()
        return rows
    finally:
        for t in transports:
            t.close()
        sock.close()
        pool.shutdown()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=112_640)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--inflight", type=int, default=8, help="GETs in flight for the N rows")
    args = ap.parse_args()
    import uvloop

    with tempfile.TemporaryDirectory(prefix="get-floor-") as tmp, SeaweedServer() as sw:
        lib = build_engine(tmp)
        sw.create_bucket(BUCKET)
        status, _ = sw.request("PUT", f"/{BUCKET}/obj", os.urandom(args.size))
        if status != 200:
            raise SystemExit(f"PUT: HTTP {status}")
        req = signed_get(sw, f"/{BUCKET}/obj")
        sock = connect(sw.s3_port)
        rows: dict[str, list[float]] = {}
        for _ in range(args.rounds):
            key = "blocking socket, caller's thread"
            us = best_of(lambda k: [blocking_get(sock, req) for _ in range(k)], args.requests, key)
            rows.setdefault(key, []).append(us)
            key = "C, blocking socket, no Python (wire floor)"
            us = best_of(lambda k: c_blocking(lib, sock, req, k, args.size), args.requests, key)
            rows.setdefault(key, []).append(us)
            for name, runner in (("asyncio", asyncio.run), ("uvloop", uvloop.run)):
                got = runner(
                    on_a_loop(name, sw.s3_port, req, args.size, args.requests, args.inflight, lib)
                )
                for what, v in got.items():
                    rows.setdefault(what, []).append(v)
        sock.close()
    print(
        f"client CPU per {args.size}-byte GET (µs), best of {PASSES} x {args.requests}, per round;"
        " of the best pass: the kernel's share, the C engine thread's share"
    )
    for name, vs in rows.items():
        _, system, thread = BEST[name]
        shares = f"  kernel {system:4.0%}" + (
            f"  engine thread {thread:4.0%}" if thread is not None else ""
        )
        print(f"  {name:<56} " + "  ".join(f"{v:6.1f}" for v in vs) + shares)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
