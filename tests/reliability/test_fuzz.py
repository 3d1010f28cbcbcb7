"""In-process fuzzing, for breadth: record framing (``RecordReader``), the call header and
credentials, every procedure's argument decoding and the dispatcher's one mapping site, and
the transport's stall rule.

The in-memory gateway (``tests.harness.memory``) runs on a loop thread; records go straight
to its dispatcher (no sockets, tens of thousands of cases in seconds). Every record gets
exactly the outcome ``rpcfuzz.expected`` derives from RFC 5531 and the gateway's rules (no
reply, an RPC error, an auth error, or a result that decodes completely), within a bound (a
hung call fails the test), and no call ever ends in NFS3ERR_SERVERFAULT (a handler crash).
``NFSGW_FUZZ_CASES`` scales the mutation count (CI: 50,000).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import struct
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.exports import ExportConfig
from gateway.transport import ConnectionStats, ConnectionTable, Peer, RpcConnection, TransportLimits
from nfsproto import mount3, nfs3, rpc
from nfsproto.nfs3 import Nfs3Proc
from nfsproto.rpc import LAST_FRAGMENT, AuthStat, RecordError, RecordReader
from nfsproto.xdr import Writer
from tests.harness.memory import MemoryGateway
from tests.harness.thread import LoopThread
from tests.reliability.rpcfuzz import (
    Handles,
    Mutator,
    check_reply,
    credential_cases,
    expected,
    grows_file_far,
    make_call,
    raw_cred_call,
    seed_calls,
)
from tests.unit.nfsproto.strategies_nfs3 import ARGS

CASES = int(os.environ.get("NFSGW_FUZZ_CASES", "50000"))
CALL_BOUND_S = 10.0


class Target:
    """The in-memory gateway on its loop thread, its handles, and a blocking ``dispatch``."""

    def __init__(self, loop: LoopThread, gw: MemoryGateway) -> None:
        self.loop = loop
        self.gw = gw
        self.handles: Handles | None = None

    def dispatch(self, record: bytes) -> bytes | None:
        async def go() -> bytes | None:
            async with asyncio.timeout(CALL_BOUND_S):
                return await self.gw.record(record)

        return self.loop.run(go(), timeout=CALL_BOUND_S + 5)

    def mount(self, path: bytes) -> bytes:
        return self.loop.run(self.gw.mount(path))

    def walk(self, d: bytes, path: str) -> bytes:
        return self.loop.run(self.gw.walk(d, path))


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    tmp: Path = tmp_path_factory.mktemp("fuzz")
    files = {f"data/d/f{i}.bin": bytes([i]) * (100 * i + 1) for i in range(10)}
    files["data/d/sub/x"] = b"x"
    files["rw/file.bin"] = b"0123456789"
    # The mutated calls carry AUTH_NONE as well as AUTH_SYS: both exports list it (the
    # default, sec = ["sys"], answers AUTH_NONE with AUTH_TOOWEAK: tests/unit/ops/test_defaults)
    both = ("sys", "none")
    exports = [
        ExportConfig("/data", "s3://b/data/", read_only=True, sec=both),
        ExportConfig("/rw", "s3://b/rw/", squash="none", sec=both),
    ]
    loop = LoopThread("fuzz").start()
    gw = MemoryGateway.of(tmp, exports, files=files)
    loop.run(gw.__aenter__())
    t = Target(loop, gw)
    try:
        root = t.mount(b"/data")
        d = t.walk(root, "d")
        rw_root = t.mount(b"/rw")
        t.handles = Handles(root, d, t.walk(d, "f3.bin"), rw_root, t.walk(rw_root, "file.bin"))
        yield t
        crashes = {k: v for k, v in gw.statuses().items() if "SERVERFAULT" in k[1]}
        assert not crashes, f"handler crashes (NFS3ERR_SERVERFAULT): {crashes}"
    finally:
        try:
            loop.run(gw.__aexit__(None, None, None))
        finally:
            loop.close()


def _seeds(t: Target, *, auth_none: bool = False) -> list[bytes]:
    """Every procedure's valid call with AUTH_SYS (and with AUTH_NONE: mutations then land
    in the arguments more often than in a 28-byte credential)."""
    assert t.handles is not None
    creds = [None, rpc.NULL_AUTH] if auth_none else [None]
    return [
        make_call(0x100 + i, prog, vers, proc, args, cred)
        for cred in creds
        for i, (prog, vers, proc, args) in enumerate(seed_calls(t.handles))
    ]


def _judge(t: Target, record: bytes) -> str | None:
    want = expected(record)
    try:
        reply = t.dispatch(record)
    except TimeoutError:
        return f"no answer within {CALL_BOUND_S} s (a hung call)"
    err = check_reply(want, reply)
    return None if err is None else f"{err} (expected {want.kind})"


# --------------------------------------------------------------------------- dispatch


def test_every_seed_call_is_served(target: Target) -> None:
    seeds = _seeds(target)
    assert len(seeds) == 22 + 6 + 4
    for rec in seeds:
        assert expected(rec).kind == "SUCCESS"
        assert _judge(target, rec) is None, rec[:40].hex()


def test_mutated_calls_get_their_rpc_outcome(target: Target) -> None:
    """``CASES`` mutations of valid calls of every procedure, plus random records. Calls
    that would grow a file past 64 MiB (a mutated WRITE offset or SETATTR size) are left
    out: the write path materialises the hole as zeros in the object store, which is
    correct and takes minutes for a mutated 2 GiB offset (docs/reliability.md)."""
    m = Mutator(20240611, _seeds(target, auth_none=True))
    failures: list[str] = []
    kinds: Counter[str] = Counter()
    for i in range(CASES):
        rec = m.random_bytes() if i % 10 == 9 else m.record()
        if grows_file_far(rec):
            # legal, and slow by design: the write path uploads the hole as zeros
            kinds["skipped: file grown past 64 MiB"] += 1
            continue
        kinds[expected(rec).kind] += 1
        err = _judge(target, rec)
        if err is not None:
            failures.append(f"{rec.hex()}: {err}")
            if len(failures) >= 10:
                break
    assert not failures, "\n".join(failures)
    print(f"\nfuzzed {CASES} records in-process: {dict(kinds)}")
    # the mutations reach every outcome class, not just garbage
    for k in ("drop", "SUCCESS", "GARBAGE_ARGS", "PROC_UNAVAIL", "PROG_UNAVAIL", "auth"):
        assert kinds[k] > 0, kinds


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=300))
def test_random_records(target: Target, data: bytes) -> None:
    assert _judge(target, data) is None


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_well_typed_arguments_of_every_procedure(target: Target, data: st.DataObject) -> None:
    """Arguments of every type the codecs know (random handles, names, offsets, counts,
    sattr3 arms), optionally truncated: a decodable result or GARBAGE_ARGS, never a crash."""
    name = data.draw(st.sampled_from(sorted(ARGS)))
    proc = Nfs3Proc[name.upper()]
    args = data.draw(ARGS[name])
    w = Writer()
    nfs3.PROCS[proc].pack_args(w, args)
    raw = w.getvalue()
    cut = data.draw(st.integers(0, len(raw)))
    rec = make_call(data.draw(st.integers(0, 2**32 - 1)), nfs3.PROGRAM, 3, proc, raw[:cut])
    assert _judge(target, rec) is None


def test_credentials_at_and_past_their_limits(target: Target) -> None:
    """AUTH_SYS with 16/17 gids, 255/256-byte machine names, lying counts, trailing bytes;
    other flavours; credential and verifier bodies of 400 and 401 bytes."""
    assert target.handles is not None
    getattr_args = Writer()
    nfs3.pack_getattr3args(getattr_args, nfs3.Getattr3Args(target.handles.file))
    procs = [
        (nfs3.PROGRAM, 3, Nfs3Proc.GETATTR, getattr_args.getvalue()),
        (mount3.PROGRAM, 3, mount3.MountProc.MNT, b"\0\0\0\x05/data\0\0\0"),
    ]
    for name, cred, outcome in credential_cases():
        for prog, vers, proc, args in procs:
            rec = make_call(0xC0DE, prog, vers, proc, args, cred)
            want = expected(rec)
            got = want.auth_stat.name if want.kind == "auth" and want.auth_stat else "ok"
            assert got == outcome, (name, want)
            assert _judge(target, rec) is None, name
        # NULL accepts any flavour (RPCSEC_GSS probes it) but still rejects a bad AUTH_SYS
        rec = make_call(0xC0DF, nfs3.PROGRAM, 3, 0, b"", cred)
        assert _judge(target, rec) is None, name
    for flavor in (rpc.AuthFlavor.AUTH_NONE, rpc.AuthFlavor.AUTH_SYS):
        for body in (400, 401, 0x7FFFFFFF):
            rec = raw_cred_call(0xBEEF, nfs3.PROGRAM, 3, Nfs3Proc.FSINFO, flavor, body)
            want = expected(rec)
            if body > rpc.MAX_AUTH_BODY:
                assert want.kind == "auth" and want.auth_stat == AuthStat.AUTH_BADCRED
            assert _judge(target, rec) is None, (flavor, body)


# --------------------------------------------------------------------------- framing


def _mark(n: int, last: bool) -> bytes:
    return struct.pack(">I", (LAST_FRAGMENT if last else 0) | n)


@st.composite
def fragmented(draw: st.DrawFn) -> tuple[list[bytes], bytes]:
    """Records split into fragments (empty ones included), and the stream they make."""
    records = draw(st.lists(st.binary(max_size=200), min_size=1, max_size=6))
    stream = bytearray()
    for rec in records:
        cuts = sorted(draw(st.lists(st.integers(0, len(rec)), max_size=5)))
        pieces = [rec[a:b] for a, b in zip([0, *cuts], [*cuts, len(rec)], strict=True)]
        for i, p in enumerate(pieces):
            stream += _mark(len(p), i == len(pieces) - 1) + p
    return records, bytes(stream)


@settings(max_examples=500, deadline=None)
@given(fragmented(), st.lists(st.integers(1, 64), min_size=1, max_size=20))
def test_records_survive_any_fragmentation_and_chunking(
    case: tuple[list[bytes], bytes], chunks: list[int]
) -> None:
    records, stream = case
    r = RecordReader(max_record=4096)
    got: list[bytes] = []
    pos, i = 0, 0
    while pos < len(stream):
        n = chunks[i % len(chunks)]
        got += [bytes(x) for x in r.feed(stream[pos : pos + n])]
        # never more held than was fed, and never more than one record's worth
        assert r.pending_bytes() <= min(pos + n, 4096 + 4)
        pos, i = pos + n, i + 1
    assert got == records
    assert r.pending_bytes() == 0


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2000), st.integers(1, 512))
def test_random_streams_only_ever_raise_record_error(data: bytes, chunk: int) -> None:
    r = RecordReader(max_record=1000)
    fed = 0
    try:
        for i in range(0, len(data), chunk):
            r.feed(data[i : i + chunk])
            fed += min(chunk, len(data) - i)
            assert r.pending_bytes() <= min(fed, 1000 + 4)
    except RecordError:
        pass


def test_huge_marks_are_refused_before_any_allocation() -> None:
    for n in (4097, 0x7FFFFFFF):
        r = RecordReader(max_record=4096)
        with pytest.raises(RecordError):
            r.feed(_mark(n, True))
        # the same across fragments: 4096 then 1 more
        r = RecordReader(max_record=4096)
        r.feed(_mark(4096, False) + b"x" * 4096)
        with pytest.raises(RecordError):
            r.feed(_mark(1, True))
    r = RecordReader(max_record=4 << 20)
    r.feed(_mark(4 << 20, True))  # a 4 MiB claim: only what arrives is held
    assert r.pending_bytes() == 4  # a record has started (the stall rule applies to it)
    r.feed(b"abc")
    assert r.pending_bytes() == 4 + 3


def test_fragment_storms_cost_only_their_payload() -> None:
    """100,000 empty fragments, then 100,000 one-byte fragments, then the last one: one
    record, and the reader never holds more than the payload received."""
    r = RecordReader()
    empty = _mark(0, False) * 1000
    for _ in range(100):
        assert r.feed(empty) == []
        assert r.pending_bytes() == 4  # the first mark: a record has started
    one = (_mark(1, False) + b"z") * 1000
    for k in range(100):
        assert r.feed(one) == []
        assert r.pending_bytes() == 4 + 1000 * (k + 1)
    [rec] = r.feed(_mark(2, True) + b"!!")
    assert bytes(rec) == b"z" * 100_000 + b"!!"


# --------------------------------------------------------------------------- stall rule


class _Conn:
    """An RpcConnection on a real socket pair: the server end, its stats, and the client."""

    def __init__(self, limits: TransportLimits, handler_delay_s: float = 0.0) -> None:
        self.limits = limits
        self.delay = handler_delay_s
        self.stats = ConnectionStats()
        self.conns = ConnectionTable()

    async def handler(self, record: Any, peer: Peer) -> list[Any]:
        await asyncio.sleep(self.delay)
        return [bytes(record[:4]) + b"\0\0\0\x01\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0"]

    async def open(
        self,
    ) -> tuple[asyncio.AbstractServer, asyncio.StreamReader, asyncio.StreamWriter]:
        loop = asyncio.get_running_loop()
        srv = await loop.create_server(
            lambda: RpcConnection(self.handler, self.limits, self.stats, self.conns), "127.0.0.1", 0
        )
        port = srv.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        return srv, reader, writer


async def test_a_busy_connection_is_not_a_stalled_one() -> None:
    """Records arriving steadily, no read ending on a record boundary, for four stall
    periods: the connection stays open (it was closed after one period before the fix)."""
    c = _Conn(TransportLimits(stall_timeout_s=0.2))
    srv, _reader, writer = await c.open()
    rec = _mark(96, True) + b"n" * 96
    stream = rec * 400
    try:
        for i in range(40):  # 40 x 20 ms = 4 stall periods, 150 B per write
            writer.write(stream[i * 150 : (i + 1) * 150])
            await writer.drain()
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.05)
        assert c.stats.open == 1 and c.stats.closed == 0
    finally:
        writer.close()
        srv.close()


@pytest.mark.parametrize("partial", [_mark(100, True) + b"only part", _mark(100, True), b"\x80\0"])
async def test_a_stalled_record_closes_its_connection(partial: bytes) -> None:
    """Part of a record, a mark alone, part of a mark: closed after the stall timeout."""
    c = _Conn(TransportLimits(stall_timeout_s=0.2))
    srv, reader, writer = await c.open()
    try:
        writer.write(partial)
        await writer.drain()
        async with asyncio.timeout(10):
            assert await reader.read() == b""  # closed by the server
        assert c.stats.closed == 1
    finally:
        writer.close()
        srv.close()


async def test_our_own_back_pressure_is_not_the_clients_stall() -> None:
    """Reading paused at the in-flight bound (slow calls) with a partial record buffered for
    longer than the stall timeout: the connection survives and every call is answered."""
    c = _Conn(TransportLimits(max_inflight=2, stall_timeout_s=0.2), handler_delay_s=0.3)
    srv, reader, writer = await c.open()
    calls = [struct.pack(">I", i) + b"\0" * 36 for i in range(8)]
    stream = b"".join(_mark(len(x), True) + x for x in calls)
    try:
        writer.write(stream[:-10])  # the last record stays partial while the others run
        await writer.drain()
        await asyncio.sleep(0.5)
        writer.write(stream[-10:])
        await writer.drain()
        rr = RecordReader()
        got: list[bytes] = []
        async with asyncio.timeout(20):
            while len(got) < len(calls):
                data = await reader.read(65536)
                assert data, "connection closed"
                got += [bytes(x) for x in rr.feed(data)]
        assert sorted(x[:4] for x in got) == sorted(x[:4] for x in calls)
        assert c.stats.closed == 0
    finally:
        writer.close()
        srv.close()


async def test_partial_records_past_the_budget_close_the_oldest() -> None:
    """Eight connections each drip a record claiming 1 MiB, 100 KiB held each, against a
    budget of 256 KiB: the bytes held never pass the budget, the oldest partial records'
    connections are the ones closed, and a whole call on another connection is answered."""
    c = _Conn(TransportLimits(partial_record_budget=256 << 10, stall_timeout_s=30))
    loop = asyncio.get_running_loop()
    srv = await loop.create_server(
        lambda: RpcConnection(c.handler, c.limits, c.stats, c.conns), "127.0.0.1", 0
    )
    port = srv.sockets[0].getsockname()[1]
    socks = [await asyncio.open_connection("127.0.0.1", port) for _ in range(8)]
    try:
        peak = 0
        for _, w in socks:
            w.write(_mark(1 << 20, True) + b"p" * (100 << 10))
            await w.drain()
            seen, still = -1, 0
            while still < 10:  # until the server has read it all: bytes_in settles
                await asyncio.sleep(0.005)
                peak = max(peak, c.stats.partial_bytes)
                still = still + 1 if c.stats.bytes_in == seen else 0
                seen = c.stats.bytes_in
        assert peak <= 256 << 10 and c.stats.partial_bytes <= 256 << 10
        assert c.stats.over_budget == 6  # 100 KiB + 4 each: two fit
        closed = []
        for r, _ in socks:
            try:
                async with asyncio.timeout(0.2):
                    closed.append(await r.read(1) == b"")
            except TimeoutError:
                closed.append(False)
        assert closed == [True] * 6 + [False] * 2  # the oldest went first
        r, w = await asyncio.open_connection("127.0.0.1", port)
        call = struct.pack(">I", 7) + b"\0" * 36
        w.write(_mark(len(call), True) + call)
        async with asyncio.timeout(5):
            assert (await r.readexactly(4 + 24))[4:8] == struct.pack(">I", 7)
        w.close()
    finally:
        for _, w in socks:
            w.close()
        srv.close()


async def test_partial_records_past_the_deadline_close_their_connection() -> None:
    """A record dripped a few bytes every 50 ms (never stalled) is closed at the record
    deadline, not kept for as long as bytes keep coming."""
    c = _Conn(TransportLimits(record_deadline_s=0.3, stall_timeout_s=30))
    srv, reader, writer = await c.open()
    t0 = asyncio.get_running_loop().time()
    try:
        writer.write(_mark(1000, True))
        with contextlib.suppress(ConnectionError):
            for _ in range(40):  # 2 s of drip, if it were allowed
                writer.write(b"d" * 5)
                await writer.drain()
                await asyncio.sleep(0.05)
                if c.stats.over_deadline:
                    break
        async with asyncio.timeout(5):
            assert await reader.read() == b""
        took = asyncio.get_running_loop().time() - t0
        assert c.stats.over_deadline == 1 and c.stats.closed == 1 and 0.25 <= took < 1.5
        assert c.stats.partial_bytes == 0
    finally:
        writer.close()
        srv.close()
