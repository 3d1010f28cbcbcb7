"""One asyncio.Protocol per TCP connection: record framing, many calls in flight, replies out
of order, bounded in-flight, honoured write back-pressure.

Owns: bytes in, records to the dispatcher, reply buffers out. Must not: decode RPC or NFS (that
is ``dispatch``'s), or buffer without bound: at ``max_inflight`` calls the connection stops
reading; a record over ``max_record`` closes it (the stream cannot be resynchronised); a
partial record that makes no progress for ``stall_timeout_s`` while we are reading closes it
(bytes arriving are progress; time spent with reading paused by our own in-flight bound is
not the client's stall).

At a connection limit the listener makes room (``ConnectionTable.make_room``) by closing the
oldest connection that never had a call answered, else the one idle longest; ``close_idle``
closes connections idle past ``[server] idle_timeout_s`` (knfsd's rules: a full table or an
idle peer never locks real clients out).
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final, Protocol, cast

import structlog

from gateway.fastwire import record_reader
from gateway.settings import MiB, int_in, seconds, setting, size
from nfsproto.nfs3 import MAX_DATA
from nfsproto.rpc import RecordError, frame
from nfsproto.xdr import Buffer

log = structlog.get_logger(__name__)

# A record's largest legitimate size: a WRITE of the largest wsize the gateway can offer
# (gateway.registry.MAX_IO, 1 MiB: the Linux client's largest) plus the RPC and NFS headers
# around its data (an AUTH_SYS call's are under 1 KiB). knfsd's bound is the same: its
# largest payload plus a page or so.
RECORD_HEADROOM: Final = 64 << 10
DEFAULT_MAX_RECORD: Final = min(MAX_DATA, 1 << 20) + RECORD_HEADROOM


class LogBudget:
    """At most ``per_s`` lines a second for events a peer causes at will (a connection
    opened, closed): a flood of 10,000 connections would otherwise write 20,000 journal lines
    and spend the loop on rendering them. The first line after a suppressed stretch says how
    many were left out (``suppressed``)."""

    __slots__ = ("_left", "_second", "per_s", "suppressed")

    def __init__(self, per_s: int) -> None:
        self.per_s = per_s
        self._second = -1
        self._left = 0
        self.suppressed = 0

    def take(self) -> int | None:
        """None: leave this line out; else the lines left out before it (0 mostly)."""
        now = int(time.monotonic())
        if now != self._second:
            self._second, self._left = now, self.per_s
        if self._left <= 0:
            self.suppressed += 1
            return None
        self._left -= 1
        gone, self.suppressed = self.suppressed, 0
        return gone


_CONN_LOGS: Final = LogBudget(100)  # connection_opened/_closed/_idle_closed, per process


@dataclass(slots=True)
class Peer:
    host: str
    port: int
    local_port: int


# record -> reply buffers (None: send nothing)
CallHandler = Callable[[Buffer, Peer], Awaitable[list[Buffer] | None]]


class FastCalls(Protocol):
    """Answers some records synchronously in the receive callback (``gateway.fastpath``):
    the buffers of one complete reply record, or None (the record takes the ordinary path).
    ``session`` is called once per connection; what it returns is passed to ``answer``."""

    def session(self, peer: Peer) -> Any: ...

    def answer(self, record: Buffer, session: Any) -> list[Buffer] | None: ...


@dataclass(frozen=True, slots=True)
class TransportLimits:
    """Per-connection bounds; ``max_record`` and ``max_inflight`` are keys of the ``[server]``
    table of ``nfsgw.toml`` (declared here, ``gateway.settings``)."""

    max_record: int = field(
        default=DEFAULT_MAX_RECORD,
        metadata=setting(
            size(64 << 10, 64 * MiB),
            "largest RPC record (default: the largest wsize plus 64 KiB of headers); larger "
            "ones close the connection",
            flag="--max-record",
        ),
    )
    max_inflight: int = field(
        default=64,
        metadata=setting(
            int_in(1, 4096),
            "calls in flight per connection before it stops reading",
            key="max_inflight_per_conn",
            flag="--max-inflight",
        ),
    )
    record_deadline_s: float = field(
        default=30.0,
        metadata=setting(
            seconds(0.001),
            "seconds a record may take from its first byte to its last; a slower one closes "
            "its connection (a drip-fed record holds its bytes no longer)",
            flag="--record-deadline",
        ),
    )
    partial_record_budget: int = field(
        default=64 * MiB,
        metadata=setting(
            size(64 << 10, 1 << 40),
            "bytes all connections may hold in partial records; past it the connection with "
            "the oldest partial record is closed",
            flag="--partial-record-budget",
        ),
    )
    stall_timeout_s: float = 60.0


class ConnectionStats:
    """Shared counters across connections (read by metrics)."""

    __slots__ = (
        "bytes_in",
        "bytes_out",
        "closed",
        "inflight",
        "open",
        "opened",
        "oversized",
        "over_budget",
        "over_deadline",
        "partial_bytes",
    )

    def __init__(self) -> None:
        self.open = 0
        self.opened = 0
        self.closed = 0
        self.inflight = 0
        self.bytes_in = 0
        self.bytes_out = 0
        self.oversized = 0
        self.partial_bytes = 0  # held by partial records, all connections
        self.over_budget = 0  # connections closed: partial_record_budget
        self.over_deadline = 0  # connections closed: record_deadline_s


class RpcConnection(asyncio.Protocol):
    def __init__(
        self,
        handler: CallHandler,
        limits: TransportLimits,
        stats: ConnectionStats,
        connections: ConnectionTable,
        fast: FastCalls | None = None,
    ) -> None:
        self._handler = handler
        self._fast = fast
        self._session: Any = None
        self._limits = limits
        self._stats = stats
        self._connections = connections
        self._reader = record_reader(limits.max_record)  # C, or nfsproto's
        self._transport: asyncio.Transport | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        # Records decoded but not started: one read can carry many calls; only
        # ``max_inflight`` run at once, and reading pauses while any wait here.
        self._queue: collections.deque[Buffer] = collections.deque()
        self._paused_reading = False
        self._can_write = asyncio.Event()
        self._can_write.set()
        self._stall: asyncio.TimerHandle | None = None
        self._progress_at = 0.0  # loop time of the last bytes of a partial record
        self._partial = 0  # bytes of the partial record, as charged to stats.partial_bytes
        self.partial_since = 0.0  # loop time the partial record began
        self._closing = False
        self._draining = False
        self._out: list[Buffer] = []
        self._flush_scheduled = False
        self.peer = Peer("?", 0, 0)
        self.calls = 0
        self.answered = 0  # calls that got a reply: 0 = never carried a call we answered
        self.opened_at = 0.0  # loop times
        self.active_at = 0.0  # of the last record in or reply out
        # Called in ``connection_made`` once the peer is known: False closes the connection
        # at once (the listener's per-address cap).
        self.admit: Callable[[RpcConnection], bool] | None = None

    # ------------------------------------------------------------------ asyncio callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        pn = transport.get_extra_info("peername")
        sn = transport.get_extra_info("sockname")
        if isinstance(pn, tuple) and isinstance(sn, tuple):
            self.peer = Peer(str(pn[0]), int(pn[1]), int(sn[1]))
        else:  # a Unix socket: the link from another worker (gateway.forward)
            self.peer = Peer("local", 0, 0)
        self.opened_at = self.active_at = asyncio.get_running_loop().time()
        if self.admit is not None and not self._admitted():
            self._closing = True
            self._transport.abort()
            return
        if self._fast is not None:
            self._session = self._fast.session(self.peer)
        self._connections.add(self)
        self._stats.open += 1
        self._stats.opened += 1
        gone = _CONN_LOGS.take()
        if gone is not None:
            log.info(
                "connection_opened",
                client=self.peer.host,
                client_port=self.peer.port,
                local_port=self.peer.local_port,
                suppressed=gone or None,
            )

    def _admitted(self) -> bool:
        """The server's ``admit`` check; a check that fails closes the connection (logged),
        it never escapes into the event loop."""
        assert self.admit is not None
        try:
            return self.admit(self)
        except Exception:
            log.exception("connection_admit_failed", client=self.peer.host)
            return False

    def connection_lost(self, exc: Exception | None) -> None:
        if self not in self._connections:  # refused in connection_made: never counted
            return
        self._closing = True
        self._connections.discard(self)
        self._stats.partial_bytes -= self._partial
        self._partial = 0
        self._stats.open -= 1
        self._stats.closed += 1
        if self._stall is not None:
            self._stall.cancel()
        for t in self._tasks:
            t.cancel()
        self._queue.clear()
        self._can_write.set()
        gone = _CONN_LOGS.take()
        if gone is not None:
            log.info(
                "connection_closed",
                client=self.peer.host,
                client_port=self.peer.port,
                calls=self.calls,
                error=str(exc) if exc else None,
                suppressed=gone or None,
            )

    def data_received(self, data: bytes) -> None:
        self._stats.bytes_in += len(data)
        try:
            records = self._reader.feed(data)
        except RecordError as e:
            self._stats.oversized += 1
            log.warning("record_rejected", client=self.peer.host, error=str(e))
            self.abort()
            return
        if self._fast is not None and records and self._can_write.is_set():
            records = self._answer_fast(records)
        if records:
            self.active_at = asyncio.get_running_loop().time()
            self._queue.extend(records)
            self._start_queued()
        self._arm_stall_timer()
        self._charge_partial()

    def _charge_partial(self) -> None:
        """Charge the partial record to the shared budget; past it, close the connection
        whose partial record is oldest (this one, or another)."""
        pending = self._reader.pending_bytes() if not self._closing else 0
        if pending and not self._partial:
            self.partial_since = asyncio.get_running_loop().time()
        st = self._stats
        st.partial_bytes += pending - self._partial
        self._partial = pending
        while st.partial_bytes > self._limits.partial_record_budget:
            held = [c for c in self._connections if c._partial and not c._closing]
            if not held:
                return
            oldest = min(held, key=lambda c: c.partial_since)
            st.over_budget += 1
            log.warning(
                "record_over_budget",
                client=oldest.peer.host,
                pending=oldest._partial,
                held=st.partial_bytes,
                budget=self._limits.partial_record_budget,
            )
            st.partial_bytes -= oldest._partial
            oldest._partial = 0
            oldest.abort()

    def _answer_fast(self, records: list[Buffer]) -> list[Buffer]:
        """Answer what the fast path can, all in one ``writelines``; the rest, in order."""
        fast = self._fast
        assert fast is not None
        session = self._session
        out: list[Buffer] = []
        rest: list[Buffer] = []
        for rec in records:
            reply = fast.answer(rec, session)
            if reply is None:
                rest.append(rec)
            else:
                out += reply
                self.calls += 1
                if not self.answered:
                    self._connections.answered(self)
                self.answered += 1
        if out and self._transport is not None and not self._closing:
            n = 0
            for b in out:
                n += len(b)
            self._stats.bytes_out += n
            self._transport.writelines(out)
        return rest

    def pause_writing(self) -> None:
        self._can_write.clear()

    def resume_writing(self) -> None:
        self._can_write.set()

    # ------------------------------------------------------------------ calls

    def _start_queued(self) -> None:
        loop = asyncio.get_running_loop()
        while self._queue and len(self._tasks) < self._limits.max_inflight and not self._closing:
            record = self._queue.popleft()
            self.calls += 1
            self._stats.inflight += 1
            task = loop.create_task(self._run_call(record))
            self._tasks.add(task)
            task.add_done_callback(self._call_done)
        busy = bool(self._queue) or len(self._tasks) >= self._limits.max_inflight
        if self._transport is None or self._closing:
            return
        if busy and not self._paused_reading:
            self._transport.pause_reading()
            self._paused_reading = True
        elif not busy and self._paused_reading and not self._draining:
            self._transport.resume_reading()
            self._paused_reading = False
            # A partial record waited while we did not read: its stall clock starts again.
            self._progress_at = self.partial_since = asyncio.get_running_loop().time()

    async def _run_call(self, record: Buffer) -> None:
        reply = await self._handler(record, self.peer)
        if reply is None or self._closing:
            return
        if not self.answered:
            self._connections.answered(self)
        self.answered += 1
        self.active_at = asyncio.get_running_loop().time()
        if not self._can_write.is_set():
            await self._can_write.wait()
        if self._closing or self._transport is None:
            return
        bufs = frame(reply)
        for b in bufs:
            self._stats.bytes_out += len(b)
        # Replies finished in the same loop iteration go out in one writelines (one send
        # instead of one per reply: the syscall dominated the cost of a cached GETATTR).
        self._out.extend(bufs)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        out, self._out = self._out, []
        if out and self._transport is not None and not self._closing:
            self._transport.writelines(out)

    def _call_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._stats.inflight -= 1
        if not task.cancelled() and task.exception() is not None:
            # dispatch maps every error to a reply; reaching here is a bug: close the connection
            log.error("call_task_failed", client=self.peer.host, exc_info=task.exception())
            self.abort()
            return
        self._start_queued()

    # ------------------------------------------------------------------ stalls and shutdown

    def _arm_stall_timer(self) -> None:
        """Called after every read. A timer runs while a partial record is pending; bytes
        arriving move its deadline (one timer per stall period, not one per read: a busy
        connection whose reads rarely end on a record boundary is making progress, not
        stalling)."""
        if self._reader.pending_bytes() == 0:
            if self._stall is not None:
                self._stall.cancel()
                self._stall = None
            return
        loop = asyncio.get_running_loop()
        self._progress_at = loop.time()
        if self._stall is None:
            first = min(self._limits.stall_timeout_s, self._limits.record_deadline_s)
            self._stall = loop.call_later(first, self._stalled)

    def _stalled(self) -> None:
        self._stall = None
        if self._closing or not self._reader.pending_bytes():
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        late = now - self.partial_since >= self._limits.record_deadline_s
        if late and self._partial and not self._paused_reading:
            self._stats.over_deadline += 1
            log.warning("record_too_slow", client=self.peer.host, pending=self._partial)
            self.abort()
            return
        idle = now - self._progress_at
        if self._paused_reading or idle < self._limits.stall_timeout_s:
            # Progress since the timer was set, or we are the ones not reading: check again
            # when the record could first count as stalled.
            wait = self._limits.stall_timeout_s - (0.0 if self._paused_reading else idle)
            if self._partial:
                wait = min(wait, self.partial_since + self._limits.record_deadline_s - now)
            wait = max(wait, 0.001)
            self._stall = loop.call_later(wait, self._stalled)
            return
        log.warning("record_stalled", client=self.peer.host, pending=self._reader.pending_bytes())
        self.abort()

    @property
    def idle(self) -> bool:
        """No call running or queued, no partial record and nothing unsent."""
        if self._tasks or self._queue or self._out or self._reader.pending_bytes():
            return False
        t = self._transport
        return t is None or t.get_write_buffer_size() == 0

    @property
    def closing(self) -> bool:
        return self._closing

    def abort(self) -> None:
        self._closing = True
        self._connections.retire(self)
        if self._transport is not None:
            self._transport.abort()

    def close(self) -> None:
        """Graceful: stop reading, let in-flight calls finish, then close."""
        if self._transport is not None and not self._closing:
            self._transport.pause_reading()
            self._paused_reading = True
            self._draining = True

    async def drain(self) -> None:
        while self._tasks:
            await asyncio.wait(set(self._tasks))
        if self._transport is not None:
            self._transport.close()


class ConnectionTable:
    """The open connections of a listener (or of several sharing one bound): in the order
    they opened, by peer address, and those that never had a call answered, so that a new
    connection at a limit finds whom to close without scanning the table (an accept stays
    constant-time under a flood of 10,000 idle connections). A connection leaves the
    address index and the never-answered list once it is closing (``retire``), though it
    stays counted until its transport is gone (``discard``)."""

    __slots__ = ("_all", "_by_host", "_never")

    def __init__(self) -> None:
        self._all: dict[RpcConnection, None] = {}
        self._never: dict[RpcConnection, None] = {}  # opening order
        self._by_host: dict[str, dict[RpcConnection, None]] = {}

    def add(self, conn: RpcConnection) -> None:
        self._all[conn] = None
        if not conn.answered:
            self._never[conn] = None
        self._by_host.setdefault(conn.peer.host, {})[conn] = None

    def retire(self, conn: RpcConnection) -> None:
        """``conn`` is closing: no longer a candidate, no longer counted for its address."""
        self._never.pop(conn, None)
        same = self._by_host.get(conn.peer.host)
        if same is not None:
            same.pop(conn, None)
            if not same:
                del self._by_host[conn.peer.host]

    def discard(self, conn: RpcConnection) -> None:
        self._all.pop(conn, None)
        self.retire(conn)

    def answered(self, conn: RpcConnection) -> None:
        """``conn`` had its first call answered."""
        self._never.pop(conn, None)

    def from_host(self, host: str) -> Collection[RpcConnection]:
        """The open (not closing) connections from ``host``, oldest first."""
        return self._by_host.get(host, {}).keys()

    def __len__(self) -> int:
        return len(self._all)

    def __iter__(self) -> Iterator[RpcConnection]:
        return iter(self._all)

    def __contains__(self, conn: object) -> bool:
        return conn in self._all

    def make_room(self, host: str | None = None) -> RpcConnection | None:
        """The connection to close so a new one fits (from ``host`` only, or any): the
        oldest that never had a call answered, else the one idle longest; None when every
        one is busy (the new one is refused). The first is found in constant time; the
        second scans (every connection then carried a call: at most the limit's count)."""
        pool = self._never if host is None else self._by_host.get(host, {})
        for c in pool:
            if not c.answered and not c.closing:
                return c
            if host is None:
                break  # the list's head is never a closing or answered one
        idle = [c for c in (self._all if host is None else pool) if c.idle and not c.closing]
        return min(idle, key=lambda c: c.active_at) if idle else None


def close_idle(connections: Iterable[RpcConnection], now: float, idle_timeout_s: float) -> int:
    """Abort the connections idle for ``idle_timeout_s`` (loop time ``now``); how many."""
    stale = [
        c for c in connections if not c.closing and c.idle and now - c.active_at >= idle_timeout_s
    ]
    for c in stale:
        gone = _CONN_LOGS.take()
        if gone is not None:
            log.info(
                "connection_idle_closed",
                client=c.peer.host,
                client_port=c.peer.port,
                suppressed=gone or None,
            )
        c.abort()
    return len(stale)
