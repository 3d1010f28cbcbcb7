"""The admin API's answers from this process (``LocalAdmin``, an ``AdminBackend``).

Owns: what the routes operators and probes use answer, on ``admin.listen`` (127.0.0.1:9426 by
default with a config file; the HTTP side, the bearer token and the listeners are
``gateway.ops.adminhttp.AdminHttp``):

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

Depends on what it is given by the server (``gateway.ops.server``): the export
registry, the metrics, the warm-ups, a clock, and ``Served``, the few things only the process
itself knows (its configuration, port, life-cycle state and reload).

Must not: import the server, block the loop, or put paths or keys into metric labels.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog
from prometheus_client import generate_latest

from gateway import version
from gateway.clock import Clock
from gateway.ops.adminhttp import Process, Reply
from gateway.ops.metrics import Metrics
from gateway.ops.probe import BackendProbe
from gateway.ops.warmup import WarmupRefused, Warmups
from gateway.pack.store import PackedStore
from gateway.registry import Gateway

log = structlog.get_logger(__name__)

READY_CACHE_S = 5.0


class Served(Process, Protocol):
    """What the admin API needs from the process it serves (``gateway.ops.server.Server``)."""

    @property
    def probes(self) -> Mapping[str, BackendProbe]:
        """Export path -> its backend's probe."""
        ...


@dataclass(eq=False, repr=False)
class LocalAdmin:
    """The admin routes' answers from this process's own state (``AdminBackend``)."""

    served: Served
    gateway: Gateway
    metrics: Metrics
    warmups: Warmups
    clock: Clock
    _ready: tuple[float, bool, dict[str, str | None]] | None = field(init=False, default=None)
    _probe: asyncio.Task[dict[str, str | None]] | None = field(init=False, default=None)

    @property
    def token(self) -> str | None:
        return self.served.config.admin.token

    async def close(self) -> None:
        if self._probe is not None:
            self._probe.cancel()

    # -- probes and metrics -------------------------------------------------------------------

    async def exposition(self) -> bytes:
        return generate_latest(self.metrics.registry)

    async def ready(self) -> Reply:
        s = self.served
        if not s.started or s.stopping:
            return Reply(503, {"ready": False, "reason": "stopping" if s.stopping else "starting"})
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
        return Reply(200 if ok else 503, body)

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

    async def stats(self) -> dict[str, Any]:
        return stats_snapshot(self.served, self.gateway, self.metrics, self.warmups)

    @staticmethod
    def _flag(v: object) -> bool:
        return v is True or (isinstance(v, str) and v.lower() in ("1", "true", "yes"))

    async def invalidate(self, body: dict[str, Any]) -> Reply:
        path = body.get("path")
        if not isinstance(path, str) or not path.startswith("/"):
            return Reply(400, {"error": "give an absolute path: /export/dir"})
        subtree = self._flag(body.get("subtree", False))
        found = self.gateway.find_export(path)
        if found is None:
            return Reply(404, {"error": f"{path}: no export contains it"})
        export, rel = found
        export.ns.invalidate(rel, subtree=subtree)
        if rel:
            self.gateway.reader.invalidate(export.store.name, export.prefix + rel)
        log.info("invalidated", export=export.cfg.path, path=rel, subtree=subtree)
        return Reply(200, {"export": export.cfg.path, "path": rel, "subtree": subtree})

    async def warmup(self, body: dict[str, Any]) -> Reply:
        path = body.get("path")
        if not isinstance(path, str) or not path.startswith("/"):
            return Reply(400, {"error": "give an absolute path: /export/dir"})
        try:
            concurrency = int(body.get("concurrency", 8))
        except (TypeError, ValueError):
            return Reply(400, {"error": "concurrency must be an integer"})
        try:
            job = self.warmups.start(
                path, data=self._flag(body.get("data", False)), concurrency=concurrency
            )
        except LookupError as e:
            return Reply(404, {"error": str(e)})
        except ValueError as e:
            return Reply(400, {"error": str(e)})
        except WarmupRefused as e:
            return Reply(429, {"error": str(e)})
        if self._flag(body.get("wait", False)):
            await job.done.wait()
            return Reply(200, job.as_dict())
        return Reply(202, job.as_dict())

    async def warmup_list(self) -> list[dict[str, Any]]:
        return [j.as_dict() for j in self.warmups.jobs.values()]

    async def warmup_get(self, job_id: int) -> Reply | None:
        job = self.warmups.jobs.get(job_id)
        if job is None:
            return None
        return Reply(200, self.warmups.progress(job).as_dict())

    async def warmup_cancel(self, job_id: int) -> Reply | None:
        job = self.warmups.jobs.get(job_id)
        if job is None:
            return None
        self.warmups.cancel(job.id)
        with contextlib.suppress(asyncio.CancelledError):
            await job.done.wait()
        return Reply(200, job.as_dict())

    async def reload(self) -> Reply:
        ok = await self.served.reload()
        return Reply(200 if ok else 422, {"ok": ok, "errors": self.served.last_reload_error})


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
                "secure_port": c.secure,
                "sec": list(c.sec),
                "metadata": {k: v for k, v in _fields(e.ns.stats)},
            }
        )
    return {
        "version": version(),
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
