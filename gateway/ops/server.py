"""The life cycle of one gateway process: its parts (built by ``gateway.ops.build``), the
listeners, the admin API (``gateway.ops.admin``); signals, reload and graceful shutdown;
systemd notifications.

Owns:

- ``start``: the parts (``build``: state and cache directories, handle secret, data cache,
  one store + namespace per export), each export's backend probe (``gateway.ops.probe``: one
  LIST at once, retried in the background until it answers, one error line per cause), the
  NFS/MOUNT/PORTMAP listener(s)
  and the admin API, which are not held back by the probes or the pack indexes; then
  ``READY=1`` once every export's first probe has ended and every pack index is in (or its
  ``index_wait_s`` is over), whichever way: a backend that is down at boot does not fail the
  service's start, ``STATUS=`` names the exports not answering and ``/readyz`` says 503 with
  the reason until they do.
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
import contextlib
import errno
import time
from collections.abc import Callable, Coroutine
from typing import Any

import structlog

from gateway import pmap_client
from gateway.backend import checksums
from gateway.backend.base import ObjectStore, RequestObserver, StoreWrapper
from gateway.clock import Clock, SystemClock
from gateway.data.prefetch import DataPrefetcher, PrefetchStats
from gateway.data.shared import SharedTier
from gateway.dispatch import Dispatcher
from gateway.drc import DuplicateRequestCache
from gateway.exports import Export, ExportConfig
from gateway.fastpath import FastPath
from gateway.forward import OwnerLink, Router, serve_owner_link
from gateway.ops.admin import LocalAdmin
from gateway.ops.adminhttp import AdminHttp
from gateway.ops.build import ExportBuilder, build
from gateway.ops.config import ServerConfig, needs_rebuild, reload_plan
from gateway.ops.configfile import ConfigErrors, load_config
from gateway.ops.gcwatch import GcWatch
from gateway.ops.metrics import Metrics, ServerStats
from gateway.ops.probe import PROBE_TIMEOUT_S, BackendProbe
from gateway.ops.systemd import Notifier
from gateway.ops.warmup import Warmups
from gateway.ops.workers import WorkerRole, until_signalled
from gateway.pack.store import PackConfig, PackedStore
from gateway.registry import Gateway
from gateway.transport import (
    CallHandler,
    ConnectionStats,
    ConnectionTable,
    RpcConnection,
    close_idle,
)
from nfsproto import mount3, nfs3, portmap

log = structlog.get_logger(__name__)


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
        role: WorkerRole | None = None,
        probe_at_start: bool | None = None,
    ) -> None:
        self.config = config
        # The process's own stores are probed at start (``gateway.ops.probe``); in-process
        # servers over given stores (tests, whose request counts are exact) opt in.
        self.probe_at_start = store_factory is None if probe_at_start is None else probe_at_start
        # One of ``server.workers`` processes (``gateway.ops.workers``), or None: the only one.
        self.role = role
        self.store_factory = store_factory
        self.clock = clock or SystemClock()
        # Off unless given: in-process servers (tests) must not talk to a real manager.
        self.notifier = notifier or Notifier({})
        self.config_loader = config_loader
        self.metrics = Metrics()
        self.pack_config = PackConfig()
        # Export path -> its backend's probe (``gateway.ops.probe``), for /readyz and STATUS=.
        self.probes: dict[str, BackendProbe] = {}
        self.announced = False  # READY=1 sent
        self._announce: asyncio.Task[None] | None = None
        self.drc = DuplicateRequestCache(config.server.nfs.drc, self.clock)
        self.prefetcher: DataPrefetcher | None = None
        self.shared: SharedTier | None = None
        self.fastpath: FastPath | None = None
        self.gc_watch = GcWatch()
        self.prefetch_stats = PrefetchStats()
        self._exports: ExportBuilder | None = None
        self.dispatcher = Dispatcher(self.metrics, self.drc)
        self.conn_stats = ConnectionStats()
        self.connections = ConnectionTable()
        self._servers: list[asyncio.Server] = []
        self._link: OwnerLink | None = None
        self._registered_with_rpcbind = False
        self.gateway: Gateway | None = None
        self.admin: AdminHttp | None = None
        self.warmups: Warmups | None = None
        self.port = 0
        self.portmap_port = 0
        self.metrics_port = 0
        self.started = False
        self.stopping = False
        self.refused_connections = 0
        self.evicted_connections = 0
        self.refused_peers = 0
        self._idle_sweeping = False
        self.idle_closed_connections = 0
        self.reloads = {"ok": 0, "error": 0}
        self.last_reload_error: list[str] = []
        self._reload_lock = asyncio.Lock()
        self._retiring: set[asyncio.Task[None]] = set()
        self._retired_exports: list[Export] = []
        self._stopping = asyncio.Event()
        self._stopped = False

    # ------------------------------------------------------------------ start

    async def start(self) -> None:
        c = self.config
        role = self.role
        crc = self._check_crcs()
        parts = await build(
            c,
            clock=self.clock,
            metrics=self.metrics,
            dispatcher=self.dispatcher,
            role=role,
            store_factory=self.store_factory,
            pack_config=self.pack_config,
            prefetch_stats=self.prefetch_stats,
            spawn=self._spawn,
        )
        gw = self.gateway = parts.gateway
        self.prefetcher = parts.prefetcher
        self.warmups = parts.warmups
        self.fastpath = fast = parts.fastpath
        self._exports = parts.exports
        self.shared = parts.shared
        if (
            checksums.compiled_missing()
            and not crc.failed
            and (fast is None or fast.kind != "python")
        ):
            # The fast path's warning says it when its own extension is missing too.
            log.warning("checksums_pure_python", reason=checksums.WITHOUT_COMPILED)
        self.metrics.add_stats("conn", self.conn_stats)
        self.metrics.add_stats("server", self._server_stats)
        self.metrics.add_stats("drc", self.drc.stats)
        self.metrics.add_stats("gc", self.gc_watch.stats)
        for export in gw.exports.values():
            self._watch_backend(export)
        self.gc_watch.install()
        if self.prefetcher is not None:
            self.prefetcher.start()
        if self.shared is not None:
            self._spawn(self._start_shared(self.shared), "shared-tier")

        loop = asyncio.get_running_loop()
        limits = c.server.transport
        handler: CallHandler = self.dispatcher.handle
        if role is not None and role.owner:
            self._servers.append(
                await serve_owner_link(
                    role.owner_socket, self.dispatcher.handle, limits, self.connections
                )
            )
        elif role is not None:
            self._link = OwnerLink(role.owner_socket, limits.max_record)
            self.metrics.add_stats("route", self._link.stats)
            handler = Router(self.dispatcher, gw, self._link).handle

        def factory() -> asyncio.Protocol:
            full = len(self.connections) >= self.config.server.max_connections
            if full and not self._make_room(None, "max_connections"):
                return _Refused()
            conn = RpcConnection(handler, limits, self.conn_stats, self.connections, fast)
            conn.admit = self._admit
            self._sweep_idle()
            return conn

        # Workers share the port: the kernel spreads connections over their listeners.
        srv = await loop.create_server(
            factory,
            c.server.listen,
            c.server.port,
            reuse_address=True,
            reuse_port=role is not None,
            backlog=1024,
        )
        self._servers.append(srv)
        self.port = gw.port = srv.sockets[0].getsockname()[1]
        if c.server.portmap_port is not None:
            await self._start_portmap(factory, c.server.portmap_port)
        gw.portmap_port = self.portmap_port
        listen = c.admin.listen
        if role is not None:
            # A worker's admin API is its supervisor's: on a private Unix socket.
            admin = AdminHttp(LocalAdmin(self, gw, self.metrics, self.warmups, self.clock))
            await admin.start_unix(str(role.admin_socket))
            self.admin = admin
        elif listen:
            admin = AdminHttp(LocalAdmin(self, gw, self.metrics, self.warmups, self.clock))
            self.metrics_port = await admin.start(listen)
            self.admin = admin
        self.started = True
        # The listeners serve already (and /readyz joins a probe in flight); the first probes
        # (sent before the listeners opened) have at most PROBE_TIMEOUT_S to end, so a wrong
        # backend is said next to gateway_started.
        first = [p.first.wait() for p in self.probes.values() if p.started]
        bound = max((p.timeout_s for p in self.probes.values()), default=PROBE_TIMEOUT_S)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(bound + 0.5):
                await asyncio.gather(*first)
        log.info(
            "gateway_started",
            listen=c.server.listen,
            port=self.port,
            portmap_port=self.portmap_port or None,
            admin_port=self.metrics_port or None,
            exports=[e.path for e in c.exports],
            cache_memory=gw.reader.cache.budget_bytes,
            fast_path=fast.kind if fast is not None else "off",
            crc_engine=crc.engine,
            config=str(c.source) if c.source else None,
            not_answering=self._not_answering() or None,
        )
        self.notifier.start_watchdog()
        self._announce = loop.create_task(self._announce_ready(), name="announce-ready")

    @staticmethod
    def _check_crcs() -> checksums.EngineCheck:
        """The compiled CRC engine checked against the reference (``checksums.self_check``,
        ~10 ms once a process); a fallback is said in one warning naming both engines."""
        crc = checksums.self_check()
        if crc.failed:
            log.warning(
                "checksum_engine_fallback",
                failed=list(crc.failed),
                engine=crc.engine,
                mismatch=crc.mismatch,
                lost=checksums.WITHOUT_COMPILED if crc.engine == "python" else None,
            )
        return crc

    async def _announce_ready(self) -> None:
        """``READY=1`` once every pack index is in or was waited for long enough
        (``PackConfig.index_wait_s``, each bounded on its own), with ``STATUS=`` naming the
        exports not answering and the indexes still loading. A backend that does not answer
        does not hold READY back (the first probes ended, or timed out, before
        ``gateway_started``): a service that never became ready because S3 was down at
        boot would fail its start."""
        gw = self.gateway
        assert gw is not None
        t0 = time.monotonic()
        waits = [e.store.settled() for e in gw.exports.values() if isinstance(e.store, PackedStore)]
        if waits:
            with contextlib.suppress(TimeoutError):  # a guard: each wait is bounded already
                async with asyncio.timeout(self.pack_config.index_wait_s + 1.0):
                    await asyncio.gather(*waits)
        self.announced = True
        log.info(
            "gateway_ready",
            waited_s=round(time.monotonic() - t0, 3),
            not_answering=self._not_answering() or None,
            pack_index_loading=self._packs_pending() or None,
        )
        self.notifier.ready(self._status())

    def _not_answering(self) -> list[str]:
        return sorted(p for p, pr in self.probes.items() if pr.answered is False)

    def _packs_pending(self) -> list[str]:
        gw = self.gateway
        return sorted(
            p
            for p, e in (gw.by_path.items() if gw else ())
            if isinstance(e.store, PackedStore) and e.store.pending
        )

    def _watch_backend(self, export: Export) -> None:
        """Probe ``export``'s backend now and until it answers (replacing the probe of an
        export it rebuilds)."""
        ec = export.cfg
        store = export.store.inner if isinstance(export.store, StoreWrapper) else export.store
        probe = BackendProbe(
            ec.path,
            ec.backend,
            store.traits.endpoint,
            store,
            export.prefix,
            on_change=self._status_changed,
            # With workers, one line per cause for the service: the owner's.
            quiet=self.role is not None and not self.role.owner,
        )
        self._unwatch(ec.path)
        self.probes[ec.path] = probe
        if self.probe_at_start:
            probe.start()

    def _unwatch(self, path: str) -> None:
        old = self.probes.pop(path, None)
        if old is not None:
            self._spawn(old.close(), f"probe-close:{path}")

    def _status_changed(self) -> None:
        if self.announced and not self.stopping:
            self.notifier.status(self._status())

    def _status(self) -> str:
        gw = self.gateway
        n = len(gw.exports) if gw else 0
        text = f"serving {n} export{'s' if n != 1 else ''} on port {self.port}"
        for path, p in sorted(self.probes.items()):
            if p.answered is False and p.diagnosis is not None:
                text += f"; {path} not answering: {p.diagnosis.problem}"
        for path in self._packs_pending():
            text += f"; {path}: pack index loading"
        return text

    def _build_export(self, ec: ExportConfig) -> Export:
        assert self._exports is not None, "start() builds the exports"
        return self._exports.build(ec, self.config)

    def _make_room(self, host: str | None, limit: str) -> bool:
        """Close a connection (from ``host``, or any: ``ConnectionTable.make_room``'s
        choice) for a new one; False: every one is busy and the new connection is refused."""
        victim = self.connections.make_room(host)
        if victim is None:
            self.refused_connections += 1
            if self.refused_connections == 1 or self.refused_connections % 1000 == 0:
                log.warning("connection_refused", limit=limit, refused=self.refused_connections)
            return False
        self.evicted_connections += 1
        if self.evicted_connections == 1 or self.evicted_connections % 1000 == 0:
            log.warning(
                "connection_evicted",
                limit=limit,
                client=victim.peer.host,
                answered_calls=victim.answered,
                evicted=self.evicted_connections,
            )
        victim.abort()
        return True

    def _admit(self, conn: RpcConnection) -> bool:
        """Once the new connection's peer is known: ``refuse_unknown_peers`` (a peer in no
        export's ``clients``), then the per-address cap."""
        c = self.config
        if c.server.refuse_unknown_peers and not any(e.allows(conn.peer.host) for e in c.exports):
            self.refused_peers += 1
            if self.refused_peers == 1 or self.refused_peers % 1000 == 0:
                log.warning(
                    "connection_refused_peer", client=conn.peer.host, refused=self.refused_peers
                )
            return False
        cap = c.server.max_connections_per_address
        host = conn.peer.host
        if len(self.connections.from_host(host)) < cap:
            return True
        return self._make_room(host, "max_connections_per_address")

    def _sweep_idle(self) -> None:
        """Start the idle sweep, unless it runs: it runs while there are connections."""
        if not self._idle_sweeping and self.config.server.idle_timeout_s > 0:
            self._idle_sweeping = True
            self._spawn(self._close_idle_connections(), "close-idle-connections")

    async def _close_idle_connections(self) -> None:
        """Every few seconds, close the connections idle past ``idle_timeout_s``; ends when
        no connection is left (the next one starts it again)."""
        loop = asyncio.get_running_loop()
        try:
            while not self.stopping:
                timeout = self.config.server.idle_timeout_s
                if timeout <= 0:
                    return
                await asyncio.sleep(min(30.0, timeout / 4))
                if self.stopping or not self.connections:
                    return
                closed = close_idle(self.connections, loop.time(), timeout)
                self.idle_closed_connections += closed
        finally:
            self._idle_sweeping = False

    @staticmethod
    async def _start_shared(shared: SharedTier) -> None:
        """Probe the shared tier once (one line either way), then keep the fleet's members
        current while the server runs."""
        await shared.probe()
        if shared.fleet is not None:
            await shared.fleet.run()

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        """Run ``coro`` in the background until it ends or the server stops."""
        t = asyncio.get_running_loop().create_task(coro, name=name)
        self._retiring.add(t)
        t.add_done_callback(self._retiring.discard)

    async def _start_portmap(self, factory: Callable[[], asyncio.Protocol], port: int) -> None:
        loop = asyncio.get_running_loop()
        try:
            srv = await loop.create_server(
                factory,
                self.config.server.listen,
                port,
                reuse_address=True,
                reuse_port=self.role is not None,
            )
        except OSError as e:
            if e.errno != errno.EADDRINUSE:
                raise
            if self.role is not None and not self.role.owner:
                return  # one registration per service: the owner's
            # A system rpcbind owns the port: register our programs with it instead.
            listen = self.config.server.listen
            host = "127.0.0.1" if listen in ("0.0.0.0", "::") else listen
            for prog, vers in ((nfs3.PROGRAM, nfs3.VERSION), (mount3.PROGRAM, mount3.VERSION)):
                ok = await pmap_client.set_mapping(
                    host, port, portmap.Mapping(prog, vers, portmap.IPPROTO_TCP, self.port)
                )
                log.info("rpcbind_registered", prog=prog, vers=vers, ok=ok, rpcbind_port=port)
            self._registered_with_rpcbind = True
            return
        self._servers.append(srv)
        self.portmap_port = srv.sockets[0].getsockname()[1]

    def _server_stats(self) -> ServerStats:
        """The process's own readings, for ``gateway.ops.metrics`` at scrape time."""
        gw = self.gateway
        return ServerStats(
            exports=len(gw.exports) if gw else 0,
            connections_refused=self.refused_connections,
            connections_evicted=self.evicted_connections,
            connections_refused_peer=self.refused_peers,
            connections_idle_closed=self.idle_closed_connections,
            reloads_ok=self.reloads["ok"],
            reloads_error=self.reloads["error"],
            data_cache_budget_bytes=gw.reader.cache.budget_bytes if gw else 0,
            metadata_cache_budget_bytes=self.config.cache.metadata_memory,
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
        # Settings a reload cannot change (listeners, budgets, the handle secret) keep their
        # running values; each key declares which it is (gateway.ops.config).
        merged, restart = reload_plan(old, new)
        self.config = merged
        gw.config = merged.server.nfs
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
                self._unwatch(path)
                changes["removed"].append(path)
        for path, ec in wanted.items():
            cur = gw.by_path.get(path)
            if cur is None:
                fresh = self._build_export(ec)
                gw.add_export(fresh)
                self._watch_backend(fresh)
                changes["added"].append(path)
            elif cur.cfg == ec:
                continue
            elif needs_rebuild(cur.cfg, ec):
                fresh = self._build_export(ec)
                gw.remove_export(cur)
                gw.add_export(fresh)
                self._watch_backend(fresh)
                self._retire(cur)
                changes["rebuilt"].append(path)
            else:
                cur.cfg = ec  # security and attribute rules: the next call sees them
                changes["updated"].append(path)
        if self.fastpath is not None:
            self.fastpath.clear()  # client lists, squash, modes: decided again
        self.reloads["ok"] += 1
        self.last_reload_error = []
        log.info("config_reloaded", **{k: v for k, v in changes.items() if v})
        if restart:
            log.warning("config_restart_needed", settings=restart)
        return changes

    def _retire(self, export: Export) -> None:
        """Close a replaced or removed export's index and store once calls still using it had
        time to finish; keep its counters in the totals (they must never go down)."""
        self.metrics.retire_stats("namespace", export.ns.stats)
        if self.prefetcher is not None:
            self.prefetcher.forget_store(export.store)

        async def close_later() -> None:
            await asyncio.sleep(self.config.server.drain_timeout_s)
            await self._close_export(export)

        self._spawn(close_later(), f"export-close:{export.cfg.path}")
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
        timeout = self.config.server.drain_timeout_s if drain_timeout_s is None else drain_timeout_s
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
        # Non-idempotent calls run on in the duplicate-request cache after their connection
        # is gone: let them finish (or cancel them) before the stores close.
        await self.drc.close(max(0.0, deadline - self.clock.monotonic()))
        for s in self._servers:
            try:
                await s.wait_closed()
            except Exception as e:
                log.warning("close_failed", what="listener", error=repr(e))
        if self._registered_with_rpcbind and self.config.server.portmap_port:
            host = "127.0.0.1"
            for prog, vers in ((nfs3.PROGRAM, nfs3.VERSION), (mount3.PROGRAM, mount3.VERSION)):
                try:
                    await pmap_client.unset_mapping(
                        host,
                        self.config.server.portmap_port,
                        portmap.Mapping(prog, vers, portmap.IPPROTO_TCP, self.port),
                    )
                except Exception as e:
                    log.warning("rpcbind_unset_failed", prog=prog, vers=vers, error=repr(e))
        if self._announce is not None:
            self._announce.cancel()
        for probe in list(self.probes.values()):
            await probe.close()
        self.probes.clear()
        if self._link is not None:
            await self._link.close()
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
            # Fetches still in flight (read-ahead, prefetch) use the stores: stop them first.
            if self.prefetcher is not None:
                await self.prefetcher.close()
            await self.gateway.reader.close()
            if self.shared is not None:
                await self.shared.close()
            if self.gateway.reader.disk is not None:
                await self.gateway.reader.disk.close()
            for export in [*self.gateway.exports.values(), *self._retired_exports]:
                await self._close_export(export)
            await self.gateway.handles.close()
        self.gc_watch.remove()
        await self.notifier.close()
        log.info("gateway_stopped", port=self.port)

    async def run_until_signalled(self) -> int:
        """Serve until SIGTERM/SIGINT (then drain and return 0); SIGHUP reloads."""
        return await until_signalled(self._stopping, self.reload, self.stop, "gateway_stopping")
