"""``loadgen.waiting.wait_until``: the value, the last failure, a dead process, the log tail."""

from __future__ import annotations

import itertools

import pytest

from loadgen.waiting import NotReady, wait_until


def test_returns_the_first_ready_value() -> None:
    n = itertools.count()
    assert wait_until(lambda: next(n) >= 3 or None, timeout_s=5, what="x", interval_s=0) is True
    m = itertools.count()
    assert wait_until(lambda: next(m) or None, timeout_s=5, what="x", interval_s=0) == 1


def test_timeout_names_the_last_failure_and_the_log_tail() -> None:
    def probe() -> int:
        raise NotReady("HTTP 503")

    with pytest.raises(RuntimeError) as e:
        wait_until(probe, timeout_s=0.05, what="srv", interval_s=0.01, log_tail=lambda: "the log")
    assert str(e.value) == "srv: not ready after 0 s (HTTP 503)\nthe log"


def test_a_refused_connection_is_not_yet() -> None:
    def probe() -> int:
        raise ConnectionRefusedError("refused")

    class Boom(Exception):
        pass

    with pytest.raises(
        Boom, match=r"^srv: not ready after 0 s \(ConnectionRefusedError: refused\)$"
    ):
        wait_until(probe, timeout_s=0.02, what="srv", interval_s=0.01, error=Boom)


def test_a_dead_process_ends_the_wait_at_once() -> None:
    calls = itertools.count()

    def probe() -> None:
        next(calls)

    with pytest.raises(RuntimeError, match=r"^gw: exited with 3\nlog$"):
        wait_until(
            probe, timeout_s=60, what="gw", alive=lambda: "exited with 3", log_tail=lambda: "log"
        )
    assert next(calls) == 1  # one probe, no waiting
