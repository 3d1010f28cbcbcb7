"""The ImageNet-epoch workload: simulated training nodes x data-loader workers reading every
file of a dataset once per epoch over NFSv3, with every byte checked against the manifest.

Owns: the sampler (a fresh shuffle per epoch, split across nodes like PyTorch's
``DistributedSampler`` without padding, so each file is read exactly once per epoch; each
node's share cut into batches handed round-robin to its workers like ``DataLoader``), the
per-file RPC patterns, per-file latency and per-batch completion times, and running nodes as
processes (``NodeGroup``). Must not: know about gateways, proxies or reports.

Per-file RPC patterns (``WorkloadSpec.pattern``):

- ``kernel``: what the Linux client sends for an ``ImageFolder`` epoch. Set-up scans the tree
  (READDIRPLUS of the root and of every class folder, all pages, ``dircount = maxcount`` as
  Linux 6.1 sends);
  then per file GETATTR (close-to-open) + ACCESS (only the first time this node opens the
  file: the access cache) + READ in ``rsize`` chunks, issued together (read-ahead).
- ``cv2``: the same scan and GETATTR/ACCESS, then many small reads with seeks, one at a time,
  as a decoder without a page cache does: the first 4 KiB, the last 4 KiB, then the rest in
  ``cv2_read`` pieces.
- ``manifest``: no scan (the file list comes from the manifest): each path component is
  looked up with a kernel-like dentry cache (a class folder once per node, single-flight);
  the first open of a file costs LOOKUP + ACCESS (the LOOKUP's attributes are fresh, so no
  GETATTR), later opens GETATTR; then READ like ``kernel``.

A target is an ``nfs://`` URL or ``local:DIR`` (``loadgen.localfs``: the same calls answered
with system calls on a local directory, the yardstick every report can carry). A file whose
size or sha256 differs from the manifest fails the run (``DataMismatch``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import multiprocessing
import multiprocessing.connection
import random
import time
import traceback
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeVar

from loadgen.dataset import Manifest, ManifestEntry
from loadgen.localfs import LocalClient, is_local
from loadgen.nfsclient import ACCESS_FILE_READ, NfsClient, NfsError, RpcError
from nfsproto import nfs3

__all__ = [
    "PATTERNS",
    "DataMismatch",
    "EpochPart",
    "Node",
    "NodeGroup",
    "SetupPart",
    "WorkloadSpec",
    "epoch_order",
    "node_share",
    "make_batches",
]

Pattern = Literal["kernel", "cv2", "manifest"]
PATTERNS: tuple[Pattern, ...] = ("kernel", "cv2", "manifest")
CV2_EDGE = 4096
T = TypeVar("T")


class DataMismatch(Exception):
    """A file's bytes (or size, or presence) differ from the manifest."""


class NodeFailed(Exception):
    """A node process failed; the message carries its error."""


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    target: str
    manifest: str
    pattern: Pattern = "kernel"
    nodes: int = 1
    workers: int = 8
    batch_size: int = 64
    seed: int = 0
    rsize: int = 0  # 0: the server's FSINFO rtpref (at most rtmax)
    cv2_read: int = 16384
    nconnect: int = 1
    readdir_bytes: int = 65536
    timeout_s: float = 60.0  # per RPC
    max_files: int = 0  # 0: the whole manifest; N: its first N files (tiny runs)

    def __post_init__(self) -> None:
        if self.pattern not in PATTERNS:
            raise ValueError(f"pattern must be one of {', '.join(PATTERNS)}")
        if self.nodes < 1 or self.workers < 1 or self.batch_size < 1 or self.nconnect < 1:
            raise ValueError("nodes, workers, batch size and nconnect must be >= 1")
        if self.rsize < 0 or self.cv2_read < 1 or self.readdir_bytes < 1024:
            raise ValueError("bad rsize, cv2 read size or readdir size")

    def to_json(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in self.__dataclass_fields__}


# --------------------------------------------------------------------------- sampler


def epoch_order(n: int, seed: int, epoch: int) -> list[int]:
    """The epoch's global shuffle (the same on every node, like DistributedSampler with
    ``set_epoch``)."""
    order = list(range(n))
    random.Random(f"{seed}:epoch:{epoch}").shuffle(order)
    return order


def node_share(order: list[int], rank: int, nodes: int) -> list[int]:
    """Node ``rank``'s part of the order: every ``nodes``-th index (no padding, so every file
    is read exactly once per epoch across nodes)."""
    return order[rank::nodes]


def make_batches(share: list[int], batch_size: int) -> list[list[int]]:
    """The node's batches in the order the trainer consumes them (the last may be short);
    batch ``b`` is loaded by worker ``b % workers`` (DataLoader's round-robin)."""
    return [share[i : i + batch_size] for i in range(0, len(share), batch_size)]


# --------------------------------------------------------------------------- results


@dataclass(slots=True)
class SetupPart:
    rank: int
    seconds: float
    files: int
    rpc: dict[str, int]


@dataclass(slots=True)
class EpochPart:
    """One node's epoch. ``latencies``: seconds per file (first RPC to last byte);
    ``batch_ready``: seconds from the epoch's start until each batch (in consumption order)
    was complete."""

    rank: int
    epoch: int
    files: int
    bytes: int
    seconds: float
    latencies: list[float] = field(default_factory=list)
    batch_ready: list[float] = field(default_factory=list)
    rpc: dict[str, int] = field(default_factory=dict)


# --------------------------------------------------------------------------- one node


def _first_error(eg: BaseExceptionGroup[BaseException]) -> BaseException:
    """The error to report from a failed task group: a data mismatch if there is one."""
    leaves: list[BaseException] = []
    stack: list[BaseException] = [eg]
    while stack:
        e = stack.pop(0)
        if isinstance(e, BaseExceptionGroup):
            stack[:0] = list(e.exceptions)
        else:
            leaves.append(e)
    for e in leaves:
        if isinstance(e, DataMismatch):
            return e
    return leaves[0] if leaves else eg


@dataclass(slots=True)
class _Sample:
    path: str
    size: int
    sha256: str
    fh: bytes | None = None


class Node:
    """One simulated training node: one NFS mount (``nconnect`` connections) and
    ``spec.workers`` data-loader workers (tasks)."""

    def __init__(self, spec: WorkloadSpec, rank: int, manifest: Manifest | None = None) -> None:
        self.spec = spec
        self.rank = rank
        self.manifest = manifest if manifest is not None else Manifest.read(spec.manifest)
        entries = self.manifest.entries
        if spec.max_files:
            entries = entries[: spec.max_files]
        self.expected: list[ManifestEntry] = entries
        self.samples: list[_Sample] = []
        self.client: NfsClient | LocalClient | None = None
        self.rsize = 0
        self._opened: set[int] = set()  # sample indices this node has opened (access cache)
        self._dentries: dict[str, bytes] = {}  # directory path -> handle
        self._dentry_tasks: dict[str, asyncio.Task[bytes]] = {}

    async def setup(self) -> SetupPart:
        t0 = time.perf_counter()
        spec = self.spec
        c: NfsClient | LocalClient
        if is_local(spec.target):  # local disk, the yardstick: the same calls, system calls
            c = await LocalClient.open(spec.target, threads=spec.workers, timeout_s=spec.timeout_s)
        else:
            c = await NfsClient.connect(
                spec.target, nconnect=spec.nconnect, timeout_s=spec.timeout_s
            )
        self.client = c
        rt = c.fsinfo.rtpref or c.fsinfo.rtmax or (1 << 20)
        self.rsize = min(spec.rsize or rt, c.fsinfo.rtmax or rt)
        if spec.pattern == "manifest":
            self.samples = [_Sample(e.path, e.size, e.sha256) for e in self.expected]
        else:
            self.samples = await self._scan()
        return SetupPart(self.rank, time.perf_counter() - t0, len(self.samples), dict(c.counts))

    async def _scan(self) -> list[_Sample]:
        """ImageFolder's scan: class folders are the root's directories, samples their files,
        both sorted by name. The result must match the manifest exactly."""
        c = self.client
        assert c is not None
        maxcount = self.spec.readdir_bytes
        root = await c.readdirplus(c.root, maxcount=maxcount)
        classes = sorted(
            (e.name.decode(errors="surrogateescape"), e.name_handle)
            for e in root
            if e.name not in (b".", b"..")
            and e.name_attributes is not None
            and e.name_attributes.type == nfs3.Ftype3.NF3DIR
        )
        want = {e.path: e for e in self.expected}
        wanted_classes = {p.split("/", 1)[0] for p in want}
        extra = [n for n, _ in classes if n not in wanted_classes]
        if extra and not self.spec.max_files:
            raise DataMismatch(f"{extra[0]}/: a class folder on the server but not in the manifest")
        classes = [(n, fh) for n, fh in classes if n in wanted_classes]

        async def one(name: str, fh: bytes | None) -> list[tuple[str, bytes | None, int]]:
            if fh is None:
                fh, _ = await c.lookup(c.root, name.encode())
            self._dentries[name] = fh
            ents = await c.readdirplus(fh, maxcount=maxcount)
            out = []
            for e in ents:
                a = e.name_attributes
                if e.name in (b".", b"..") or (a is not None and a.type != nfs3.Ftype3.NF3REG):
                    continue
                fname = e.name.decode(errors="surrogateescape")
                out.append((f"{name}/{fname}", e.name_handle, a.size if a else -1))
            return out

        # The kernel scans one directory at a time per process; a few in flight keep the scan
        # from being pure latency without changing the calls made.
        sem = asyncio.Semaphore(4)

        async def bounded(name: str, fh: bytes | None) -> list[tuple[str, bytes | None, int]]:
            async with sem:
                return await one(name, fh)

        per_class = await asyncio.gather(*(bounded(n, fh) for n, fh in classes))
        found = sorted(x for lst in per_class for x in lst)
        if self.spec.max_files:
            found = [x for x in found if x[0] in want]
        samples: list[_Sample] = []
        for path, fh, size in found:
            e = want.get(path)
            if e is None:
                raise DataMismatch(f"{path}: on the server but not in the manifest")
            if size >= 0 and size != e.size:
                raise DataMismatch(f"{path}: READDIRPLUS size {size}, manifest {e.size}")
            samples.append(_Sample(path, e.size, e.sha256, fh))
        if len(samples) != len(want):
            missing = sorted(set(want) - {s.path for s in samples})
            raise DataMismatch(
                f"{len(missing)} manifest file(s) not found on the server, e.g. {missing[0]}"
            )
        return samples

    async def close(self) -> None:
        for t in self._dentry_tasks.values():
            t.cancel()
        if self.client is not None:
            await self.client.close()
            self.client = None

    # ------------------------------------------------------------------ one epoch

    async def epoch(
        self, epoch: int, progress: Callable[[int, int], None] | None = None
    ) -> EpochPart:
        c = self.client
        assert c is not None, "setup() first"
        spec = self.spec
        before = Counter(c.counts)
        order = epoch_order(len(self.samples), spec.seed, epoch)
        batches = make_batches(node_share(order, self.rank, spec.nodes), spec.batch_size)
        ready = [0.0] * len(batches)
        latencies: list[float] = []
        nbytes = 0
        t0 = time.perf_counter()

        async def worker(w: int) -> None:
            nonlocal nbytes
            for b in range(w, len(batches), spec.workers):
                for idx in batches[b]:
                    s0 = time.perf_counter()
                    data = await self._read_file(idx)
                    latencies.append(time.perf_counter() - s0)
                    self._verify(idx, data)
                    nbytes += len(data)
                    if progress is not None:
                        progress(1, len(data))
                ready[b] = time.perf_counter() - t0

        try:
            async with asyncio.TaskGroup() as tg:
                for w in range(min(spec.workers, max(1, len(batches)))):
                    tg.create_task(worker(w))
        except BaseExceptionGroup as eg:  # the first worker's error stopped the others
            raise _first_error(eg) from None
        seconds = time.perf_counter() - t0
        rpc = {k: v - before.get(k, 0) for k, v in c.counts.items() if v - before.get(k, 0)}
        return EpochPart(self.rank, epoch, len(latencies), nbytes, seconds, latencies, ready, rpc)

    def _verify(self, idx: int, data: bytearray) -> None:
        s = self.samples[idx]
        if len(data) != s.size:
            raise DataMismatch(f"{s.path}: read {len(data)} bytes, manifest says {s.size}")
        if hashlib.sha256(data).hexdigest() != s.sha256:
            raise DataMismatch(f"{s.path}: content differs from the manifest (sha256)")

    async def _read_file(self, idx: int) -> bytearray:
        c = self.client
        assert c is not None
        s = self.samples[idx]
        first = idx not in self._opened
        if s.fh is None:
            # No dentry yet (the manifest pattern, or a READDIRPLUS without handles): LOOKUP,
            # whose attributes are fresh enough for open() to skip the GETATTR.
            parent, _, name = s.path.rpartition("/")
            dir_fh = await self._dir_handle(parent)
            s.fh, attrs = await c.lookup(dir_fh, name.encode())
            size = attrs.size if attrs is not None else (await c.getattr(s.fh)).size
        else:
            size = (await c.getattr(s.fh)).size
        if first:
            await c.access(s.fh, ACCESS_FILE_READ)
            self._opened.add(idx)
        if size != s.size:
            raise DataMismatch(f"{s.path}: the server says {size} bytes, manifest {s.size}")
        buf = bytearray(size)
        if self.spec.pattern == "cv2":
            edge = min(CV2_EDGE, size)
            await self._read_into(s.fh, buf, 0, edge)
            await self._read_into(s.fh, buf, size - edge, edge)
            step = self.spec.cv2_read
            for off in range(edge, size - edge, step):
                await self._read_into(s.fh, buf, off, min(step, size - edge - off))
        else:
            rs = self.rsize
            await asyncio.gather(
                *(
                    self._read_into(s.fh, buf, off, min(rs, size - off))
                    for off in range(0, size, rs)
                )
            )
        return buf

    async def _read_into(self, fh: bytes, buf: bytearray, offset: int, count: int) -> None:
        """Fill ``buf[offset:offset+count]``, following short reads. A premature EOF leaves
        the rest zero (the checksum then fails the file)."""
        c = self.client
        assert c is not None
        end = offset + count
        # Each round trip either advances or stops: bounded by count (+1 for EOF).
        while offset < end:
            data, eof = await c.read(fh, offset, end - offset)
            n = len(data)
            if n > end - offset:
                raise DataMismatch(f"READ returned {n} bytes for {end - offset} asked")
            buf[offset : offset + n] = data
            offset += n
            if n == 0:
                if eof:
                    return
                raise DataMismatch("READ returned no data before EOF")

    async def _dir_handle(self, path: str) -> bytes:
        """A directory's handle through the node's dentry cache (single-flight)."""
        c = self.client
        assert c is not None
        if not path:
            return c.root
        fh = self._dentries.get(path)
        if fh is not None:
            return fh
        task = self._dentry_tasks.get(path)
        if task is None:

            async def resolve() -> bytes:
                parent, _, name = path.rpartition("/")
                pfh = await self._dir_handle(parent)
                h, _ = await c.lookup(pfh, name.encode())
                await c.access(h, nfs3.ACCESS3_LOOKUP | nfs3.ACCESS3_READ)
                self._dentries[path] = h
                return h

            task = self._dentry_tasks[path] = asyncio.get_running_loop().create_task(resolve())
        try:
            return await asyncio.shield(task)
        finally:
            if task.done():
                self._dentry_tasks.pop(path, None)


# --------------------------------------------------------------------------- node processes


Progress = Callable[[int, int], None]


class NodeDriver(Protocol):
    async def start(self) -> None: ...

    async def setup(self) -> SetupPart: ...

    async def epoch(self, epoch: int, progress: Progress | None) -> EpochPart: ...

    async def close(self, *, abort: bool = False) -> None: ...


class _InProcess:
    """A node as tasks in this event loop (tests; ``--in-process``)."""

    def __init__(self, spec: WorkloadSpec, rank: int, manifest: Manifest) -> None:
        self.node = Node(spec, rank, manifest)

    async def start(self) -> None:
        return None

    async def setup(self) -> SetupPart:
        return await self.node.setup()

    async def epoch(self, epoch: int, progress: Progress | None) -> EpochPart:
        return await self.node.epoch(epoch, progress)

    async def close(self, *, abort: bool = False) -> None:
        await self.node.close()


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return asyncio.new_event_loop()


def _node_main(conn: multiprocessing.connection.Connection, spec: WorkloadSpec, rank: int) -> None:
    """A node process: commands in, results out, over one pipe."""
    loop = _new_loop()
    asyncio.set_event_loop(loop)
    node: Node | None = None
    pending = [0, 0]
    last = [time.monotonic()]

    def progress(n: int, b: int) -> None:
        pending[0] += n
        pending[1] += b
        now = time.monotonic()
        if now - last[0] >= 0.25:
            last[0] = now
            conn.send(("progress", pending[0], pending[1]))
            pending[0] = pending[1] = 0

    def run(coro: Coroutine[Any, Any, T]) -> T:
        return loop.run_until_complete(coro)

    try:
        while True:
            try:
                cmd = conn.recv()
            except EOFError:
                break
            try:
                if cmd[0] == "ping":
                    conn.send(("result", None))
                elif cmd[0] == "setup":
                    node = Node(spec, rank)
                    conn.send(("result", run(node.setup())))
                elif cmd[0] == "epoch":
                    assert node is not None
                    part = run(node.epoch(int(cmd[1]), progress))
                    conn.send(("progress", pending[0], pending[1]))
                    pending[0] = pending[1] = 0
                    conn.send(("result", part))
                elif cmd[0] == "close":
                    if node is not None:
                        run(node.close())
                    conn.send(("result", None))
                    break
            except (BrokenPipeError, EOFError):
                raise  # the parent is gone: nobody to report to
            except Exception as e:  # reported to the parent, which fails the run
                if isinstance(e, DataMismatch):
                    conn.send(("mismatch", f"node {rank}: {e}"))
                elif isinstance(e, NfsError | RpcError | OSError | TimeoutError):
                    conn.send(("error", f"node {rank}: {type(e).__name__}: {e}"))
                else:
                    tb = traceback.format_exc(limit=6)
                    conn.send(("error", f"node {rank}: {type(e).__name__}: {e}\n{tb}"))
    except (BrokenPipeError, EOFError, KeyboardInterrupt):
        pass  # the parent went away or the user interrupted: stop quietly
    finally:
        with contextlib.suppress(Exception):
            if node is not None and node.client is not None:
                loop.run_until_complete(node.close())
        loop.close()
        conn.close()


class _Process:
    """A node in its own process (spawned, so it starts clean whatever the parent runs)."""

    def __init__(self, spec: WorkloadSpec, rank: int, deadline_s: float) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.rank = rank
        self.deadline_s = deadline_s
        self.proc = ctx.Process(
            target=_node_main, args=(child, spec, rank), name=f"loadgen-node-{rank}", daemon=True
        )
        self.proc.start()
        child.close()

    def _recv(self, timeout_s: float) -> Any:
        if not self.conn.poll(timeout_s):
            return None
        return self.conn.recv()

    async def _request(self, cmd: tuple[Any, ...], progress: Progress | None = None) -> Any:
        self.conn.send(cmd)
        loop = asyncio.get_running_loop()
        deadline = time.monotonic() + self.deadline_s
        while time.monotonic() < deadline:  # bounded: one poll per second until the deadline
            try:
                msg = await loop.run_in_executor(None, self._recv, 1.0)
            except EOFError:
                raise NodeFailed(f"node {self.rank} exited ({self.proc.exitcode})") from None
            if msg is None:
                if not self.proc.is_alive():
                    raise NodeFailed(f"node {self.rank} exited ({self.proc.exitcode})")
                continue
            kind = msg[0]
            if kind == "progress":
                if progress is not None and (msg[1] or msg[2]):
                    progress(msg[1], msg[2])
            elif kind == "result":
                return msg[1]
            elif kind == "mismatch":
                raise DataMismatch(msg[1])
            else:
                raise NodeFailed(msg[1])
        raise NodeFailed(f"node {self.rank}: no result within {self.deadline_s:.0f} s")

    async def start(self) -> None:
        """Wait until the process has started and imported everything (not part of any
        measured phase)."""
        await self._request(("ping",))

    async def setup(self) -> SetupPart:
        part: SetupPart = await self._request(("setup",))
        return part

    async def epoch(self, epoch: int, progress: Progress | None) -> EpochPart:
        part: EpochPart = await self._request(("epoch", epoch), progress)
        return part

    async def close(self, *, abort: bool = False) -> None:
        try:
            if self.proc.is_alive() and not abort:
                with contextlib.suppress(Exception):
                    self.deadline_s = 30.0
                    await self._request(("close",))
        finally:
            self.conn.close()
            if abort and self.proc.is_alive():
                self.proc.kill()
            await asyncio.get_running_loop().run_in_executor(None, self.proc.join, 10.0)
            if self.proc.is_alive():
                self.proc.kill()
                self.proc.join(5.0)


class NodeGroup:
    """``spec.nodes`` nodes: ``await g.start()`` (processes up), ``await g.setup()``,
    ``await g.epoch(e, progress)`` (all nodes at once; their parts), ``await g.close()``.
    ``in_process`` runs them as tasks in this loop. When one node fails, the others are
    stopped and the first error is raised."""

    def __init__(
        self, spec: WorkloadSpec, *, in_process: bool = False, deadline_s: float = 3600.0
    ) -> None:
        self.spec = spec
        self.drivers: list[NodeDriver] = []
        if in_process:
            manifest = Manifest.read(spec.manifest)
            self.drivers = [_InProcess(spec, r, manifest) for r in range(spec.nodes)]
        else:
            self.drivers = [_Process(spec, r, deadline_s) for r in range(spec.nodes)]

    @staticmethod
    async def _all(coros: list[Coroutine[Any, Any, T]]) -> list[T]:
        tasks = [asyncio.ensure_future(c) for c in coros]
        try:
            return list(await asyncio.gather(*tasks))
        except BaseException:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise

    async def start(self) -> None:
        await self._all([d.start() for d in self.drivers])

    async def setup(self) -> list[SetupPart]:
        return await self._all([d.setup() for d in self.drivers])

    async def epoch(self, epoch: int, progress: Progress | None = None) -> list[EpochPart]:
        return await self._all([d.epoch(epoch, progress) for d in self.drivers])

    async def close(self, *, abort: bool = False) -> None:
        await asyncio.gather(*(d.close(abort=abort) for d in self.drivers), return_exceptions=True)

    async def __aenter__(self) -> NodeGroup:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close(abort=exc[0] is not None)
