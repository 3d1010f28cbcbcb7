"""The shared tier (gateway.data.shared): keys per object version, verified bodies, bounded
fills and a breaker — on a MemoryStore for the rules, on SeaweedFS for the real S3 path."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib

import pytest

from gateway.backend.base import AccessDeniedError, BackendUnavailable
from gateway.backend.memory import MemoryStore
from gateway.backend.s3 import S3Store
from gateway.data.shared import Breaker, SharedLimits, SharedTier, shared_key
from gateway.data.tiers import NO_CLAIM, Piece
from loadgen.seaweed import SeaweedServer
from tests.harness.buckets import MakeBucket

BODY = bytes(range(256)) * 400  # ~100 kB
PIECE = Piece("s3://origin", "train/n01/img 1.jpg", "etag-1", 0, len(BODY))


def tier(store: MemoryStore | S3Store, **limits: float) -> SharedTier:
    return SharedTier(
        store,
        "cache/",
        origins={"s3://origin": "http://origin:8333/origin"},
        limits=SharedLimits(**limits),  # type: ignore[arg-type]
    )


async def fill(t: SharedTier, piece: Piece = PIECE, data: bytes = BODY) -> bool:
    assert t.admit(piece)
    return await t.put(piece, data)


async def test_a_filled_piece_is_found_and_verified() -> None:
    store = MemoryStore("shared")
    t = tier(store)
    assert await t.lookup(PIECE, mapped=False) is None  # absent: a miss, not an error
    assert await fill(t)
    assert await t.lookup(PIECE, mapped=False) == BODY
    assert (t.stats.hits, t.stats.misses, t.stats.fills, t.stats.errors) == (1, 1, 1, 0)
    assert t.stats.inflight_puts == 0 and t.stats.inflight_bytes == 0
    (key,) = store.keys()
    assert key.startswith("cache/v1/") and key.endswith(f"/0-{len(BODY)}")
    assert await t.claim(PIECE) is NO_CLAIM and t.owns(PIECE)


async def test_keys_follow_origin_object_version_and_range() -> None:
    base = shared_key("p/", "o", PIECE)
    others = {
        shared_key("p/", "o2", PIECE),
        shared_key("p/", "o", Piece(PIECE.store, PIECE.key + "x", PIECE.etag, 0, PIECE.length)),
        shared_key("p/", "o", Piece(PIECE.store, PIECE.key, "etag-2", 0, PIECE.length)),
        shared_key("p/", "o", Piece(PIECE.store, PIECE.key, PIECE.etag, 4096, 100)),
    }
    assert base not in others and len(others) == 4


async def test_a_replaced_object_is_never_served_from_the_tier() -> None:
    t = tier(MemoryStore("shared"))
    assert await fill(t)
    newer = Piece(PIECE.store, PIECE.key, "etag-2", 0, len(BODY))
    assert await t.lookup(newer, mapped=False) is None
    assert t.stats.hits == 0


@pytest.mark.parametrize(
    ("damage", "cause"),
    [
        ("flip", "checksum"),
        ("truncate", "length"),
        ("origin", "metadata"),
        ("etag", "metadata"),
        ("no_crc", "checksum"),
    ],
)
async def test_a_damaged_body_or_wrong_metadata_is_a_miss(damage: str, cause: str) -> None:
    store = MemoryStore("shared")
    t = tier(store)
    assert await fill(t)
    key = t.key(PIECE)
    got = await store.get(key)
    data, meta = bytearray(got.data), dict(got.metadata)
    if damage == "flip":
        data[12345] ^= 0x01
    elif damage == "truncate":
        del data[-1]
    elif damage == "origin":
        meta["nfsgw-origin"] = "http://elsewhere/origin"
    elif damage == "etag":
        meta["nfsgw-etag"] = "etag-0"
    else:
        del meta["nfsgw-crc64nvme"]
    store.seed(key, bytes(data), metadata=meta)
    assert await t.lookup(PIECE, mapped=False) is None
    assert await t.lookup(PIECE, mapped=False) is None
    assert getattr(t.stats, f"bad_{cause}") == 2 and t.stats.hits == 0
    assert not t.breaker.is_open  # a bad entry is not a failing tier


async def test_fills_wait_their_turn_and_are_bounded_by_queue_bytes_and_size() -> None:
    gate = asyncio.Event()
    sending = [0, 0]  # now, most at once

    class Slow(MemoryStore):
        async def put(self, key, data, metadata=None):  # type: ignore[no-untyped-def]
            sending[0] += 1
            sending[1] = max(sending)
            await gate.wait()
            sending[0] -= 1
            return await super().put(key, data, metadata)

    t = tier(Slow("shared"), max_inflight_puts=2, max_inflight_bytes=5 * len(BODY))
    t.limits = dataclasses.replace(t.limits, max_queued_fills=4)
    pieces = [Piece("s3://origin", f"k{i}", "e", 0, len(BODY)) for i in range(6)]
    tasks = []
    for p in pieces[:4]:
        assert t.admit(p)  # past the PUTs at once: queued, not dropped
        tasks.append(t.put(p, BODY))
    assert not t.admit(pieces[4]) and t.stats.skip_queue == 1  # the queue's bound
    await asyncio.sleep(0.05)
    assert t.stats.queued_fills == 4 and t.stats.inflight_puts == 2 and sending[0] == 2
    big = Piece("s3://origin", "big", "e", 0, 65 << 20)
    assert not t.admit(big) and t.stats.skip_too_big == 1
    gate.set()
    assert await asyncio.gather(*tasks) == [True] * 4
    assert sending[1] == 2  # never more than max_inflight_puts sent at once
    assert t.stats.fills == 4 and t.stats.queued_fills == 0 and t.stats.inflight_bytes == 0
    t2 = tier(MemoryStore("s"), max_inflight_bytes=len(BODY) + 10)
    assert t2.admit(pieces[0]) and not t2.admit(pieces[1])
    assert t2.stats.skip_bytes == 1
    t2.put(pieces[0], BODY)
    await t2.drain()


async def test_a_failing_tier_opens_its_breaker_and_comes_back() -> None:
    now = [0.0]
    failing = [True]

    def fail(op: str, key: str) -> BaseException | None:
        return BackendUnavailable("connection refused") if failing[0] else None

    store = MemoryStore("shared", fail=fail)
    t = SharedTier(store, "c/", limits=SharedLimits(breaker_failures=3, breaker_cooldown_s=30))
    t.breaker = Breaker(3, 30.0, clock=lambda: now[0])
    for _ in range(3):
        assert await t.lookup(PIECE, mapped=False) is None
    assert t.breaker.is_open and t.stats.breaker_trips == 1 and t.stats.breaker_open == 1
    sent = store.requests["get"]
    assert await t.lookup(PIECE, mapped=False) is None  # open: not even sent
    assert store.requests["get"] == sent and t.stats.skipped == 1
    assert not t.admit(PIECE) and t.stats.skip_breaker == 1
    now[0] = 31.0  # half open: one request tries
    assert await t.lookup(PIECE, mapped=False) is None
    assert t.breaker.is_open and t.stats.breaker_trips == 1  # still failing: open again
    now[0] = 62.0
    failing[0] = False
    assert await t.lookup(PIECE, mapped=False) is None  # a plain miss now: closed
    assert not t.breaker.is_open and t.stats.breaker_open == 0
    assert await fill(t) and await t.lookup(PIECE, mapped=False) == BODY


async def test_refused_credentials_and_refused_puts_open_the_breaker_at_once() -> None:
    store = MemoryStore(
        "shared",
        fail=lambda op, key: AccessDeniedError("AccessDenied") if op == "put" else None,
    )
    t = tier(store)
    assert await fill(t) is False
    assert t.breaker.is_open and t.stats.fill_errors == 1 and t.stats.breaker_trips == 1
    assert t.stats.inflight_puts == 0 and t.stats.inflight_bytes == 0


async def test_a_full_tier_is_a_failed_fill_never_an_error() -> None:
    store = MemoryStore(
        "shared",
        fail=lambda op, key: BackendUnavailable("507 InsufficientStorage") if op == "put" else None,
    )
    t = tier(store, breaker_failures=2)
    assert await fill(t) is False
    assert await fill(t) is False
    assert t.breaker.is_open and t.stats.fill_errors == 2
    assert await t.lookup(PIECE, mapped=False) is None  # skipped while open


@pytest.fixture
def shared_bucket(make_bucket: MakeBucket) -> str:
    return make_bucket("shared")


async def test_on_seaweedfs_a_fill_is_read_back_by_another_gateway(
    seaweed: SeaweedServer, shared_bucket: str
) -> None:
    """Two tiers (two gateways' views) of one bucket: what one fills the other reads; the
    store keeps the metadata and checks the CRC32 of the PUT."""
    a = tier(S3Store(shared_bucket, **seaweed.store_kwargs()))
    b = tier(S3Store(shared_bucket, **seaweed.store_kwargs()))
    try:
        assert await b.lookup(PIECE, mapped=False) is None
        assert await fill(a)
        got = await b.lookup(PIECE, mapped=False)
        assert got is not None and hashlib.sha256(got).digest() == hashlib.sha256(BODY).digest()
        assert b.stats.hits == 1 and b.stats.errors == 0
        # a replaced origin object: another key, never the old body
        assert await b.lookup(Piece(PIECE.store, PIECE.key, "etag-2", 0, len(BODY)), False) is None
        # a flipped byte written behind the tier's back: refused by the checksum
        raw = S3Store(shared_bucket, **seaweed.store_kwargs())
        try:
            key = a.key(PIECE)
            old = await raw.get(key)
            bad = bytearray(old.data)
            bad[7] ^= 0x80
            await raw.put(key, bytes(bad), dict(old.metadata))
        finally:
            await raw.close()
        assert await b.lookup(PIECE, mapped=False) is None
        assert b.stats.bad_checksum == 1
    finally:
        await a.close()
        await b.close()


def test_a_half_open_probe_that_never_reports_does_not_keep_the_breaker_open() -> None:
    now = [0.0]
    b = Breaker(1, 30.0, clock=lambda: now[0])
    assert b.failure() and not b.allow()
    now[0] = 31.0
    assert b.allow() and not b.allow()  # one probe at a time
    now[0] = 62.0  # that probe was cancelled: never a success or a failure
    assert b.allow()
    b.success()
    assert not b.is_open and b.allow()
