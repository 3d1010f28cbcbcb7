"""A worker's ties to its supervisor (``gateway.ops.workers.die_with_supervisor``): the
parent-death signal is set as asked, and the lifeline's end (EOF on its pipe) stops the
worker, drained or not within the grace. Each in a child process (a parent-death signal set
in the test process would outlive the test); the whole ``--workers 2`` case is
tests/integration/test_workers.py."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from gateway.ops import workers

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux prctl")


def _child(code: str, env: dict[str, str], fds: tuple[int, ...] = ()) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", code],
        env={**os.environ, **env},
        pass_fds=fds,
        stdout=subprocess.PIPE,
        text=True,
    )


def test_not_a_worker_without_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(workers.SUPERVISOR_ENV, raising=False)
    assert workers.die_with_supervisor(1.0) is False
    monkeypatch.setenv(workers.SUPERVISOR_ENV, "garbage")
    assert workers.die_with_supervisor(1.0) is False
    assert workers.SUPERVISOR_ENV not in os.environ  # not passed on to its own children


def test_the_parent_death_signal_is_set() -> None:
    code = (
        "import ctypes, signal\n"
        "from gateway.ops import workers\n"
        "assert workers.set_parent_death_signal(signal.SIGTERM)\n"
        "libc = ctypes.CDLL(None); got = ctypes.c_int()\n"
        "libc.prctl(2, ctypes.byref(got), 0, 0, 0)\n"  # PR_GET_PDEATHSIG
        "print(got.value)\n"
    )
    p = _child(code, {})
    out, _ = p.communicate(timeout=30)
    assert p.returncode == 0 and int(out) == 15


@pytest.mark.parametrize("drains", [True, False], ids=["drained", "stuck"])
def test_the_lifeline_closing_stops_the_worker(drains: bool) -> None:
    """The supervisor's end closed: SIGTERM to itself (the usual drain: exit 0 here), or, if
    the drain does not end within the grace, ``EXIT_ORPHANED``."""
    r, w = os.pipe()
    handler = "sys.exit(0)" if drains else "None"
    code = (
        "import signal, sys, time\n"
        "from gateway.ops import workers\n"
        f"signal.signal(signal.SIGTERM, lambda *a: {handler})\n"
        "assert workers.die_with_supervisor(0.3)\n"
        "print('ready', flush=True)\n"
        "time.sleep(30)\n"
        "sys.exit(3)\n"
    )
    p = _child(code, {workers.SUPERVISOR_ENV: f"{os.getpid()}:{r}"}, (r,))
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        os.close(r)
        t0 = time.monotonic()
        os.close(w)  # the supervisor is gone
        code_ = p.wait(10)
        assert code_ == (0 if drains else workers.EXIT_ORPHANED)
        assert time.monotonic() - t0 < 5
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
