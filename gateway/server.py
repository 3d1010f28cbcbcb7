"""Wiring: configuration -> stores, namespaces, data reader, dispatcher, listeners; signals and
graceful shutdown; the /metrics and /healthz endpoint.

Owns: the life cycle of one gateway process. Must not: contain protocol or cache logic.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import signal
import socket
from collections.abc import Callable
from pathlib import Path

import structlog
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gateway import pmap_client
from gateway.backend import open_store, parse_store_url
from gateway.backend.base import ObjectStore, RequestObserver
from gateway.clock import Clock, SystemClock
from gateway.config import ExportConfig, ServerConfig
from gateway.core import Export, Gateway, export_id_for
from gateway.data import DataCache, DataConfig, DataStats, ObjectReader
from gateway.dispatch import Dispatcher
from gateway.handlers import register_all
from gateway.metrics import Metrics
from gateway.namespace.handles import HandleCodec, load_or_create_secret
from gateway.namespace.index import Namespace, NamespaceConfig, NamespaceStats
from gateway.transport import ConnectionStats, RpcConnection, TransportLimits
from nfsproto import mount3, nfs3, portmap

log = structlog.get_logger(__name__)


class Server:
    def __init__(
        self,
        config: ServerConfig,
        *,
        clock: Clock | None = None,
        store_factory: Callable[[ExportConfig, RequestObserver], ObjectStore] | None = None,
    ) -> None:
        self.config = config
        self.store_factory = store_factory
        self.clock = clock or SystemClock()
        self.metrics = Metrics()
        self.dispatcher = Dispatcher(self.metrics)
        self.conn_stats = ConnectionStats()
        self.connections: set[RpcConnection] = set()
        self._servers: list[asyncio.Server] = []
        self._web: web.AppRunner | None = None
        self._registered_with_rpcbind = False
        self.gateway: Gateway | None = None
        self.port = 0
        self.portmap_port = 0
        self.metrics_port = 0
        self._stopping = asyncio.Event()

    # ------------------------------------------------------------------ start

    async def start(self) -> None:
        c = self.config
        c.state_dir.mkdir(parents=True, exist_ok=True)
        secret = load_or_create_secret(c.state_dir)
        handles = HandleCodec(secret, c.state_dir / "handles.sqlite3")
        data_stats = DataStats()
        cache = DataCache(c.cache_memory, stats=data_stats)
        data_cfg = DataConfig(
            small_file_max=c.small_file_max if c.coalesce else 0,
            block_size=c.block_size,
            max_readahead=c.max_readahead if c.coalesce else 0,
        )
        reader = ObjectReader(cache, data_cfg, data_stats)
        gw = Gateway(c, handles, reader)
        self.metrics.add_stats("data", data_stats)
        self.metrics.add_stats("conn", self.conn_stats)
        per_export_meta = max(1 << 20, c.metadata_memory // max(1, len(c.exports)))
        for ec in c.exports:
            if self.store_factory is not None:
                store = self.store_factory(ec, self.metrics.backend_request)
            else:
                store = self._open_store(ec)
            prefix = parse_store_url(ec.backend).prefix
            ns_stats = NamespaceStats()
            ns = Namespace(
                store,
                prefix,
                clock=self.clock,
                config=NamespaceConfig(
                    attr_ttl_s=ec.attr_ttl_s,
                    immutable=ec.immutable,
                    memory_bytes=per_export_meta,
                    prefetch=c.prefetch,
                ),
                stats=ns_stats,
            )
            self.metrics.add_stats("namespace", ns_stats)
            gw.add_export(Export(export_id_for(ec.path), ec, store, ns, prefix))
        self.gateway = gw
        register_all(self.dispatcher, gw)

        loop = asyncio.get_running_loop()
        limits = TransportLimits(max_record=c.max_record, max_inflight=c.max_inflight_per_conn)

        def factory() -> RpcConnection:
            return RpcConnection(self.dispatcher.handle, limits, self.conn_stats, self.connections)

        srv = await loop.create_server(factory, c.listen, c.port, reuse_address=True, backlog=1024)
        self._servers.append(srv)
        self.port = gw.port = srv.sockets[0].getsockname()[1]
        if c.portmap_port is not None:
            await self._start_portmap(factory, c.portmap_port)
        gw.portmap_port = self.portmap_port
        if c.metrics_listen:
            await self._start_web(c.metrics_listen)
        log.info(
            "gateway_started",
            listen=c.listen,
            port=self.port,
            portmap_port=self.portmap_port or None,
            metrics_port=self.metrics_port or None,
            exports=[e.path for e in c.exports],
            cache_memory=c.cache_memory,
        )

    def _open_store(self, ec: ExportConfig) -> ObjectStore:
        s3 = self.config.s3
        return open_store(
            ec.backend,
            observer=self.metrics.backend_request,
            endpoint_url=s3.endpoint_url,
            region=s3.region,
            addressing_style=s3.addressing_style,
            profile=s3.profile,
            max_connections=s3.max_connections,
        )

    async def _start_portmap(self, factory: Callable[[], RpcConnection], port: int) -> None:
        loop = asyncio.get_running_loop()
        try:
            srv = await loop.create_server(factory, self.config.listen, port, reuse_address=True)
        except OSError as e:
            if e.errno != errno.EADDRINUSE:
                raise
            # A system rpcbind owns the port: register our programs with it instead.
            host = "127.0.0.1" if self.config.listen in ("0.0.0.0", "::") else self.config.listen
            for prog, vers in ((nfs3.PROGRAM, nfs3.VERSION), (mount3.PROGRAM, mount3.VERSION)):
                ok = await pmap_client.set_mapping(
                    host, port, portmap.Mapping(prog, vers, portmap.IPPROTO_TCP, self.port)
                )
                log.info("rpcbind_registered", prog=prog, vers=vers, ok=ok, rpcbind_port=port)
            self._registered_with_rpcbind = True
            return
        self._servers.append(srv)
        self.portmap_port = srv.sockets[0].getsockname()[1]

    async def _start_web(self, listen: str) -> None:
        host, _, port = listen.rpartition(":")
        app = web.Application()

        async def metrics(request: web.Request) -> web.Response:
            body = generate_latest(self.metrics.registry)
            return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

        async def healthz(request: web.Request) -> web.Response:
            return web.Response(text="ok\n")

        app.router.add_get("/metrics", metrics)
        app.router.add_get("/healthz", healthz)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, host or "127.0.0.1", int(port))
        await site.start()
        self._web = runner
        server = getattr(site, "_server", None)
        socks = getattr(server, "sockets", None) or []
        self.metrics_port = socks[0].getsockname()[1] if socks else int(port)

    # ------------------------------------------------------------------ stop

    async def stop(self, drain_timeout_s: float = 10.0) -> None:
        for s in self._servers:
            s.close()
        for conn in list(self.connections):
            conn.close()
        if self.connections:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(drain_timeout_s):
                    await asyncio.gather(
                        *(c.drain() for c in list(self.connections)), return_exceptions=True
                    )
        for conn in list(self.connections):
            conn.abort()
        for s in self._servers:
            with contextlib.suppress(Exception):
                await s.wait_closed()
        if self._registered_with_rpcbind and self.config.portmap_port:
            host = "127.0.0.1"
            for prog, vers in ((nfs3.PROGRAM, nfs3.VERSION), (mount3.PROGRAM, mount3.VERSION)):
                with contextlib.suppress(Exception):
                    await pmap_client.unset_mapping(
                        host,
                        self.config.portmap_port,
                        portmap.Mapping(prog, vers, portmap.IPPROTO_TCP, self.port),
                    )
        if self._web is not None:
            await self._web.cleanup()
        if self.gateway is not None:
            # Fetches still in flight (read-ahead) use the stores: stop them first.
            await self.gateway.reader.close()
            for e in self.gateway.exports.values():
                await e.ns.close()
                await e.store.close()
            await self.gateway.handles.close()
        log.info("gateway_stopped", port=self.port)

    async def run_until_signalled(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._stopping.set)
        await self._stopping.wait()
        log.info("gateway_stopping")
        await self.stop()


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def state_dir_default() -> Path:
    return Path("/var/lib/nfsgw")
