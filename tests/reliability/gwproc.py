"""The gateway as a child process (``nfsgw serve --config FILE``), for tests that kill it with
SIGKILL, restart it on the same port and state directory, or measure its own memory, file
descriptors and threads.

Owns: writing the TOML configuration, starting the process with S3 credentials in its
environment, waiting until it serves (its ``gateway_started`` log line, then a TCP connect),
its admin API (``/metrics``), and stopping it. Must not: leave the process running (``stop``
in ``finally``/``with``); wait without a bound.

    with GatewayProcess(tmp, [{"path": "/data", "backend": "s3://bkt/ds/"}], s3=sw) as gw:
        ...
        gw.kill()            # SIGKILL
        gw.start()           # same port, same state directory
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from gateway.ops.server import free_port
from loadgen.seaweed import SeaweedServer

__all__ = ["GatewayProcess", "toml"]

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 60.0


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
    """``sections`` are merged over the defaults below ([server], [admin], [log], [s3],
    [cache], ...); ``exports`` are ``[[export]]`` tables."""

    def __init__(
        self,
        tmp: Path,
        exports: Sequence[Mapping[str, object]],
        *,
        s3: SeaweedServer | None = None,
        s3_endpoint: str | None = None,
        sections: Mapping[str, Mapping[str, object]] | None = None,
        state_dir: Path | None = None,
        port: int | None = None,
    ) -> None:
        self.tmp = tmp
        tmp.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.admin_port = free_port()
        self.state_dir = state_dir or tmp / "state"
        self.exports = list(exports)
        self.s3 = s3
        base: dict[str, dict[str, object]] = {
            "server": {
                "listen": "127.0.0.1",
                "port": self.port,
                "state_dir": str(self.state_dir),
                "drain_timeout_s": 5,
                "uvloop": True,  # the production default (in-process test servers use asyncio)
            },
            "admin": {"listen": f"127.0.0.1:{self.admin_port}"},
            "log": {"format": "json", "level": "info"},
            "cache": {"memory": "256M", "metadata_memory": "64M"},
        }
        if s3 is not None or s3_endpoint is not None:
            base["s3"] = {
                "endpoint_url": s3_endpoint or (s3.endpoint_url if s3 else ""),
                "addressing_style": "path",
            }
        for name, table in (sections or {}).items():
            base.setdefault(name, {}).update(table)
        self.sections = base
        self.config = tmp / "nfsgw.toml"
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self._log: Any = None

    # ------------------------------------------------------------------ life cycle

    def write_config(self) -> None:
        self.config.write_text(toml(self.sections, self.exports))

    @property
    def log_path(self) -> Path:
        return self.tmp / f"gateway-{self.starts}.log"

    def start(self) -> GatewayProcess:
        """Start (or restart, after ``kill``/``stop``) and wait until it accepts calls."""
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError("gateway already running")
        self.write_config()
        self.starts += 1
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "NFSGW_"))}
        env["AWS_EC2_METADATA_DISABLED"] = "true"
        if self.s3 is not None:
            env["AWS_ACCESS_KEY_ID"] = self.s3.access_key
            env["AWS_SECRET_ACCESS_KEY"] = self.s3.secret_key
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gateway.ops.cli", "serve", "--config", str(self.config)],
            cwd=REPO,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        end = time.monotonic() + START_TIMEOUT_S
        while b"gateway_started" not in self.log_path.read_bytes():
            if self.proc.poll() is not None:
                raise RuntimeError(f"gateway exited ({self.proc.returncode}):\n{self.log_tail()}")
            if time.monotonic() > end:
                self.kill()
                raise RuntimeError(f"gateway did not start:\n{self.log_tail()}")
            time.sleep(0.05)
        with socket.create_connection(("127.0.0.1", self.port), timeout=10):
            pass
        return self

    def kill(self) -> None:
        """SIGKILL, no drain: what a crash or an OOM kill does."""
        self._end(signal.SIGKILL)

    def stop(self) -> None:
        """SIGTERM (drain), SIGKILL if it does not exit within 30 s."""
        self._end(signal.SIGTERM)

    def _end(self, sig: signal.Signals) -> None:
        p = self.proc
        if p is not None and p.poll() is None:
            p.send_signal(sig)
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(30)
        if self._log is not None:
            self._log.close()
            self._log = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def log_tail(self, n: int = 30) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return ""
        return "\n".join(lines[-n:])

    def log_events(self) -> list[dict[str, Any]]:
        """The JSON log lines of the current run."""
        out = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue
        return out

    # ------------------------------------------------------------------ admin API

    def url(self, export: str = "/data") -> str:
        """The libnfs URL of an export (NFS and MOUNT on our port, no portmapper)."""
        return (
            f"nfs://127.0.0.1{export}?nfsport={self.port}&mountport={self.port}&version=3"
            "&auto-traverse-mounts=0"
        )

    def http(self, path: str) -> bytes:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.admin_port}{path}", timeout=30) as r:
            body: bytes = r.read()
            return body

    def metrics(self) -> dict[str, float]:
        """``/metrics`` as {"name{label=value,...}": value} (labels sorted)."""
        from prometheus_client.parser import text_string_to_metric_families

        out: dict[str, float] = {}
        for fam in text_string_to_metric_families(self.http("/metrics").decode()):
            for s in fam.samples:
                labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
                out[f"{s.name}{{{labels}}}"] = s.value
        return out

    def metric_sum(self, name: str, **labels: str) -> float:
        """The sum of the samples of ``name`` whose labels include ``labels``."""
        total = 0.0
        want = [f"{k}={v}" for k, v in labels.items()]
        for key, v in self.metrics().items():
            n, _, rest = key.partition("{")
            if n == name and all(w in rest.rstrip("}").split(",") for w in want):
                total += v
        return total

    def __enter__(self) -> GatewayProcess:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
