"""Warm-up of the disk tier: one object version fetched straight into
``gateway.data.disk.DiskStore``, not into the memory tier (a warm-up of a dataset larger than
memory must not flush the hot set), with its GETs in read-ahead's share of the reader's slots
(demand READs go first).

Owns: ``warm_object``. Must not: evict (a warm-up stops at the budget: ``DiskStore.store``
answers "budget"), cache in memory, or know about jobs, paths or progress
(``gateway.ops.warmup`` does).
"""

from __future__ import annotations

import asyncio

from gateway.backend.base import BackendError, BackendUnavailable, ObjectStore
from gateway.data.disk.fileformat import disk_key
from gateway.data.fetches import block_runs, same_etag
from gateway.data.mappings import is_mapping
from gateway.data.reader import ObjectReader
from gateway.errors import VersionChanged
from gateway.fastwire import copy_mapped

__all__ = ["warm_object"]


class _Ticket:
    """What a GET slot needs to know of its holder: a read-ahead-class request."""

    __slots__ = ("demand", "slot_ra", "waiter")

    def __init__(self) -> None:
        self.demand = False
        self.slot_ra = False
        self.waiter: asyncio.Future[None] | None = None


async def warm_object(
    reader: ObjectReader, store: ObjectStore, key: str, etag: str, size: int
) -> tuple[str, int]:
    """Put version ``etag`` of ``key`` (``size`` bytes) into the disk tier, in the blocks a
    READ would look up. Returns (outcome, bytes fetched): "cached" when every block already
    was there (a resumed warm-up skips it at the cost of a ``stat`` per block) or another
    warm-up of this process was writing it (single-flight: it is awaited), "written", or,
    with what was fetched so far, "budget" (the tier is full: stop the warm-up), "refused"
    or "error" (``DiskStore.store``). Raises what the GET raises (``VersionChanged`` when
    the object is no longer ``etag``)."""
    ident = (store.name, key, etag)
    warming = reader.warming
    running = warming.get(ident)
    if running is not None:
        outcome, _ = await asyncio.shield(running)  # its failure is this call's failure
        return ("cached" if outcome == "written" else outcome), 0
    task = asyncio.ensure_future(_warm(reader, store, key, etag, size))
    warming[ident] = task
    task.add_done_callback(lambda _: warming.pop(ident, None))
    return await asyncio.shield(task)


async def _warm(
    reader: ObjectReader, store: ObjectStore, key: str, etag: str, size: int
) -> tuple[str, int]:
    disk = reader.disk
    if disk is None:
        raise RuntimeError("no disk tier")
    cfg = reader.config
    small = size <= cfg.small_file_max
    bs = cfg.block_size
    spans = [(0, size)] if small else [(o, min(o + bs, size)) for o in range(0, size, bs)]
    keys = [disk_key(store.name, key, etag, lo, hi - lo) for lo, hi in spans]
    present = await asyncio.gather(*(disk.contains(k) for k in keys))
    missing = [i for i, p in enumerate(present) if not p]
    if not missing:
        return "cached", 0
    if not disk.has_room(sum(keys[i].charge for i in missing)):
        disk.stats.refused_budget += 1
        return "budget", 0  # known before any GET
    fetched = 0
    written = False
    for first, n in block_runs(missing, 1 if small else reader.max_run):
        lo, hi = spans[first][0], spans[first + n - 1][1]
        claim = await disk.claim(keys[first])  # another worker's fetch of it: wait, skip
        try:
            if claim.present:
                continue
            data = await _get(reader, store, key, etag, size, lo, None if small else hi)
            fetched += len(data)
            for i in range(first, first + n):
                outcome = await disk.store(keys[i], data[spans[i][0] - lo : spans[i][1] - lo])
                if outcome == "written":
                    written = True
                elif outcome != "present":
                    return outcome, fetched
        finally:
            claim.release()
    return ("written" if written else "cached"), fetched


async def _get(
    reader: ObjectReader,
    store: ObjectStore,
    key: str,
    etag: str,
    size: int,
    start: int,
    end: int | None,
) -> bytes:
    if size == 0:
        return b""
    want = (size if end is None else end) - start
    stats = reader.stats
    ticket = _Ticket()
    await reader.slots.acquire(ticket)
    stats.inflight_fetches += 1
    stats.gets += 1
    try:
        async with asyncio.timeout(reader.config.fetch_timeout_s):
            res = await store.get(key, start, end, if_match=etag)
    except TimeoutError as exc:
        raise BackendUnavailable(f"{key}: GET timed out") from exc
    finally:
        stats.inflight_fetches -= 1
        reader.slots.release(ticket)
    if (res.etag and not same_etag(res.etag, etag)) or res.size != size:
        raise VersionChanged(f"{key}: now {res.etag!r} ({res.size} B)")
    if len(res.data) != want:
        raise BackendError(f"{key}: got {len(res.data)} B for a {want} B range")
    stats.bytes_fetched += want
    body = res.data
    if is_mapping(body):  # a pack member found on the shared disk tier: copy it guarded
        got = copy_mapped(body, 0, len(body))
        if got is None:
            raise BackendError(f"{key}: its disk-tier entry broke while being read")
        return got
    return bytes(body)
