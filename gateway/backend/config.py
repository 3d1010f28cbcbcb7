"""The S3 backend's retry and timeout settings."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Retries and timeouts for one backend call. ``deadline_s`` bounds the whole call,
    including backoff sleeps; each attempt is bounded by ``request_timeout_s`` (connect
    included) and ``connect_timeout_s`` for the TCP/TLS connect alone."""

    max_attempts: int = 5
    deadline_s: float = 30.0
    request_timeout_s: float = 20.0
    connect_timeout_s: float = 3.0
    base_delay_s: float = 0.05
    max_delay_s: float = 2.0

    def backoff(self, attempt: int) -> float:
        """Full jitter: uniform in [0, min(cap, base * 2**(attempt-1)))."""
        return random.uniform(0.0, min(self.max_delay_s, self.base_delay_s * (1 << (attempt - 1))))
