"""Listings of a packed immutable export from its index (``list_from_index``: 0 LIST
requests): one ListObjectsV2 page with delimiter "/" made of the index's members and the
keys the pack does not hold (``unpacked.tsv.gz``), in key order (UTF-8 bytes, as S3 lists).

Must not: read anything (the index and the unpacked keys are in memory).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable

from gateway.backend.base import ListPage, ObjectInfo
from gateway.pack.format import PackIndex
from gateway.pack.indexload import UnpackedKeys

__all__ = ["list_from_index"]


def list_from_index(
    index: PackIndex,
    unpacked: UnpackedKeys,
    source: str,
    prefix: str,
    after: str | None,
    max_keys: int,
) -> ListPage:
    """One page: keys and common prefixes under ``prefix`` (a key under ``source``, the
    export's prefix) after ``after``, at most ``max_keys``."""
    rel = prefix[len(source) :].encode("utf-8", "surrogateescape")
    a = None if after is None else after[len(source) :].encode("utf-8", "surrogateescape")
    items: dict[bytes, ObjectInfo | None] = {}  # key -> object, or None: a common prefix

    def member(i: int) -> ObjectInfo:
        return ObjectInfo(source + index.path(i), index.sizes[i], index.etag(i), index.mtimes[i])

    _walk(index.n, index.key, index.lower_bound, member, rel, a, max_keys + 1, items)
    keys = [k for k, _ in unpacked]

    def other(i: int) -> ObjectInfo:
        u = unpacked[i][1]
        return ObjectInfo(source + u.path, u.size, u.etag, u.mtime_ns)

    _walk(
        len(keys), keys.__getitem__, lambda k: bisect_left(keys, k), other, rel, a,
        max_keys + 1, items,
    )  # fmt: skip
    found = sorted(items)
    objects: list[ObjectInfo] = []
    prefixes: list[str] = []
    for k in found[:max_keys]:
        info = items[k]
        if info is None:
            prefixes.append(source + k.decode("utf-8", "surrogateescape"))
        else:
            objects.append(info)
    more = len(found) > max_keys
    last = source + found[max_keys - 1].decode("utf-8", "surrogateescape") if more else None
    return ListPage(objects, prefixes, last)


def _walk(
    n: int,
    key_at: Callable[[int], bytes],
    lower_bound: Callable[[bytes], int],
    info_at: Callable[[int], ObjectInfo],
    rel: bytes,
    after: bytes | None,
    limit: int,
    items: dict[bytes, ObjectInfo | None],
) -> None:
    """Up to ``limit`` entries of one sorted list of ``n`` keys (relative to the export's
    prefix) under ``rel`` and after ``after`` into ``items``: a key under a subdirectory (or
    a directory's marker) as its common prefix, once, its whole subtree skipped."""
    i = lower_bound(rel)
    if after is not None:
        if after.endswith(b"/"):  # a common prefix: past everything under it
            i = max(i, lower_bound(after[:-1] + b"0"))
        else:
            i = max(i, lower_bound(after + b"\0"))
    width, found = len(rel), 0
    while i < n and found < limit:
        key = key_at(i)
        if not key.startswith(rel):
            break
        slash = key.find(b"/", width)
        if slash >= 0:
            items[key[: slash + 1]] = None
            i = lower_bound(key[:slash] + b"0")  # "/" + 1: past the whole subtree
        else:
            items[key] = info_at(i)
            i += 1
        found += 1
