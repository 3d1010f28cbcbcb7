"""A wrong backend is said at start: ``nfsgw serve`` as a child process
(``loadgen.gwprocess``) against an endpoint nobody listens on, a bucket SeaweedFS does not
have, and credentials SeaweedFS refuses:

- one ``export_backend_failed`` line at error level (export, backend, endpoint, cause, fix),
  before ``gateway_started``, and not again while it is retried;
- ``READY=1`` all the same, with ``STATUS=`` naming the export; ``/readyz`` 503 with the
  reason;
- the missing bucket created: ``/readyz`` turns 200 and one ``export_backend_recovered``.
"""

from __future__ import annotations

import json
import os
import socket
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from loadgen.gwprocess import GatewayProcess
from loadgen.seaweed import SeaweedServer

pytestmark = [pytest.mark.s3]

STATE: dict[str, dict[str, object]] = {
    "server": {"uvloop": False, "drain_timeout_s": 2},
    "cache": {"memory": "64M"},
}


@dataclass(frozen=True)
class Account:
    endpoint_url: str
    access_key: str
    secret_key: str


def readyz(gw: GatewayProcess) -> tuple[int, dict[str, Any]]:
    url = f"http://127.0.0.1:{gw.admin_port}/readyz"
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def lines(gw: GatewayProcess, event: str) -> list[dict[str, Any]]:
    out = []
    for line in gw.log_path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            d = json.loads(line)
            if d.get("event") == event:
                out.append(d)
    return out


def wait(cond: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s:g} s")
        time.sleep(0.1)


def events_in_order(gw: GatewayProcess) -> list[str]:
    return [
        json.loads(line)["event"]
        for line in gw.log_path.read_text(errors="replace").splitlines()
        if line.startswith("{")
    ]


class Manager:
    """The service manager's end of NOTIFY_SOCKET: READY=1 and STATUS= lines."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(30)

    def wait_for(self, key: str) -> dict[str, str]:
        while True:
            data = self.sock.recv(4096)
            msg = dict(line.split("=", 1) for line in data.decode().splitlines())
            if key in msg:
                return msg


@pytest.fixture
def manager(tmp_path: Path) -> Iterator[Manager]:
    m = Manager(tmp_path / "notify.sock")
    try:
        yield m
    finally:
        m.sock.close()


def at_a_dead_endpoint(
    tmp_path: Path, manager: Manager, workers: int = 1
) -> tuple[str, GatewayProcess]:
    """A gateway whose export's S3 endpoint refuses connections (a port that was free a
    moment ago), reporting to ``manager``; and that endpoint."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env |= {
        "AWS_ACCESS_KEY_ID": "k",
        "AWS_SECRET_ACCESS_KEY": "s",
        "AWS_EC2_METADATA_DISABLED": "true",
        "NOTIFY_SOCKET": str(manager.path),
    }
    gw = GatewayProcess(
        tmp_path,
        [{"path": "/data", "backend": "s3://nosuchbucket/", "insecure": True}],
        sections={**STATE, "s3": {"endpoint_url": dead}},
        env=env,
        startup_timeout_s=30,
        workers=workers,
    )
    return dead, gw


def test_an_endpoint_nobody_listens_on(tmp_path: Path, manager: Manager) -> None:
    dead, gw = at_a_dead_endpoint(tmp_path, manager)
    with gw:
        ready = manager.wait_for("READY")
        assert "/data not answering: the endpoint does not answer" in ready["STATUS"]
        (f,) = lines(gw, "export_backend_failed")
        assert f["level"] == "error" and f["export"] == "/data"
        assert (f["backend"], f["endpoint"], f["cause"]) == (
            "s3://nosuchbucket/",
            dead,
            "unreachable",
        )
        assert "--s3-endpoint-url" in f["fix"] and "Connect call failed" in f["error"]
        order = events_in_order(gw)
        assert order.index("export_backend_failed") < order.index("gateway_started")
        assert lines(gw, "gateway_started")[0]["not_answering"] == ["/data"]
        status, body = readyz(gw)
        assert status == 503 and body["reason"].startswith("/data: the endpoint does not answer")
        time.sleep(3.5)  # retries at 1 and 2 s (and /readyz probes): said once
        assert len(lines(gw, "export_backend_failed")) == 1


def test_with_workers_the_services_status_names_the_export(
    tmp_path: Path, manager: Manager
) -> None:
    """The supervisor's STATUS= (the one systemd shows) carries worker 0's /readyz reason."""
    _, gw = at_a_dead_endpoint(tmp_path, manager, workers=2)
    with gw:
        ready = manager.wait_for("READY")
        assert ready["STATUS"].startswith("2 of 2 workers serving")
        while "not answer" not in (status := manager.wait_for("STATUS")["STATUS"]):
            pass  # within the supervisor's next health probe (PROBE_EVERY_S / 2)
        assert status.startswith("2 of 2 workers serving on port ")
        assert "/data: the endpoint does not answer" in status


def test_a_missing_bucket_then_created(seaweed: SeaweedServer, tmp_path: Path) -> None:
    bucket = f"t-{uuid.uuid4().hex[:16]}"
    gw = GatewayProcess(
        tmp_path,
        [{"path": "/data", "backend": f"s3://{bucket}/ds/", "insecure": True}],
        sections=STATE,
        s3=seaweed,
        startup_timeout_s=30,
    )
    try:
        with gw:
            (f,) = lines(gw, "export_backend_failed")
            assert (f["export"], f["cause"]) == ("/data", "no_such_bucket")
            assert f["backend"] == f"s3://{bucket}/ds/" and f["endpoint"] == seaweed.endpoint_url
            assert "create the bucket" in f["fix"] and "NoSuchBucket" in f["error"]
            status, body = readyz(gw)
            assert status == 503
            assert body["reason"].startswith("/data: the bucket does not exist")
            assert "/data" in body["backends"] and body["backends"]["/data"] != "ok"
            seaweed.create_bucket(bucket)
            wait(lambda: readyz(gw)[0] == 200, 30, "/readyz 200 once the bucket exists")
            wait(lambda: lines(gw, "export_backend_recovered") != [], 10, "the recovery line")
            (r,) = lines(gw, "export_backend_recovered")
            assert (r["export"], r["was"], r["level"]) == ("/data", "no_such_bucket", "info")
            assert len(lines(gw, "export_backend_failed")) == 1
    finally:
        seaweed.delete_bucket(bucket)


@pytest.mark.parametrize("wrong", ["access_key", "secret_key"])
def test_refused_credentials(
    seaweed: SeaweedServer, s3_bucket: str, tmp_path: Path, wrong: str
) -> None:
    account = Account(
        seaweed.endpoint_url,
        "nobody" if wrong == "access_key" else seaweed.access_key,
        "wrong-secret" if wrong == "secret_key" else seaweed.secret_key,
    )
    gw = GatewayProcess(
        tmp_path,
        [{"path": "/data", "backend": f"s3://{s3_bucket}/", "insecure": True}],
        sections=STATE,
        s3=account,
        startup_timeout_s=30,
    )
    with gw:
        (f,) = lines(gw, "export_backend_failed")
        assert (f["export"], f["cause"]) == ("/data", "bad_credentials"), f
        assert "AWS_ACCESS_KEY_ID" in f["fix"]
        code = "InvalidAccessKeyId" if wrong == "access_key" else "SignatureDoesNotMatch"
        assert code in f["error"], f
        status, body = readyz(gw)
        assert status == 503 and "the store refused the credentials" in body["reason"]
