"""S3Store's lean GET/HEAD wire (``lean_http=True``, gateway/backend/http1.py) against its
aiohttp wire (``lean_http=False``) on the test SeaweedFS: the same results and the same
errors for whole objects, ranges, If-Match hits and misses, missing keys, 0-byte objects,
odd keys and several MiB; and the lean wire through ``tests.faultproxy`` (resets, truncated
bodies, stalls, 5xx): retried to the right bytes, or the same error as aiohttp."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import pytest

from gateway.backend.base import BackendError, GetResult, ObjectInfo
from gateway.backend.config import RetryPolicy
from gateway.backend.s3 import S3Store
from loadgen.seaweed import SeaweedServer
from tests.faultproxy import FaultProxy, Rule

pytestmark = [pytest.mark.s3]

MiB = 1 << 20
KEYS = {
    "plain.txt": b"hello world",
    "empty": b"",
    "with space.txt": b"spaces",
    "ünïcödé/ファイル.jpg": os.urandom(3000),
    "a//double/slash": b"double",
    "dir/": b"",
    "dir/file": b"in dir",
    "plus+sign%20": b"plus",
    "big.bin": os.urandom(5 * MiB + 123),
    "mid.bin": os.urandom(110 * 1024),
}


@pytest.fixture
async def pair(seaweed: SeaweedServer, s3_bucket: str) -> AsyncIterator[tuple[S3Store, S3Store]]:
    lean = S3Store(s3_bucket, lean_http=True, **seaweed.store_kwargs())
    slow = S3Store(s3_bucket, lean_http=False, **seaweed.store_kwargs())
    try:
        await asyncio.gather(*(slow.put(k, v, {"mode": "644"}) for k, v in KEYS.items()))
        yield lean, slow
    finally:
        await lean.close()
        await slow.close()


async def outcome(call: Awaitable[Any]) -> tuple[str, Any]:
    """("ok", comparable result) or (error class name, its message minus the request id)."""
    try:
        r = await call
    except BackendError as e:
        return type(e).__name__, str(e).split(" (")[0].rsplit(": ", 1)[0]
    if isinstance(r, GetResult):
        assert type(r.data) is bytes
        return "ok", (r.data, r.etag, r.size, r.mtime_ns, dict(r.metadata))
    assert isinstance(r, ObjectInfo)
    return "ok", (r.key, r.size, r.etag, r.mtime_ns, dict(r.metadata))


async def test_lean_and_aiohttp_agree(pair: tuple[S3Store, S3Store]) -> None:
    lean, slow = pair
    etag = (await slow.head("plain.txt")).etag
    # (method, args, kwargs) per request, run on both stores
    calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
    for key in [*KEYS, "missing", "dir/missing/", "ünïcödé/none"]:
        calls += [
            ("head", (key,), {}),
            ("get", (key,), {}),
            ("get", (key, 1, 5), {}),
            ("get", (key, 3), {}),
            ("get", (key, 0, 10**9), {}),
        ]
    calls += [
        ("get", ("plain.txt",), {"if_match": etag}),
        ("get", ("plain.txt",), {"if_match": "0" * 32}),
        ("get", ("plain.txt", 2, 4), {"if_match": "0" * 32}),
        ("get", ("plain.txt", 100), {}),  # past the end: 416
        ("get", ("plain.txt", 5, 5), {}),  # empty range: answered by a HEAD
        ("get", ("big.bin", MiB, 3 * MiB), {}),
        ("get", ("empty", 0, 1), {}),
    ]
    seen = set()
    for name, args, kwargs in calls:
        a = await outcome(getattr(lean, name)(*args, **kwargs))
        b = await outcome(getattr(slow, name)(*args, **kwargs))
        assert a == b, (name, args, kwargs)
        seen.add(a[0])
    assert seen >= {"ok", "ObjectNotFound", "PreconditionFailed"}
    pool = lean._pool
    assert pool is not None and pool.connects == 1  # every request on one keep-alive connection


async def test_missing_bucket_is_the_same_error(seaweed: SeaweedServer) -> None:
    got = []
    for lean_http in (True, False):
        store = S3Store("no-such-bucket-xyz", lean_http=lean_http, **seaweed.store_kwargs())
        try:
            got.append(await outcome(store.get("k")))
            got.append(await outcome(store.head("k")))
        finally:
            await store.close()
    assert got[:2] == got[2:]
    assert got[0][0] == "BackendError"  # NoSuchBucket: not a missing file


async def test_environment_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NFSGW_S3_LEAN_HTTP", "0")
    assert S3Store("b", endpoint_url="http://127.0.0.1:1", region="r")._lean_http is False
    monkeypatch.delenv("NFSGW_S3_LEAN_HTTP")
    assert S3Store("b", endpoint_url="http://127.0.0.1:1", region="r")._lean_http is True


# ------------------------------------------------------------------------ fault proxy


@pytest.fixture
async def faulty(
    seaweed: SeaweedServer, s3_bucket: str
) -> AsyncIterator[tuple[S3Store, FaultProxy]]:
    seed = S3Store(s3_bucket, **seaweed.store_kwargs())
    await seed.put("obj", KEYS["mid.bin"])
    await seed.close()
    async with FaultProxy(seaweed.endpoint_url, seed=3) as proxy:
        kw: dict[str, Any] = {**seaweed.store_kwargs(), "endpoint_url": proxy.endpoint_url}
        policy = RetryPolicy(
            max_attempts=3, deadline_s=3.0, request_timeout_s=0.5, base_delay_s=0.01
        )
        store = S3Store(s3_bucket, lean_http=True, retry=policy, **kw)
        try:
            yield store, proxy
        finally:
            await store.close()


@pytest.mark.parametrize(
    "fault", ["reset", "reset-body", "truncate", "long-cl", "stall", "stall-body", "500", "503"]
)
async def test_transient_faults_are_retried(faulty: tuple[S3Store, FaultProxy], fault: str) -> None:
    store, proxy = faulty
    proxy.add(Rule(fault, kinds={"GET", "HEAD"}, times=1, stall_s=2.0))
    got = await store.get("obj")
    assert got.data == KEYS["mid.bin"]
    assert (await store.head("obj")).size == len(KEYS["mid.bin"])
    assert proxy.faults() == 1
    pool = store._pool
    assert pool is not None and pool.open_connections <= 1  # the broken one was discarded


async def test_persistent_reset_gives_up(faulty: tuple[S3Store, FaultProxy]) -> None:
    store, proxy = faulty
    proxy.add(Rule("reset-body", kinds={"GET"}))
    with pytest.raises(BackendError, match="giving up after 3"):
        await store.get("obj")
    proxy.clear()
    assert (await store.get("obj")).data == KEYS["mid.bin"]


async def test_stall_respects_the_deadline(faulty: tuple[S3Store, FaultProxy]) -> None:
    store, proxy = faulty
    proxy.add(Rule("stall-body", kinds={"GET"}, stall_s=5.0))
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    with pytest.raises(BackendError):
        await store.get("obj")
    assert loop.time() - t0 < 3.0
    pool = store._pool
    assert pool is not None and pool.open_connections == 0
