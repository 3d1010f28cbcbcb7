"""Checking a pack (``nfsgw pack --verify`` / ``--verify-only``): every shard read front to
back in ranged GETs, every member's tar header bytes, bounds, overlaps and CRC-32, and the
end-of-archive blocks, against the index (``gateway.pack.format``).

Owns: ``load_index`` (the pack's index, or ``PackFailed``) and ``verify``. Must not: write
anything (it only reads the pack).
"""

from __future__ import annotations

import asyncio
import gzip
import time
from dataclasses import dataclass, field

from gateway.backend.base import (
    BackendError,
    ObjectNotFound,
    ObjectStore,
)
from gateway.backend.checksums import crc32
from gateway.pack.format import (
    END_OF_ARCHIVE,
    INDEX_NAME,
    PackError,
    PackIndex,
    member_header,
    padding,
    parse_index,
)
from gateway.pack.packer import HASH_ON_LOOP_BYTES, MiB, PackFailed, cancel_all
from gateway.progress import Progress

__all__ = ["VerifyReport", "load_index", "verify"]


@dataclass(slots=True)
class VerifyReport:
    shards: int = 0
    files: int = 0
    bytes: int = 0
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors


async def load_index(store: ObjectStore, prefix: str) -> PackIndex:
    """The pack's index (``PackFailed`` when it is missing or does not parse)."""
    key = prefix + INDEX_NAME
    try:
        raw = (await store.get(key)).data
    except ObjectNotFound as e:
        raise PackFailed(f"no pack index at {key}") from e
    try:
        text = await asyncio.to_thread(gzip.decompress, raw)
        return await asyncio.to_thread(parse_index, text)
    except (OSError, EOFError, PackError) as e:
        raise PackFailed(f"{key}: {e}") from e


class _ShardReader:
    """A shard read front to back in ranged GETs of ``step`` bytes, the next one in flight."""

    def __init__(self, store: ObjectStore, key: str, size: int, step: int) -> None:
        self.store = store
        self.key = key
        self.size = size
        self.step = step
        self.pos = 0  # of buf[0]
        self.buf = bytearray()
        self._next = 0
        self._task: asyncio.Task[bytes] | None = None
        self.fetched = 0

    def _start(self) -> None:
        if self._task is None and self._next < self.size:
            end = min(self.size, self._next + self.step)
            self._task = asyncio.create_task(self._fetch(self._next, end))
            self._next = end

    async def _fetch(self, start: int, end: int) -> bytes:
        data = (await self.store.get(self.key, start, end)).data
        if len(data) != end - start:
            raise BackendError(f"{self.key}: {len(data)} bytes at {start}, wanted {end - start}")
        return data

    async def take(self, start: int, n: int) -> bytes:
        """Bytes [start, start + n) (start >= every earlier request's start)."""
        if start + n > self.size:
            raise PackFailed(f"{self.key}: [{start}, {start + n}) is past its end ({self.size})")
        while True:
            if start > self.pos:  # bytes before ``start`` are not wanted again
                drop = min(start - self.pos, len(self.buf))
                del self.buf[:drop]
                self.pos += drop
            if self.pos + len(self.buf) >= start + n:
                break
            self._start()
            assert self._task is not None
            data = await self._task
            self._task = None
            self.fetched += len(data)
            self._start()
            self.buf += data
        i = start - self.pos
        return bytes(self.buf[i : i + n])

    async def close(self) -> None:
        if self._task is not None:
            await cancel_all([self._task])


async def verify(
    store: ObjectStore,
    prefix: str,
    *,
    range_size: int = 16 * MiB,
    progress: Progress | None = None,
) -> VerifyReport:
    """Re-read every shard of the pack under ``prefix`` front to back and check every member:
    its tar header is the one ``member_header`` writes, it lies within its shard after the
    member before it, its bytes have its CRC-32; every shard ends with the end-of-archive
    blocks. ``PackFailed`` if there is no readable index."""
    t0 = time.monotonic()
    index = await load_index(store, prefix)
    rep = VerifyReport()
    by_shard: dict[int, list[int]] = {no: [] for no in index.shards}
    for i in range(len(index)):
        by_shard[index.shard_of[i]].append(i)
    if progress is not None:
        progress.total_files = len(index)
        progress.total_bytes = sum(s.size for s in index.shards.values())
        progress.counting = False
    errors = rep.errors
    for no in sorted(index.shards):
        shard = index.shards[no]
        rows = sorted(by_shard[no], key=lambda i: index.data_at[i])
        reader = _ShardReader(store, prefix + shard.name, shard.size, range_size)
        before = 0
        try:
            end = 0
            for i in rows:
                path, size, at = index.path(i), index.sizes[i], index.data_at[i]
                header = member_header(path, size, index.mtimes[i])
                h0 = at - len(header)
                if h0 < end:
                    errors.append(f"{shard.name}: {path!r} overlaps the member before it")
                    continue
                if at + size + len(padding(size)) > shard.size - len(END_OF_ARCHIVE):
                    errors.append(f"{shard.name}: {path!r} lies past the shard's end")
                    continue
                if await reader.take(h0, len(header)) != header:
                    errors.append(f"{shard.name}: {path!r}: tar header differs at {h0}")
                crc = 0
                pos = at
                while pos < at + size:
                    n = min(range_size, at + size - pos)
                    data = await reader.take(pos, n)
                    if n > HASH_ON_LOOP_BYTES:
                        crc = await asyncio.to_thread(crc32, data, crc)
                    else:
                        crc = crc32(data, crc)
                    pos += n
                if crc != index.crcs[i]:
                    errors.append(
                        f"{shard.name}: {path!r}: CRC-32 {crc:08x}, index says {index.crcs[i]:08x}"
                    )
                end = at + size + len(padding(size))
                rep.files += 1
                rep.bytes += size
                if progress is not None:
                    progress.add(1, reader.fetched - before)
                    before = reader.fetched
            tail = await reader.take(shard.size - len(END_OF_ARCHIVE), len(END_OF_ARCHIVE))
            if tail != END_OF_ARCHIVE:
                errors.append(f"{shard.name}: does not end with the end-of-archive blocks")
        except BackendError as e:
            errors.append(f"{shard.name}: {e}")
        finally:
            await reader.close()
        if progress is not None:
            progress.add(0, reader.fetched - before)
        rep.shards += 1
    if progress is not None:
        progress.tick(force=True)
        progress.close()
    rep.seconds = time.monotonic() - t0
    return rep
