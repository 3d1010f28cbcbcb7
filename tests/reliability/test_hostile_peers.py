"""Hostile peers against a real gateway (issue 37): ``nfsgw serve`` as a child process
(``loadgen.gwprocess.GatewayProcess``: one process, a ``file://`` export to 127.0.0.1, every
setting at its default but the one a case is about) while libnfs, a well-behaved client from
127.0.0.1, mounts and reads a file over and over, byte-exact, each time within 1 s:

- 10,000 idle TCP connections from 127.0.0.1, then 10,000 from 200 addresses (127.0.0.2 to
  127.0.0.201): the per-address cap (256) and ``max_connections`` (1024) make room by closing
  the never-answered connections; with ``--idle-timeout 2`` those left are gone after the
  timeout (the ``nfsgw_connections`` gauge and the gateway's descriptors in ``/proc``);
- 64 connections drip-feeding a 4 MiB record each: with ``--partial-record-budget 16M`` the
  gateway's RSS grows by at most the budget plus ``PARTIAL_SLACK``; with
  ``--record-deadline 2`` a drip-fed record's connection is closed 2 s after its first byte;
- records past ``max_record`` (one fragment, or fragments adding up), garbage, truncated
  headers and arguments: the connection is closed (oversized) or the record answered or
  dropped by the RPC rules (RFC 5531) with the connection still serving;
- an S3 endpoint (``tests.harness.fakes3.FakeS3``, honest for listings) whose GETs of some
  objects claim a 1 GiB body, send endless headers, or trickle the body: those READs fail
  (NFS3ERR_IO; NFS3ERR_JUKEBOX for what timed out) within the store's deadline with a log line
  naming the cause, the RSS stays within 16 MiB, the ``file://`` export is served throughout.

Every flood is bounded in count and time and ends by itself; sockets are closed with an RST
(``SO_LINGER`` 0: no TIME_WAIT left behind) and every gateway is stopped in ``finally``.
The figures each case measured are printed (``-s``) and recorded in docs/reliability.md
("Hostile peers: measured").
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import resource
import select
import socket
import struct
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from loadgen.gwprocess import GatewayProcess
from loadgen.waiting import wait_until
from nfsproto import mount3, nfs3, rpc
from nfsproto.nfs3 import Diropargs3, Nfs3Proc, NfsStat3
from nfsproto.rpc import AcceptStat
from nfsproto.xdr import Reader, Writer
from tests.harness.fakes3 import FakeS3
from tests.harness.thread import LoopThread
from tests.libnfs import LibNfs, libnfs_available
from tests.rpcclient import BlockingRpcClient

pytestmark = [
    pytest.mark.libnfs,
    pytest.mark.skipif(not libnfs_available(), reason="libnfs (libnfs.so.13) is not installed"),
]

MiB = 1 << 20
GiB = 1 << 30
LAST = 0x8000_0000  # record mark: last fragment (RFC 5531 §11)
# The well-behaved client's mount + read must never be locked out: every round is answered
# within this (a hang guard, not a timing target: tests never time; the figures printed go to
# docs/reliability.md). The 1 s holds but for a SYN the flood made the kernel drop
# (the listen backlog overflowed), which the client's kernel resends after 1 s.
MOUNT_WITHIN_S = 5.0
FLOOD = 10_000
SOURCES = [f"127.0.0.{i}" for i in range(2, 202)]  # 200 addresses
IDLE_TIMEOUT_S = 2.0
BUDGET = 16 * MiB
# What the gateway's RSS may grow by past the partial-record budget: each record grows a
# bytearray (~1/8 over-allocated), a read buffer per receive (256 KiB), the allocator's
# unreturned pages of records freed when their connection was closed.
PARTIAL_SLACK = 16 * MiB
RSS_SLACK = 16 * MiB  # the hostile backend: RSS unchanged within this
DEADLINE_S = 2.0
DEFAULT_MAX_RECORD = 4160 * 1024
# The file the good client reads, and a few more in the export.
FILES = {
    f"f{i}.bin": bytes((i * 7 + j) % 251 for j in range(256)) * (64 * (i + 1)) for i in range(4)
}
GOOD_FILE = "f3.bin"  # 64 KiB
NOFILE = 65_536


# ------------------------------------------------------------------------------ helpers


@pytest.fixture(scope="module", autouse=True)
def _nofile() -> Iterator[None]:
    """Descriptors for 10,000 sockets here and for the gateway (it inherits the limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = max(soft, NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, max(hard, want)))
    except (ValueError, OSError):
        if hard < FLOOD + 1024:
            pytest.skip(f"RLIMIT_NOFILE {soft}/{hard} too low for {FLOOD} sockets")
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hostile-tree")
    for name, data in FILES.items():
        (root / name).write_bytes(data)
    return root


def _export(tree: Path) -> dict[str, object]:
    return {
        "path": "/data",
        "backend": f"file://{tree}",
        "read_only": True,
        "insecure": True,
        "clients": ["127.0.0.1/32"],  # the flood's 127.0.0.2..201 are no export's clients
    }


@contextlib.contextmanager
def gateway(
    tmp: Path,
    tree: Path,
    flags: Sequence[str] = (),
    *,
    exports: Sequence[dict[str, object]] = (),
    s3: S3Account | None = None,
    s3_section: dict[str, object] | None = None,
) -> Iterator[GatewayProcess]:
    sections: dict[str, dict[str, object]] = {
        "server": {"cache_dir": str(tmp / "cache"), "drain_timeout_s": 2},
        "cache": {"memory": "64M"},
    }
    if s3_section:
        sections["s3"] = s3_section
    gw = GatewayProcess(tmp, [_export(tree), *exports], sections=sections, flags=list(flags), s3=s3)
    try:
        yield gw.start()
    finally:
        gw.stop(timeout_s=10)


def _tree_pids(pid: int) -> list[int]:
    """``pid`` and its descendants (a supervisor's workers)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{p}/task"):
                kids = Path(f"/proc/{p}/task/{task}/children").read_text().split()
                todo += [int(k) for k in kids]
    return out


def rss(pid: int) -> int:
    """VmRSS of the gateway's processes, bytes."""
    total = 0
    for p in _tree_pids(pid):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
    return total


def fds(pid: int) -> int:
    """Open descriptors of the gateway's processes."""
    return sum(len(os.listdir(f"/proc/{p}/fd")) for p in _tree_pids(pid))


def gauge(gw: GatewayProcess, name: str) -> float:
    return gw.metrics().get(name, 0.0)


class RssPeak:
    """The gateway's RSS sampled every 20 ms on a thread: the highest seen."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, name="rss-peak", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss(self.pid))
            self._stop.wait(0.02)

    def __enter__(self) -> RssPeak:
        self.peak = rss(self.pid)
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join(5)
        self.peak = max(self.peak, rss(self.pid))


class GoodClient:
    """libnfs from 127.0.0.1, on a thread: mount, read ``GOOD_FILE`` whole and compare, unmount;
    again every ``interval_s`` until stopped. ``times``: each round's seconds; ``failures``:
    what went wrong (a wrong byte, an error, a round slower than ``MOUNT_WITHIN_S``)."""

    def __init__(self, gw: GatewayProcess, interval_s: float = 0.25) -> None:
        self.url = gw.libnfs_url("/data")
        self.interval_s = interval_s
        self.times: list[float] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, name="good-client", daemon=True)

    def once(self) -> float:
        t0 = time.monotonic()
        with LibNfs(self.url, timeout_ms=5000) as nfs:
            data = nfs.read_file("/" + GOOD_FILE)
        took = time.monotonic() - t0
        if data != FILES[GOOD_FILE]:
            raise AssertionError(f"wrong bytes: {len(data)} bytes read")
        return took

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                took = self.once()
                self.times.append(took)
                if took > MOUNT_WITHIN_S:
                    self.failures.append(f"mount + read took {took:.2f} s")
            except Exception as e:
                self.failures.append(repr(e))
            self._stop.wait(self.interval_s)

    def __enter__(self) -> GoodClient:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join(15)

    def check(self, at_least: int) -> str:
        assert not self.failures, self.failures[:5]
        assert len(self.times) >= at_least, self.times
        return f"{len(self.times)} rounds, slowest {max(self.times) * 1000:.0f} ms"


def _raw(src: str = "127.0.0.1") -> socket.socket:
    """A non-blocking TCP socket bound to ``src`` (its port chosen at connect), closed with an
    RST."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.setsockopt(socket.IPPROTO_IP, getattr(socket, "IP_BIND_ADDRESS_NO_PORT", 24), 1)
    s.bind((src, 0))
    s.setblocking(False)
    return s


def flood(port: int, n: int, sources: Sequence[str], batch: int = 500) -> list[socket.socket]:
    """``n`` connections that send nothing, from ``sources`` in turn, ``batch`` connects in
    flight at a time (each batch waited for, 5 s at most)."""
    socks: list[socket.socket] = []
    try:
        for i in range(0, n, batch):
            pending = {}
            for j in range(i, min(n, i + batch)):
                s = _raw(sources[j % len(sources)])
                socks.append(s)
                s.connect_ex(("127.0.0.1", port))
                pending[s.fileno()] = s
            poll = select.poll()
            for fd in pending:
                poll.register(fd, select.POLLOUT)
            deadline = time.monotonic() + 5.0
            while pending and time.monotonic() < deadline:
                for fd, _ in poll.poll(100):
                    poll.unregister(fd)
                    pending.pop(fd)
            assert not pending, f"{len(pending)} connects of batch {i // batch} not done in 5 s"
    except BaseException:
        close_all(socks)
        raise
    return socks


def closed_by_peer(socks: Sequence[socket.socket]) -> int:
    """How many of ``socks`` the other end has closed (readable: EOF or RST)."""
    n = 0
    for k in range(0, len(socks), 1000):
        part = socks[k : k + 1000]
        poll = select.poll()
        for s in part:
            poll.register(s.fileno(), select.POLLIN | select.POLLHUP | select.POLLERR)
        n += len(poll.poll(0))
    return n


def close_all(socks: Sequence[socket.socket]) -> None:
    for s in socks:
        s.close()


# ------------------------------------------------------------- 1. idle connection floods


def test_idle_floods_from_one_and_from_200_addresses(tmp_path: Path, tree: Path) -> None:
    with gateway(tmp_path, tree, ["--idle-timeout", str(IDLE_TIMEOUT_S)]) as gw:
        good = GoodClient(gw)
        base_fds = fds(gw.pid)
        with good:
            for label, sources, room in (
                ("1 address", ["127.0.0.1"], 256),  # max_connections_per_address
                ("200 addresses", SOURCES, 1024),  # max_connections
            ):
                t0 = time.monotonic()
                socks = flood(gw.port, FLOOD, sources)
                try:
                    flood_s = time.monotonic() - t0
                    # The flood's sockets all open on our side: mount and read now.
                    took = [good.once() for _ in range(3)]
                    open_now = gauge(gw, "nfsgw_connections")
                    gw_fds = fds(gw.pid)
                    # what the gateway holds: its cap (+ the good client's connections)
                    assert open_now <= room + 4, (label, open_now)
                    assert gw_fds <= base_fds + room + 8, (label, gw_fds, base_fds)
                    assert max(took) < MOUNT_WITHIN_S, (label, took)
                    # idle past the timeout: every flood connection closed by the gateway
                    t1 = time.monotonic()
                    wait_until(
                        lambda socks=socks: closed_by_peer(socks) == FLOOD or None,
                        timeout_s=IDLE_TIMEOUT_S + 3.0,
                        what=f"the {label} flood closed after the idle timeout",
                    )
                    gone_s = time.monotonic() - t1
                    left = gauge(gw, "nfsgw_connections")
                    left_fds = fds(gw.pid)
                    assert left <= 2, (label, left)  # the good client's, at most
                    assert left_fds <= base_fds + 2, (label, left_fds, base_fds)
                finally:
                    close_all(socks)
                print(
                    f"\nflood from {label}: {FLOOD} connects in {flood_s:.2f} s; held "
                    f"{open_now:.0f} (cap {room}), {gw_fds - base_fds:+d} fds; mount+read "
                    f"{max(took) * 1000:.0f} ms max; all closed {gone_s:.2f} s after the "
                    f"flood (idle timeout {IDLE_TIMEOUT_S:.0f} s); left {left:.0f} connections, "
                    f"{left_fds - base_fds:+d} fds"
                )
        m = gw.metrics()
        assert m.get("nfsgw_connections_evicted_total", 0) >= 2 * FLOOD - 256 - 1024 - 8
        assert m.get("nfsgw_connections_idle_closed_total", 0) >= 256 + 1024 - 8
        print("good client:", good.check(at_least=4))


# ---------------------------------------------------------- 2. drip-fed partial records


RECORD = 4 * MiB  # what each drip-fed record mark claims
# The default max_record (the largest wsize plus 64 KiB, 1,088 KiB) refuses a 4 MiB mark at
# once (test_oversized_...); the drip tests raise it to the old 4,160 KiB so such records are
# held and the budget and the deadline are what bounds them.
DRIP_ARGS = ["--max-record", "4160K"]
DRIPS = 64
CHUNK = 32 * 1024
TICK_S = 0.05
DRIP_S = 4.0


def _drip_open(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=2)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.setblocking(False)
    s.send(struct.pack(">I", LAST | RECORD) + b"\x00" * 64)
    return s


def test_drip_fed_records_are_bounded_by_the_partial_record_budget(
    tmp_path: Path, tree: Path
) -> None:
    with gateway(tmp_path, tree, [*DRIP_ARGS, "--partial-record-budget", str(BUDGET)]) as gw:
        good = GoodClient(gw)
        for _ in range(3):
            good.once()  # warm: imports, caches, the first connections
        base = rss(gw.pid)
        socks = [_drip_open(gw.port) for _ in range(DRIPS)]
        sent = closed = 0
        held_max = 0.0
        chunk = b"\xa5" * CHUNK
        try:
            with good, RssPeak(gw.pid) as peak:
                end = time.monotonic() + DRIP_S
                while time.monotonic() < end:
                    for k, s in enumerate(socks):
                        try:
                            sent += s.send(chunk)
                        except BlockingIOError:
                            pass  # the gateway reads slower than we drip: fine
                        except (ConnectionResetError, BrokenPipeError):
                            closed += 1  # over the budget: closed; a new one drips on
                            s.close()
                            socks[k] = _drip_open(gw.port)
                    held_max = max(held_max, gauge(gw, "nfsgw_partial_record_bytes"))
                    time.sleep(TICK_S)
            over = gauge(gw, "nfsgw_records_over_budget_total")
        finally:
            close_all(socks)
        grown = peak.peak - base
        print(
            f"\n{DRIPS} drip-fed {RECORD // MiB} MiB records, {sent / MiB:.0f} MiB sent in "
            f"{DRIP_S:.0f} s: {over:.0f} closed over the budget ({closed} seen here); "
            f"partial bytes held at most {held_max / MiB:.1f} MiB (gauge); RSS peak "
            f"{grown / MiB:+.1f} MiB (budget {BUDGET // MiB} MiB + slack "
            f"{PARTIAL_SLACK // MiB} MiB); good client {good.check(at_least=8)}"
        )
        assert sent > 2 * BUDGET  # the budget was put to the test
        assert over > 0 and closed > 0
        assert held_max <= BUDGET
        assert grown <= BUDGET + PARTIAL_SLACK, f"RSS grew by {grown / MiB:.1f} MiB"
        wait_until(
            lambda: gauge(gw, "nfsgw_partial_record_bytes") == 0 or None,
            timeout_s=3,
            what="partial record bytes released",
        )


def test_a_drip_fed_record_is_closed_at_the_record_deadline(tmp_path: Path, tree: Path) -> None:
    with gateway(tmp_path, tree, [*DRIP_ARGS, "--record-deadline", str(DEADLINE_S)]) as gw:
        good = GoodClient(gw)
        good.once()
        socks: list[socket.socket] = []
        started: list[float] = []
        ended: dict[int, float] = {}
        try:
            with good:
                for _ in range(8):
                    socks.append(_drip_open(gw.port))  # mark + 64 bytes: the clock starts
                    started.append(time.monotonic())
                deadline = time.monotonic() + DEADLINE_S + 3.0
                while len(ended) < len(socks) and time.monotonic() < deadline:
                    for k, s in enumerate(socks):
                        if k in ended:
                            continue
                        try:
                            s.send(b"x")  # a byte every 100 ms: progress, never the end
                        except (ConnectionResetError, BrokenPipeError):
                            ended[k] = time.monotonic()
                    time.sleep(0.1)
            too_slow = gauge(gw, "nfsgw_records_too_slow_total")
        finally:
            close_all(socks)
        lived = [ended[k] - started[k] for k in sorted(ended)]
        print(
            f"\nrecord deadline {DEADLINE_S:.0f} s: {len(lived)}/{len(socks)} drip-fed records "
            f"closed after {min(lived, default=0):.2f}-{max(lived, default=0):.2f} s; "
            f"good client {good.check(at_least=4)}"
        )
        assert len(ended) == len(socks), f"{len(socks) - len(ended)} still open"
        # the closing is seen at our next send: up to one 100 ms tick late
        assert all(DEADLINE_S - 0.05 <= t <= DEADLINE_S + 1.0 for t in lived), lived
        assert too_slow == len(socks)


# ----------------------------------------------------- 3. oversized and malformed records


def _call(xid: int, prog: int, vers: int, proc: int, args: bytes = b"") -> bytes:
    w = Writer()
    rpc.pack_call(w, xid, prog, vers, proc, rpc.auth_sys(0, 0, [0], b"hostile"))
    return b"".join(bytes(b) for b in w.buffers()) + args


def _record(body: bytes, last: bool = True) -> bytes:
    return struct.pack(">I", (LAST if last else 0) | len(body)) + body


def _closed_within(s: socket.socket, timeout_s: float) -> bool:
    """The gateway closed ``s`` (EOF or RST) within ``timeout_s``."""
    s.settimeout(timeout_s)
    try:
        while s.recv(65536):
            pass
        return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def _answers_null(s: socket.socket) -> rpc.ReplyHeader:
    """A NULL call on ``s``: its reply header (the connection still serves)."""
    c = BlockingRpcClient(sock=s, timeout_s=2.0)
    hdr, _ = c.call_raw(nfs3.PROGRAM, nfs3.VERSION, 0)
    return hdr


def _reply_to(s: socket.socket, timeout_s: float = 1.0) -> bytes | None:
    """The next reply record on ``s``, or None if none comes within ``timeout_s``."""
    s.settimeout(timeout_s)
    buf = b""
    try:
        while True:
            data = s.recv(65536)
            if not data:
                raise ConnectionError("closed")
            buf += data
            if len(buf) >= 4:
                n = struct.unpack(">I", buf[:4])[0] & ~LAST
                if len(buf) >= 4 + n:
                    return buf[4 : 4 + n]
    except TimeoutError:
        return None


def test_oversized_and_malformed_records(tmp_path: Path, tree: Path) -> None:
    with gateway(tmp_path, tree) as gw:
        good = GoodClient(gw)
        good.once()
        base_fds = fds(gw.pid)
        with good:
            # Past max_record: in one mark, in fragments adding up, a 2 GiB claim. Closed.
            oversized = {
                "one mark past max_record": struct.pack(">I", LAST | (DEFAULT_MAX_RECORD + 1))
                + b"\x00" * 1024,
                "a 2 GiB mark": struct.pack(">I", LAST | 0x7FFF_FFFF) + b"\x00" * 16,
                "fragments adding up": b"".join(
                    _record(b"\x00" * MiB, last=False) for _ in range(5)
                ),
            }
            t_closed = {}
            for what, payload in oversized.items():
                s = socket.create_connection(("127.0.0.1", gw.port), timeout=2)
                try:
                    t0 = time.monotonic()
                    with contextlib.suppress(ConnectionResetError, BrokenPipeError):
                        s.sendall(payload)
                    assert _closed_within(s, 2.0), what
                    t_closed[what] = time.monotonic() - t0
                finally:
                    s.close()
            # Records the stream survives: each is answered by the RPC rules or dropped,
            # and a NULL call after it on the same connection is answered.
            garbage = bytes((i * 37 + 11) % 256 for i in range(200))
            read_args = struct.pack(">I", 64) + b"\x01" * 30  # a handle cut short
            # What each is answered with: RFC 5531 §9, a call whose header or arguments do not
            # decode is answered GARBAGE_ARGS when its xid and CALL are there; anything less (no
            # xid, not a call) is dropped, the stream goes on (its framing is intact).
            cases: dict[str, tuple[bytes, str]] = {
                "3 bytes (no xid)": (_record(b"abc"), "dropped"),
                "xid and CALL only": (_record(struct.pack(">II", 0x1111, 0)), "GARBAGE_ARGS"),
                "a reply, not a call": (_record(struct.pack(">III", 0x2222, 1, 0)), "dropped"),
                "200 bytes of garbage": (_record(garbage), "dropped"),
                "READ with a truncated handle": (
                    _record(_call(0x3333, nfs3.PROGRAM, nfs3.VERSION, Nfs3Proc.READ, read_args)),
                    "GARBAGE_ARGS",
                ),
                "MOUNT MNT with no path": (
                    _record(_call(0x4444, mount3.PROGRAM, mount3.VERSION, 1)),
                    "GARBAGE_ARGS",
                ),
            }
            outcomes = {}
            for what, (payload, want) in cases.items():
                s = socket.create_connection(("127.0.0.1", gw.port), timeout=2)
                try:
                    s.sendall(payload)
                    reply = _reply_to(s, 0.5)
                    if reply is None:
                        outcomes[what] = "dropped"
                    else:
                        hdr = rpc.unpack_reply(Reader(reply))
                        stat = hdr.accept_stat or hdr.reject_stat or hdr.stat
                        outcomes[what] = stat.name
                    assert outcomes[what] == want, (what, outcomes[what])
                    hdr = _answers_null(s)
                    assert hdr.accept_stat == AcceptStat.SUCCESS, (what, hdr)
                finally:
                    s.close()
        print(
            "\nmalformed records:",
            {k: f"closed in {v * 1000:.0f} ms" for k, v in t_closed.items()},
            outcomes,
            f"good client {good.check(at_least=2)}",
        )
        wait_until(
            lambda: fds(gw.pid) <= base_fds + 2 or None, timeout_s=3, what="sockets released"
        )
        assert gauge(gw, "nfsgw_records_rejected_total") == len(oversized)


# --------------------------------------------------------- 4. a hostile HTTP backend


@dataclass
class S3Account:
    endpoint_url: str
    access_key: str = "AKIAHOSTILEPEERS0001"
    secret_key: str = field(default="hostile-peers-secret-key-00000000000000", repr=False)


async def _claim_1gib(w: asyncio.StreamWriter) -> None:
    """A ranged GET's 206 head claiming 1 GiB, a few bytes, then nothing."""
    w.write(b"HTTP/1.1 206 Partial Content\r\nContent-Length: %d\r\n\r\nfirst bytes" % GiB)
    await w.drain()
    await asyncio.sleep(20)


async def _claim_1gib_whole(w: asyncio.StreamWriter) -> None:
    w.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\nfirst bytes" % GiB)
    await w.drain()
    await asyncio.sleep(20)


async def _endless_headers(w: asyncio.StreamWriter) -> None:
    w.write(b"HTTP/1.1 200 OK\r\n")
    with contextlib.suppress(ConnectionError):
        for _ in range(20_000):  # 20 MB at most: stops by itself
            w.write(b"x-endless: yes\r\n" * 64)
            await w.drain()


async def _slow_body(w: asyncio.StreamWriter) -> None:
    """A head, then one byte every 20 ms: progress all along, never done in time."""
    w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10000\r\n\r\n")
    with contextlib.suppress(ConnectionError):
        for _ in range(1000):
            w.write(b"x")
            await w.drain()
            await asyncio.sleep(0.02)


BAD = {
    "big.bin": (bytes(6 * MiB), _claim_1gib),  # block GETs (ranged)
    "small.bin": (bytes(10_000), _claim_1gib_whole),  # one whole-object GET
    "headers.bin": (bytes(10_000), _endless_headers),
    "slow.bin": (bytes(10_000), _slow_body),
}
S3_RETRY = {"max_attempts": 2, "deadline_s": 4, "request_timeout_s": 1}


def _hostile_read(port: int, name: str) -> tuple[str, NfsStat3, float]:
    with BlockingRpcClient("127.0.0.1", port, timeout_s=15) as c:
        root = c.mnt(b"/s3").fhandle
        res = c.nfs(Nfs3Proc.LOOKUP, nfs3.Lookup3Args(Diropargs3(root, name.encode())))
        assert res.status == NfsStat3.NFS3_OK, (name, res.status)
        t0 = time.monotonic()
        offset = 2 * MiB if name == "big.bin" else 0
        got = c.nfs(Nfs3Proc.READ, nfs3.Read3Args(res.object, offset, 64 * 1024))
        return name, got.status, time.monotonic() - t0


def test_a_hostile_s3_backend_fails_its_reads_and_the_good_export_is_served(
    tmp_path: Path, tree: Path
) -> None:
    loop = LoopThread("hostile-s3").start()
    s3 = FakeS3("bucket", {f"ds/{k}": v[0] for k, v in BAD.items()})
    s3.hostile = {f"ds/{k}": v[1] for k, v in BAD.items()}
    loop.run(s3.start())
    try:
        account = S3Account(f"http://127.0.0.1:{s3.port}")
        s3x = {"path": "/s3", "backend": "s3://bucket/ds/", "read_only": True, "insecure": True}
        with gateway(
            tmp_path,
            tree,
            exports=[s3x],
            s3=account,
            s3_section={"region": "us-east-1", **S3_RETRY},
        ) as gw:
            good = GoodClient(gw)
            good.once()
            before = rss(gw.pid)
            with good, RssPeak(gw.pid) as peak:
                results: list[tuple[str, NfsStat3, float]] = []
                threads = [
                    threading.Thread(target=lambda n=n: results.append(_hostile_read(gw.port, n)))
                    for n in BAD
                ]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join(20)
            after = rss(gw.pid)
            outcomes = {n: (s.name, round(t, 2)) for n, s, t in results}
            print(
                f"\nhostile S3 READs: {outcomes}; RSS {(after - before) / MiB:+.1f} MiB "
                f"(peak {(peak.peak - before) / MiB:+.1f}); good client {good.check(at_least=4)}"
            )
            assert len(results) == len(BAD), outcomes
            for name, (status, took) in outcomes.items():
                assert status in ("NFS3ERR_IO", "NFS3ERR_JUKEBOX"), (name, status)
                assert took < S3_RETRY["deadline_s"] + 2.0, (name, took)
            assert outcomes["big.bin"][0] == "NFS3ERR_IO"  # refused at the head, at once
            assert outcomes["big.bin"][1] < 1.0
            assert abs(after - before) <= RSS_SLACK
            assert peak.peak - before <= RSS_SLACK
            lines = [
                json.loads(x) for x in gw.log_path.read_text().splitlines() if x.startswith("{")
            ]
            failed = [x for x in lines if x.get("event") == "call_failed"]
            assert any("claims a 1073741824-byte body" in str(x.get("error")) for x in failed), [
                (x.get("event"), x.get("error")) for x in failed
            ]
    finally:
        loop.run(s3.close())
        loop.close()
