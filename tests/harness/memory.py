"""The in-memory gateway: the composition root (``gateway.ops.server.Server``) over one
``MemoryStore`` and a ``FakeClock``, called by handing whole RPC records to its dispatcher
(``Dispatcher.handle(record, peer)``): no socket between a test and the gateway, as aioquic
and h11 test their cores.

Owns: the configuration tests start from (``gateway_config``), the in-memory bucket every
export is a prefix of (backend request counts come from it), the typed calls a test makes
(``Calls``: NFS and MOUNT by procedure, a few procedures by name) and what carries them: a
``MemoryClient`` (a record in, a record out; any credential and peer) or a ``TcpClient`` (the
asyncio RPC client, for the tests of the transport itself: ordering, in-flight bounds,
records, connections; the server also listens on 127.0.0.1, port 0). Must not: wire the
gateway itself (``Server`` does) or call past the dispatcher.

    async with MemoryGateway.of(tmp_path, [ExportConfig("/data", "s3://b/ds/")],
                                files={"ds/d/a.jpg": b"..."}) as gw:
        root = await gw.mount(b"/data")
        fh = await gw.walk(root, "d/a.jpg")
        assert gw.requests() == {"list": 2}
"""

from __future__ import annotations

import asyncio
import random
import socket
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeVar

from gateway.backend.base import ObjectStore, RequestObserver
from gateway.backend.memory import MemoryStore
from gateway.clock import Clock, FakeClock
from gateway.exports import Export, ExportConfig
from gateway.ops.config import ServerConfig
from gateway.ops.server import ConfigLoader, Server
from gateway.ops.systemd import Notifier
from gateway.registry import Gateway
from gateway.rpcclient import RpcClient, TypedCalls
from gateway.transport import Peer
from nfsproto import mount3, rpc
from nfsproto.client import CallSpec
from nfsproto.nfs3 import NfsStat3
from nfsproto.xdr import Buffer, Writer

__all__ = [
    "PEER",
    "ROOT",
    "Calls",
    "MemoryClient",
    "MemoryGateway",
    "TcpClient",
    "cred",
    "gateway_config",
]

A = TypeVar("A")
T = TypeVar("T")

ROOT = rpc.auth_sys(0, 0, [0], b"nfsgw-test")
PEER = Peer("127.0.0.1", 700, 2049)  # a kernel client's privileged source port
_OWN = ("store", "files", "clock", "notifier", "config_loader")  # MemoryGateway's own arguments


def cred(uid: int, gid: int, gids: Sequence[int] = ()) -> rpc.OpaqueAuth:
    """An AUTH_SYS credential."""
    return rpc.auth_sys(uid, gid, list(gids), b"nfsgw-test")


def gateway_config(
    state_dir: Path, exports: Sequence[ExportConfig], **settings: Any
) -> ServerConfig:
    """A configuration for an in-process gateway: 127.0.0.1, a free port, asyncio's own loop,
    a 64 MiB data cache, data prefetch off (``cache_data_prefetch=True`` turns it on: with it
    off, every request count a test asserts is exactly what the gateway did before it existed);
    ``settings`` are ``ServerConfig.of``'s (``writes_part_size=...``)."""
    settings.setdefault("cache_memory", 64 << 20)
    settings.setdefault("cache_data_prefetch", False)
    return ServerConfig.of(
        exports,
        server_listen="127.0.0.1",
        server_port=0,
        server_state_dir=state_dir,
        server_uvloop=False,
        **settings,
    )


class Calls(TypedCalls):
    """``gateway.rpcclient.TypedCalls`` (NFS and MOUNT by procedure, a few procedures by
    name; the NFS status is the caller's to check) plus the two that must succeed: ``mount``
    and ``walk``."""

    async def mount(self, path: bytes) -> bytes:
        """The root handle of ``path`` (MNT must succeed)."""
        res = await self.mnt(path)
        assert res.status == mount3.MountStat3.MNT3_OK, (path, res.status)
        return res.fhandle

    async def walk(self, d: bytes, path: str) -> bytes:
        """The handle of ``path`` (``a/b/c``) under directory ``d``; every LOOKUP must succeed."""
        for name in path.split("/"):
            res = await self.lookup(d, name.encode())
            assert res.status == NfsStat3.NFS3_OK, (path, res.status)
            d = res.object
        return d


class MemoryClient(Calls):
    """One client of the gateway (``cred``, ``peer``): its calls are records handed to the
    server's dispatcher; ``xid`` is the last call's."""

    def __init__(self, server: Server, cred: rpc.OpaqueAuth = ROOT, peer: Peer = PEER) -> None:
        self.server = server
        self.cred = cred
        self.peer = peer
        # A random first XID, as real clients pick: two clients must not send the same
        # (XID, call) pair, which the duplicate-request cache would answer from its replies.
        self.xid = random.getrandbits(31)
        self._session: Any = None
        self.fast_answers = 0  # calls the fast path answered

    async def record(self, record: Buffer) -> bytes | None:
        """A whole call record in, the whole reply record out (None: no reply is sent): as
        a connection does it, the fast path first (``gateway.fastpath``; its reply comes with
        the record mark, dropped here), then the dispatcher."""
        fast = self.server.fastpath
        if fast is not None:
            if self._session is None:
                self._session = fast.session(self.peer)
            got = fast.answer(record, self._session)
            if got is not None:
                self.fast_answers += 1
                return b"".join(bytes(b) for b in got)[4:]
        out = await self.server.dispatcher.handle(record, self.peer)
        return None if out is None else b"".join(bytes(b) for b in out)

    async def _roundtrip(self, spec: CallSpec[A, T], args: A, cred: rpc.OpaqueAuth | None) -> bytes:
        self.xid = xid = self.xid + 1
        w = Writer()
        rpc.pack_call(w, xid, spec.prog, spec.vers, spec.proc, cred or self.cred)
        spec.pack_args(w, args)
        reply = await self.record(w.getvalue())
        assert reply is not None and rpc.peek_xid(reply) == xid, reply
        return reply


class TcpClient(RpcClient, Calls):
    """The asyncio RPC client (``gateway.rpcclient``) with the typed calls, over a real
    connection: for what only a connection shows (ordering, bounds, records, sessions)."""


class MemoryGateway(MemoryClient):
    """``Server`` over ``store`` (every export's backend, whatever its URL; ``files`` are
    seeded into it) and ``clock`` (a ``FakeClock`` unless given). As a client it calls as
    root from a privileged port (``client`` makes others); ``async with`` starts and stops
    it."""

    def __init__(
        self,
        config: ServerConfig,
        *,
        store: MemoryStore | None = None,
        files: Mapping[str, bytes] | None = None,
        clock: Clock | None = None,
        notifier: Notifier | None = None,
        config_loader: ConfigLoader | None = None,
    ) -> None:
        self.clock = clock or FakeClock()
        self.store = MemoryStore("mem") if store is None else store
        for key, data in (files or {}).items():
            self.store.seed(key, data)
        server = Server(
            config,
            clock=self.clock,
            store_factory=self._store_for,
            notifier=notifier,
            config_loader=config_loader,
        )
        super().__init__(server)

    @classmethod
    def of(cls, tmp_path: Path, exports: Sequence[ExportConfig], **kw: Any) -> Self:
        """A gateway with ``gateway_config(tmp_path / "state", exports, **settings)``: the
        keyword arguments are the constructor's (``store``, ``files``, ``clock``...), the rest
        are settings."""
        own = {k: kw.pop(k) for k in _OWN if k in kw}
        return cls(gateway_config(tmp_path / "state", exports, **kw), **own)

    def _store_for(self, ec: ExportConfig, observer: RequestObserver) -> ObjectStore:
        self.store.observer = observer
        return self.store

    async def __aenter__(self) -> Self:
        await self.server.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.server.stop(drain_timeout_s=2)

    # ----------------------------------------------------------------------------- access

    @property
    def gateway(self) -> Gateway:
        """The export registry (started servers only)."""
        assert self.server.gateway is not None, "not started"
        return self.server.gateway

    @property
    def port(self) -> int:
        return self.server.port

    def export(self, path: str) -> Export:
        return self.gateway.by_path[path]

    def requests(self) -> dict[str, int]:
        """Backend requests by operation ("list", "get", ...) since the last reset."""
        return dict(self.store.requests)

    def reset_requests(self) -> None:
        self.store.reset_counts()

    def statuses(self) -> Counter[tuple[str, str]]:
        """Calls answered by (procedure, status): ("NFS3.READ", "NFS3ERR_IO")."""
        rpc_hists = self.server.metrics.rpc.items()
        return Counter({k: h.count for k, h in rpc_hists if h.count})

    # ----------------------------------------------------------------------------- clients

    def client(self, cred: rpc.OpaqueAuth = ROOT, peer: Peer = PEER) -> MemoryClient:
        return MemoryClient(self.server, cred, peer)

    async def connect(self, cred: rpc.OpaqueAuth = ROOT, *, source_port: int = 0) -> TcpClient:
        """A TCP client on the server's port (from ``source_port``, if given)."""
        sock = socket.socket()
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", source_port))
            sock.setblocking(False)
            await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", self.port))
        except OSError:
            sock.close()
            raise
        reader, writer = await asyncio.open_connection(sock=sock, limit=1 << 20)
        return TcpClient(reader, writer, cred)
