"""Shared pieces of the operations tests: a real ``Server`` on 127.0.0.1 over in-memory stores
(one ``MemoryStore`` per export, reached through ``store_factory``), an RPC client with a
chosen AUTH_SYS identity, and a small HTTP client for the admin API."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from gateway.backend.base import ObjectStore, RequestObserver
from gateway.backend.memory import MemoryStore
from gateway.clock import Clock
from gateway.exports import ExportConfig
from gateway.ops.config import AdminConfig, ServerConfig
from gateway.ops.server import Server
from gateway.ops.systemd import Notifier
from gateway.rpcclient import RpcClient
from nfsproto import mount3, nfs3, rpc
from nfsproto.nfs3 import Nfs3Proc

P = nfs3.PROCS
ROOT_CRED = rpc.auth_sys(0, 0, [0], b"test-root")


def cred(uid: int, gid: int, gids: Sequence[int] = ()) -> rpc.OpaqueAuth:
    return rpc.auth_sys(uid, gid, list(gids), b"test")


class Stores:
    """One MemoryStore per export path (created on demand), wired to the server's observer."""

    def __init__(
        self,
        seed: Mapping[str, Mapping[str, bytes]] | None = None,
        cls: type[MemoryStore] = MemoryStore,
    ) -> None:
        self.by_path: dict[str, MemoryStore] = {}
        self.seed = dict(seed or {})
        self.opened: list[str] = []
        self.cls = cls

    def factory(self, ec: ExportConfig, obs: RequestObserver) -> ObjectStore:
        store = self.by_path.get(ec.path)
        if store is None:
            store = self.by_path[ec.path] = self.cls(f"mem{ec.path}")
            for key, data in self.seed.get(ec.path, {}).items():
                store.seed(key, data)
        store.observer = obs
        self.opened.append(ec.path)
        return store


def make_config(tmp_path: Path, exports: Sequence[ExportConfig], **kw: Any) -> ServerConfig:
    kw.setdefault("cache_memory", 64 << 20)
    return ServerConfig.of(
        exports,
        server_listen="127.0.0.1",
        server_port=0,
        server_state_dir=tmp_path / "state",
        server_uvloop=False,
        **kw,
    )


@contextlib.asynccontextmanager
async def running(
    config: ServerConfig,
    stores: Stores,
    *,
    clock: Clock | None = None,
    notifier: Notifier | None = None,
    **kw: Any,
) -> AsyncIterator[Server]:
    server = Server(config, clock=clock, store_factory=stores.factory, notifier=notifier, **kw)
    await server.start()
    try:
        yield server
    finally:
        await server.stop(drain_timeout_s=2)


def admin_config(token: str | None = None) -> AdminConfig:
    return AdminConfig(listen="127.0.0.1:0", token=token)


class Client:
    """An NFS/MOUNT client on one TCP connection with a fixed credential."""

    def __init__(self, rpc_client: RpcClient) -> None:
        self.c = rpc_client

    @classmethod
    async def connect(
        cls, port: int, auth: rpc.OpaqueAuth = ROOT_CRED, *, source_port: int | None = None
    ) -> Client:
        if source_port is None:
            return cls(await RpcClient.connect("127.0.0.1", port, cred=auth))
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", source_port))
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
        reader, writer = await asyncio.open_connection(sock=sock, limit=1 << 20)
        return cls(RpcClient(reader, writer, auth, 8 << 20))

    async def mnt(self, path: bytes) -> mount3.Mnt3Res:
        return await self.c.call(
            mount3.PROGRAM,
            3,
            mount3.MountProc.MNT,
            mount3.pack_mnt3args,
            mount3.Mnt3Args(path),
            mount3.unpack_mnt3res,
        )

    async def mount(self, path: bytes) -> bytes:
        res = await self.mnt(path)
        assert res.status == mount3.MountStat3.MNT3_OK, res.status
        return res.fhandle

    async def nfs(self, proc: Nfs3Proc, args: object) -> Any:
        codec = P[proc]
        return await self.c.call(nfs3.PROGRAM, 3, proc, codec.pack_args, args, codec.unpack_res)  # type: ignore[arg-type]

    async def lookup(self, d: bytes, name: bytes) -> Any:
        return await self.nfs(Nfs3Proc.LOOKUP, nfs3.Lookup3Args(nfs3.Diropargs3(d, name)))

    async def getattr(self, fh: bytes) -> Any:
        return await self.nfs(Nfs3Proc.GETATTR, nfs3.Getattr3Args(fh))

    async def read(self, fh: bytes, offset: int = 0, count: int = 1 << 20) -> Any:
        return await self.nfs(Nfs3Proc.READ, nfs3.Read3Args(fh, offset, count))

    async def readdirplus(self, fh: bytes) -> Any:
        return await self.nfs(
            Nfs3Proc.READDIRPLUS, nfs3.Readdirplus3Args(fh, 0, bytes(8), 4096, 65536)
        )

    async def access(self, fh: bytes, bits: int = 0x3F) -> Any:
        return await self.nfs(Nfs3Proc.ACCESS, nfs3.Access3Args(fh, bits))

    async def close(self) -> None:
        await self.c.close()


class Http:
    """The admin API over real HTTP."""

    def __init__(self, port: int, token: str | None = None) -> None:
        self.base = f"http://127.0.0.1:{port}"
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.session = aiohttp.ClientSession()

    async def get(self, path: str, **kw: Any) -> tuple[int, str]:
        async with self.session.get(self.base + path, headers=self.headers, **kw) as r:
            return r.status, await r.text()

    async def json(self, method: str, path: str, body: object = None) -> tuple[int, Any]:
        async with self.session.request(
            method, self.base + path, json=body, headers=self.headers
        ) as r:
            text = await r.text()
            return r.status, json.loads(text) if text else None

    async def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """Sample name + sorted labels -> value."""
        status, text = await self.get("/metrics")
        assert status == 200
        out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
        return out

    async def close(self) -> None:
        await self.session.close()


def sample(
    m: Mapping[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float:
    return m.get((name, tuple(sorted(labels.items()))), 0.0)
