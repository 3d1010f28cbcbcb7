"""S3Store's lean GET/HEAD/LIST wire (``lean_http=True``, gateway/backend/http1.py) against its
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

from gateway.backend.base import BackendError, GetResult, ListPage, ObjectInfo, Unchanged
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


# ------------------------------------------------------------------------------- LIST


async def test_lean_and_aiohttp_list_the_same(pair: tuple[S3Store, S3Store]) -> None:
    """LIST over the lean wire: the same pages (and digests: the same bytes) as over aiohttp,
    for odd keys, small pages with tokens, markers and a missing prefix."""
    lean, slow = pair
    for prefix, max_keys in (("", 1000), ("", 2), ("dir/", 1000), ("ünïcödé/", 1), ("no/", 5)):
        pages = []
        for store in (lean, slow):
            got, token = [], None
            while True:
                page = await store.list_page(prefix, token=token, max_keys=max_keys)
                got.append(page)
                if (token := page.next_token) is None:
                    break
            pages.append(got)
        assert pages[0] == pages[1], prefix
        assert all(p.digest for p in pages[0])
    pool = lean._pool
    assert pool is not None and pool.connects == 1


async def test_list_page_if_changed(pair: tuple[S3Store, S3Store]) -> None:
    lean, _ = pair
    first = await lean.list_page("dir/")
    same = await lean.list_page_if_changed("dir/", known=first.digest)
    assert isinstance(same, Unchanged) and same.digest == first.digest
    assert same.parse() == first  # held, it parses to what it was
    await lean.put("dir/file2", b"new")
    changed = await lean.list_page_if_changed("dir/", known=first.digest)
    assert isinstance(changed, ListPage) and changed.digest != first.digest
    assert [o.key for o in changed.objects] == ["dir/", "dir/file", "dir/file2"]


@pytest.mark.parametrize("fault", ["reset", "reset-body", "truncate", "long-cl", "500", "503"])
async def test_list_faults_are_retried(faulty: tuple[S3Store, FaultProxy], fault: str) -> None:
    store, proxy = faulty
    want = await store.list_page("")
    proxy.add(Rule(fault, kinds={"LIST"}, times=1))
    assert await store.list_page("") == want
    assert proxy.faults() == 1
    assert store._pool is not None  # still on the lean wire


async def test_relist_of_an_unchanged_directory_on_seaweedfs(
    seaweed: SeaweedServer, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the namespace: a re-list of an unchanged 2,100-file directory (three pages)
    sends its LISTs and parses none of them; one ETag changed on the last page is seen."""
    from gateway.backend import s3wire
    from gateway.clock import FakeClock
    from gateway.namespace import Namespace, NamespaceConfig

    store = S3Store(s3_bucket, **seaweed.store_kwargs())
    sem = asyncio.Semaphore(32)

    async def put(j: int, data: bytes) -> None:
        async with sem:
            await store.put(f"ds/d/f{j:05d}.jpg", data)

    await asyncio.gather(*(put(j, b"%d" % j) for j in range(2100)))
    parses = [0]
    original = s3wire.parse_list

    def counting(body: bytes | bytearray) -> ListPage:
        parses[0] += 1
        return original(body)

    monkeypatch.setattr(s3wire, "parse_list", counting)
    clock = FakeClock()
    ns = Namespace(store, "ds/", clock=clock, config=NamespaceConfig(age_ttl_factor=0.0))
    try:
        first = await ns.lookup("d", "f02099.jpg")
        await ns.quiesce()
        assert parses[0] == 3
        cols = ns._dirs["d"].cols
        clock.advance(100_000.0)
        await ns.lookup("d", "f00000.jpg")
        await ns.quiesce()
        assert parses[0] == 3 and ns.stats.list_pages == 6 and ns._dirs["d"].cols is cols
        await put(2099, b"changed")
        clock.advance(100_000.0)
        await ns.lookup("d", "f00000.jpg")
        await ns.quiesce()
        assert parses[0] == 6
        e = await ns.lookup("d", "f02099.jpg")
        assert e.size == len(b"changed") and e.etag != first.etag
    finally:
        await ns.close()
        await store.close()
