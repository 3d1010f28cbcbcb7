"""``nfsgw serve --workers N``: N gateway processes behind one port, and their supervisor.

Owns: the worker count (``server.workers``: 0 = one per core the process may run on), the
supervisor process's life cycle (spawn, health, restart with back-off, signals, systemd
notifications) and what a worker needs to know about its place (``WorkerRole``).

Design. One Python process serves about one core, so a host serves its NFS clients with
several. Each worker is a full gateway (``gateway.ops.server.Server``) started from the same
command line, with ``--worker I/N/RUN_DIR`` appended: it listens on the NFS port with
SO_REUSEPORT (the kernel spreads connections, e.g. a client's ``nconnect=`` connections, over the
workers' listeners), serves its admin API on a Unix socket in the private ``RUN_DIR``, and keeps
its own directory index; the handle secret and the data cache (the disk tier, whose entries
each worker maps: ``gateway.data.disk``) are shared through the file system, so any worker
answers any handle and a file is fetched and held once per host. Calls for read-write
exports are served by worker 0, the owner (``gateway.forward`` says why and what it costs).

The supervisor binds nothing but the admin API (``gateway.ops.fanout``: one ``/metrics`` and
``/v1/*`` for all workers). It starts the workers, sends ``READY=1`` once every one answers,
restarts a worker that exits (back-off doubling from ``RESTART_BACKOFF_S`` while it keeps dying
within ``CRASH_WINDOW_S``; three such exits in a row is a crash loop, reported by ``/readyz``
and in the journal), forwards SIGHUP (every worker reloads its configuration, and the supervisor
its own admin settings) and SIGTERM/SIGINT (every worker drains; the supervisor waits
``drain_timeout_s`` plus a margin, then kills what is left). ``--workers 1`` runs no supervisor
at all: the one process is today's gateway.

Workers die with their supervisor (``die_with_supervisor``, first thing in a worker): a
supervisor killed with SIGKILL or by the OOM killer must not leave its workers serving the
port unsupervised (no restarts, no merged metrics, a port shared with the next gateway started
outside the service's cgroup). Two mechanisms, either enough: the kernel's parent-death signal
(``PR_SET_PDEATHSIG`` = SIGTERM, Linux; set by the worker itself after the exec, its parent's
pid checked after, so a supervisor that died in between is seen too; it fires when the thread
that forked exits, the supervisor's event-loop thread, which spawns every worker), and a
lifeline: a pipe whose write end only the supervisor holds, its read end inherited by every
worker (``NFSGW_SUPERVISOR`` = ``PID:FD``) and watched by a thread, EOF meaning the supervisor
is gone (any Unix, and whatever thread forked). Then the worker drains as on SIGTERM (its
listeners close first: the port is free) for at most ``ORPHAN_GRACE_S`` (or
``drain_timeout_s`` if shorter), and exits (``EXIT_ORPHANED`` if the drain did not end in time).

Must not: serve NFS itself, share memory with the workers, or import the server (a worker is a
separate process).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import structlog

from gateway.ops.adminhttp import AdminHttp
from gateway.ops.config import ServerConfig
from gateway.ops.fanout import FleetAdmin
from gateway.ops.systemd import Notifier

log = structlog.get_logger(__name__)

RESTART_BACKOFF_S: Final = 0.5
RESTART_BACKOFF_MAX_S: Final = 30.0
CRASH_WINDOW_S: Final = 30.0  # a worker that dies sooner than this after starting "crashed"
CRASH_LOOP_AFTER: Final = 3
START_TIMEOUT_S: Final = 60.0
# A worker whose loop does not answer /healthz PROBE_MISSES times in a row (each probe waits
# PROBE_EVERY_S / 2, the next starts PROBE_EVERY_S / 2 later: ~30 s in all) is wedged: it is
# killed and restarted like one that died (systemd's watchdog covers the supervisor's loop).
PROBE_EVERY_S: Final = 10.0
PROBE_MISSES: Final = 3
KILL_MARGIN_S: Final = 5.0
_HEALTH_POLL_S: Final = 0.05
_ENV_DROP: Final = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")
SUPERVISOR_ENV: Final = "NFSGW_SUPERVISOR"  # "PID:FD": the supervisor and the lifeline's fd
ORPHAN_GRACE_S: Final = 3.0  # an orphaned worker's drain, at most; then it exits regardless
EXIT_ORPHANED: Final = 75  # a worker whose supervisor died and whose drain did not end in time
_PR_SET_PDEATHSIG: Final = 1


def worker_count(setting: int) -> int:
    """``server.workers``: 0 means one per CPU this process may use."""
    if setting > 0:
        return setting
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


@dataclass(frozen=True, slots=True)
class WorkerRole:
    """What a worker process knows about its place among its siblings."""

    index: int
    count: int
    run_dir: Path

    @property
    def owner(self) -> bool:
        """Worker 0 serves every call of the read-write exports."""
        return self.index == 0

    @property
    def admin_socket(self) -> Path:
        return self.run_dir / f"worker-{self.index}.sock"

    @property
    def owner_socket(self) -> Path:
        return self.run_dir / "owner.sock"

    def arg(self) -> str:
        return f"{self.index}/{self.count}/{self.run_dir}"

    @classmethod
    def parse(cls, s: str) -> WorkerRole:
        """``I/N/RUN_DIR`` (the hidden ``--worker`` flag the supervisor passes)."""
        i, n, d = s.split("/", 2)
        role = cls(int(i), int(n), Path("/" + d.lstrip("/")))
        if not 0 <= role.index < role.count:
            raise ValueError(f"worker index {role.index} not in 0..{role.count - 1}")
        return role


@dataclass(slots=True)
class Worker:
    """The supervisor's record of one worker slot."""

    role: WorkerRole
    proc: asyncio.subprocess.Process | None = None
    started_at: float = 0.0
    ready: bool = False
    restarts: int = 0
    crashes_in_a_row: int = 0
    last_exit: int | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def crash_looping(self) -> bool:
        """Died young ``CRASH_LOOP_AFTER`` times in a row and has not yet lived
        ``CRASH_WINDOW_S`` since."""
        if self.crashes_in_a_row < CRASH_LOOP_AFTER:
            return False
        return not self.ready or time.monotonic() - self.started_at < CRASH_WINDOW_S


def _hold_port(host: str, port: int) -> tuple[socket.socket, int]:
    """Reserve ``port`` (0: pick one) for the workers: a bound, never listening SO_REUSEPORT
    socket, so every worker binds the same number and nothing else takes it meanwhile. The
    kernel hands connections only to listening sockets: the reservation receives none."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        s.bind((host, port))
    except OSError:
        s.close()
        raise
    return s, int(s.getsockname()[1])


class Supervisor:
    """The parent of ``server.workers`` gateway processes (see the module docstring)."""

    def __init__(
        self,
        config: ServerConfig,
        argv: Sequence[str],
        *,
        notifier: Notifier | None = None,
        config_loader: Callable[[], ServerConfig] | None = None,
    ) -> None:
        self.config = config
        self.argv = list(argv)
        self.notifier = notifier or Notifier({})
        self.config_loader = config_loader
        self.count = worker_count(config.server.workers)
        self.run_dir: Path | None = None
        self.workers: list[Worker] = []
        self.port = 0
        self.portmap_port = 0
        self.admin_port = 0
        self.started = False
        self.stopping = False
        self.last_reload_error: list[str] = []
        self.not_ready = ""  # worker 0's /readyz reason, named in STATUS= ("" when ready)
        self._held: list[socket.socket] = []
        self._monitors: set[asyncio.Task[None]] = set()
        self._stop = asyncio.Event()
        self._admin: AdminHttp | None = None
        self._lifeline: tuple[int, int] | None = None  # (read, write) ends of the pipe

    # -- life cycle -----------------------------------------------------------------------

    async def start(self) -> None:
        from gateway.namespace.handles import load_or_create_secret

        # The lifeline (``die_with_supervisor``): both ends close-on-exec; only the read end
        # is passed to each worker, so the write end closes when this process dies.
        if self._lifeline is None:
            self._lifeline = os.pipe()

        c = self.config
        # The secret before any worker: they all read the one file (its creation is atomic
        # anyway; this only saves a race at first start).
        await asyncio.to_thread(load_or_create_secret, c.server.state_dir)
        base = os.environ.get("RUNTIME_DIRECTORY") or None
        self.run_dir = Path(await asyncio.to_thread(tempfile.mkdtemp, "", "nfsgw-", base))
        held, self.port = _hold_port(c.server.listen, c.server.port)
        self._held.append(held)
        if c.server.portmap_port is not None:
            try:
                held, self.portmap_port = _hold_port(c.server.listen, c.server.portmap_port)
                self._held.append(held)
            except OSError:
                self.portmap_port = c.server.portmap_port  # rpcbind's: the owner registers
        self.workers = [Worker(WorkerRole(i, self.count, self.run_dir)) for i in range(self.count)]
        for w in self.workers:
            await self._spawn(w)
        try:
            async with asyncio.timeout(START_TIMEOUT_S):
                await asyncio.gather(*(self._wait_ready(w) for w in self.workers))
        except TimeoutError:
            raise RuntimeError(
                f"workers not ready after {START_TIMEOUT_S:g} s: "
                + ", ".join(str(w.role.index) for w in self.workers if not w.ready)
            ) from None
        for w in self.workers:
            self._watch(w)
        if c.admin.listen:
            api = AdminHttp(FleetAdmin(self))
            self.admin_port = await api.start(c.admin.listen)
            self._admin = api
        self.started = True
        log.info(
            "supervisor_started",
            workers=self.count,
            pids=[w.pid for w in self.workers],
            port=self.port,
            admin_port=self.admin_port or None,
        )
        self.notifier.ready(self.status())
        self.notifier.start_watchdog()

    def status(self) -> str:
        up = sum(1 for w in self.workers if w.ready)
        text = f"{up} of {self.count} workers serving on port {self.port}"
        return f"{text}; {self.not_ready}" if self.not_ready else text

    def _worker_argv(self, w: Worker) -> list[str]:
        args = [*self.argv, "--port", str(self.port), "--worker", w.role.arg()]
        if self.config.server.portmap_port is not None:
            args += ["--portmap-port", str(self.portmap_port)]
        return [sys.executable, "-m", "gateway.ops.cli", *args]

    async def _spawn(self, w: Worker) -> None:
        env = {k: v for k, v in os.environ.items() if k not in _ENV_DROP}
        w.ready = False
        fds: tuple[int, ...] = ()
        if self._lifeline is not None:
            fds = (self._lifeline[0],)
            env[SUPERVISOR_ENV] = f"{os.getpid()}:{self._lifeline[0]}"
        w.proc = await asyncio.create_subprocess_exec(
            *self._worker_argv(w), env=env, stdin=asyncio.subprocess.DEVNULL, pass_fds=fds
        )
        w.started_at = time.monotonic()
        log.info("worker_started", worker=w.role.index, pid=w.proc.pid)

    async def _wait_ready(self, w: Worker) -> None:
        """Until the worker's admin socket answers (it opens after the NFS listener)."""
        import aiohttp

        assert w.proc is not None
        path = str(w.role.admin_socket)
        async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=path)) as s:
            while w.proc.returncode is None:
                with contextlib.suppress(aiohttp.ClientError, OSError):
                    async with s.get("http://worker/healthz") as r:
                        if r.status == 200:
                            w.ready = True
                            return
                await asyncio.sleep(_HEALTH_POLL_S)
        raise RuntimeError(f"worker {w.role.index} exited with {w.proc.returncode} at start")

    def _watch(self, w: Worker) -> None:
        for job in (self._monitor(w), self._probe(w)):
            t = asyncio.get_running_loop().create_task(job)
            self._monitors.add(t)
            t.add_done_callback(self._monitors.discard)

    async def _probe(self, w: Worker) -> None:
        """Kill a worker whose event loop stopped answering (``_monitor`` restarts it)."""
        import aiohttp

        misses = 0
        timeout = aiohttp.ClientTimeout(total=PROBE_EVERY_S / 2)
        connector = aiohttp.UnixConnector(path=str(w.role.admin_socket))
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as s:
            while not self._is_stopping():
                await asyncio.sleep(PROBE_EVERY_S / 2)
                if not w.ready or w.proc is None:
                    misses = 0
                    continue
                try:
                    async with s.get("http://worker/healthz") as r:
                        ok = r.status == 200
                except (aiohttp.ClientError, OSError, TimeoutError):
                    ok = False
                if ok and w.role.index == 0:  # not a health miss if it fails or is slow
                    await self._readiness(s)
                misses = 0 if ok else misses + 1
                if misses >= PROBE_MISSES and w.proc.returncode is None:
                    log.error("worker_wedged", worker=w.role.index, pid=w.pid, misses=misses)
                    w.proc.kill()
                    misses = 0

    async def _readiness(self, s: Any) -> None:
        """Worker 0's ``/readyz`` reason (an export whose backend does not answer, a pack
        index loading: every worker sees the same backends) into the service's ``STATUS=``,
        when it changes. A /readyz that fails or takes too long (it may wait for a backend
        probe) changes nothing: it is asked again with the next health probe."""
        import aiohttp

        try:
            async with s.get("http://worker/readyz") as r:
                status = r.status
                body = await r.json(content_type=None) if status in (200, 503) else {}
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as e:
            log.debug("readiness_poll_failed", error=repr(e))
            return
        reason = "" if status == 200 or not isinstance(body, dict) else str(body.get("reason", ""))
        if reason != self.not_ready:
            self.not_ready = reason
            self.notifier.status(self.status())

    async def _monitor(self, w: Worker) -> None:
        """Restart ``w`` whenever it exits, until the supervisor stops."""
        while not self.stopping:
            assert w.proc is not None
            code = await w.proc.wait()
            if self._is_stopping():  # (a method: mypy would keep the loop's narrowing)
                return
            w.ready = False
            w.last_exit = code
            lived = time.monotonic() - w.started_at
            w.crashes_in_a_row = w.crashes_in_a_row + 1 if lived < CRASH_WINDOW_S else 1
            delay = min(RESTART_BACKOFF_MAX_S, RESTART_BACKOFF_S * 2 ** (w.crashes_in_a_row - 1))
            (log.error if w.crash_looping else log.warning)(
                "worker_exited",
                worker=w.role.index,
                pid=w.pid,
                code=code,
                lived_s=round(lived, 3),
                restart_in_s=delay,
                crash_loop=w.crash_looping,
            )
            self.notifier.status(self.status())
            await asyncio.sleep(delay)
            if self._is_stopping():
                return
            w.restarts += 1
            await self._spawn(w)
            try:
                async with asyncio.timeout(START_TIMEOUT_S):
                    await self._wait_ready(w)
            except (TimeoutError, RuntimeError) as e:
                log.error("worker_start_failed", worker=w.role.index, error=str(e))
                if w.proc.returncode is None:
                    w.proc.kill()
                continue
            self.notifier.status(self.status())

    def _is_stopping(self) -> bool:
        return self.stopping

    async def reload(self) -> bool:
        """SIGHUP: every worker re-reads the configuration; the supervisor takes the new admin
        token (other settings of its own need a restart: workers, listeners)."""
        errors: list[str] = []
        if self.config_loader is not None:
            try:
                new = await asyncio.to_thread(self.config_loader)
                self.config = _with_admin(self.config, new)
            except Exception as e:  # ConfigErrors or a loader bug: keep the running one
                errors.append(str(e))
        for w in self.workers:
            if w.proc is not None and w.proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    w.proc.send_signal(signal.SIGHUP)
        self.last_reload_error = errors
        return not errors

    async def stop(self) -> None:
        if self.stopping and not self.workers:
            return
        self.stopping = True
        timeout = self.config.server.drain_timeout_s
        self.notifier.stopping(timeout + KILL_MARGIN_S)
        for t in list(self._monitors):
            t.cancel()
        live = [w for w in self.workers if w.proc is not None and w.proc.returncode is None]
        for w in live:
            with contextlib.suppress(ProcessLookupError):
                w.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        try:
            async with asyncio.timeout(timeout + KILL_MARGIN_S):
                await asyncio.gather(*(w.proc.wait() for w in live))  # type: ignore[union-attr]
        except TimeoutError:
            for w in live:
                if w.proc is not None and w.proc.returncode is None:
                    log.error("worker_killed", worker=w.role.index, pid=w.pid)
                    w.proc.kill()
                    await w.proc.wait()
        if self._admin is not None:
            await self._admin.stop()
        for s in self._held:
            s.close()
        if self.run_dir is not None:
            await asyncio.to_thread(shutil.rmtree, self.run_dir, True)
        if self._lifeline is not None:
            for fd in self._lifeline:
                os.close(fd)
            self._lifeline = None
        await self.notifier.close()
        log.info("supervisor_stopped", codes=[w.proc.returncode for w in live if w.proc])

    async def run_until_signalled(self) -> int:
        return await until_signalled(self._stop, self.reload, self.stop, "supervisor_stopping")


def die_with_supervisor(drain_timeout_s: float) -> bool:
    """In a worker, first thing: exit when the supervisor that started it dies (see the
    module docstring): the parent-death signal (SIGTERM), and a thread watching the
    lifeline's read end. False when this process was not started by a supervisor (no
    ``NFSGW_SUPERVISOR``) or the variable is garbled (logged)."""
    spec = os.environ.pop(SUPERVISOR_ENV, "")
    if not spec:
        return False
    pid_text, _, fd_text = spec.partition(":")
    try:
        parent, fd = int(pid_text), int(fd_text)
        os.set_inheritable(fd, False)  # not into this worker's own children
    except (ValueError, OSError) as e:
        log.error("supervisor_lifeline_unusable", value=spec, error=str(e))
        return False
    grace = max(0.0, min(ORPHAN_GRACE_S, drain_timeout_s))
    set_parent_death_signal(signal.SIGTERM)
    threading.Thread(
        target=_watch_lifeline, args=(fd, parent, grace), name="nfsgw-lifeline", daemon=True
    ).start()
    return True


def set_parent_death_signal(sig: int) -> bool:
    """``prctl(PR_SET_PDEATHSIG, sig)``: the kernel sends ``sig`` to this process when the
    thread that forked it exits. False where there is no such call (not Linux)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _watch_lifeline(fd: int, parent: int, grace_s: float) -> None:
    """The lifeline's thread: blocks on the pipe until EOF (every write end closed: the
    supervisor is gone), then stops the worker. A parent already gone when the worker
    started (it died before the parent-death signal was set) counts the same."""
    if os.getppid() == parent:
        while True:
            try:
                if not os.read(fd, 64):
                    break
            except InterruptedError:
                continue
            except OSError:
                break
    orphaned(grace_s)


def orphaned(grace_s: float) -> None:
    """The supervisor is gone: drain as on SIGTERM (the signal handler's path), exit after
    ``grace_s`` whatever the drain is doing. Runs in the lifeline's thread."""
    log.error("supervisor_gone", pid=os.getpid(), exit_within_s=grace_s)
    with contextlib.suppress(ProcessLookupError):
        os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(grace_s)
    log.error("orphan_exit", pid=os.getpid(), reason=f"drain not over after {grace_s:g} s")
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    os._exit(EXIT_ORPHANED)


def hold_reloads() -> None:
    """Keep SIGHUP pending until ``until_signalled`` handles it: its default action ends
    the process, and a worker answers health probes (so its supervisor may forward a
    reload) before its start is over. Called first thing by ``nfsgw serve``; the workers a
    supervisor starts inherit the held signal and release it the same way."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})


async def until_signalled(
    stop_requested: asyncio.Event,
    reload: Callable[[], Coroutine[Any, Any, bool]],
    stop: Callable[[], Awaitable[None]],
    event: str,
) -> int:
    """A service process's main wait (a gateway's or the supervisor's): SIGHUP runs ``reload``
    (in a task, so a slow one never blocks a stop), SIGTERM/SIGINT set ``stop_requested``;
    then reloads still running are cancelled, ``event`` is logged and ``stop`` awaited."""
    loop = asyncio.get_running_loop()
    reloads: set[asyncio.Task[bool]] = set()

    def on_hup() -> None:
        t = loop.create_task(reload())
        reloads.add(t)
        t.add_done_callback(reloads.discard)

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop_requested.set)
    loop.add_signal_handler(signal.SIGHUP, on_hup)
    # A SIGHUP that came while the process started (``hold_reloads``) is delivered now.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGHUP})
    try:
        await stop_requested.wait()
        log.info(event)
        for t in list(reloads):
            t.cancel()
        await stop()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            loop.remove_signal_handler(sig)
    return 0


def _with_admin(old: ServerConfig, new: ServerConfig) -> ServerConfig:
    import dataclasses

    return dataclasses.replace(old, admin=dataclasses.replace(old.admin, token=new.admin.token))
