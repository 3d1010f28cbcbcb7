"""Calls for read-write exports go to one owner worker; everything else is served where it lands.

Owns: the routing decision of a worker process (``gateway.ops.workers`` runs several behind one
SO_REUSEPORT port), the link that carries a routed call to the owner and its reply back, and the
owner's side of that link.

Why route: writes are staged in the serving process (``gateway.writes``: spool files, the write
verifier, per-file locks, the DRC) and directory indexes are per process. The Linux client with
``nconnect=4`` spreads one file's WRITEs and its COMMIT over four connections, which the kernel
spreads over the workers; a COMMIT in one worker would not see WRITEs staged in another, and a
READ in a third would not see the file at all. So every NFS call on a read-write export is
served by worker 0 (the owner): the same results as one process, at the price of one extra hop
(a Unix socket, ~20-40 µs of CPU on each side) and one core for read-write exports. Read-only
exports (training data) are served by every worker, with no extra cost: the routing decision is
made only when the process has a read-write export at all, and then costs one header decode.

Every NFSv3 procedure but NULL starts with a file handle whose bytes 2..3 are the export id
(``gateway.namespace.handles``); MOUNT and PORTMAP calls are stateless and served locally.

Link format: each routed call is one RPC record on a Unix stream socket (the same framing as
the client's TCP connection, so ``transport.RpcConnection`` serves the owner's end with its
bounds): ``tag (u32) | host length (u8) | host | port (u16) | local port (u16) | the client's
record``; the reply record is ``tag (u32) | the reply`` (just the tag: no reply). The client's
address travels with the call, so the owner applies export rules and keys its duplicate-request
cache by the real client. If the owner cannot be reached (restarting after a crash), or dies
with the call in flight, the call is answered NFS3ERR_JUKEBOX: the client retries after a delay,
by which time the supervisor has started a new owner.

Must not: decode NFS arguments beyond the first handle, or keep per-client state.
"""

from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import structlog

from gateway.dispatch import Dispatcher
from gateway.registry import Gateway
from gateway.transport import (
    CallHandler,
    ConnectionStats,
    ConnectionTable,
    Peer,
    RpcConnection,
    TransportLimits,
)
from nfsproto import nfs3, rpc
from nfsproto.nfs3 import NfsStat3
from nfsproto.rpc import RecordError, RecordReader, frame
from nfsproto.xdr import Buffer, Reader, Writer, XdrError

log = structlog.get_logger(__name__)

_TAG = struct.Struct(">I")
_PORTS = struct.Struct(">HH")
CONNECT_TIMEOUT_S: Final = 2.0
# Calls routed at once per worker; more wait for a slot (the client's own connection bounds
# how many it sends us, this bounds what one worker can queue at the owner).
MAX_ROUTED_INFLIGHT: Final = 1024


def export_id_of(record: Buffer) -> int | None:
    """The export id named by an NFSv3 call's first handle, or None (not NFSv3, NULL, or no
    readable handle: the local dispatcher answers those with the right error)."""
    r = Reader(record)
    try:
        hdr = rpc.unpack_call(r)
        if hdr.prog != nfs3.PROGRAM or hdr.vers != nfs3.VERSION or hdr.proc == 0:
            return None
        fh = r.opaque(nfs3.NFS3_FHSIZE)
    except (rpc.RpcDecodeError, XdrError):
        return None
    if len(fh) < 4:
        return None
    return int.from_bytes(fh[2:4], "big")


def jukebox_reply(dispatcher: Dispatcher, record: Buffer) -> list[Buffer] | None:
    """NFS3ERR_JUKEBOX for a call we could not route, built like any failure reply: the
    procedure's bare failure result from its status (``Procedure.fail_body``)."""
    r = Reader(record)
    try:
        hdr = rpc.unpack_call(r)
    except rpc.RpcDecodeError:
        return None
    versions = dispatcher.programs.get(hdr.prog)
    proc = versions.versions.get(hdr.vers, {}).get(hdr.proc) if versions else None
    if proc is None or proc.fail_body is None:
        return None
    w = Writer()
    rpc.pack_accepted_reply(w, hdr.xid, rpc.AcceptStat.SUCCESS)
    proc.pack_res(w, proc.fail_body(NfsStat3.NFS3ERR_JUKEBOX))
    return w.buffers()


@dataclass(slots=True)
class RouteStats:
    """Calls a worker passed to the owner, and those answered JUKEBOX because the owner could
    not be reached or went away with the call (read by ``gateway.ops.metrics``)."""

    routed: int = 0
    link_down: int = 0


class LinkDown(Exception):
    """The owner could not be reached, or went away before answering."""


class OwnerLink:
    """A worker's connection to the owner: multiplexes routed calls by tag; reconnects on
    demand; answers JUKEBOX for calls it cannot deliver or that lose their connection."""

    def __init__(self, path: Path, max_record: int, stats: RouteStats | None = None) -> None:
        self.path = path
        self.max_record = max_record
        self.stats = stats or RouteStats()
        self._next_tag = 0
        self._pending: dict[int, asyncio.Future[list[Buffer] | None]] = {}
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._connecting: asyncio.Lock = asyncio.Lock()
        self._slots = asyncio.Semaphore(MAX_ROUTED_INFLIGHT)
        self._closed = False

    async def call(self, record: Buffer, peer: Peer) -> list[Buffer] | None:
        """The owner's reply to ``record`` (None: it sends none). Raises ``LinkDown``."""
        async with self._slots:
            try:
                w = await self._connected()
            except (OSError, TimeoutError) as e:
                self.stats.link_down += 1
                log.warning("owner_unreachable", socket=str(self.path), error=str(e))
                raise LinkDown(str(e)) from None
            self._next_tag = (self._next_tag + 1) & 0xFFFFFFFF
            tag = self._next_tag
            fut: asyncio.Future[list[Buffer] | None] = asyncio.get_running_loop().create_future()
            self._pending[tag] = fut
            host = peer.host.encode()[:255]
            head = (
                _TAG.pack(tag)
                + bytes((len(host),))
                + host
                + _PORTS.pack(peer.port & 0xFFFF, peer.local_port & 0xFFFF)
            )
            w.writelines(frame([head, record]))
            self.stats.routed += 1
            try:
                # Back-pressure: a slow owner stops this worker's writes at the transport's
                # high-water mark, not at MAX_ROUTED_INFLIGHT records of buffered bytes.
                await w.drain()
                reply = await fut
            except (ConnectionError, OSError):
                reply = _LOST  # the link broke while we wrote
            finally:
                self._pending.pop(tag, None)
            if reply is _LOST:
                self.stats.link_down += 1
                raise LinkDown("the owner went away with the call in flight")
            return reply

    async def _connected(self) -> asyncio.StreamWriter:
        if self._writer is not None and not self._writer.is_closing():
            return self._writer
        async with self._connecting:
            if self._writer is not None and not self._writer.is_closing():
                return self._writer
            if self._closed:
                raise ConnectionError("link closed")
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                reader, writer = await asyncio.open_unix_connection(str(self.path))
            self._writer = writer
            self._reader_task = asyncio.get_running_loop().create_task(self._read(reader))
            return writer

    async def _read(self, reader: asyncio.StreamReader) -> None:
        records = RecordReader(self.max_record + 4096)
        try:
            while True:
                data = await reader.read(1 << 16)
                if not data:
                    break
                for rec in records.feed(data):
                    if len(rec) < 4:
                        continue
                    (tag,) = _TAG.unpack_from(rec)
                    fut = self._pending.get(tag)
                    if fut is not None and not fut.done():
                        body = bytes(rec[4:])
                        fut.set_result([body] if body else None)
        except (OSError, RecordError) as e:
            log.warning("owner_link_broken", error=str(e))
        finally:
            if self._writer is not None:
                self._writer.close()
            self._writer = None
            for fut in self._pending.values():
                if not fut.done():
                    fut.set_result(_LOST)

    async def close(self) -> None:
        self._closed = True
        if self._writer is not None:
            self._writer.close()
        if self._reader_task is not None:
            self._reader_task.cancel()
            await asyncio.gather(self._reader_task, return_exceptions=True)


_LOST: Final[list[Buffer]] = []  # sentinel: the link died with the call in flight


class Router:
    """The call handler of a worker that is not the owner: read-write exports go over the
    link, everything else to the local dispatcher."""

    def __init__(self, dispatcher: Dispatcher, gateway: Gateway, link: OwnerLink) -> None:
        self.dispatcher = dispatcher
        self.gateway = gateway
        self.link = link

    async def handle(self, record: Buffer, peer: Peer) -> list[Buffer] | None:
        if not self._routed(record):
            return await self.dispatcher.handle(record, peer)
        try:
            return await self.link.call(record, peer)
        except LinkDown:
            return jukebox_reply(self.dispatcher, record)

    def _routed(self, record: Buffer) -> bool:
        exports = self.gateway.exports
        if all(e.cfg.read_only for e in exports.values()):
            return False
        eid = export_id_of(record)
        if eid is None:
            return False
        export = exports.get(eid)
        return export is not None and not export.cfg.read_only


def owner_handler(local: CallHandler) -> CallHandler:
    """The owner's end of the link: unwrap the tag and the client's address, dispatch as if
    the call had arrived on the client's own connection, tag the reply."""

    async def handle(record: Buffer, _link_peer: Peer) -> list[Buffer] | None:
        mv = memoryview(record)
        try:
            tag_b = bytes(mv[:4])
            n = mv[4]
            host = bytes(mv[5 : 5 + n]).decode(errors="replace")
            port, local_port = _PORTS.unpack_from(mv, 5 + n)
            call = mv[5 + n + _PORTS.size :]
        except (IndexError, struct.error, ValueError):
            log.warning("owner_link_garbage", length=len(mv))
            return None
        reply = await local(call, Peer(host, port, local_port))
        return [tag_b, *(reply or ())]

    return handle


async def serve_owner_link(
    path: Path,
    local: CallHandler,
    limits: TransportLimits,
    connections: ConnectionTable,
    stats: ConnectionStats | None = None,
) -> asyncio.Server:
    """Listen on ``path`` for routed calls (the owner worker). The link's records carry a
    small header on top of the client's record, and each link carries many clients' calls:
    the limits are the client limits with room for both."""
    link_limits = TransportLimits(
        max_record=limits.max_record + 512,
        max_inflight=MAX_ROUTED_INFLIGHT,
        stall_timeout_s=limits.stall_timeout_s,
        record_deadline_s=limits.record_deadline_s,
        partial_record_budget=limits.partial_record_budget,
    )
    handler = owner_handler(local)
    st = stats or ConnectionStats()

    def factory() -> asyncio.Protocol:
        return RpcConnection(handler, link_limits, st, connections)

    await asyncio.to_thread(path.unlink, True)  # a previous owner's socket
    return await asyncio.get_running_loop().create_unix_server(factory, str(path))
