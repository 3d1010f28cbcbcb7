"""Loading a pack for serving: its index, the keys it does not hold, and the check that its
shards are all there with their sizes (``gateway.pack.store``'s module docstring, "Bad
input"). Parsing runs in a thread; every object read is refused over ``max_bytes`` before a
byte of it is read, and decompression stops there too (a gzip bomb).

Must not: decide what happens when the pack cannot be used (``PackedStore.load`` does).
"""

from __future__ import annotations

import asyncio
import gzip
import io

import structlog

from gateway.backend import parse_store_url
from gateway.backend.base import BackendError, ObjectStore
from gateway.pack.format import (
    INDEX_NAME,
    UNPACKED_NAME,
    PackError,
    PackIndex,
    Unpacked,
    parse_index,
    parse_unpacked,
)

__all__ = ["UnpackedKeys", "load_pack", "parse_gzipped_index"]

log = structlog.get_logger("nfsgw.pack")

UnpackedKeys = list[tuple[bytes, Unpacked]]
"""The keys a pack does not hold, as (UTF-8 path, entry), sorted."""


async def load_pack(
    packs: ObjectStore,
    pack_prefix: str,
    source_url: str,
    *,
    max_bytes: int,
    listings: bool,
    url: str,
) -> tuple[PackIndex, UnpackedKeys | None]:
    """The index under ``pack_prefix`` of ``packs`` and the keys the pack does not hold
    (None when it has no such list: listings then come from the bucket even on an immutable
    export, logged when ``listings`` were wanted). ``PackError`` (or the store's errors)
    when the index is missing, damaged, made from another source than ``source_url``, or
    its shards are not all there with their sizes. ``url`` names the pack in logs."""
    key = pack_prefix + INDEX_NAME
    try:
        raw = await _read_bounded(packs, key, max_bytes)
    except BackendError as e:
        raise PackError(f"cannot read the index {key!r}: {e}") from e
    index = await asyncio.to_thread(parse_gzipped_index, raw, max_bytes)
    if not _same_place(index.source, source_url):
        raise PackError(f"the pack was made from {index.source}, this export serves {source_url}")
    unpacked = await _load_unpacked(packs, pack_prefix, max_bytes, listings, url)
    sizes = await _shard_sizes(packs, pack_prefix)
    for s in index.shards.values():
        got = sizes.get(s.name)
        if got != s.size:
            why = "missing" if got is None else f"{got} B, the index says {s.size} B"
            raise PackError(f"shard {s.name}: {why}")
    return index, unpacked


async def _load_unpacked(
    packs: ObjectStore, pack_prefix: str, limit: int, listings: bool, url: str
) -> UnpackedKeys | None:
    """The keys the pack does not hold (``unpacked.tsv.gz``), sorted; None when it has no
    such list."""
    key = pack_prefix + UNPACKED_NAME
    try:
        raw = await _read_bounded(packs, key, limit)
        items = await asyncio.to_thread(lambda: parse_unpacked(_gunzip(raw, limit)))
    except (BackendError, PackError, OSError, EOFError) as e:
        if listings:
            log.warning("pack_listings_from_bucket", pack=url, reason=str(e))
        return None
    return sorted((u.path.encode("utf-8", "surrogateescape"), u) for u in items)


async def _read_bounded(packs: ObjectStore, key: str, limit: int) -> bytes:
    """The object ``key`` of the pack, refused (``PackError``) over ``limit`` bytes before any
    byte of it is read."""
    size = (await packs.head(key)).size
    if size > limit:
        raise PackError(f"{key}: {size} B is over max_index_bytes")
    return bytes((await packs.get(key)).data)


async def _shard_sizes(packs: ObjectStore, pack_prefix: str) -> dict[str, int]:
    out: dict[str, int] = {}
    token: str | None = None
    while True:
        page = await packs.list_page(pack_prefix + "shard-", delimiter="/", token=token)
        for o in page.objects:
            out[o.key[len(pack_prefix) :]] = o.size
        token = page.next_token
        if not token:
            return out


def _same_place(a: str, b: str) -> bool:
    """Whether two store URLs name the same bucket and prefix."""
    try:
        ua, ub = parse_store_url(a), parse_store_url(b)
    except ValueError:
        return False
    return (ua.scheme, ua.location, ua.prefix) == (ub.scheme, ub.location, ub.prefix)


def _gunzip(raw: bytes, limit: int) -> bytes:
    """``raw`` decompressed, ``PackError`` past ``limit`` bytes (a gzip bomb stops there)."""
    with gzip.GzipFile(fileobj=io.BytesIO(raw)) as gz:
        text = gz.read(limit + 1)
    if len(text) > limit:
        raise PackError("decompressed over max_index_bytes")
    return text


def parse_gzipped_index(raw: bytes, limit: int) -> PackIndex:
    """The index ``index.tsv.gz`` holds (blocking: the gateway runs it in a thread)."""
    return parse_index(_gunzip(raw, limit))
