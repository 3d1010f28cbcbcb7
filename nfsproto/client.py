"""The client side of ONC RPC v2 over TCP (RFC 5531), sans-I/O: the one core every RPC client
of the project is built on (the gateway's rpcbind registration, the load generator's NFS
client, the tests' clients).

Owns: fresh xids, encoding and record-marking calls (§11), reassembling the reply stream with
``RecordReader``, matching replies to the calls still waiting by xid, and decoding a reply
into the procedure's result or an ``RpcError`` (MSG_DENIED, or MSG_ACCEPTED with anything but
SUCCESS). Must not: do I/O, read clocks or import anything outside nfsproto; the glues (an
asyncio one in ``gateway.rpcclient``, a blocking one in the tests) own the socket and waiting.

    core = RpcClientCore[Waiter](rpc.auth_sys(0, 0))
    xid, out = core.call(waiter, prog, vers, proc, pack_args, args)   # write ``out``
    for waiter, record in core.receive(data):                         # bytes read
        result = decode_result(record, unpack_res)                    # or RpcError

A waiter is whatever the glue wants back with the reply (a future, the xid). Several calls
may wait at once; replies may come in any order; a reply whose xid waits for nothing (the
caller gave up: ``forget``) is dropped and counted in ``unmatched``.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Generic, TypeVar

from nfsproto import rpc
from nfsproto.xdr import Buffer, Reader, Writer

__all__ = ["RpcClientCore", "RpcError", "decode_reply", "decode_result"]

W = TypeVar("W")
T = TypeVar("T")
A = TypeVar("A")


class RpcError(Exception):
    """The server did not run the procedure: the reply was MSG_DENIED (``reject_stat``,
    ``auth_stat``) or accepted with an ``accept_stat`` other than SUCCESS."""

    def __init__(self, header: rpc.ReplyHeader) -> None:
        if header.stat == rpc.ReplyStat.MSG_ACCEPTED:
            why = header.accept_stat.name if header.accept_stat is not None else "?"
        elif header.reject_stat == rpc.RejectStat.AUTH_ERROR and header.auth_stat is not None:
            why = f"AUTH_ERROR {header.auth_stat.name}"
        else:
            why = header.reject_stat.name if header.reject_stat is not None else "?"
        super().__init__(f"rpc call {header.xid:#x} failed: {why}")
        self.header = header


def decode_reply(record: Buffer) -> tuple[rpc.ReplyHeader, Reader]:
    """A reply record's header and a Reader at what follows it (the results for SUCCESS).
    A malformed header raises ``XdrError``."""
    r = Reader(record)
    return rpc.unpack_reply(r), r


def decode_result(record: Buffer, unpack_res: Callable[[Reader], T]) -> T:
    """The procedure's result from a reply record; ``RpcError`` when the server did not run
    the procedure, ``XdrError`` when the reply is malformed or longer than its result."""
    r = Reader(record)
    h = rpc.unpack_reply(r)
    if h.accept_stat != rpc.AcceptStat.SUCCESS:
        raise RpcError(h)
    res = unpack_res(r)
    r.done()
    return res


class RpcClientCore(Generic[W]):
    """One connection's client state: the default credential, the xid sequence, the calls
    waiting for a reply and the reply stream's reassembly."""

    __slots__ = ("_pending", "_records", "_xid", "cred", "unmatched")

    def __init__(
        self,
        cred: rpc.OpaqueAuth = rpc.NULL_AUTH,
        *,
        max_record: int = rpc.DEFAULT_MAX_RECORD,
        first_xid: int | None = None,
    ) -> None:
        self.cred = cred
        # A random start, so a reconnecting client's new calls are not mistaken for the old
        # ones by a server's duplicate-request cache.
        self._xid = secrets.randbits(24) << 8 if first_xid is None else first_xid
        self._pending: dict[int, W] = {}
        self._records = rpc.RecordReader(max_record)
        self.unmatched = 0

    def __len__(self) -> int:
        """Calls waiting for their reply."""
        return len(self._pending)

    def _next_xid(self) -> int:
        xid = self._xid & 0xFFFFFFFF
        while xid in self._pending:  # after 2**32 calls, skip a call still waiting
            xid = (xid + 1) & 0xFFFFFFFF
        self._xid = xid + 1
        return xid

    def call(
        self,
        waiter: W,
        prog: int,
        vers: int,
        proc: int,
        pack_args: Callable[[Writer, A], None],
        args: A,
        cred: rpc.OpaqueAuth | None = None,
    ) -> tuple[int, list[Buffer]]:
        """Encode a call under a fresh xid and register ``waiter`` for its reply. Returns the
        xid and the record-marked buffers to send (``Writer.raw`` packs encoded args)."""
        xid = self._next_xid()
        w = Writer()
        rpc.pack_call(w, xid, prog, vers, proc, self.cred if cred is None else cred)
        pack_args(w, args)
        out = rpc.frame(w.buffers())
        self._pending[xid] = waiter
        return xid, out

    def forget(self, xid: int) -> None:
        """The caller stopped waiting for ``xid`` (timeout, cancellation, done): a late reply
        is dropped."""
        self._pending.pop(xid, None)

    def receive(self, data: Buffer) -> list[tuple[W, Buffer]]:
        """Feed bytes read from the connection; the (waiter, reply record) pairs they
        complete, each waiter removed. A record larger than ``max_record`` raises
        ``RecordError`` (the stream is lost: close the connection)."""
        out: list[tuple[W, Buffer]] = []
        pending = self._pending
        for rec in self._records.feed(data):
            xid = rpc.peek_xid(rec)
            if xid is not None and xid in pending:
                out.append((pending.pop(xid), rec))
            else:
                self.unmatched += 1
        return out

    def close(self) -> list[W]:
        """The connection is gone: every waiter still waiting, removed (to be failed)."""
        waiters = list(self._pending.values())
        self._pending.clear()
        return waiters
