"""Writing a pack's shards: each one multipart upload, parts of a fixed size, a bounded number
in flight (``ShardWriter``), and what a finished shard is (``Finished``, ``shard_end``).

Must not: decide what goes into a shard or when it closes (``gateway.pack.packer``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gateway.backend.base import BackendError, ObjectInfo, ObjectStore
from gateway.pack.format import END_OF_ARCHIVE, Member, Shard, padding

__all__ = ["Finished", "ShardWriter", "cancel_all", "shard_end"]


async def cancel_all(tasks: Iterable[asyncio.Task[Any]]) -> None:
    """Cancel ``tasks`` and wait for them to end (their errors dropped; a cancellation of
    the caller is not)."""
    ts = list(tasks)
    for t in ts:
        t.cancel()
    await asyncio.gather(*ts, return_exceptions=True)


@dataclass(slots=True)
class Finished:
    """A finished shard: its table row, member count and last path."""

    shard: Shard
    count: int
    last: str


class ShardWriter:
    """One shard as one multipart upload: bytes in, ``part_size`` parts out, at most
    ``uploads`` in flight."""

    def __init__(self, store: ObjectStore, key: str, part_size: int, uploads: int) -> None:
        self.store = store
        self.key = key
        self.part_size = part_size
        self.uploads = uploads
        self.size = 0  # bytes written so far (the next member's header offset)
        self._buf = bytearray()
        self._upload_id: str | None = None
        self._inflight: deque[asyncio.Task[tuple[int, str]]] = deque()
        self._parts: list[tuple[int, str]] = []
        self._next_part = 1

    async def write(self, data: bytes) -> None:
        self._buf += data
        self.size += len(data)
        while len(self._buf) >= self.part_size:
            part = bytes(self._buf[: self.part_size])
            del self._buf[: self.part_size]
            await self._send(part)

    async def _send(self, part: bytes) -> None:
        if self._upload_id is None:
            self._upload_id = await self.store.create_multipart(self.key)
        while len(self._inflight) >= self.uploads:
            self._parts.append(await self._inflight.popleft())
        no = self._next_part
        self._next_part += 1
        self._inflight.append(asyncio.create_task(self._upload(no, part)))

    async def _upload(self, no: int, data: bytes) -> tuple[int, str]:
        assert self._upload_id is not None
        return no, await self.store.upload_part(self.key, self._upload_id, no, data)

    async def finish(self) -> ObjectInfo:
        if self._buf or self._next_part == 1:
            part = bytes(self._buf)
            self._buf.clear()
            await self._send(part)
        while self._inflight:
            self._parts.append(await self._inflight.popleft())
        assert self._upload_id is not None
        info = await self.store.complete_multipart(self.key, self._upload_id, self._parts)
        self._upload_id = None
        return info

    async def abort(self) -> None:
        """Cancel the parts in flight and abort the upload (best effort; never raises but
        cancellation)."""
        inflight, self._inflight = self._inflight, deque()
        await cancel_all(inflight)
        upload_id, self._upload_id = self._upload_id, None
        if upload_id is not None:
            with contextlib.suppress(BackendError):
                await self.store.abort_multipart(self.key, upload_id)


def shard_end(last: Member) -> int:
    """The size of a shard whose last member is ``last``."""
    return last.offset + last.size + len(padding(last.size)) + len(END_OF_ARCHIVE)
