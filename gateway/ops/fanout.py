"""The supervisor's admin API: one ``/metrics`` and one ``/v1`` for all worker processes.

Owns: ``FleetAdmin``, the ``AdminBackend`` behind the same routes as a single process
(``gateway.ops.adminhttp.AdminHttp``: same bearer token), answered by asking every worker over
its private Unix socket and combining the answers:

- ``/metrics``: the workers' expositions summed series by series (counters, histogram buckets,
  and gauges that are per-process amounts such as cache bytes); the gauges every worker reports
  alike (``Merge.MAX`` rows of ``gateway.ops.metricdefs``, e.g. the export count or the shared
  disk tier's size) are taken once, and the start time is the supervisor's
  (``Merge.SUPERVISOR``). A worker that restarts starts its
  counters from 0: the supervisor adds the last values it scraped from the previous process,
  so the service's counters never go down (Prometheus would read a drop as a reset). Plus the
  supervisor's own series (``metricdefs.SUPERVISOR_METRICS``): workers configured, up, restarts,
  calls per worker. Why not prometheus-client's multiprocess mode: the gateway's metrics are
  collectors reading plain counters at scrape time (``gateway.ops.metrics``: no lock and no
  shared-memory write on the hot path), which that mode cannot aggregate; scraping each worker
  costs one small HTTP exchange per worker per scrape instead.
- ``/v1/stats``: the workers' snapshots merged (numbers summed, ratios recomputed, exports by
  path) plus a ``workers`` list (pid, up, restarts, crash loop, calls).
- ``/readyz``: 200 when every worker is up and ready; 503 naming a worker that is starting,
  restarting or crash-looping, or whose backend probe fails or pack index loads, with the
  worker's own ``reason`` (the export and what is wrong) and a top-level ``reason``; the
  ``backends`` and ``packs`` maps are the workers' merged, a failing answer winning.
- ``/v1/invalidate`` and ``/v1/reload``: sent to every worker.
- ``/v1/warmup``: metadata warm-ups run in every worker (each has its own index); the data
  part runs in worker 0 only, since the disk tier it fills is shared (the other workers' memory
  tiers fill on demand from it). Jobs get a supervisor id; ``GET`` shows worker 0's progress
  and ``DELETE`` cancels the job in every worker.

Must not: hold state a worker needs, or block the loop.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Protocol

import aiohttp
import structlog
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from gateway.ops.adminhttp import Process, Reply
from gateway.ops.metricdefs import METRICS, SUPERVISOR_METRICS, Field, Merge, merge_of
from gateway.ops.warmup import MAX_WARMUP_KEPT


def _merge_status(into: dict[str, Any], got: object) -> None:
    """Per-export states of one worker into ``into``: an export keeps the first answer that
    is not "ok" (one worker's failing probe is the service's)."""
    if not isinstance(got, dict):
        return
    for path, v in got.items():
        if into.get(path, "ok") == "ok":
            into[path] = v


class WorkerRoleView(Protocol):
    @property
    def index(self) -> int: ...

    @property
    def owner(self) -> bool: ...

    @property
    def admin_socket(self) -> Path: ...


class WorkerView(Protocol):
    """One worker slot as the supervisor sees it (``gateway.ops.workers.Worker``)."""

    @property
    def role(self) -> WorkerRoleView: ...

    @property
    def pid(self) -> int | None: ...

    @property
    def ready(self) -> bool: ...

    @property
    def restarts(self) -> int: ...

    @property
    def crashes_in_a_row(self) -> int: ...

    @property
    def crash_looping(self) -> bool: ...

    @property
    def last_exit(self) -> int | None: ...


class Fleet(Process, Protocol):
    """What the admin API needs from the supervisor (``gateway.ops.workers.Supervisor``)."""

    @property
    def count(self) -> int: ...

    @property
    def workers(self) -> Sequence[WorkerView]: ...


log = structlog.get_logger(__name__)

WORKER_TIMEOUT_S: Final = 10.0
_RATIOS: Final = {
    # key -> (numerator path, denominator path) inside the merged snapshot
    "backend_requests_per_file_opened": (("backend", "requests_total"), ("files_opened",)),
}

# /v1/stats "disk_cache" keys of the one tier every worker shares: the MAX rows of the table.
_DISK_SHARED: Final = tuple(
    m.source.name
    for m in METRICS
    if m.merge is Merge.MAX and isinstance(m.source, Field) and m.source.layer == "disk"
)

SampleKey = tuple[str, str, tuple[tuple[str, str], ...]]  # family, sample name, labels

# A per-worker row of SUPERVISOR_METRICS read from the worker's slot -> its value.
_FROM_SLOT: Final[dict[str, Callable[[WorkerView], float]]] = {
    "nfsgw_worker_up": lambda w: 1.0 if w.ready else 0.0,
    "nfsgw_worker_restarts_total": lambda w: float(w.restarts),
    "nfsgw_worker_crash_loop": lambda w: 1.0 if w.crash_looping else 0.0,
}
# A gateway sample name -> the per-worker row that counts it (``MetricDef.per_worker_of``).
_PER_WORKER_OF: Final = {d.per_worker_of: d.name for d in SUPERVISOR_METRICS if d.per_worker_of}
Counted = dict[str, dict[int, float]]  # per-worker row -> worker index -> value


@dataclass(slots=True)
class _Carry:
    """Counter values of a worker slot's earlier processes, added to the current one."""

    pid: int | None = None
    last: dict[SampleKey, float] = field(default_factory=dict)
    retired: dict[SampleKey, float] = field(default_factory=dict)


@dataclass(slots=True)
class _Job:
    id: int
    worker_ids: dict[int, int]  # worker index -> that worker's job id


class FleetAdmin:
    """The admin routes' answers from every worker, combined (``AdminBackend``)."""

    def __init__(self, sup: Fleet) -> None:
        self.sup = sup
        self.start_time = time.time()
        self._sessions: dict[int, aiohttp.ClientSession] = {}
        self._carry: dict[int, _Carry] = {}
        self._types: dict[str, tuple[str, str]] = {}  # family -> (help, type), as last seen
        self._jobs: dict[int, _Job] = {}
        self._next_job = 0
        self._warmup_lock = asyncio.Lock()

    @property
    def token(self) -> str | None:
        return self.sup.config.admin.token

    async def close(self) -> None:
        for s in self._sessions.values():
            await s.close()
        self._sessions.clear()

    # -- talking to workers -----------------------------------------------------------------

    def _session(self, w: WorkerView) -> aiohttp.ClientSession:
        s = self._sessions.get(w.role.index)
        if s is None or s.closed:
            s = aiohttp.ClientSession(
                connector=aiohttp.UnixConnector(path=str(w.role.admin_socket)),
                timeout=aiohttp.ClientTimeout(total=WORKER_TIMEOUT_S),
            )
            self._sessions[w.role.index] = s
        return s

    async def _ask(
        self, w: WorkerView, method: str, path: str, body: Any = None
    ) -> tuple[int, Any] | None:
        """(status, decoded body) from one worker, or None when it does not answer."""
        if not w.ready:
            return None
        try:
            async with self._session(w).request(method, "http://worker" + path, json=body) as r:
                text = await r.text()
                if r.content_type == "application/json":
                    return r.status, json.loads(text)
                return r.status, text
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as e:
            log.warning("worker_admin_failed", worker=w.role.index, path=path, error=repr(e))
            return None

    async def _ask_all(
        self, method: str, path: str, body: Any = None
    ) -> list[tuple[WorkerView, tuple[int, Any] | None]]:
        ws = list(self.sup.workers)
        answers = await asyncio.gather(*(self._ask(w, method, path, body) for w in ws))
        return list(zip(ws, answers, strict=True))

    # -- probes and metrics -------------------------------------------------------------------

    async def ready(self) -> Reply:
        sup = self.sup
        if not sup.started or sup.stopping:
            reason = "stopping" if sup.stopping else "starting"
            return Reply(503, {"ready": False, "reason": reason})
        workers: list[dict[str, Any]] = []
        backends: dict[str, Any] = {}
        packs: dict[str, Any] = {}
        reasons: list[str] = []
        ok = True
        for w, ans in await self._ask_all("GET", "/readyz"):
            state = self._worker_state(w)
            if ans is not None and isinstance(ans[1], dict):
                _merge_status(backends, ans[1].get("backends"))
                _merge_status(packs, ans[1].get("packs"))
                if ans[0] != 200:
                    state["reason"] = ans[1].get("reason") or "backend unreachable"
            elif w.ready:
                state["reason"] = "no answer"
            # A crash-looping worker stays not ready until it has lived the crash window,
            # even while it answers (it may die again any moment).
            state["ready"] = ans is not None and ans[0] == 200 and not w.crash_looping
            ok = ok and state["ready"]
            if not state["ready"] and state.get("reason") and state["reason"] not in reasons:
                reasons.append(state["reason"])
            workers.append(state)
        body: dict[str, Any] = {"ready": ok, "workers": workers, "backends": backends}
        if packs:
            body["packs"] = packs
        if not ok:
            body["reason"] = "; ".join(reasons) or "not ready"
        return Reply(200 if ok else 503, body)

    def _worker_state(self, w: WorkerView) -> dict[str, Any]:
        d: dict[str, Any] = {
            "worker": w.role.index,
            "pid": w.pid,
            "up": w.ready,
            "restarts": w.restarts,
            "crash_loop": w.crash_looping,
            "last_exit": w.last_exit,
        }
        if w.crash_looping:
            d["reason"] = f"crash loop: exited {w.crashes_in_a_row} times in a row"
        elif not w.ready:
            d["reason"] = "restarting"
        return d

    async def exposition(self) -> bytes:
        texts: list[tuple[WorkerView, str]] = []
        for w, ans in await self._ask_all("GET", "/metrics"):
            if ans is not None and ans[0] == 200 and isinstance(ans[1], str):
                texts.append((w, ans[1]))
        merged, counted = self.merge(texts)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Families([*merged, *self._own(counted)]))
        return generate_latest(registry)

    def merge(self, texts: list[tuple[WorkerView, str]]) -> tuple[list[Metric], Counted]:
        """Sum the workers' families (see the module docstring); also, for each per-worker row
        (``MetricDef.per_worker_of``), each worker's value.
        A worker that did not answer (restarting) counts with what it last reported, so the
        sums never go down."""
        answered = {w.role.index: text for w, text in texts}
        fams: dict[str, Metric] = {}
        values: dict[SampleKey, float] = {}
        counted: Counted = {}
        for w in self.sup.workers:
            carry = self._carry.setdefault(w.role.index, _Carry())
            text = answered.get(w.role.index)
            if text is not None and carry.pid != w.pid:
                # A new process in this slot: keep what the old one counted.
                for k, v in carry.last.items():
                    carry.retired[k] = carry.retired.get(k, 0.0) + v
                carry.last = {}
                carry.pid = w.pid
            samples: dict[SampleKey, float] = {}
            if text is not None:
                for f in text_string_to_metric_families(text):
                    if merge_of(f.name) is Merge.SUPERVISOR:
                        continue
                    if f.name not in fams:
                        fams[f.name] = Metric(f.name, f.documentation, f.type)
                    self._types[f.name] = (f.documentation, f.type)
                    for smp in f.samples:
                        samples[(f.name, smp.name, tuple(sorted(smp.labels.items())))] = smp.value
                carry.last = {k: v for k, v in samples.items() if self._monotonic(k[0])}
            else:
                samples = dict(carry.last)
            for k, v in carry.retired.items():
                samples[k] = samples.get(k, 0.0) + v
            for key, v in samples.items():
                fname, sname, _ = key
                if fname not in fams:
                    doc, typ = self._types[fname]
                    fams[fname] = Metric(fname, doc, typ)
                row = _PER_WORKER_OF.get(sname)
                if row is not None:
                    per = counted.setdefault(row, {})
                    per[w.role.index] = per.get(w.role.index, 0.0) + v
                if key not in values:
                    values[key] = v
                elif merge_of(fname) is Merge.MAX:
                    values[key] = max(values[key], v)
                else:
                    values[key] += v
        for (fname, sname, labels), v in values.items():
            fams[fname].add_sample(sname, dict(labels), v)
        start = GaugeMetricFamily(
            "nfsgw_start_time_seconds", "Start time of the process (Unix time)"
        )
        start.add_metric([], self.start_time)
        return [*fams.values(), start], counted

    def _monotonic(self, family: str) -> bool:
        return self._types[family][1] in ("counter", "histogram")

    def _own(self, counted: Counted) -> Iterator[Metric]:
        sup = self.sup
        for d in SUPERVISOR_METRICS:
            kind = CounterMetricFamily if d.kind.value == "counter" else GaugeMetricFamily
            fam = kind(d.name, d.help, labels=d.labels)
            if not d.labels:  # nfsgw_workers: the fleet's size
                if sup.workers:
                    fam.add_metric([], float(sup.count))
            elif d.per_worker_of:
                per = counted.get(d.name, {})
                for w in sup.workers:
                    if w.role.index in per:
                        fam.add_metric([str(w.role.index)], per[w.role.index])
            else:
                read = _FROM_SLOT[d.name]
                for w in sup.workers:
                    fam.add_metric([str(w.role.index)], read(w))
            yield fam

    # -- /v1 ------------------------------------------------------------------------------------

    async def stats(self) -> dict[str, Any]:
        answers = await self._ask_all("GET", "/v1/stats")
        snaps = [a[1] for _, a in answers if a is not None and a[0] == 200]
        merged: dict[str, Any] = merge_snapshots(snaps) if snaps else {}
        merged["uptime_s"] = round(time.time() - self.start_time, 3)
        merged["port"] = self.sup.port
        merged["ready"] = self.sup.started and not self.sup.stopping
        merged["workers"] = []
        for w, a in answers:
            state = self._worker_state(w)
            if a is not None and a[0] == 200:
                state["calls_total"] = a[1].get("rpc", {}).get("calls_total")
            merged["workers"].append(state)
        return merged

    def _combined(self, answers: list[tuple[WorkerView, tuple[int, Any] | None]]) -> Reply:
        """Worker 0's answer for the whole service, 502 if a worker that is up failed."""
        missing = [w.role.index for w, a in answers if a is None and w.ready]
        first = next((a for _, a in answers if a is not None), None)
        if first is None:
            return Reply(502, {"error": "no worker answered"})
        status, body = first
        if missing and status < 400:
            return Reply(502, {"error": f"workers {missing} did not answer", "answer": body})
        return Reply(status, body)

    async def invalidate(self, body: dict[str, Any]) -> Reply:
        return self._combined(await self._ask_all("POST", "/v1/invalidate", body))

    async def reload(self) -> Reply:
        ok = await self.sup.reload()
        answers = await self._ask_all("POST", "/v1/reload", {})
        errors = list(self.sup.last_reload_error)
        for _, a in answers:
            if a is not None and a[0] != 200 and isinstance(a[1], dict):
                errors += [e for e in a[1].get("errors", []) if e not in errors]
        ok = ok and all(a is not None and a[0] == 200 for _, a in answers)
        return Reply(200 if ok else 422, {"ok": ok, "errors": errors})

    async def warmup(self, body: dict[str, Any]) -> Reply:
        async with self._warmup_lock:
            ws = list(self.sup.workers)
            bodies = [body if w.role.owner else {**body, "data": False} for w in ws]
            answers = await asyncio.gather(
                *(self._ask(w, "POST", "/v1/warmup", b) for w, b in zip(ws, bodies, strict=True))
            )
            pairs = list(zip(ws, answers, strict=True))
            ids = {
                w.role.index: int(a[1]["id"])
                for w, a in pairs
                if a is not None and a[0] in (200, 202) and isinstance(a[1], dict)
            }
            if 0 not in ids:
                return self._combined(pairs)
            self._next_job += 1
            job = _Job(self._next_job, ids)
            self._jobs[job.id] = job
            while len(self._jobs) > MAX_WARMUP_KEPT:  # as each worker keeps its own
                del self._jobs[next(iter(self._jobs))]
            status, first = next(a for w, a in pairs if w.role.owner and a is not None)
            return Reply(status, self._job_view(job, first))

    def _job_view(self, job: _Job, owner_view: dict[str, Any]) -> dict[str, Any]:
        return {**owner_view, "id": job.id, "workers": len(job.worker_ids)}

    async def warmup_list(self) -> list[dict[str, Any]]:
        out = []
        for job in list(self._jobs.values()):
            a = await self._ask(self.sup.workers[0], "GET", f"/v1/warmup/{job.worker_ids[0]}")
            if a is not None and a[0] == 200:
                out.append(self._job_view(job, a[1]))
        return out

    async def warmup_get(self, job_id: int) -> Reply | None:
        job = self._jobs.get(job_id)
        if job is None:
            return None
        a = await self._ask(self.sup.workers[0], "GET", f"/v1/warmup/{job.worker_ids[0]}")
        if a is None or a[0] != 200:
            return Reply(410, {"error": "worker 0 lost the job (restarted?)"})
        return Reply(200, self._job_view(job, a[1]))

    async def warmup_cancel(self, job_id: int) -> Reply | None:
        job = self._jobs.get(job_id)
        if job is None:
            return None
        answers = await asyncio.gather(
            *(
                self._ask(w, "DELETE", f"/v1/warmup/{job.worker_ids[w.role.index]}")
                for w in self.sup.workers
                if w.role.index in job.worker_ids
            )
        )
        owner = answers[0] if answers else None
        if owner is None or owner[0] != 200:
            return Reply(410, {"error": "worker 0 lost the job (restarted?)"})
        return Reply(200, self._job_view(job, owner[1]))


class _Families(Collector):
    def __init__(self, fams: list[Metric]) -> None:
        self.fams = fams

    def collect(self) -> Iterator[Metric]:
        return iter(self.fams)


def merge_snapshots(snaps: list[dict[str, Any]]) -> dict[str, Any]:
    """Workers' ``/v1/stats`` merged: numbers summed, dicts by key, ratios recomputed; each
    export's configuration from the first worker with its index counters summed; strings,
    booleans, other lists (warm-ups) and the reload record from the first (worker 0 when it
    answered: the supervisor asks in worker order)."""
    merged = _merge(snaps)
    assert isinstance(merged, dict)
    merged["reloads"] = snaps[0].get("reloads")
    by_path: dict[str, list[dict[str, Any]]] = {}
    for snap in snaps:
        for e in snap.get("exports") or ():
            by_path.setdefault(str(e.get("path")), []).append(e)
    merged["exports"] = [
        {**es[0], "metadata": _merge([e.get("metadata") or {} for e in es])}
        for es in by_path.values()
    ]
    for key, (num, den) in _RATIOS.items():
        n, d = _at(merged, num), _at(merged, den)
        merged[key] = round(n / d, 4) if isinstance(n, int | float) and d else None
    cache = merged.get("data_cache")
    if isinstance(cache, dict):
        looked = cache.get("hits", 0) + cache.get("misses", 0)
        cache["hit_ratio"] = round(cache.get("hits", 0) / looked, 4) if looked else None
    pf = merged.get("data_prefetch")
    if isinstance(pf, dict):
        done = pf.get("objects", 0)
        pf["waste_ratio"] = round(pf.get("wasted", 0) / done, 4) if done else None
    disk = merged.get("disk_cache")
    if isinstance(disk, dict):
        # One tier shared by every worker: its sizes are the same in each, not a sum.
        for k in _DISK_SHARED:
            disk[k] = max((s.get("disk_cache", {}).get(k, 0) for s in snaps), default=0)
        looked = disk.get("hits", 0) + disk.get("misses", 0)
        disk["hit_ratio"] = round(disk.get("hits", 0) / looked, 4) if looked else None
    return merged


def _at(d: dict[str, Any], path: tuple[str, ...]) -> Any:
    cur: Any = d
    for p in path:
        cur = cur.get(p) if isinstance(cur, dict) else None
    return cur


def _merge(values: list[Any]) -> Any:
    first = values[0]
    if isinstance(first, bool) or first is None or isinstance(first, str):
        return first
    if isinstance(first, int | float):
        nums = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
        return sum(nums)
    if isinstance(first, dict):
        keys: dict[str, None] = {}
        for v in values:
            if isinstance(v, dict):
                keys.update(dict.fromkeys(v))
        return {k: _merge([v[k] for v in values if isinstance(v, dict) and k in v]) for k in keys}
    return first
