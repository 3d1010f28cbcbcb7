"""The SeaweedFS launcher for tests: it lives in ``loadgen.seaweed`` (``make demo`` uses it
too, and the installed package must not import from ``tests``); re-exported here so tests and
benchmarks keep importing ``tests.seaweed``."""

from __future__ import annotations

from loadgen.seaweed import S3Endpoint, SeaweedError, SeaweedServer, find_weed

__all__ = ["S3Endpoint", "SeaweedError", "SeaweedServer", "find_weed"]
