"""The last step of ``nfsgw pack``: ``index.tsv.gz`` from the finished shards' part files and
``unpacked.tsv.gz``, the keys under SRC the pack does not hold (docs/packs.md, "Format").

Memory: one part file at a time and the compressed index (a few tens of MB for ImageNet's
1.28M files). Must not: hold every member at once, or write anything but those two objects.
"""

from __future__ import annotations

import asyncio
import gzip
import io
from collections.abc import AsyncGenerator, Iterable, Iterator, Sequence
from typing import cast

from gateway.backend.base import ObjectStore
from gateway.namespace.paths import key_order
from gateway.pack.format import (
    INDEX_NAME,
    UNPACKED_NAME,
    Member,
    PackError,
    Unpacked,
    format_index,
    format_unpacked,
    parse_part,
    part_name,
)
from gateway.pack.shards import Finished

__all__ = ["write_index", "write_unpacked"]


async def write_index(
    dst: ObjectStore, dst_prefix: str, source_url: str, done: Sequence[Finished]
) -> str:
    """``index.tsv.gz`` from the finished shards' part files, read back one at a time
    (gzip in a thread; the thread asks the loop for each part file); returns its key."""
    loop = asyncio.get_running_loop()
    dp = dst_prefix
    done = list(done)

    def members() -> Iterator[Member]:
        for d in done:
            fut = asyncio.run_coroutine_threadsafe(dst.get(dp + part_name(d.shard.no)), loop)
            data = fut.result().data
            part = parse_part(io.StringIO(data.decode("utf-8", "surrogateescape")))
            if len(part) != d.count:
                raise PackError(f"{part_name(d.shard.no)} changed while the index was written")
            yield from part

    def build() -> bytes:
        out = io.BytesIO()
        n = sum(d.count for d in done)
        streamed = cast(list[Member], _Sized(n, members()))  # sized, read as it goes
        lines = format_index(source_url, [d.shard for d in done], streamed)
        with gzip.GzipFile(fileobj=out, mode="wb", compresslevel=6, mtime=0) as gz:
            buf: list[str] = []
            for line in lines:
                buf.append(line)
                if len(buf) >= 4096:
                    gz.write("".join(buf).encode("utf-8", "surrogateescape"))
                    buf.clear()
            gz.write("".join(buf).encode("utf-8", "surrogateescape"))
        return out.getvalue()

    body = await asyncio.to_thread(build)
    key = dp + INDEX_NAME
    await dst.put(key, body)
    return key


async def _unpacked_keys(
    src: ObjectStore, src_prefix: str, dst: ObjectStore, dst_prefix: str, done: list[Finished]
) -> list[Unpacked]:
    """Every key under SRC now that the pack does not hold, in key order: a listing walked
    against the members (read back from the part files one at a time)."""
    sp, dp = src_prefix, dst_prefix

    async def packed() -> AsyncGenerator[bytes, None]:
        for d in done:
            data = (await dst.get(dp + part_name(d.shard.no))).data
            for m in parse_part(io.StringIO(bytes(data).decode("utf-8", "surrogateescape"))):
                yield key_order(m.path)

    out: list[Unpacked] = []
    members = packed()
    cur: bytes | None = await anext(members, None)
    token: str | None = None
    while True:
        page = await src.list_page(sp, delimiter=None, token=token)
        for o in page.objects:
            rel = o.key[len(sp) :]
            k = key_order(rel)
            while cur is not None and cur < k:
                cur = await anext(members, None)
            if cur == k:
                continue  # packed
            out.append(Unpacked(rel, o.size, o.mtime_ns, o.etag))
        token = page.next_token
        if not token:
            return out


async def write_unpacked(
    src: ObjectStore, src_prefix: str, dst: ObjectStore, dst_prefix: str, done: Sequence[Finished]
) -> int:
    """``unpacked.tsv.gz`` (docs/packs.md): what listings from the index must add; returns
    how many keys it names."""
    items = await _unpacked_keys(src, src_prefix, dst, dst_prefix, list(done))

    def build() -> bytes:
        text = "".join(format_unpacked(items)).encode("utf-8", "surrogateescape")
        return gzip.compress(text, 6, mtime=0)

    await dst.put(dst_prefix + UNPACKED_NAME, await asyncio.to_thread(build))
    return len(items)


class _Sized(Iterable[Member]):
    """An iterable that knows its length up front: ``format_index`` writes the count in the
    header before the members, which stream from the part files."""

    def __init__(self, n: int, it: Iterator[Member]) -> None:
        self.n = n
        self.it = it

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[Member]:
        return self.it
