"""Warm-up jobs: the metadata (and optionally the data) of a subtree, fetched ahead of clients.

Owns: the jobs of one process (at most ``MAX_WARMUP_RUNNING`` at once, the last
``MAX_WARMUP_KEPT`` kept for ``GET /v1/warmup``), their walk (breadth-first listing with at most
``concurrency`` backend requests at once), their progress (with an ETA) and the counters behind
``nfsgw_warmup_*`` (``WarmupStats``, read by ``gateway.ops.metrics``).

Data (``data=True``): with a disk tier, every file goes into the disk tier, not into memory
(``gateway.data.warm``); a file whose version is already there is skipped (``files_cached``),
so a warm-up interrupted or cancelled resumes where it stopped when started again; the job
stops (``done``, ``stopped`` says why) when the tier's budget is reached (warm-ups never evict)
or the tier refuses new entries. Without a disk tier files are read into memory, up to
``WARMUP_DATA_SHARE`` of its budget. Depends on the export registry (``gateway.registry``) and a
clock only; the admin API (``gateway.ops.admin``) starts, lists and cancels jobs.

Must not: know the server, HTTP or metric names; block the loop.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Awaitable, Iterable
from dataclasses import dataclass, field
from typing import Any

import structlog

from gateway.backend.base import BackendError
from gateway.clock import Clock
from gateway.data.warm import warm_object
from gateway.errors import GatewayError, NotFound
from gateway.exports import Export
from gateway.namespace import Entry, EntryKind
from gateway.registry import Gateway

__all__ = [
    "MAX_WARMUP_CONCURRENCY",
    "WarmupJob",
    "WarmupRefused",
    "WarmupStats",
    "Warmups",
]

log = structlog.get_logger(__name__)

MAX_WARMUP_RUNNING = 4
MAX_WARMUP_KEPT = 32
MAX_WARMUP_CONCURRENCY = 256
MAX_WARMUP_FRONTIER = 1_000_000  # directories waiting to be listed, per job
WARMUP_CHUNK = 4 << 20
WARMUP_DATA_SHARE = 0.9  # of the data cache budget a data warm-up may fill
JOB_STATES = ("running", "done", "failed", "cancelled")


@dataclass(slots=True)
class WarmupJob:
    id: int
    path: str
    export: str
    rel: str
    data: bool
    concurrency: int
    state: str = "running"  # one of JOB_STATES
    dirs_listed: int = 0
    files_seen: int = 0
    bytes_seen: int = 0
    files_read: int = 0
    bytes_read: int = 0
    files_skipped: int = 0  # data not read: the cache share was full
    files_cached: int = 0  # already in the disk tier (a resumed warm-up)
    bytes_cached: int = 0
    tier: str = "memory"  # where data goes: "disk" or "memory"
    target_bytes: int = 0  # data bytes the job can place (what the tier had room for at start)
    listing: bool = True  # directories still to list (bytes_seen still grows)
    stopped: str | None = None  # why a data job stopped before reading everything
    eta_s: float | None = None
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
            "files_cached": self.files_cached,
            "bytes_cached": self.bytes_cached,
            "tier": self.tier,
            "target_bytes": self.target_bytes,
            "listing": self.listing,
            "stopped": self.stopped,
            "eta_s": None if self.eta_s is None else round(self.eta_s, 1),
            "errors": self.errors,
            "error": self.error,
            "started_at": self.started_at,
            "elapsed_s": round(self.elapsed_s, 3),
        }


@dataclass(slots=True)
class WarmupStats:
    """Counters (monotonic, over every job of the process) and gauges (jobs kept, by state)."""

    dirs: int = 0
    files: int = 0
    bytes_read: int = 0
    running: int = 0  # gauge
    done: int = 0  # gauge
    failed: int = 0  # gauge
    cancelled: int = 0  # gauge


class WarmupRefused(Exception):
    """Too many jobs are running: the caller should wait or cancel one."""


class _Stop(Exception):
    """A data warm-up reached the disk tier's budget or was refused by it."""


class Warmups:
    """Warm-up jobs of one process over the exports of ``gateway``."""

    def __init__(self, gateway: Gateway, clock: Clock) -> None:
        self.gateway = gateway
        self.clock = clock
        self.jobs: collections.OrderedDict[int, WarmupJob] = collections.OrderedDict()
        self._ids = 0
        self._totals = WarmupStats()

    def stats(self) -> WarmupStats:
        """A snapshot: the counters, and the jobs kept counted by state."""
        states = collections.Counter(j.state for j in self.jobs.values())
        t = self._totals
        return WarmupStats(t.dirs, t.files, t.bytes_read, *(states.get(s, 0) for s in JOB_STATES))

    def running(self) -> int:
        return sum(1 for j in self.jobs.values() if j.state == "running")

    def start(self, path: str, *, data: bool = False, concurrency: int = 8) -> WarmupJob:
        found = self.gateway.find_export(path)
        if found is None:
            raise LookupError(f"{path}: no export contains it")
        if not 1 <= concurrency <= MAX_WARMUP_CONCURRENCY:
            raise ValueError(f"concurrency must be 1..{MAX_WARMUP_CONCURRENCY}")
        if self.running() >= MAX_WARMUP_RUNNING:
            raise WarmupRefused(f"{MAX_WARMUP_RUNNING} warm-ups are running; wait or cancel one")
        export, rel = found
        self._ids += 1
        job = WarmupJob(self._ids, path, export.cfg.path, rel, data, concurrency)
        disk = self.gateway.reader.disk
        if data and disk is not None:
            job.tier = "disk"
            job.target_bytes = max(0, disk.budget_bytes - disk.used_bytes)
        elif data:
            job.target_bytes = int(self.gateway.reader.cache.budget_bytes * WARMUP_DATA_SHARE)
        job.t0 = self.clock.monotonic()
        job.task = asyncio.get_running_loop().create_task(self._run(job, export))
        self.jobs[job.id] = job
        while len(self.jobs) > MAX_WARMUP_KEPT:
            oldest = next((j for j in self.jobs.values() if j.state != "running"), None)
            if oldest is None:
                break
            del self.jobs[oldest.id]
        return job

    def progress(self, job: WarmupJob) -> WarmupJob:
        """``job`` with ``elapsed_s`` and ``eta_s`` brought up to date while it runs. The ETA
        is the data left (what was listed so far, within what the tier had room for) at the
        rate so far; while ``listing`` it is a lower bound."""
        if job.state != "running":
            job.eta_s = None if job.state != "done" else 0.0
            return job
        job.elapsed_s = elapsed = self.clock.monotonic() - job.t0
        if not job.data:
            return job
        done = job.bytes_read + job.bytes_cached
        target = min(job.bytes_seen, job.target_bytes) if job.target_bytes else job.bytes_seen
        rate = done / elapsed if elapsed > 0 else 0.0
        job.eta_s = max(0.0, target - done) / rate if rate > 0 else None
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
            try:
                await self._walk(job, export)
            except _Stop as e:
                job.stopped = str(e)
            job.state = "done"
        except asyncio.CancelledError:
            job.state = "cancelled"
            raise
        except NotFound:
            job.state, job.error = "failed", f"{job.path}: no such file or directory"
        except (GatewayError, BackendError, OverflowError) as e:
            job.state, job.error = "failed", f"{type(e).__name__}: {e}"
        finally:
            job.elapsed_s = self.clock.monotonic() - job.t0
            job.listing = False
            self.progress(job)
            job.done.set()
            log.info("warmup_finished", **{k: v for k, v in job.as_dict().items() if v is not None})

    async def _walk(self, job: WarmupJob, export: Export) -> None:
        ns = export.ns
        sem = asyncio.Semaphore(job.concurrency)
        reader = self.gateway.reader
        data_cap = int(reader.cache.budget_bytes * WARMUP_DATA_SHARE)
        totals = self._totals
        root = await ns.getattr(job.rel)

        async def list_dir(path: str) -> list[Entry]:
            async with sem:
                out: list[Entry] = []
                cookie = 0
                while True:
                    page = await ns.readdir(path, cookie, max_entries=4096)
                    out.extend(e for _, e in page.entries)
                    if page.eof or not page.entries:
                        break
                    cookie = page.entries[-1][0]
            job.dirs_listed += 1
            totals.dirs += 1
            return out

        async def warm_file(e: Entry) -> None:
            async with sem:
                if job.stopped:
                    return
                outcome, fetched = await warm_object(
                    reader, export.store, export.prefix + e.path, e.etag, e.size
                )
            if outcome == "cached":
                job.files_cached += 1
                job.bytes_cached += e.size
                return
            job.bytes_read += fetched
            totals.bytes_read += fetched
            if outcome == "written":
                job.files_read += 1
            elif outcome == "budget":
                job.stopped = "the disk tier's budget is reached"
            else:
                job.stopped = "the disk tier refused new entries (free-space floor or errors)"

        async def read_file(e: Entry) -> None:
            if reader.disk is not None:
                return await warm_file(e)
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
            totals.bytes_read += off

        async def read_files(files: list[Entry]) -> None:
            batch: list[Entry] = []
            planned = 0
            for e in files:
                if job.stopped:
                    raise _Stop(job.stopped)
                if reader.disk is None and job.bytes_read + planned + e.size > data_cap:
                    job.files_skipped += 1
                    continue
                batch.append(e)
                planned += e.size
                if len(batch) >= job.concurrency * 4:
                    await self._gather(job, (read_file(b) for b in batch))
                    batch, planned = [], 0
            if batch:
                await self._gather(job, (read_file(b) for b in batch))
            if job.stopped:
                raise _Stop(job.stopped)

        def seen(e: Entry, files: list[Entry]) -> None:
            job.files_seen += 1
            totals.files += 1
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
        job.listing = bool(frontier)
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
            job.listing = bool(frontier)
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
