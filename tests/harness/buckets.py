"""Fresh S3 buckets on the test suite's SeaweedFS, each deleted when its owner closes.

Owns: unique bucket names (``<tag>-<12 hex digits>``), filling a bucket with objects
(``S3Store`` PUTs, 32 at once) and deleting every bucket it made. The ``make_bucket`` fixture
(tests/conftest.py) is one per test; a module-scoped fixture uses the class itself:

    @pytest.fixture(scope="module")
    def bucket(seaweed: SeaweedServer) -> Iterator[str]:
        with Buckets(seaweed) as buckets:
            yield buckets.make("rp", {"ds/a.jpg": b"..."})

Must not: run inside an event loop (filling uses ``asyncio.run``; make the bucket in a
fixture, not in an async test's body).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping
from types import TracebackType
from typing import Protocol

from loadgen.seaweed import SeaweedServer

__all__ = ["Buckets", "MakeBucket"]


class MakeBucket(Protocol):
    """The ``make_bucket`` fixture's type (``Buckets.make``)."""

    def __call__(self, tag: str = "t", objects: Mapping[str, bytes] | None = None) -> str: ...


class Buckets:
    def __init__(self, seaweed: SeaweedServer) -> None:
        self.seaweed = seaweed
        self.names: list[str] = []

    def make(self, tag: str = "t", objects: Mapping[str, bytes] | None = None) -> str:
        """A new bucket named ``<tag>-<hex>`` holding ``objects`` (full keys)."""
        name = f"{tag}-{uuid.uuid4().hex[:12]}"
        self.seaweed.create_bucket(name)
        self.names.append(name)
        if objects:
            asyncio.run(self._fill(name, objects))
        return name

    async def _fill(self, name: str, objects: Mapping[str, bytes]) -> None:
        from gateway.backend.s3 import S3Store
        from tests.datasets import put_objects

        store = S3Store(name, **self.seaweed.store_kwargs())
        try:
            await put_objects(store, objects, concurrency=32)
        finally:
            await store.close()

    def close(self) -> None:
        """Delete every bucket made (and its objects)."""
        while self.names:
            self.seaweed.delete_bucket(self.names.pop())

    def __enter__(self) -> Buckets:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
