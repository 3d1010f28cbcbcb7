"""The asyncio glue of the RPC client core (``nfsproto.client``): one TCP connection, many
calls in flight on it, replies matched by xid in any order.

Owns: the connection's stream, the task that reads it and hands the bytes to the core, and
one future per call. Used by the gateway's rpcbind registration (``pmap_client``), by the
load generator's NFS client and by tests and benchmarks that talk RPC to a gateway.
``TypedCalls`` is what every asyncio client of the project says over its one ``_roundtrip``:
``invoke(spec, args)`` with a ``CallSpec`` of ``nfsproto.client``'s call table, ``call``
with the codecs spelled out, ``call_raw`` with encoded arguments, and the NFS and MOUNT calls
tests and benchmarks make by name (the NFS status is the caller's to check). Must not: block
the loop; a call has no timeout of its own (wrap it in ``asyncio.timeout``; a cancelled
call's late reply is dropped).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any, TypeVar

from nfsproto import mount3, nfs3, rpc
from nfsproto.client import (
    MOUNT_MNT,
    NFS3,
    NFS3_ACCESS,
    NFS3_GETATTR,
    NFS3_LOOKUP,
    NFS3_READ,
    NFS3_READDIRPLUS,
    CallSpec,
    RpcClientCore,
    decode_reply,
    decode_result,
    raw_spec,
)
from nfsproto.nfs3 import Diropargs3, Nfs3Proc
from nfsproto.xdr import Buffer, Reader, Writer

__all__ = ["RpcClient", "TypedCalls", "call_once"]

T = TypeVar("T")
A = TypeVar("A")

READ_CHUNK = 1 << 20


class TypedCalls:
    """The calls of an asyncio RPC client over its ``_roundtrip`` (one encoded call out, its
    reply record back). ``nfsproto.client.RpcError`` unless the reply is SUCCESS (except
    ``call_raw``)."""

    async def _roundtrip(
        self, spec: CallSpec[A, T], args: A, cred: rpc.OpaqueAuth | None
    ) -> Buffer:
        raise NotImplementedError

    async def invoke(self, spec: CallSpec[A, T], args: A, cred: rpc.OpaqueAuth | None = None) -> T:
        """A call that must succeed at the RPC level (``RpcError`` otherwise)."""
        return decode_result(await self._roundtrip(spec, args, cred), spec.unpack_res)

    async def call(
        self,
        prog: int,
        vers: int,
        proc: int,
        pack_args: Callable[[Writer, A], None],
        args: A,
        unpack_res: Callable[[Reader], T],
        cred: rpc.OpaqueAuth | None = None,
    ) -> T:
        """``invoke`` with the procedure spelled out."""
        return await self.invoke(CallSpec(prog, vers, proc, pack_args, unpack_res), args, cred)

    async def call_raw(
        self,
        prog: int,
        vers: int,
        proc: int,
        args: Buffer = b"",
        cred: rpc.OpaqueAuth | None = None,
    ) -> tuple[rpc.ReplyHeader, Reader]:
        """One call with encoded ``args``; the reply header and a Reader at what follows it,
        whatever the accept/reject status."""
        return decode_reply(await self._roundtrip(raw_spec(prog, vers, proc), args, cred))

    async def nfs(self, proc: Nfs3Proc, args: Any) -> Any:
        return await self.invoke(NFS3[proc], args)

    async def mnt(self, path: bytes) -> mount3.Mnt3Res:
        return await self.invoke(MOUNT_MNT, mount3.Mnt3Args(path))

    async def lookup(self, d: bytes, name: bytes) -> nfs3.Lookup3Res:
        return await self.invoke(NFS3_LOOKUP, nfs3.Lookup3Args(Diropargs3(d, name)))

    async def getattr(self, fh: bytes) -> nfs3.Getattr3Res:
        return await self.invoke(NFS3_GETATTR, nfs3.Getattr3Args(fh))

    async def access(self, fh: bytes, bits: int = 0x3F) -> nfs3.Access3Res:
        return await self.invoke(NFS3_ACCESS, nfs3.Access3Args(fh, bits))

    async def read(self, fh: bytes, offset: int = 0, count: int = 1 << 20) -> nfs3.Read3Res:
        return await self.invoke(NFS3_READ, nfs3.Read3Args(fh, offset, count))

    async def readdirplus(
        self, fh: bytes, cookie: int = 0, verf: bytes = bytes(8)
    ) -> nfs3.Readdirplus3Res:
        args = nfs3.Readdirplus3Args(fh, cookie, verf, 4096, 65536)
        return await self.invoke(NFS3_READDIRPLUS, args)


class RpcClient(TypedCalls):
    """``await RpcClient.connect(host, port, cred=...)``; ``await c.call(...)`` from as many
    tasks as you like; ``await c.close()``. A reply that is not SUCCESS raises
    ``nfsproto.client.RpcError``; a lost connection fails every waiting call with the error
    that ended it (``ConnectionError`` when the server closed)."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        cred: rpc.OpaqueAuth,
        max_record: int = 8 << 20,
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._core: RpcClientCore[asyncio.Future[Buffer]] = RpcClientCore(
            cred, max_record=max_record
        )
        self._loop = asyncio.get_running_loop()
        self._task = self._loop.create_task(self._read_loop())
        self.closed = False

    @classmethod
    async def connect(
        cls, host: str, port: int, *, cred: rpc.OpaqueAuth | None = None, max_record: int = 8 << 20
    ) -> RpcClient:
        reader, writer = await asyncio.open_connection(host, port, limit=READ_CHUNK)
        return cls(reader, writer, cred or rpc.auth_sys(0, 0, [0], b"nfsgw-client"), max_record)

    @property
    def cred(self) -> rpc.OpaqueAuth:
        """The credential of calls that do not pass their own."""
        return self._core.cred

    @cred.setter
    def cred(self, cred: rpc.OpaqueAuth) -> None:
        self._core.cred = cred

    async def _read_loop(self) -> None:
        err: BaseException = ConnectionError("connection closed")
        core = self._core
        try:
            while data := await self._reader.read(READ_CHUNK):
                for fut, rec in core.receive(data):
                    if not fut.done():
                        fut.set_result(rec)
        except (OSError, rpc.RecordError) as e:
            err = e
        finally:
            self.closed = True
            for fut in core.close():
                if not fut.done():
                    fut.set_exception(err)

    async def _roundtrip(
        self, spec: CallSpec[A, T], args: A, cred: rpc.OpaqueAuth | None
    ) -> Buffer:
        if self.closed:
            raise ConnectionError("connection closed")
        fut: asyncio.Future[Buffer] = self._loop.create_future()
        xid, out = self._core.call(fut, spec.prog, spec.vers, spec.proc, spec.pack_args, args, cred)
        self._writer.writelines(out)
        try:
            return await fut
        finally:
            self._core.forget(xid)

    def send_raw(self, data: bytes) -> None:
        """Write bytes as they are (for malformed-input tests)."""
        self._writer.write(data)

    async def close(self) -> None:
        self._writer.close()
        with contextlib.suppress(Exception):
            await self._writer.wait_closed()
        self._task.cancel()
        # asyncio.wait, not ``await`` under suppress(CancelledError): a cancelled close()
        # must stay cancelled.
        await asyncio.wait([self._task])
        if not self._task.cancelled():
            self._task.exception()  # retrieved: the reader's failure was reported to callers


async def call_once(
    host: str,
    port: int,
    spec: CallSpec[A, T],
    args: A,
    *,
    cred: rpc.OpaqueAuth,
    timeout_s: float,
) -> T:
    """Connect, make one call, close; the whole bounded by ``timeout_s`` (``TimeoutError``)."""
    async with asyncio.timeout(timeout_s):
        c = await RpcClient.connect(host, port, cred=cred, max_record=1 << 20)
        try:
            return await c.invoke(spec, args)
        finally:
            await c.close()
