"""The blocking glue of the RPC client core (``nfsproto.client``), for tests on a thread of
their own (the gateway runs on another: ``tests.harness.thread.GatewayThread``): one TCP
connection, one call at a time, AUTH_SYS uid/gid 0 unless told otherwise. For the calls a
well-behaved client never makes (forged handles, other programs, READDIRPLUS driven cookie by
cookie, a stream that already carried garbage).

Owns: the socket and its timeout. Must not: be used on an event loop's thread.

    with BlockingRpcClient("127.0.0.1", gw.port) as c:
        root = c.mnt(b"/data").fhandle
        res = c.nfs(Nfs3Proc.GETATTR, nfs3.Getattr3Args(root))
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from types import TracebackType
from typing import Any, TypeVar

from nfsproto import mount3, nfs3, rpc
from nfsproto.client import (
    MOUNT_MNT,
    NFS3,
    CallSpec,
    RpcClientCore,
    decode_reply,
    decode_result,
    raw_spec,
)
from nfsproto.xdr import Buffer, Reader, Writer

__all__ = ["BlockingRpcClient"]

A = TypeVar("A")
R = TypeVar("R")


class BlockingRpcClient:
    """``call_raw`` returns the reply header and a Reader at what follows it, whatever the
    status; ``invoke`` (a ``CallSpec`` of ``nfsproto.client``'s call table), ``call``,
    ``nfs``, ``mnt`` decode the result (``RpcError`` unless SUCCESS, and the
    result must use the whole reply). A server that closes raises ``ConnectionError``; one
    that does not answer within ``timeout_s`` raises ``TimeoutError``. ``sock`` adopts a
    connected socket instead of opening one."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        cred: rpc.OpaqueAuth | None = None,
        timeout_s: float = 30.0,
        max_record: int = 8 << 20,
        sock: socket.socket | None = None,
    ) -> None:
        self.sock = sock or socket.create_connection((host, port), timeout=timeout_s)
        self.sock.settimeout(timeout_s)
        self.core: RpcClientCore[int] = RpcClientCore(
            cred or rpc.auth_sys(0, 0, [0], b"nfsgw-test"), max_record=max_record
        )

    @property
    def cred(self) -> rpc.OpaqueAuth:
        return self.core.cred

    @cred.setter
    def cred(self, cred: rpc.OpaqueAuth) -> None:
        self.core.cred = cred

    def _roundtrip(self, spec: CallSpec[A, R], args: A, cred: rpc.OpaqueAuth | None) -> bytes:
        xid, out = self.core.call(0, spec.prog, spec.vers, spec.proc, spec.pack_args, args, cred)
        try:
            self.sock.sendall(b"".join(out))
            while True:
                data = self.sock.recv(1 << 20)
                if not data:
                    raise ConnectionError("connection closed by the server")
                for _, rec in self.core.receive(data):
                    return bytes(rec)  # one call at a time: the reply to ``xid``
        finally:
            self.core.forget(xid)

    def call_raw(
        self,
        prog: int,
        vers: int,
        proc: int,
        args: Buffer = b"",
        cred: rpc.OpaqueAuth | None = None,
    ) -> tuple[rpc.ReplyHeader, Reader]:
        """One call with encoded ``args``, whatever the reply's status."""
        return decode_reply(self._roundtrip(raw_spec(prog, vers, proc), args, cred))

    def invoke(self, spec: CallSpec[A, R], args: A, cred: rpc.OpaqueAuth | None = None) -> R:
        """One call of the call table (``nfsproto.client``)."""
        return decode_result(self._roundtrip(spec, args, cred), spec.unpack_res)

    def call(
        self,
        prog: int,
        vers: int,
        proc: int,
        pack_args: Callable[[Writer, A], None],
        args: A,
        unpack_res: Callable[[Reader], R],
        cred: rpc.OpaqueAuth | None = None,
    ) -> R:
        return self.invoke(CallSpec(prog, vers, proc, pack_args, unpack_res), args, cred)

    def nfs(self, proc: nfs3.Nfs3Proc, args: Any) -> Any:
        return self.invoke(NFS3[proc], args)

    def mnt(self, path: bytes) -> mount3.Mnt3Res:
        return self.invoke(MOUNT_MNT, mount3.Mnt3Args(path))

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> BlockingRpcClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
