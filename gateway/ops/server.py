"""Wiring: configuration -> stores, namespaces, data reader, dispatcher, listeners; the admin
API (``gateway.ops.admin``); signals, reload and graceful shutdown; systemd notifications.

Owns: the life cycle of one gateway process:

- ``start``: state and cache directories, handle secret, data cache, one store + namespace per
  export, the NFS/MOUNT/PORTMAP listener(s), the admin API, then ``READY=1``.
- ``reload`` (SIGHUP, ``POST /v1/reload``): re-reads the configuration file off the loop; a bad
  file keeps the running configuration and logs every error. Exports are added, removed or
  changed without dropping connections: a change of clients, squash, ids, modes or
  read-only applies to the next call and keeps the export's caches; a change of backend,
  ``attr_ttl_s`` or ``immutable`` gives the export a fresh store and index (handles stay valid:
  they carry the export path's id). Settings that need a restart are logged, not applied.
- ``stop`` (SIGTERM/SIGINT): ``STOPPING=1``, stop accepting, let in-flight calls finish and
  staged writes upload, all within ``drain_timeout_s``, abort what is left, close caches,
  stores and the admin API. The process then exits 0.

Must not: contain protocol or cache logic.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import signal
import socket
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import structlog
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gateway import pmap_client
from gateway.backend import open_store, parse_store_url
from gateway.backend.base import ObjectStore, RequestObserver
from gateway.clock import Clock, SystemClock
from gateway.data import DataCache, DataConfig, DataStats, ObjectReader
from gateway.dispatch import Dispatcher
from gateway.exports import Export
from gateway.handlers import register_all
from gateway.namespace import Namespace, NamespaceStats
from gateway.namespace.config import NamespaceConfig
from gateway.namespace.handles import HandleCodec, load_or_create_secret
from gateway.ops.config import ConfigErrors, ExportConfig, ServerConfig, export_id_for, load_config
from gateway.ops.metrics import Metrics
from gateway.ops.systemd import Notifier
from gateway.registry import Gateway
from gateway.transport import ConnectionStats, RpcConnection, TransportLimits
from gateway.writes import WriteConfig, WriteManager
from nfsproto import mount3, nfs3, portmap

if TYPE_CHECKING:
    from gateway.ops.admin import AdminApi, Warmups

log = structlog.get_logger(__name__)

# Settings a reload cannot change in a running process (listeners, budgets, the handle secret).
RESTART_ONLY = (
    "listen",
    "port",
    "portmap_port",
    "state_dir",
    "cache_dir",
    "s3",
    "cache_memory",
    "metadata_memory",
    "small_file_max",
    "block_size",
    "max_readahead",
    "max_inflight_per_conn",
    "max_record",
    "rsize",
    "wsize",
    "uvloop",
    "prefetch",
    "coalesce",
    "log",
    "spool_dir",
    "spool_bytes",
    "write_part_size",
    "write_flush_idle_s",
    "rename_max_entries",
)
# Series created at start-up (rates start from 0): the read path.
PREPARED_PROCS = (
    "MOUNT3.MNT",
    *(
        f"NFS3.{p}"
        for p in (
            "GETATTR",
            "LOOKUP",
            "ACCESS",
            "READLINK",
            "READ",
            "READDIR",
            "READDIRPLUS",
            "FSSTAT",
            "FSINFO",
            "PATHCONF",
        )
    ),
)
# Export settings whose change needs a fresh store and index.
_REBUILD = ("backend", "attr_ttl_s", "immutable")
_NS_GAUGES = ("entries", "bytes", "dirs")


class _Refused(asyncio.Protocol):
    """A connection over ``max_connections``: closed at once."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()


ConfigLoader = Callable[[], ServerConfig]


class Server:
    def __init__(
        self,
        config: ServerConfig,
        *,
        clock: Clock | None = None,
        store_factory: Callable[[ExportConfig, RequestObserver], ObjectStore] | None = None,
        notifier: Notifier | None = None,
        config_loader: ConfigLoader | None = None,
    ) -> None:
        self.config = config
        self.store_factory = store_factory
        self.clock = clock or SystemClock()
        # Off unless given: in-process servers (tests) must not talk to a real manager.
        self.notifier = notifier or Notifier({})
        self.config_loader = config_loader
        self.metrics = Metrics()
        self.dispatcher = Dispatcher(self.metrics)
        self.conn_stats = ConnectionStats()
        self.connections: set[RpcConnection] = set()
        self._servers: list[asyncio.Server] = []
        self._registered_with_rpcbind = False
        self.gateway: Gateway | None = None
        self.admin: AdminApi | None = None
        self.warmups: Warmups | None = None
        self.port = 0
        self.portmap_port = 0
        self.metrics_port = 0
        self.started = False
        self.stopping = False
        self.refused_connections = 0
        self.reloads = {"ok": 0, "error": 0}
        self.last_reload_error: list[str] = []
        self._reload_lock = asyncio.Lock()
        self._retired_ns = NamespaceStats()
        self._retiring: set[asyncio.Task[None]] = set()
        self._retired_exports: list[Export] = []
        self._stopping = asyncio.Event()
        self._stopped = False

    # ------------------------------------------------------------------ start

    async def start(self) -> None:
        from gateway.ops.admin import AdminApi, Warmups

        c = self.config
        await asyncio.to_thread(self._make_dirs)
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
        writes = WriteManager(WriteConfig.from_server(c), reader)
        gw = Gateway(c, handles, reader, writes)
        self.metrics.add_stats("data", data_stats)
        self.metrics.add_stats("conn", self.conn_stats)
        self.metrics.add_stats("gateway", gw.stats)
        self.metrics.add_stats("writes", writes.stats)
        self.metrics.add_stats("namespace", self._retired_ns)
        self.metrics.extra_collectors.append(self._server_families)
        for ec in c.exports:
            gw.add_export(self._make_export(ec))
        self.gateway = gw
        register_all(self.dispatcher, gw)
        self.metrics.prepare(PREPARED_PROCS, ["list", "get", "head"])
        self.warmups = Warmups(self)

        loop = asyncio.get_running_loop()
        limits = TransportLimits(max_record=c.max_record, max_inflight=c.max_inflight_per_conn)

        def factory() -> asyncio.Protocol:
            if len(self.connections) >= self.config.max_connections:
                self.refused_connections += 1
                if self.refused_connections == 1 or self.refused_connections % 1000 == 0:
                    log.warning(
                        "connection_refused",
                        limit=self.config.max_connections,
                        refused=self.refused_connections,
                    )
                return _Refused()
            return RpcConnection(self.dispatcher.handle, limits, self.conn_stats, self.connections)

        srv = await loop.create_server(factory, c.listen, c.port, reuse_address=True, backlog=1024)
        self._servers.append(srv)
        self.port = gw.port = srv.sockets[0].getsockname()[1]
        if c.portmap_port is not None:
            await self._start_portmap(factory, c.portmap_port)
        gw.portmap_port = self.portmap_port
        listen = c.admin_listen
        if listen:
            admin = AdminApi(self)
            self.metrics_port = await admin.start(listen)
            self.admin = admin
        self.started = True
        log.info(
            "gateway_started",
            listen=c.listen,
            port=self.port,
            portmap_port=self.portmap_port or None,
            admin_port=self.metrics_port or None,
            exports=[e.path for e in c.exports],
            cache_memory=c.cache_memory,
            config=str(c.source) if c.source else None,
        )
        self.notifier.ready(self._status())
        self.notifier.start_watchdog()

    def _make_dirs(self) -> None:
        self.config.state_dir.mkdir(parents=True, exist_ok=True)
        if self.config.cache_dir is not None:
            self.config.cache_dir.mkdir(parents=True, exist_ok=True)

    def _status(self) -> str:
        gw = self.gateway
        n = len(gw.exports) if gw else 0
        return f"serving {n} export{'s' if n != 1 else ''} on port {self.port}"

    def _make_export(self, ec: ExportConfig) -> Export:
        c = self.config
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
                memory_bytes=max(1 << 20, c.metadata_memory // max(1, len(c.exports))),
                prefetch=c.prefetch,
            ),
            stats=ns_stats,
        )
        self.metrics.add_stats("namespace", ns_stats)
        return Export(export_id_for(ec.path), ec, store, ns, prefix)

    def _open_store(self, ec: ExportConfig) -> ObjectStore:
        from gateway.backend.config import RetryPolicy

        s3 = self.config.s3
        kw: dict[str, object] = {}
        if ec.backend.startswith("s3://"):
            kw = {
                "endpoint_url": s3.endpoint_url,
                "region": s3.region,
                "addressing_style": s3.addressing_style,
                "profile": s3.profile,
                "anonymous": s3.anonymous or None,
                "max_connections": s3.max_connections,
                "retry": RetryPolicy(
                    max_attempts=s3.max_attempts,
                    request_timeout_s=s3.request_timeout_s,
                    deadline_s=s3.deadline_s,
                ),
            }
        return open_store(ec.backend, observer=self.metrics.backend_request, **kw)  # type: ignore[arg-type]

    async def _start_portmap(self, factory: Callable[[], asyncio.Protocol], port: int) -> None:
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

    def _server_families(self) -> Iterable[Metric]:
        gw = self.gateway
        yield GaugeMetricFamily(
            "nfsgw_exports", "Exports served", value=len(gw.exports) if gw else 0
        )
        yield CounterMetricFamily(
            "nfsgw_connections_refused",
            "Connections closed at once because max_connections were open",
            value=self.refused_connections,
        )
        r = CounterMetricFamily(
            "nfsgw_config_reloads", "Configuration reloads by outcome", labels=["outcome"]
        )
        for outcome, n in sorted(self.reloads.items()):
            r.add_metric([outcome], n)
        yield r
        if gw is not None:
            yield GaugeMetricFamily(
                "nfsgw_data_cache_budget_bytes",
                "Data cache budget",
                value=gw.reader.cache.budget_bytes,
            )
            yield GaugeMetricFamily(
                "nfsgw_metadata_cache_budget_bytes",
                "Directory index budget across exports",
                value=self.config.metadata_memory,
            )

    # ------------------------------------------------------------------ reload

    async def reload(self) -> bool:
        """Re-read the configuration and apply what can change while running. False (and the
        old configuration kept) if the new one has errors."""
        async with self._reload_lock:
            self.notifier.reloading()
            try:
                try:
                    new = await asyncio.to_thread(self._load)
                except ConfigErrors as e:
                    self._reload_failed([i.format() for i in e.errors])
                    return False
                except Exception as e:  # a loader bug must not take the service down
                    self._reload_failed([repr(e)])
                    return False
                self.apply(new)
                return True
            finally:
                self.notifier.ready(self._status())

    def _load(self) -> ServerConfig:
        if self.config_loader is not None:
            return self.config_loader()
        if self.config.source is None:
            raise ConfigErrors([])  # nothing to reload from
        return load_config(self.config.source)[0]

    def _reload_failed(self, errors: list[str]) -> None:
        self.reloads["error"] += 1
        self.last_reload_error = errors
        log.error("config_reload_failed", errors=errors, kept="the running configuration")

    def apply(self, new: ServerConfig) -> dict[str, list[str]]:
        """Apply ``new`` to the running server (see the module docstring); returns what
        changed: ``added``, ``removed``, ``updated``, ``rebuilt`` exports and
        ``restart_needed`` settings."""
        gw = self.gateway
        assert gw is not None, "apply() before start()"
        old = self.config
        restart = [f for f in RESTART_ONLY if getattr(old, f) != getattr(new, f)]
        if old.admin_listen != new.admin_listen:
            restart.append("admin.listen")
        merged = dataclasses.replace(
            new, **{f: getattr(old, f) for f in RESTART_ONLY}, metrics_listen=old.metrics_listen
        )
        if old.admin_listen != new.admin_listen:
            merged = dataclasses.replace(
                merged, admin=dataclasses.replace(new.admin, listen=old.admin.listen)
            )
        self.config = merged
        gw.config = merged
        changes: dict[str, list[str]] = {
            "added": [],
            "removed": [],
            "updated": [],
            "rebuilt": [],
            "restart_needed": restart,
        }
        wanted = {ec.path: ec for ec in new.exports}
        for path, export in list(gw.by_path.items()):
            if path not in wanted:
                gw.remove_export(export)
                self._retire(export)
                changes["removed"].append(path)
        for path, ec in wanted.items():
            cur = gw.by_path.get(path)
            if cur is None:
                gw.add_export(self._make_export(ec))
                changes["added"].append(path)
            elif cur.cfg == ec:
                continue
            elif any(getattr(cur.cfg, f) != getattr(ec, f) for f in _REBUILD):
                fresh = self._make_export(ec)
                gw.remove_export(cur)
                gw.add_export(fresh)
                self._retire(cur)
                changes["rebuilt"].append(path)
            else:
                cur.cfg = ec  # security and attribute rules: the next call sees them
                changes["updated"].append(path)
        self.reloads["ok"] += 1
        self.last_reload_error = []
        log.info("config_reloaded", **{k: v for k, v in changes.items() if v})
        if restart:
            log.warning("config_restart_needed", settings=restart)
        return changes

    def _retire(self, export: Export) -> None:
        """Close a replaced or removed export's index and store once calls still using it had
        time to finish; keep its counters in the totals (they must never go down)."""
        self.metrics.remove_stats("namespace", export.ns.stats)
        for f in dataclasses.fields(NamespaceStats):
            if f.name not in _NS_GAUGES:
                v = getattr(self._retired_ns, f.name) + getattr(export.ns.stats, f.name)
                setattr(self._retired_ns, f.name, v)

        async def close_later() -> None:
            await asyncio.sleep(self.config.drain_timeout_s)
            await self._close_export(export)

        t = asyncio.get_running_loop().create_task(close_later())
        self._retiring.add(t)
        t.add_done_callback(self._retiring.discard)
        self._retired_exports.append(export)

    @staticmethod
    async def _close_export(export: Export) -> None:
        for what, close in (("namespace", export.ns.close), ("store", export.store.close)):
            try:
                await close()
            except Exception as e:
                log.warning("close_failed", what=what, export=export.cfg.path, error=repr(e))

    # ------------------------------------------------------------------ stop

    async def stop(self, drain_timeout_s: float | None = None) -> None:
        if self._stopped:
            return
        self._stopped = True
        self.stopping = True
        timeout = self.config.drain_timeout_s if drain_timeout_s is None else drain_timeout_s
        deadline = self.clock.monotonic() + timeout
        self.notifier.stopping(timeout)
        for s in self._servers:
            s.close()
        inflight = self.conn_stats.inflight
        for conn in list(self.connections):
            conn.close()
        drained = True
        if self.connections:
            try:
                async with asyncio.timeout(timeout):
                    await asyncio.gather(
                        *(c.drain() for c in list(self.connections)), return_exceptions=True
                    )
            except TimeoutError:
                drained = False
        aborted = len(self.connections)
        for conn in list(self.connections):
            conn.abort()
        log.info(
            "gateway_drained",
            inflight_at_stop=inflight,
            complete=drained,
            connections_aborted=aborted,
        )
        for s in self._servers:
            try:
                await s.wait_closed()
            except Exception as e:
                log.warning("close_failed", what="listener", error=repr(e))
        if self._registered_with_rpcbind and self.config.portmap_port:
            host = "127.0.0.1"
            for prog, vers in ((nfs3.PROGRAM, nfs3.VERSION), (mount3.PROGRAM, mount3.VERSION)):
                try:
                    await pmap_client.unset_mapping(
                        host,
                        self.config.portmap_port,
                        portmap.Mapping(prog, vers, portmap.IPPROTO_TCP, self.port),
                    )
                except Exception as e:
                    log.warning("rpcbind_unset_failed", prog=prog, vers=vers, error=repr(e))
        if self.warmups is not None:
            await self.warmups.close()
        if self.admin is not None:
            await self.admin.stop()
        for t in list(self._retiring):
            t.cancel()
        if self.gateway is not None:
            writes = getattr(self.gateway, "writes", None)
            if writes is not None:
                # Staged writes are committed (uploaded) within what is left of the deadline;
                # clients resend anything not committed (the write verifier changes).
                left = max(0.0, deadline - self.clock.monotonic())
                await writes.close(commit_timeout_s=left)
            # Fetches still in flight (read-ahead) use the stores: stop them first.
            await self.gateway.reader.close()
            for export in [*self.gateway.exports.values(), *self._retired_exports]:
                await self._close_export(export)
            await self.gateway.handles.close()
        await self.notifier.close()
        log.info("gateway_stopped", port=self.port)

    def request_stop(self) -> None:
        self._stopping.set()

    async def run_until_signalled(self) -> int:
        """Serve until SIGTERM/SIGINT (then drain and return 0); SIGHUP reloads."""
        loop = asyncio.get_running_loop()
        reloads: set[asyncio.Task[bool]] = set()

        def on_hup() -> None:
            t = loop.create_task(self.reload())
            reloads.add(t)
            t.add_done_callback(reloads.discard)

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._stopping.set)
        loop.add_signal_handler(signal.SIGHUP, on_hup)
        try:
            await self._stopping.wait()
            log.info("gateway_stopping")
            for t in list(reloads):
                t.cancel()
            await self.stop()
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                loop.remove_signal_handler(sig)
        return 0


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def state_dir_default() -> Path:
    return Path("/var/lib/nfsgw")
