"""``nfsgw serve`` as a child process: the one process harness of the project, used by the
comparison runs (``loadgen.bench.compare``, which ``make demo`` drives) and by the tests that
need a real process (kill -9 and restart, signals, memory and descriptors, the kernel client).

Owns: the configuration file it writes (``[section]`` tables over a few defaults, then one
``[[export]]`` per export), its two ports (free ones, chosen once: a restart serves on the same
port and state directory), the child's environment, its log (one file per gateway, appended
across restarts), waiting until it serves (its ``gateway_started`` line, bounded), reading its
admin API, and ending it (SIGTERM to its process group, SIGKILL after a bound; ``kill`` is
SIGKILL at once). Must not: import the gateway (it runs one by its command line) or leave the
process running (``stop`` in ``finally``/``with``).

    with GatewayProcess(tmp, [{"path": "/data", "backend": "s3://bkt/ds/"}], s3=seaweed) as gw:
        ...
        gw.kill()            # SIGKILL: what a crash or an OOM kill does
        gw.start()           # same port, same state directory
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Protocol

from loadgen.gwmetrics import Samples, parse_metrics
from loadgen.waiting import wait_until

__all__ = ["GatewayProcess", "S3Account", "free_port", "toml"]


class S3Account(Protocol):
    """Where the gateway's S3 is and who it is there (``loadgen.seaweed.SeaweedServer``)."""

    @property
    def endpoint_url(self) -> str: ...

    @property
    def access_key(self) -> str: ...

    @property
    def secret_key(self) -> str: ...


_given: set[int] = set()


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now, and not one this process handed out before: two calls
    in a row (a gateway's NFS and admin ports) can otherwise get the same ephemeral port."""
    while True:
        with socket.socket() as s:
            s.bind((host, 0))
            port: int = s.getsockname()[1]
        if port not in _given:
            _given.add(port)
            return port


def _value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str | Path):
        return json.dumps(str(v))
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    raise TypeError(f"no TOML form for {v!r}")


def toml(
    sections: Mapping[str, Mapping[str, object]], exports: Sequence[Mapping[str, object]]
) -> str:
    """A configuration file: ``[section]`` tables, then one ``[[export]]`` per export."""
    out: list[str] = []
    for name, table in sections.items():
        out.append(f"[{name}]")
        out += [f"{k} = {_value(v)}" for k, v in table.items()]
    for e in exports:
        out.append("[[export]]")
        out += [f"{k} = {_value(v)}" for k, v in e.items()]
    return "\n".join(out) + "\n"


class GatewayProcess:
    """A gateway named ``name`` with its files in ``work_dir`` (``NAME.toml``, ``NAME.log``,
    ``NAME-state/``). ``sections`` are merged over the defaults (127.0.0.1 and the chosen
    ports, the state directory, the admin API, JSON logs); ``flags`` are ``nfsgw serve``
    flags, which win over the file. ``s3``: the ``[s3]`` endpoint and the credentials, and
    then nothing else of the caller's AWS set-up reaches the child; else ``env`` (default:
    this process's) is its environment as given."""

    def __init__(
        self,
        work_dir: Path,
        exports: Sequence[Mapping[str, object]],
        *,
        name: str = "nfsgw",
        sections: Mapping[str, Mapping[str, object]] | None = None,
        flags: Sequence[str] = (),
        s3: S3Account | None = None,
        env: Mapping[str, str] | None = None,
        startup_timeout_s: float = 60.0,
        workers: int = 1,
        admin_token: bool = False,
    ) -> None:
        self.work_dir = work_dir
        self.name = name
        self.exports = [dict(e) for e in exports]
        self.flags = list(flags)
        self.startup_timeout_s = startup_timeout_s
        self.port = free_port()
        self.admin_port = free_port()
        self.sections: dict[str, dict[str, object]] = {
            "server": {
                "listen": "127.0.0.1",
                "port": self.port,
                "state_dir": str(work_dir / f"{name}-state"),
                # One process unless asked: request counts per process stay exact in tests.
                "workers": workers,
            },
            "admin": {"listen": f"127.0.0.1:{self.admin_port}"},
            "log": {"format": "json"},
        }
        # On TCP, mutating admin calls (reload, invalidate, warm-up) need a bearer token: with
        # ``admin_token`` the gateway gets one and ``http``/``admin_headers`` send it.
        self.admin_token = secrets.token_hex(16) if admin_token else None
        if self.admin_token is not None:
            token_file = work_dir / f"{name}.admin-token"
            work_dir.mkdir(parents=True, exist_ok=True)
            token_file.write_text(self.admin_token + "\n")
            token_file.chmod(0o600)
            self.sections["admin"]["token_file"] = str(token_file)
        environ = dict(os.environ if env is None else env)
        if s3 is not None:
            self.sections["s3"] = {"endpoint_url": s3.endpoint_url}
            environ = {k: v for k, v in environ.items() if not k.startswith(("AWS_", "NFSGW_"))}
            environ["AWS_ACCESS_KEY_ID"] = s3.access_key
            environ["AWS_SECRET_ACCESS_KEY"] = s3.secret_key
            environ["AWS_EC2_METADATA_DISABLED"] = "true"
        self.env = environ
        for section, table in (sections or {}).items():
            self.sections.setdefault(section, {}).update(table)
        self.config_path = work_dir / f"{name}.toml"
        self.log_path = work_dir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        # With workers the supervisor says when all of them serve.
        self._started_line = b"supervisor_started" if workers != 1 else b"gateway_started"

    # ------------------------------------------------------------------ life cycle

    @property
    def state_dir(self) -> Path:
        return Path(str(self.sections["server"]["state_dir"]))

    def write_config(self) -> None:
        self.config_path.write_text(toml(self.sections, self.exports))

    def start(self) -> GatewayProcess:
        """Start (or restart, after ``kill``/``stop``) with the configuration as it is now,
        and wait until it serves. Blocking: from a loop, ``await asyncio.to_thread(gw.start)``."""
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError(f"{self.name} is already running")
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.write_config()
        self.starts += 1
        argv = [sys.executable, "-m", "gateway.ops.cli", "serve", "--config", str(self.config_path)]
        with self.log_path.open("ab") as log:
            offset = log.tell()
            self.proc = subprocess.Popen(
                argv + self.flags,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,  # its own process group: _end signals the group
            )
        try:
            wait_until(
                lambda: self._serving(offset),
                timeout_s=self.startup_timeout_s,
                what=self.name,
                alive=self._exited,
                log_tail=self.log_tail,
            )
        except RuntimeError:
            self.kill()  # did not start in time (a process that exited is left as it is)
            raise
        return self

    def _exited(self) -> str | None:
        """Why the child is gone (None: it runs)."""
        p = self.proc
        return None if p is None or p.poll() is None else f"exited with {p.returncode}"

    def _serving(self, offset: int) -> bool:
        """This run logged ``gateway_started`` (its listeners are open by then), or with
        several workers ``supervisor_started`` (every worker's are)."""
        with self.log_path.open("rb") as f:
            f.seek(offset)
            return self._started_line in f.read()

    def send_signal(self, sig: signal.Signals) -> None:
        """``sig`` to the gateway (SIGHUP: reload its configuration file)."""
        assert self.proc is not None, "not started"
        self.proc.send_signal(sig)

    def wait(self, timeout_s: float) -> int:
        """Its exit status (``subprocess.TimeoutExpired`` if it runs past ``timeout_s``)."""
        assert self.proc is not None, "not started"
        return self.proc.wait(timeout_s)

    def kill(self) -> None:
        """SIGKILL, no drain: what a crash or an OOM kill does."""
        self._end(signal.SIGKILL)

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM (drain and exit), SIGKILL if it has not exited within ``timeout_s``."""
        self._end(signal.SIGTERM, timeout_s)

    def _end(self, sig: signal.Signals, timeout_s: float = 30.0) -> None:
        p = self.proc
        if p is None or p.poll() is not None:
            return
        try:
            os.killpg(p.pid, sig)
            p.wait(timeout_s)
        except ProcessLookupError:
            p.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout_s)

    def __enter__(self) -> GatewayProcess:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def pid(self) -> int:
        assert self.proc is not None, "not started"
        return self.proc.pid

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    # ------------------------------------------------------------------ addresses

    @property
    def url(self) -> str:
        """The first export's URL for ``loadgen`` (NFS and MOUNT on the one port)."""
        return f"nfs://127.0.0.1:{self.port}{self.exports[0]['path']}"

    def libnfs_url(self, export: str = "/data") -> str:
        """An export's libnfs URL (NFS and MOUNT on our port, no portmapper, NFSv3)."""
        return (
            f"nfs://127.0.0.1{export}?nfsport={self.port}&mountport={self.port}&version=3"
            "&auto-traverse-mounts=0"
        )

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}/metrics"

    def admin_headers(self) -> dict[str, str]:
        """The admin API's bearer token as request headers (none without ``admin_token``)."""
        return {"Authorization": f"Bearer {self.admin_token}"} if self.admin_token else {}

    def http(self, path: str) -> bytes:
        """GET ``path`` of the admin API."""
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.admin_port}{path}", headers=self.admin_headers()
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            body: bytes = r.read()
            return body

    def metrics(self) -> Samples:
        """``/metrics`` as ``loadgen.gwmetrics`` reads it: {"name{label=value,...}": value}."""
        return parse_metrics(self.http("/metrics").decode())
