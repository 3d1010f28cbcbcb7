"""Injected clocks, so TTL logic is testable without sleeping (STYLE §5)."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float: ...

    def time_ns(self) -> int: ...


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def time_ns(self) -> int:
        return time.time_ns()


class FakeClock:
    """A clock tests advance by hand."""

    def __init__(self, start: float = 1000.0, wall_ns: int = 1_700_000_000 * 10**9) -> None:
        self.now = start
        self.wall_ns = wall_ns

    def monotonic(self) -> float:
        return self.now

    def time_ns(self) -> int:
        return self.wall_ns + int(self.now * 1e9)

    def advance(self, seconds: float) -> None:
        self.now += seconds
