"""The start-up backend probe (``gateway.ops.probe``), in process:

- ``diagnose`` of what ``S3Store._error`` and the credential chain raise: the cause and the
  fix for a missing bucket, refused credentials, denied access, a wrong region, an endpoint
  that does not answer, server errors.
- A gateway whose backend fails: one ``export_backend_failed`` line per cause (not one per
  retry), ``/readyz`` 503 naming the export and the reason, ``READY=1`` all the same with
  ``STATUS=`` naming it; then one ``export_backend_recovered`` line, ``/readyz`` 200 and the
  plain STATUS.
- The first probe does not hold the listeners back: a backend that never answers delays
  ``gateway_started`` by the probe's bound at most, and calls are served meanwhile.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import MutableMapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from gateway.backend.base import AccessDeniedError, BackendError, BackendUnavailable
from gateway.backend.s3 import S3Store
from gateway.clock import FakeClock
from gateway.exports import ExportConfig
from gateway.ops import probe
from gateway.ops.probe import diagnose
from gateway.ops.systemd import Notifier
from tests.harness.memory import MemoryGateway, gateway_config
from tests.unit.ops.helpers import Http, admin_config
from tests.unit.ops.test_systemd import NotifySocket, notify_sock  # noqa: F401 - a fixture

EXPORT = ExportConfig("/data", "s3://b/ds/", read_only=True, immutable=True)
FILES = {"ds/d0/f0.jpg": b"x" * 100}


def s3_error(status: int, code: str, message: str, **headers: str) -> BaseException:
    """What ``S3Store`` raises for this reply to a LIST (its one mapping site, ``_error``)."""
    store = S3Store("b", endpoint_url="http://127.0.0.1:1", access_key="k", secret_key="s")
    body = f"<Error><Code>{code}</Code><Message>{message}</Message></Error>".encode()
    return store._error("list", "ds/", status, headers, body)


CASES: dict[str, tuple[BaseException, str, str]] = {
    "missing bucket": (
        s3_error(404, "NoSuchBucket", "The specified bucket does not exist"),
        "no_such_bucket",
        "create the bucket",
    ),
    "unknown key": (
        s3_error(403, "InvalidAccessKeyId", "The AWS access key Id you provided does not exist"),
        "bad_credentials",
        "AWS_ACCESS_KEY_ID",
    ),
    "wrong secret": (
        s3_error(403, "SignatureDoesNotMatch", "The request signature we calculated ..."),
        "bad_credentials",
        "the profile",
    ),
    "denied": (s3_error(403, "AccessDenied", "Access Denied"), "access_denied", "s3:ListBucket"),
    "redirect": (
        s3_error(
            301, "PermanentRedirect", "use the endpoint", **{"x-amz-bucket-region": "eu-west-1"}
        ),
        "wrong_region",
        "--s3-region eu-west-1",
    ),
    "bad region header": (
        s3_error(
            400,
            "AuthorizationHeaderMalformed",
            "the region 'us-east-1' is wrong; expecting 'ap-south-1'",
        ),
        "wrong_region",
        "--s3-region ap-south-1",
    ),
    "refused": (
        BackendUnavailable(
            "list b/ds/: giving up after 5 attempt(s): ClientConnectorError: Cannot connect "
            "to host 127.0.0.1:1 ssl:default [Connect call failed ('127.0.0.1', 1)]"
        ),
        "unreachable",
        "--s3-endpoint-url",
    ),
    "timeout": (TimeoutError(), "unreachable", "--s3-endpoint-url"),
    "5xx": (
        BackendUnavailable("list b/ds/: giving up after 5 attempt(s): _Retry: HTTP 503 SlowDown"),
        "server_error",
        "the store's health",
    ),
    "no credentials": (
        AccessDeniedError("no AWS credentials found (env, shared files, profile, ...)"),
        "no_credentials",
        "AWS_ACCESS_KEY_ID",
    ),
    "credential chain": (
        BackendUnavailable(
            "credentials: ProfileNotFound: The config profile (x) could not be found"
        ),
        "no_credentials",
        "--s3-profile",
    ),
    "other": (BackendError("list b/ds/: HTTP 418"), "error", "see the error"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_diagnose(case: str) -> None:
    exc, cause, fix = CASES[case]
    d = diagnose(exc)
    assert d.cause == cause and fix in d.fix, d
    assert d.problem and (str(exc) in d.error or isinstance(exc, TimeoutError))
    assert d.problem in d.reason() and d.fix in d.reason()


def events(logs: Sequence[MutableMapping[str, Any]], name: str) -> list[MutableMapping[str, Any]]:
    return [e for e in logs if e["event"] == name]


@pytest.fixture
def fast_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probe, "RETRY_FIRST_S", 0.05)
    monkeypatch.setattr(probe, "RETRY_MAX_S", 0.1)


async def wait_until(cond: Any, timeout_s: float = 10.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not cond():  # noqa: ASYNC110 - polled state of background tasks
            await asyncio.sleep(0.01)


@pytest.mark.usefixtures("fast_retries")
async def test_a_failing_backend_is_said_once_per_cause_then_its_recovery(
    tmp_path: Path,
    notify_sock: NotifySocket,  # noqa: F811 - the fixture
) -> None:
    clock = FakeClock()
    failure: dict[str, BaseException | None] = {
        "now": s3_error(404, "NoSuchBucket", "The specified bucket does not exist")
    }

    def fail(op: str, key: str) -> BaseException | None:
        return failure["now"] if op == "list" else None

    cfg = gateway_config(tmp_path / "state", [EXPORT], admin=admin_config())
    n = Notifier({"NOTIFY_SOCKET": notify_sock.address})
    gw = MemoryGateway(cfg, files=FILES, clock=clock, notifier=n)
    gw.server.probe_at_start = True
    gw.store.fail = fail
    with capture_logs() as logs:
        async with gw:
            http = Http(gw.server.metrics_port)
            started = events(logs, "gateway_started")
            failed = events(logs, "export_backend_failed")
            # said at start, before gateway_started, with what to do
            assert len(failed) == 1 and logs.index(failed[0]) < logs.index(started[0])
            f = failed[0]
            assert f["log_level"] == "error"
            assert (f["export"], f["backend"], f["cause"]) == (
                "/data",
                "s3://b/ds/",
                "no_such_bucket",
            )
            assert "create the bucket" in f["fix"] and "NoSuchBucket" in f["error"]
            # the store names its endpoint (store.traits): here the memory store standing in
            # for S3; an S3Store's text is tested with the store (test_s3_config.py)
            assert f["endpoint"] == "memory"
            assert started[0]["not_answering"] == ["/data"]
            ready = await notify_sock.recv()
            assert ready["READY"] == "1"  # not held back by a backend that is down
            assert "/data not answering: the bucket does not exist" in ready["STATUS"]
            status, body = await http.json("GET", "/readyz")
            assert status == 503 and body["ready"] is False
            assert body["reason"].startswith("/data: the bucket does not exist")
            assert "create the bucket" in body["backends"]["/data"]
            # retried in the background, but not said again
            lists = gw.store.requests["list"]
            await wait_until(lambda: gw.store.requests["list"] >= lists + 3)
            assert len(events(logs, "export_backend_failed")) == 1
            # another cause: said once more
            failure["now"] = s3_error(403, "AccessDenied", "Access Denied")
            await wait_until(lambda: len(events(logs, "export_backend_failed")) == 2)
            assert events(logs, "export_backend_failed")[1]["cause"] == "access_denied"
            assert "the credentials may not list the bucket" in (await notify_sock.recv())["STATUS"]
            # it answers: one recovery line, /readyz 200, STATUS plain again
            failure["now"] = None
            await wait_until(lambda: events(logs, "export_backend_recovered") != [])
            rec = events(logs, "export_backend_recovered")
            assert (
                len(rec) == 1 and rec[0]["export"] == "/data" and rec[0]["was"] == "access_denied"
            )
            assert (await notify_sock.recv())["STATUS"] == f"serving 1 export on port {gw.port}"
            clock.advance(10)  # past the /readyz cache
            status, body = await http.json("GET", "/readyz")
            assert (status, body) == (200, {"ready": True, "backends": {"/data": "ok"}})
            lists = gw.store.requests["list"]
            await asyncio.sleep(0.3)
            assert gw.store.requests["list"] == lists  # no retries once it answers
            await http.close()
    assert len(events(logs, "export_backend_failed")) == 2
    assert len(events(logs, "export_backend_recovered")) == 1


async def test_a_backend_that_never_answers_delays_start_by_the_bound_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(probe, "PROBE_TIMEOUT_S", 0.3)
    gate = asyncio.Event()

    cfg = gateway_config(tmp_path / "state", [EXPORT])
    gw = MemoryGateway(cfg, files=FILES)
    gw.server.probe_at_start = True
    real = gw.store.list_page

    async def hang(prefix: str, **kw: Any) -> Any:
        if kw.get("max_keys") == 1:
            await gate.wait()  # the probe: no answer
        return await real(prefix, **kw)

    gw.store.list_page = hang  # type: ignore[method-assign]
    t0 = time.monotonic()
    with capture_logs() as logs:
        async with gw:
            assert time.monotonic() - t0 < 0.3 + 0.5 + 1.0
            (f,) = events(logs, "export_backend_failed")
            assert f["cause"] == "unreachable" and "did not answer in 0.3 s" in f["problem"]
            root = await gw.mount(b"/data")  # served meanwhile (the listing is no probe)
            assert (await gw.getattr(await gw.walk(root, "d0/f0.jpg"))).status == 0
            gate.set()
