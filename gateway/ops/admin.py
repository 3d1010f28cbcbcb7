"""The admin HTTP API (aiohttp).

Owns: the routes operators and probes use, on ``admin.listen`` (127.0.0.1:9426 by default
with a config file), optionally behind a bearer token (``admin.token_file``; /healthz and
/readyz stay open for probes):

- ``GET /metrics``   Prometheus text (``gateway.ops.metrics``)
- ``GET /healthz``   200 while the event loop runs
- ``GET /readyz``    200 when serving, every export's backend answers a one-key LIST (sent
                     through the export's ``gateway.ops.probe.BackendProbe``, which logs a
                     change of cause once; cached for ``READY_CACHE_S``) and no pack index is
                     awaited (``PackedStore.pending``); 503 otherwise, with ``reason`` (one
                     line naming each export and what is wrong) and the details
- ``GET /v1/stats``  JSON summary: calls, backend requests per file opened, caches, exports,
                     warm-ups, reloads
- ``POST /v1/invalidate``  ``{"path": "/export/dir/file", "subtree": false}``: the index
                     forgets the path (and with ``subtree`` everything under it); a file's
                     cached data is dropped too
- ``POST /v1/warmup``      ``{"path": "/export/dir", "data": false, "concurrency": 8,
                     "wait": false}``: start a warm-up job (``gateway.ops.warmup``); 202 + the
                     job (or 200 when ``wait``). ``GET /v1/warmup[/ID]`` shows progress,
                     ``DELETE`` cancels.
- ``POST /v1/reload``  like SIGHUP

Depends on what it is given by the composition root (``gateway.ops.server``): the export
registry, the metrics, the warm-ups, a clock, and ``Served``, the few things only the process
itself knows (its configuration, port, life-cycle state and reload).

Must not: import the server, block the loop, or put paths or keys into metric labels.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Protocol

import structlog
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gateway.clock import Clock
from gateway.ops.config import ServerConfig, split_listen
from gateway.ops.metrics import Metrics
from gateway.ops.probe import BackendProbe
from gateway.ops.warmup import WarmupJob, WarmupRefused, Warmups
from gateway.pack.store import PackedStore
from gateway.registry import Gateway

log = structlog.get_logger(__name__)

READY_CACHE_S = 5.0
_OPEN = frozenset({"/healthz", "/readyz"})


class Served(Protocol):
    """What the admin API needs from the process it serves (``gateway.ops.server.Server``)."""

    @property
    def config(self) -> ServerConfig:
        """The running configuration (``admin.token`` is read per request: a reload applies)."""
        ...

    @property
    def port(self) -> int: ...

    @property
    def started(self) -> bool: ...

    @property
    def stopping(self) -> bool: ...

    @property
    def last_reload_error(self) -> list[str]: ...

    @property
    def probes(self) -> Mapping[str, BackendProbe]:
        """Export path -> its backend's probe."""
        ...

    async def reload(self) -> bool: ...


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class AdminApi:
    def __init__(
        self, served: Served, gateway: Gateway, metrics: Metrics, warmups: Warmups, clock: Clock
    ) -> None:
        self.served = served
        self.gateway = gateway
        self.metrics = metrics
        self.warmups = warmups
        self.clock = clock
        self._runner: web.AppRunner | None = None
        self._ready: tuple[float, bool, dict[str, str | None]] | None = None
        self._probe: asyncio.Task[dict[str, str | None]] | None = None
        self.app = self._build()

    def _build(self) -> web.Application:
        app = web.Application(middlewares=[self._auth], client_max_size=64 << 10)
        r = app.router
        r.add_get("/metrics", self.metrics_page)
        r.add_get("/healthz", self.healthz)
        r.add_get("/readyz", self.readyz)
        r.add_get("/v1/stats", self.stats)
        r.add_post("/v1/invalidate", self.invalidate)
        r.add_post("/v1/warmup", self.warmup)
        r.add_get("/v1/warmup", self.warmup_list)
        r.add_get("/v1/warmup/{id}", self.warmup_get)
        r.add_delete("/v1/warmup/{id}", self.warmup_cancel)
        r.add_post("/v1/reload", self.reload)
        return app

    async def start(self, listen: str) -> int:
        host, port = split_listen(listen)
        runner = web.AppRunner(self.app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        await site.start()
        self._runner = runner
        server = getattr(site, "_server", None)
        socks = getattr(server, "sockets", None) or []
        return int(socks[0].getsockname()[1]) if socks else port

    async def start_unix(self, path: str) -> None:
        """Serve on a Unix socket (a worker process: its supervisor is the only client)."""
        runner = web.AppRunner(self.app, access_log=None, handle_signals=False)
        await runner.setup()
        await web.UnixSite(runner, path).start()
        self._runner = runner

    async def stop(self) -> None:
        if self._probe is not None:
            self._probe.cancel()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @web.middleware
    async def _auth(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        refused = check_token(request, self.served.config.admin.token)
        return refused if refused is not None else await handler(request)

    # -- probes and metrics -------------------------------------------------------------------

    async def metrics_page(self, request: web.Request) -> web.Response:
        body = generate_latest(self.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(self, request: web.Request) -> web.Response:
        s = self.served
        if not s.started or s.stopping:
            return web.json_response(
                {"ready": False, "reason": "stopping" if s.stopping else "starting"}, status=503
            )
        backends = await self.backend_status()
        reasons = [f"{p}: {why}" for p, why in sorted(backends.items()) if why is not None]
        body: dict[str, Any] = {"backends": {p: v or "ok" for p, v in backends.items()}}
        packs: dict[str, str] = {}
        for path, e in sorted(self.gateway.by_path.items()):
            if isinstance(e.store, PackedStore):
                packs[path] = e.store.status
                if e.store.pending:  # bounded: index_wait_s after its load began
                    reasons.append(f"{path}: pack index loading")
        # A pack that is not used does not make the gateway unready: it serves from the
        # bucket, as without one.
        if packs:
            body["packs"] = packs
        ok = not reasons
        body["ready"] = ok
        if not ok:
            body["reason"] = "; ".join(reasons)
        return web.json_response(body, status=200 if ok else 503)

    async def backend_status(self) -> dict[str, str | None]:
        """Export path -> None (reachable) or why not; one probe at a time, cached."""
        now = self.clock.monotonic()
        if self._ready is not None and now - self._ready[0] < READY_CACHE_S:
            return self._ready[2]
        if self._probe is None or self._probe.done():
            self._probe = asyncio.get_running_loop().create_task(self._probe_all())
        result = await asyncio.shield(self._probe)
        self._ready = (self.clock.monotonic(), True, result)
        return result

    async def _probe_all(self) -> dict[str, str | None]:
        """Each export's probe, sent again (the probe logs a new cause or a recovery once)."""
        probes = self.served.probes
        paths = sorted(self.gateway.by_path)

        async def one(path: str) -> str | None:
            probe = probes.get(path)
            if probe is None:  # an export being added by a reload
                return "backend not probed yet"
            d = await probe.check()
            return None if d is None else d.reason()

        results = await asyncio.gather(*(one(p) for p in paths))
        return dict(zip(paths, results, strict=True))

    # -- /v1 ----------------------------------------------------------------------------------

    async def stats(self, request: web.Request) -> web.Response:
        return web.json_response(
            stats_snapshot(self.served, self.gateway, self.metrics, self.warmups)
        )

    async def _json(self, request: web.Request) -> dict[str, Any]:
        if not request.can_read_body:
            return dict(request.query)
        try:
            body = await request.json()
        except ValueError:
            raise web.HTTPBadRequest(text='{"error": "body is not JSON"}') from None
        if not isinstance(body, dict):
            raise web.HTTPBadRequest(text='{"error": "body must be a JSON object"}')
        return body

    @staticmethod
    def _flag(v: object) -> bool:
        return v is True or (isinstance(v, str) and v.lower() in ("1", "true", "yes"))

    async def invalidate(self, request: web.Request) -> web.Response:
        body = await self._json(request)
        path = body.get("path")
        if not isinstance(path, str) or not path.startswith("/"):
            return web.json_response({"error": "give an absolute path: /export/dir"}, status=400)
        subtree = self._flag(body.get("subtree", False))
        found = self.gateway.find_export(path)
        if found is None:
            return web.json_response({"error": f"{path}: no export contains it"}, status=404)
        export, rel = found
        export.ns.invalidate(rel, subtree=subtree)
        if rel:
            self.gateway.reader.invalidate(export.store.name, export.prefix + rel)
        log.info("invalidated", export=export.cfg.path, path=rel, subtree=subtree)
        return web.json_response({"export": export.cfg.path, "path": rel, "subtree": subtree})

    async def warmup(self, request: web.Request) -> web.Response:
        body = await self._json(request)
        path = body.get("path")
        if not isinstance(path, str) or not path.startswith("/"):
            return web.json_response({"error": "give an absolute path: /export/dir"}, status=400)
        try:
            concurrency = int(body.get("concurrency", 8))
        except (TypeError, ValueError):
            return web.json_response({"error": "concurrency must be an integer"}, status=400)
        try:
            job = self.warmups.start(
                path, data=self._flag(body.get("data", False)), concurrency=concurrency
            )
        except LookupError as e:
            return web.json_response({"error": str(e)}, status=404)
        except ValueError as e:
            return web.json_response({"error": str(e)}, status=400)
        except WarmupRefused as e:
            return web.json_response({"error": str(e)}, status=429)
        if self._flag(body.get("wait", False)):
            await job.done.wait()
            return web.json_response(job.as_dict())
        return web.json_response(job.as_dict(), status=202)

    def _job(self, request: web.Request) -> WarmupJob:
        try:
            job = self.warmups.jobs.get(int(request.match_info["id"]))
        except ValueError:
            job = None
        if job is None:
            raise web.HTTPNotFound(
                text='{"error": "no such warm-up"}', content_type="application/json"
            )
        return job

    async def warmup_list(self, request: web.Request) -> web.Response:
        return web.json_response([j.as_dict() for j in self.warmups.jobs.values()])

    async def warmup_get(self, request: web.Request) -> web.Response:
        job = self.warmups.progress(self._job(request))
        return web.json_response(job.as_dict())

    async def warmup_cancel(self, request: web.Request) -> web.Response:
        job = self._job(request)
        self.warmups.cancel(job.id)
        with contextlib.suppress(asyncio.CancelledError):
            await job.done.wait()
        return web.json_response(job.as_dict())

    async def reload(self, request: web.Request) -> web.Response:
        ok = await self.served.reload()
        body = {"ok": ok, "errors": self.served.last_reload_error}
        return web.json_response(body, status=200 if ok else 422)


def check_token(request: web.Request, token: str | None) -> web.Response | None:
    """401 unless the request carries the bearer ``token`` (when one is set); the probes
    (/healthz, /readyz) stay open."""
    if not token or request.path in _OPEN:
        return None
    scheme, _, value = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "bearer" and hmac.compare_digest(value.strip().encode(), token.encode()):
        return None
    return web.json_response(
        {"error": "a bearer token is required (admin.token_file)"},
        status=401,
        headers={"WWW-Authenticate": 'Bearer realm="nfsgw"'},
    )


def stats_snapshot(served: Served, gw: Gateway, m: Metrics, warmups: Warmups) -> dict[str, Any]:
    """The JSON summary behind ``GET /v1/stats`` and ``nfsgw stats``."""
    rpc: dict[str, dict[str, int]] = {}
    for (proc, status), h in sorted(m.rpc.items()):
        if h.count:
            rpc.setdefault(proc, {})[status] = h.count
    backend: dict[str, dict[str, int]] = {}
    for (op, outcome), h in sorted(m.s3.items()):
        if h.count:
            backend.setdefault(op, {})[outcome] = h.count
    backend_total = sum(sum(v.values()) for v in backend.values())
    data = m.totals("data")
    gws = m.totals("gateway")
    opened = int(gws.get("files_opened", 0))
    conn = m.totals("conn")
    process = m.totals("server")
    lookups = data.get("hits", 0) + data.get("misses", 0)
    exports: list[dict[str, Any]] = []
    for path, e in sorted(gw.by_path.items()):
        c = e.cfg
        exports.append(
            {
                "path": path,
                "backend": c.backend,
                "read_only": c.read_only,
                "clients": [str(n) for n in c.clients],
                "squash": c.squash,
                "anonuid": c.anonuid,
                "anongid": c.anongid,
                "attr_ttl_s": c.attr_ttl_s,
                "immutable": c.immutable,
                "secure_port": c.secure_port,
                "metadata": {k: v for k, v in _fields(e.ns.stats)},
            }
        )
    return {
        "version": _version(),
        "uptime_s": round(time.time() - m.start_time, 3),
        "port": served.port,
        "ready": served.started and not served.stopping,
        "connections": {
            "open": int(conn.get("open", 0)),
            "opened": int(conn.get("opened", 0)),
            "refused": int(process["connections_refused"]),
        },
        "rpc": {
            "inflight": int(conn.get("inflight", 0)),
            "calls": rpc,
            "calls_total": sum(sum(v.values()) for v in rpc.values()),
            "errors": dict(m.rpc_errors),
        },
        "network": {
            "received_bytes": int(conn.get("bytes_in", 0)),
            "sent_bytes": int(conn.get("bytes_out", 0)),
        },
        "backend": {"requests": backend, "requests_total": backend_total},
        "files_opened": opened,
        "backend_requests_per_file_opened": round(backend_total / opened, 4) if opened else None,
        "data_cache": {
            **{k: int(v) for k, v in data.items()},
            "budget_bytes": gw.reader.cache.budget_bytes,
            "hit_ratio": round(data.get("hits", 0) / lookups, 4) if lookups else None,
        },
        "disk_cache": _disk_snapshot(m.totals("disk")),
        "data_prefetch": _prefetch_snapshot(m.totals("prefetch"), data),
        "metadata": {k: int(v) for k, v in m.totals("namespace").items()},
        "security": {k: int(v) for k, v in gws.items() if k != "files_opened"},
        "exports": exports,
        "warmups": [j.as_dict() for j in warmups.jobs.values()],
        "reloads": {
            "ok": int(process["reloads_ok"]),
            "error": int(process["reloads_error"]),
            "last_errors": served.last_reload_error,
        },
    }


def _prefetch_snapshot(p: dict[str, float], data: dict[str, float]) -> dict[str, Any]:
    """The data prefetcher's counters and gauges, with what READs made of its objects."""
    out: dict[str, Any] = {k: int(v) for k, v in p.items()}
    for k in ("ahead_used", "ahead_joined", "ahead_wasted", "ahead_dropped"):
        out[k.replace("ahead_", "")] = int(data.get(k, 0))
    done = out.get("objects", 0)
    out["waste_ratio"] = round(out["wasted"] / done, 4) if done else None
    return out


def _disk_snapshot(disk: dict[str, float]) -> dict[str, Any]:
    """The disk tier's counters and its hit ratio among the lookups that missed memory."""
    looked = disk.get("hits", 0) + disk.get("misses", 0)
    out: dict[str, Any] = {k: int(v) for k, v in disk.items()}
    out["hit_ratio"] = round(disk.get("hits", 0) / looked, 4) if looked else None
    return out


def _fields(stats: Any) -> Iterable[tuple[str, int]]:
    for name in getattr(stats, "__slots__", ()):
        v = getattr(stats, name, None)
        if isinstance(v, int) and not isinstance(v, bool):
            yield name, v


@functools.cache
def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("nfsgw")
    except PackageNotFoundError:
        return "unknown"
