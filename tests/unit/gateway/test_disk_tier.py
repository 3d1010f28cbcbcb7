"""The disk tier as a ``Tier`` (``gateway.data.disk.tier.DiskTier``) over a real ``DiskStore``
in a temporary directory: a look-up misses, then finds what was admitted and put (and only that
version and range); its names are the reader's (an entry published through ``DiskStore`` under
``disk_key`` is found by piece, and the other way round); a tier over a full store admits
nothing; and its claims, with two stores sharing one directory (``shared=True``: two worker
processes), are the store's: held by one while the other waits, then ``present`` once the
piece is put, or held by the waiter once released without it, or given up after
``claim_wait_s``; an unshared tier claims nothing.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

from gateway.data.config import DiskConfig
from gateway.data.disk.fileformat import disk_key
from gateway.data.disk.store import DiskStore
from gateway.data.disk.tier import DiskTier
from gateway.data.mappings import is_mapping
from gateway.data.tiers import Piece, Tier

MiB = 1 << 20
BODY = random.Random(35).randbytes(20_000)
PIECE = Piece("origin", "train/c0/1.jpg", '"e1"', 0, len(BODY))


async def open_store(d: Path, shared: bool = False, **kw: Any) -> DiskStore:
    cfg = DiskConfig(budget=kw.pop("budget", 64 * MiB), min_free=0, **kw)
    disk = await DiskStore.open(d, cfg, shared=shared)
    assert disk is not None
    return disk


async def put(t: DiskTier, piece: Piece = PIECE, data: bytes = BODY) -> bool:
    assert t.admit(piece)
    task = t.put(piece, data)
    await t.disk.drain()
    return task.result()


async def test_a_disk_tier_is_a_tier_of_one_host(tmp_path: Path) -> None:
    disk = await open_store(tmp_path)
    t: Tier = DiskTier(disk)  # mypy: DiskTier implements the Protocol
    assert t.name == "disk"
    assert t.owns(PIECE) and t.owns(Piece("other", "k", '"x"', 0, 1))
    await disk.close()


async def test_lookup_misses_then_finds_what_was_admitted_and_put(tmp_path: Path) -> None:
    disk = await open_store(tmp_path)
    t = DiskTier(disk)
    assert await t.lookup(PIECE, mapped=False) is None
    assert disk.stats.misses == 1 and disk.stats.hits == 0
    assert await put(t)
    assert disk.stats.writes == 1
    got = await t.lookup(PIECE, mapped=False)
    assert isinstance(got, bytes) and got == BODY
    got = await t.lookup(PIECE, mapped=True)
    assert got is not None and is_mapping(got) and bytes(got) == BODY
    assert disk.stats.hits == 2
    # Another version, another range, another store: other names, not served.
    for other in (
        Piece(PIECE.store, PIECE.key, '"e2"', 0, len(BODY)),
        Piece(PIECE.store, PIECE.key, PIECE.etag, 1, len(BODY) - 1),
        Piece("elsewhere", PIECE.key, PIECE.etag, 0, len(BODY)),
    ):
        assert await t.lookup(other, mapped=False) is None
    assert disk.stats.misses == 4
    await disk.close()


async def test_a_piece_is_named_as_the_reader_names_its_bytes(tmp_path: Path) -> None:
    disk = await open_store(tmp_path)
    t = DiskTier(disk)
    k = disk_key(PIECE.store, PIECE.key, PIECE.etag, PIECE.start, PIECE.length)
    assert t.key(PIECE) == k
    assert disk.admit(k)
    disk.publish(k, BODY)
    await disk.drain()
    assert await t.lookup(PIECE, mapped=False) == BODY  # written by key, found by piece
    second = Piece(PIECE.store, PIECE.key, PIECE.etag, 0, 4096)
    assert await put(t, second, BODY[:4096])
    assert (
        await disk.read(disk_key(PIECE.store, PIECE.key, PIECE.etag, 0, 4096), False)
        == (BODY[:4096])
    )
    await disk.close()


async def test_a_full_tier_admits_nothing_it_cannot_make_room_for(tmp_path: Path) -> None:
    disk = await open_store(tmp_path, budget=64 * 1024)
    t = DiskTier(disk)
    big = Piece(PIECE.store, "big", '"b"', 0, 128 * 1024)
    assert not t.admit(big)
    assert disk.stats.rejected == 1 and disk.used_bytes == 0
    await disk.close()
    assert not t.admit(PIECE)  # closed: refused, nothing reserved
    assert disk.used_bytes == 0


async def test_a_shared_tier_hands_the_written_body_as_a_mapping(tmp_path: Path) -> None:
    disk = await open_store(tmp_path, shared=True)
    t = DiskTier(disk)
    views: list[memoryview] = []
    assert t.admit(PIECE)
    task = t.put(PIECE, BODY, views.append)
    await disk.drain()
    assert task.result()
    assert len(views) == 1 and is_mapping(views[0]) and bytes(views[0]) == BODY
    await disk.close()


async def test_an_unshared_tier_claims_nothing(tmp_path: Path) -> None:
    disk = await open_store(tmp_path)
    c = await DiskTier(disk).claim(PIECE)
    assert not c.present
    c.release()
    assert disk.stats.claim_waits == 0
    await disk.close()


async def test_a_claim_holds_the_other_worker_until_the_piece_is_put(tmp_path: Path) -> None:
    a = DiskTier(await open_store(tmp_path, shared=True))
    b = DiskTier(await open_store(tmp_path, shared=True))
    held = await a.claim(PIECE)
    assert not held.present  # a fetches
    waiting = asyncio.create_task(b.claim(PIECE))
    await asyncio.sleep(0.05)
    assert not waiting.done() and b.disk.stats.claim_waits == 1  # b waits for a's fetch
    assert await put(a)
    held.release()
    found = await asyncio.wait_for(waiting, 5)
    assert found.present  # b reads a's entry instead of fetching
    found.release()
    assert await b.lookup(PIECE, mapped=True) == BODY
    assert b.disk.stats.claim_timeouts == 0 and b.disk.stats.hits == 1
    again = await b.claim(PIECE)  # present already: no wait
    assert again.present and b.disk.stats.claim_waits == 1
    await a.disk.close()
    await b.disk.close()


async def test_a_claim_released_without_the_piece_passes_to_the_waiter(tmp_path: Path) -> None:
    a = DiskTier(await open_store(tmp_path, shared=True, claim_wait_s=0.3))
    b = DiskTier(await open_store(tmp_path, shared=True))
    held = await a.claim(PIECE)
    waiting = asyncio.create_task(b.claim(PIECE))
    await asyncio.sleep(0.05)
    held.release()  # a's fetch failed: nothing put
    taken = await asyncio.wait_for(waiting, 5)
    assert not taken.present  # b fetches now, holding the claim
    lost = await a.claim(PIECE)  # a waits for b, for at most claim_wait_s, then fetches
    assert not lost.present
    assert a.disk.stats.claim_waits == 1 and a.disk.stats.claim_timeouts == 1
    lost.release()
    taken.release()
    free = await a.claim(PIECE)  # released by both: taken at once
    assert not free.present and a.disk.stats.claim_waits == 1
    free.release()
    await a.disk.close()
    await b.disk.close()
