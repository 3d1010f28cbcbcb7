"""The admin HTTP API (aiohttp) and warm-up jobs.

Owns: the routes operators and probes use, on ``admin.listen`` (127.0.0.1:9426 by default
with a config file), optionally behind a bearer token (``admin.token_file``; /healthz and
/readyz stay open for probes):

- ``GET /metrics``   Prometheus text (``gateway.ops.metrics``)
- ``GET /healthz``   200 while the event loop runs
- ``GET /readyz``    200 when serving and every export's backend answers a one-key LIST
                     (cached for ``READY_CACHE_S``); 503 with the reasons otherwise
- ``GET /v1/stats``  JSON summary: calls, backend requests per file opened, caches, exports,
                     warm-ups, reloads
- ``POST /v1/invalidate``  ``{"path": "/export/dir/file", "subtree": false}``: the index
                     forgets the path (and with ``subtree`` everything under it); a file's
                     cached data is dropped too
- ``POST /v1/warmup``      ``{"path": "/export/dir", "data": false, "concurrency": 8,
                     "wait": false}``: list every directory under the path (and with ``data``
                     read every file into the data cache, up to 90 % of its budget) with at
                     most ``concurrency`` backend requests at once; 202 + the job (or 200 when
                     ``wait``). ``GET /v1/warmup[/ID]`` shows progress, ``DELETE`` cancels.
- ``POST /v1/reload``  like SIGHUP

Must not: block the loop, or put paths or keys into metric labels.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import hmac
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import structlog
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gateway.backend.base import BackendError
from gateway.errors import GatewayError, NotFound
from gateway.exports import Export
from gateway.namespace import Entry, EntryKind
from gateway.ops.config import split_listen

if TYPE_CHECKING:
    from gateway.ops.server import Server

log = structlog.get_logger(__name__)

READY_CACHE_S = 5.0
PROBE_TIMEOUT_S = 5.0
MAX_WARMUP_RUNNING = 4
MAX_WARMUP_KEPT = 32
MAX_WARMUP_CONCURRENCY = 256
MAX_WARMUP_FRONTIER = 1_000_000  # directories waiting to be listed, per job
WARMUP_CHUNK = 4 << 20
WARMUP_DATA_SHARE = 0.9  # of the data cache budget a data warm-up may fill
_OPEN = frozenset({"/healthz", "/readyz"})


def find_export(server: Server, path: str) -> tuple[Export, str] | None:
    """The export whose path is ``path`` or its longest parent -> (export, relative path)."""
    gw = server.gateway
    if gw is None:
        return None
    clean = "/" + "/".join(p for p in path.split("/") if p)
    best: tuple[Export, str] | None = None
    for p, e in gw.by_path.items():
        if clean == p:
            return e, ""
        base = p.rstrip("/") + "/"
        if clean.startswith(base) and (best is None or len(p) > len(best[0].cfg.path)):
            best = (e, clean[len(base) :])
    return best


# ================================================================================ warm-up


@dataclass(slots=True)
class WarmupJob:
    id: int
    path: str
    export: str
    rel: str
    data: bool
    concurrency: int
    state: str = "running"  # running, done, failed, cancelled
    dirs_listed: int = 0
    files_seen: int = 0
    bytes_seen: int = 0
    files_read: int = 0
    bytes_read: int = 0
    files_skipped: int = 0  # data not read: the cache share was full
    errors: int = 0
    error: str | None = None
    started_at: float = field(default_factory=time.time)
    t0: float = 0.0
    elapsed_s: float = 0.0
    task: asyncio.Task[None] | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "path": self.path,
            "export": self.export,
            "data": self.data,
            "concurrency": self.concurrency,
            "state": self.state,
            "dirs_listed": self.dirs_listed,
            "files_seen": self.files_seen,
            "bytes_seen": self.bytes_seen,
            "files_read": self.files_read,
            "bytes_read": self.bytes_read,
            "files_skipped": self.files_skipped,
            "errors": self.errors,
            "error": self.error,
            "started_at": self.started_at,
            "elapsed_s": round(self.elapsed_s, 3),
        }


class WarmupRefused(Exception):
    pass


class Warmups:
    """Warm-up jobs of one server: metadata (and optionally data) of a subtree, fetched with
    bounded concurrency; progress in ``/v1/stats`` and ``nfsgw_warmup_*`` metrics."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.jobs: collections.OrderedDict[int, WarmupJob] = collections.OrderedDict()
        self._ids = 0
        self.totals = {"dirs": 0, "files": 0, "bytes_read": 0}
        server.metrics.extra_collectors.append(self._families)

    def running(self) -> int:
        return sum(1 for j in self.jobs.values() if j.state == "running")

    def start(self, path: str, *, data: bool = False, concurrency: int = 8) -> WarmupJob:
        found = find_export(self.server, path)
        if found is None:
            raise LookupError(f"{path}: no export contains it")
        if not 1 <= concurrency <= MAX_WARMUP_CONCURRENCY:
            raise ValueError(f"concurrency must be 1..{MAX_WARMUP_CONCURRENCY}")
        if self.running() >= MAX_WARMUP_RUNNING:
            raise WarmupRefused(f"{MAX_WARMUP_RUNNING} warm-ups are running; wait or cancel one")
        export, rel = found
        self._ids += 1
        job = WarmupJob(self._ids, path, export.cfg.path, rel, data, concurrency)
        job.t0 = self.server.clock.monotonic()
        job.task = asyncio.get_running_loop().create_task(self._run(job, export))
        self.jobs[job.id] = job
        while len(self.jobs) > MAX_WARMUP_KEPT:
            oldest = next((j for j in self.jobs.values() if j.state != "running"), None)
            if oldest is None:
                break
            del self.jobs[oldest.id]
        return job

    def cancel(self, job_id: int) -> WarmupJob | None:
        job = self.jobs.get(job_id)
        if job is not None and job.task is not None and not job.task.done():
            job.task.cancel()
        return job

    async def close(self) -> None:
        tasks = [j.task for j in self.jobs.values() if j.task is not None and not j.task.done()]
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _run(self, job: WarmupJob, export: Export) -> None:
        try:
            await self._walk(job, export)
            job.state = "done"
        except asyncio.CancelledError:
            job.state = "cancelled"
            raise
        except NotFound:
            job.state, job.error = "failed", f"{job.path}: no such file or directory"
        except (GatewayError, BackendError, OverflowError) as e:
            job.state, job.error = "failed", f"{type(e).__name__}: {e}"
        finally:
            job.elapsed_s = self.server.clock.monotonic() - job.t0
            job.done.set()
            log.info("warmup_finished", **{k: v for k, v in job.as_dict().items() if v is not None})

    async def _walk(self, job: WarmupJob, export: Export) -> None:
        ns = export.ns
        sem = asyncio.Semaphore(job.concurrency)
        reader = self.server.gateway.reader if self.server.gateway else None
        data_cap = int(reader.cache.budget_bytes * WARMUP_DATA_SHARE) if reader else 0
        root = await ns.getattr(job.rel)

        async def list_dir(path: str) -> list[Entry]:
            async with sem:
                out: list[Entry] = []
                cookie, verf = 0, bytes(8)
                while True:
                    page = await ns.readdir(path, cookie, verf, max_entries=4096)
                    out.extend(e for _, e in page.entries)
                    if page.eof or not page.entries:
                        break
                    cookie, verf = page.entries[-1][0], page.verifier
            job.dirs_listed += 1
            self.totals["dirs"] += 1
            return out

        async def read_file(e: Entry) -> None:
            assert reader is not None
            async with sem:
                off = 0
                while off < e.size:
                    buf, eof = await reader.read(
                        export.store,
                        export.prefix + e.path,
                        e.etag,
                        e.size,
                        off,
                        min(WARMUP_CHUNK, e.size - off),
                    )
                    if not buf:
                        break
                    off += len(buf)
                    if eof:
                        break
            job.files_read += 1
            job.bytes_read += off
            self.totals["bytes_read"] += off

        async def read_files(files: list[Entry]) -> None:
            batch: list[Entry] = []
            planned = 0
            for e in files:
                if job.bytes_read + planned + e.size > data_cap:
                    job.files_skipped += 1
                    continue
                batch.append(e)
                planned += e.size
                if len(batch) >= job.concurrency * 4:
                    await self._gather(job, (read_file(b) for b in batch))
                    batch, planned = [], 0
            if batch:
                await self._gather(job, (read_file(b) for b in batch))

        def seen(e: Entry, files: list[Entry]) -> None:
            job.files_seen += 1
            self.totals["files"] += 1
            job.bytes_seen += e.size
            if job.data and e.kind is EntryKind.FILE:
                files.append(e)

        frontier: collections.deque[str] = collections.deque()
        if root.kind is EntryKind.DIR:
            frontier.append(root.path)
        else:
            files: list[Entry] = []
            seen(root, files)
            await read_files(files)
        while frontier:
            n = min(len(frontier), job.concurrency * 2)
            batch = [frontier.popleft() for _ in range(n)]
            results = await self._gather(job, (list_dir(p) for p in batch))
            files = []
            for entries in results:
                for e in entries:
                    if e.kind is EntryKind.DIR:
                        frontier.append(e.path)
                    else:
                        seen(e, files)
            if len(frontier) > MAX_WARMUP_FRONTIER:
                raise OverflowError(f"more than {MAX_WARMUP_FRONTIER} directories pending")
            if files:
                await read_files(files)

    @staticmethod
    async def _gather(job: WarmupJob, coros: Iterable[Awaitable[Any]]) -> list[Any]:
        """Run ``coros``; an error in one item is counted and logged, not fatal."""
        out: list[Any] = []
        for r in await asyncio.gather(*coros, return_exceptions=True):
            if isinstance(r, asyncio.CancelledError):
                raise r
            if isinstance(r, BaseException):
                job.errors += 1
                if job.errors <= 10:
                    log.warning("warmup_item_failed", job=job.id, error=repr(r))
                continue
            out.append(r)
        return out

    def _families(self) -> Iterable[Metric]:
        g = GaugeMetricFamily("nfsgw_warmup_jobs", "Warm-up jobs by state", labels=["state"])
        states = collections.Counter(j.state for j in self.jobs.values())
        for s in ("running", "done", "failed", "cancelled"):
            g.add_metric([s], states.get(s, 0))
        yield g
        yield CounterMetricFamily(
            "nfsgw_warmup_dirs", "Directories listed by warm-ups", value=self.totals["dirs"]
        )
        yield CounterMetricFamily(
            "nfsgw_warmup_files", "Files seen by warm-ups", value=self.totals["files"]
        )
        yield CounterMetricFamily(
            "nfsgw_warmup_read_bytes",
            "Bytes read into the data cache by warm-ups",
            value=self.totals["bytes_read"],
        )


# ================================================================================ the API


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class AdminApi:
    def __init__(self, server: Server) -> None:
        self.server = server
        self._runner: web.AppRunner | None = None
        self._ready: tuple[float, bool, dict[str, str | None]] | None = None
        self._probe: asyncio.Task[dict[str, str | None]] | None = None
        self.app = self._build()

    def _build(self) -> web.Application:
        app = web.Application(middlewares=[self._auth], client_max_size=64 << 10)
        r = app.router
        r.add_get("/metrics", self.metrics)
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

    async def stop(self) -> None:
        if self._probe is not None:
            self._probe.cancel()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @web.middleware
    async def _auth(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        token = self.server.config.admin.token
        if token and request.path not in _OPEN:
            got = request.headers.get("Authorization", "")
            scheme, _, value = got.partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(
                value.strip().encode(), token.encode()
            ):
                return web.json_response(
                    {"error": "a bearer token is required (admin.token_file)"},
                    status=401,
                    headers={"WWW-Authenticate": 'Bearer realm="nfsgw"'},
                )
        return await handler(request)

    # -- probes and metrics -------------------------------------------------------------------

    async def metrics(self, request: web.Request) -> web.Response:
        body = generate_latest(self.server.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(self, request: web.Request) -> web.Response:
        s = self.server
        if not s.started or s.stopping:
            return web.json_response(
                {"ready": False, "reason": "stopping" if s.stopping else "starting"}, status=503
            )
        backends = await self.backend_status()
        ok = all(v is None for v in backends.values())
        return web.json_response(
            {"ready": ok, "backends": {p: v or "ok" for p, v in backends.items()}},
            status=200 if ok else 503,
        )

    async def backend_status(self) -> dict[str, str | None]:
        """Export path -> None (reachable) or why not; one probe at a time, cached."""
        now = self.server.clock.monotonic()
        if self._ready is not None and now - self._ready[0] < READY_CACHE_S:
            return self._ready[2]
        if self._probe is None or self._probe.done():
            self._probe = asyncio.get_running_loop().create_task(self._probe_all())
        result = await asyncio.shield(self._probe)
        self._ready = (self.server.clock.monotonic(), True, result)
        return result

    async def _probe_all(self) -> dict[str, str | None]:
        gw = self.server.gateway
        exports = list(gw.by_path.values()) if gw else []

        async def one(e: Export) -> str | None:
            try:
                async with asyncio.timeout(PROBE_TIMEOUT_S):
                    await e.store.list_page(e.prefix, delimiter="/", max_keys=1)
            except TimeoutError:
                return f"no answer in {PROBE_TIMEOUT_S:g} s"
            except BackendError as exc:
                return f"{type(exc).__name__}: {exc}"
            return None

        results = await asyncio.gather(*(one(e) for e in exports))
        out = {e.cfg.path: r for e, r in zip(exports, results, strict=True)}
        for path, why in out.items():
            if why is not None:
                log.warning("backend_unreachable", export=path, error=why)
        return out

    # -- /v1 ----------------------------------------------------------------------------------

    async def stats(self, request: web.Request) -> web.Response:
        return web.json_response(stats_snapshot(self.server))

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
        found = find_export(self.server, path)
        if found is None:
            return web.json_response({"error": f"{path}: no export contains it"}, status=404)
        export, rel = found
        export.ns.invalidate(rel, subtree=subtree)
        gw = self.server.gateway
        if gw is not None and rel:
            gw.reader.invalidate(export.store.name, export.prefix + rel)
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
        assert self.server.warmups is not None
        try:
            job = self.server.warmups.start(
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
        assert self.server.warmups is not None
        try:
            job = self.server.warmups.jobs.get(int(request.match_info["id"]))
        except ValueError:
            job = None
        if job is None:
            raise web.HTTPNotFound(
                text='{"error": "no such warm-up"}', content_type="application/json"
            )
        return job

    async def warmup_list(self, request: web.Request) -> web.Response:
        assert self.server.warmups is not None
        return web.json_response([j.as_dict() for j in self.server.warmups.jobs.values()])

    async def warmup_get(self, request: web.Request) -> web.Response:
        job = self._job(request)
        if job.state == "running":
            job.elapsed_s = self.server.clock.monotonic() - job.t0
        return web.json_response(job.as_dict())

    async def warmup_cancel(self, request: web.Request) -> web.Response:
        job = self._job(request)
        assert self.server.warmups is not None
        self.server.warmups.cancel(job.id)
        with contextlib.suppress(asyncio.CancelledError):
            await job.done.wait()
        return web.json_response(job.as_dict())

    async def reload(self, request: web.Request) -> web.Response:
        ok = await self.server.reload()
        body = {"ok": ok, "errors": self.server.last_reload_error}
        return web.json_response(body, status=200 if ok else 422)


def stats_snapshot(server: Server) -> dict[str, Any]:
    """The JSON summary behind ``GET /v1/stats`` and ``nfsgw stats``."""
    m = server.metrics
    gw = server.gateway
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
    lookups = data.get("hits", 0) + data.get("misses", 0)
    exports: list[dict[str, Any]] = []
    if gw is not None:
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
        "port": server.port,
        "ready": server.started and not server.stopping,
        "connections": {
            "open": int(conn.get("open", 0)),
            "opened": int(conn.get("opened", 0)),
            "refused": server.refused_connections,
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
            "budget_bytes": gw.reader.cache.budget_bytes if gw else 0,
            "hit_ratio": round(data.get("hits", 0) / lookups, 4) if lookups else None,
        },
        "metadata": {k: int(v) for k, v in m.totals("namespace").items()},
        "security": {k: int(v) for k, v in gws.items() if k != "files_opened"},
        "exports": exports,
        "warmups": [j.as_dict() for j in server.warmups.jobs.values()] if server.warmups else [],
        "reloads": {**server.reloads, "last_errors": server.last_reload_error},
    }


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
