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

The call table: a ``CallSpec`` is one procedure as a client calls it (program, version,
procedure, the argument packer and the result unpacker), so the glues' typed calls are
``invoke(spec, args)`` and nobody spells the five again: ``NFS3[proc]`` for any NFSv3
procedure (the codecs of ``nfs3.PROCS``, which check the value's class), ``NFS3_GETATTR`` ...
for the ones clients make by name (typed results), ``MOUNT_MNT``, ``PMAP_SET``/``UNSET``/
``GETPORT``.

    res = await client.invoke(NFS3_GETATTR, nfs3.Getattr3Args(fh))   # gateway.rpcclient
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping
from typing import Final, Generic, NamedTuple, TypeVar

from nfsproto import mount3, nfs3, portmap, rpc
from nfsproto.nfs3 import Nfs3Proc
from nfsproto.xdr import Buffer, Reader, Writer

__all__ = [
    "MOUNT_MNT",
    "NFS3",
    "NFS3_ACCESS",
    "NFS3_FSINFO",
    "NFS3_GETATTR",
    "NFS3_LOOKUP",
    "NFS3_READ",
    "NFS3_READDIRPLUS",
    "PMAP_GETPORT",
    "PMAP_SET",
    "PMAP_UNSET",
    "CallSpec",
    "RpcClientCore",
    "RpcError",
    "decode_reply",
    "decode_result",
    "raw_spec",
]

W = TypeVar("W")
T = TypeVar("T")
A = TypeVar("A")


class CallSpec(NamedTuple, Generic[A, T]):
    """One procedure as a client calls it: where (``prog``, ``vers``, ``proc``), how its
    arguments are packed and its result unpacked, and its name (counters, errors)."""

    prog: int
    vers: int
    proc: int
    pack_args: Callable[[Writer, A], None]
    unpack_res: Callable[[Reader], T]
    name: str = ""


def _no_result(r: Reader) -> None:
    """A raw call's results are the caller's to read."""


def raw_spec(prog: int, vers: int, proc: int) -> CallSpec[Buffer, None]:
    """A call whose arguments come encoded (``Writer.raw``), its results left to the caller
    (``decode_reply``): for malformed-input tests and programs without a table."""
    return CallSpec(prog, vers, proc, Writer.raw, _no_result)


def _nfs3(
    proc: Nfs3Proc, pack_args: Callable[[Writer, A], None], unpack_res: Callable[[Reader], T]
) -> CallSpec[A, T]:
    return CallSpec(nfs3.PROGRAM, nfs3.VERSION, proc, pack_args, unpack_res, proc.name)


NFS3: Final[Mapping[Nfs3Proc, CallSpec[nfs3.Nfs3Args, nfs3.Nfs3Res]]] = {
    p: _nfs3(p, nfs3.PROCS[p].pack_args, nfs3.PROCS[p].unpack_res) for p in Nfs3Proc
}
NFS3_GETATTR: Final = _nfs3(Nfs3Proc.GETATTR, nfs3.pack_getattr3args, nfs3.unpack_getattr3res)
NFS3_LOOKUP: Final = _nfs3(Nfs3Proc.LOOKUP, nfs3.pack_lookup3args, nfs3.unpack_lookup3res)
NFS3_ACCESS: Final = _nfs3(Nfs3Proc.ACCESS, nfs3.pack_access3args, nfs3.unpack_access3res)
NFS3_READ: Final = _nfs3(Nfs3Proc.READ, nfs3.pack_read3args, nfs3.unpack_read3res)
NFS3_READDIRPLUS: Final = _nfs3(
    Nfs3Proc.READDIRPLUS, nfs3.pack_readdirplus3args, nfs3.unpack_readdirplus3res
)
NFS3_FSINFO: Final = _nfs3(Nfs3Proc.FSINFO, nfs3.pack_fsinfo3args, nfs3.unpack_fsinfo3res)
MOUNT_MNT: Final = CallSpec(
    mount3.PROGRAM,
    mount3.VERSION,
    mount3.MountProc.MNT,
    mount3.pack_mnt3args,
    mount3.unpack_mnt3res,
    "MNT",
)


def _pmap(
    proc: portmap.PmapProc, unpack_res: Callable[[Reader], T]
) -> CallSpec[portmap.Mapping, T]:
    return CallSpec(
        portmap.PROGRAM, portmap.VERSION, proc, portmap.pack_mapping, unpack_res, proc.name
    )


PMAP_SET: Final = _pmap(portmap.PmapProc.SET, portmap.unpack_bool)
PMAP_UNSET: Final = _pmap(portmap.PmapProc.UNSET, portmap.unpack_bool)
PMAP_GETPORT: Final = _pmap(portmap.PmapProc.GETPORT, portmap.unpack_port)


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
