"""An asyncio ONC RPC client over TCP on nfsproto: many calls in flight on one connection,
replies matched by xid. Used by the load generator's NFS client and by tests that need to
send calls a well-behaved client never would."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
from collections.abc import Callable
from typing import TypeVar

from nfsproto import rpc
from nfsproto.xdr import Buffer, Reader, Writer

T = TypeVar("T")
T2 = TypeVar("T2")


class RpcError(Exception):
    def __init__(self, header: rpc.ReplyHeader) -> None:
        super().__init__(f"rpc call {header.xid} failed: {header}")
        self.header = header


class RpcClient:
    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        cred: rpc.OpaqueAuth,
        max_record: int,
    ) -> None:
        self._reader = reader
        self._writer = writer
        self.cred = cred
        self._pending: dict[int, asyncio.Future[Buffer]] = {}
        self._xids = itertools.count(int.from_bytes(os.urandom(3), "big") << 8)
        self._records = rpc.RecordReader(max_record)
        self._task = asyncio.get_running_loop().create_task(self._read_loop())
        self.closed = False

    @classmethod
    async def connect(
        cls, host: str, port: int, *, cred: rpc.OpaqueAuth | None = None, max_record: int = 8 << 20
    ) -> RpcClient:
        reader, writer = await asyncio.open_connection(host, port, limit=1 << 20)
        return cls(reader, writer, cred or rpc.auth_sys(0, 0, [0], b"nfsgw-client"), max_record)

    async def _read_loop(self) -> None:
        err: BaseException = ConnectionError("connection closed")
        try:
            while True:
                data = await self._reader.read(1 << 20)
                if not data:
                    break
                for rec in self._records.feed(data):
                    xid = rpc.peek_xid(rec)
                    fut = self._pending.pop(xid, None) if xid is not None else None
                    if fut is not None and not fut.done():
                        fut.set_result(rec)
        except (OSError, rpc.RecordError) as e:
            err = e
        finally:
            self.closed = True
            for fut in self._pending.values():
                if not fut.done():
                    fut.set_exception(err)
            self._pending.clear()

    def send_raw(self, data: bytes) -> None:
        """Write bytes as they are (for malformed-input tests)."""
        self._writer.write(data)

    async def call_raw(
        self, prog: int, vers: int, proc: int, args: bytes, cred: rpc.OpaqueAuth | None = None
    ) -> tuple[rpc.ReplyHeader, Reader]:
        """One call; returns the reply header and a Reader at the results (whatever the
        accept/reject status)."""
        xid = next(self._xids) & 0xFFFFFFFF
        w = Writer()
        rpc.pack_call(w, xid, prog, vers, proc, cred or self.cred)
        w.raw(args)
        return await self._roundtrip(xid, w.buffers())

    async def _roundtrip(self, xid: int, bufs: list[Buffer]) -> tuple[rpc.ReplyHeader, Reader]:
        if self.closed:
            raise ConnectionError("connection closed")
        fut: asyncio.Future[Buffer] = asyncio.get_running_loop().create_future()
        self._pending[xid] = fut
        self._writer.writelines(rpc.frame(bufs))
        try:
            rec = await fut
        finally:
            self._pending.pop(xid, None)
        r = Reader(rec)
        return rpc.unpack_reply(r), r

    async def call(
        self,
        prog: int,
        vers: int,
        proc: int,
        pack_args: Callable[[Writer, T], None],
        args: T,
        unpack_res: Callable[[Reader], T2],
    ) -> T2:
        """A call that must succeed at the RPC level (RpcError otherwise)."""
        xid = next(self._xids) & 0xFFFFFFFF
        w = Writer()
        rpc.pack_call(w, xid, prog, vers, proc, self.cred)
        pack_args(w, args)
        h, r = await self._roundtrip(xid, w.buffers())
        if h.accept_stat != rpc.AcceptStat.SUCCESS:
            raise RpcError(h)
        return unpack_res(r)

    async def close(self) -> None:
        self._writer.close()
        with contextlib.suppress(Exception):
            await self._writer.wait_closed()
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
