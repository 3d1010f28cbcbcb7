"""The one start-and-wait loop of the harnesses (``loadgen.gwprocess``, ``loadgen.seaweed``, the
benchmarks' servers): poll until something is ready, bounded in time, and when it is not, say
why: the last failure, whether the process died, and its log's tail.

Owns: the polling, its deadline and the error's message. Must not: start or stop anything
(the caller kills what did not start).

    wait_until(lambda: port_open(port), timeout_s=30, what="nfsgw",
               alive=lambda: None if proc.poll() is None else f"exited with {proc.returncode}",
               log_tail=gw.log_tail)

``probe`` returns the value to wait for (anything but None or False); it may raise
``NotReady("why")`` or an ``OSError`` (a refused connection), both of which mean "not yet" and
are remembered as the last failure. Errors: ``error`` (``RuntimeError`` unless given),
``"<what>: <why it died>"`` or ``"<what>: not ready after <n> s (<last failure>)"``, each
followed by the log's tail when there is one.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ["NotReady", "wait_until"]

T = TypeVar("T")


class NotReady(Exception):
    """Raised by a probe: not ready yet, and why (kept for the error if time runs out)."""


def wait_until(
    probe: Callable[[], T | None],
    *,
    timeout_s: float,
    what: str,
    interval_s: float = 0.05,
    alive: Callable[[], str | None] | None = None,
    log_tail: Callable[[], str] | None = None,
    error: type[Exception] = RuntimeError,
) -> T:
    """``probe()``'s first ready value; ``error`` when ``alive`` says why the process died or
    ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while True:
        try:
            got = probe()
            if got is not None and got is not False:
                return got
        except NotReady as e:
            last = str(e)
        except OSError as e:
            last = f"{type(e).__name__}: {e}"
        why = alive() if alive is not None else None
        if why is None and time.monotonic() > deadline:
            why = f"not ready after {timeout_s:.0f} s ({last})"
        if why is not None:
            tail = log_tail() if log_tail is not None else ""
            raise error(f"{what}: {why}" + (f"\n{tail}" if tail else ""))
        time.sleep(interval_s)
