"""Resuming an interrupted ``nfsgw pack``: which shards under DST are finished
(``gateway.pack.packer``'s module docstring, "Resuming").

A shard is finished when its part file parses and its object has the size the part file
implies; finished shards must be shards 0..k-1. ``parts/source.url`` records SRC: a DST made
from another source is refused (``PackFailed``).

Must not: write anything but ``parts/source.url`` of a fresh pack.
"""

from __future__ import annotations

import asyncio
import io
import itertools
import re
from collections import deque
from dataclasses import dataclass, field
from typing import Final

from gateway.backend.base import ObjectInfo, ObjectStore
from gateway.namespace.paths import key_order
from gateway.pack.format import (
    BLOCK,
    PARTS_DIR,
    Member,
    PackError,
    Shard,
    padding,
    parse_part,
    part_name,
    shard_name,
)
from gateway.pack.shards import Finished, cancel_all, shard_end

__all__ = ["SOURCE_NAME", "PackFailed", "Resumed", "resume"]

SOURCE_NAME: Final = f"{PARTS_DIR}source.url"
_SHARD_RE: Final = re.compile(r"shard-(\d{6,})\.tar")
_PART_RE: Final = re.compile(r"shard-(\d{6,})\.tsv")


class PackFailed(Exception):
    """SRC or DST cannot be used (one line for the user; ``nfsgw pack`` exits 2)."""


@dataclass(slots=True)
class Resumed:
    """The finished shards, in order, and why the next one is written again ("" if it has
    no part file)."""

    done: list[Finished] = field(default_factory=list)
    rewritten: str = ""


async def _list_all(store: ObjectStore, prefix: str) -> list[ObjectInfo]:
    out: list[ObjectInfo] = []
    token: str | None = None
    while True:
        page = await store.list_page(prefix, token=token)
        out.extend(page.objects)
        token = page.next_token
        if token is None:
            return out


async def resume(dst: ObjectStore, dst_prefix: str, source_url: str) -> Resumed:
    """Find the finished shards under ``dst_prefix``; record SRC for a fresh pack."""
    dp = dst_prefix
    out = Resumed()
    shards: dict[int, int] = {}
    for o in await _list_all(dst, dp):
        m = _SHARD_RE.fullmatch(o.key[len(dp) :])
        if m:
            shards[int(m.group(1))] = o.size
    parts: dict[int, str] = {}
    has_source = False
    for o in await _list_all(dst, dp + PARTS_DIR):
        name = o.key[len(dp) + len(PARTS_DIR) :]
        m = _PART_RE.fullmatch(name)
        if m:
            parts[int(m.group(1))] = o.key
        has_source |= o.key == dp + SOURCE_NAME
    if has_source:
        got = (await dst.get(dp + SOURCE_NAME)).data.decode("utf-8", "replace").strip()
        if got != source_url:
            raise PackFailed(
                f"{dp or 'DST'} holds a pack of {got}, not of {source_url}: "
                "pack into another prefix"
            )
    else:
        await dst.put(dp + SOURCE_NAME, source_url.encode() + b"\n")

    async def load(no: int) -> list[Member] | None:
        data = (await dst.get(parts[no])).data
        try:
            return parse_part(io.StringIO(data.decode("utf-8", "surrogateescape")))
        except PackError:
            return None

    # Shard 0, 1, ... in order, 8 part files in flight; only each one's last path is kept.
    nos = list(itertools.takewhile(parts.__contains__, itertools.count()))
    window: deque[asyncio.Task[list[Member] | None]] = deque()
    prev = b""
    try:
        for i, no in enumerate(nos):
            while len(window) < 8 and i + len(window) < len(nos):
                window.append(asyncio.create_task(load(nos[i + len(window)])))
            members = await window.popleft()
            bad = "its part file does not parse" if members is None else None
            if members is not None:
                bad = _check_part(no, members, prev)
                if bad is None and shards.get(no) != shard_end(members[-1]):
                    bad = f"the shard has {shards.get(no)} bytes, not {shard_end(members[-1])}"
            if bad is not None or members is None:
                out.rewritten = f"{shard_name(no)} is written again: {bad}"
                break
            last = members[-1].path
            out.done.append(Finished(Shard(no, shard_name(no), shards[no]), len(members), last))
            prev = key_order(last)
    finally:
        await cancel_all(window)
    beyond = sorted(no for no in parts if no > len(out.done))
    if beyond:
        raise PackFailed(
            f"{dst_prefix or 'DST'}: shard {len(out.done)} is not finished but part "
            f"files of later shards exist ({part_name(beyond[0])}): not a pack this command "
            "wrote; pack into another prefix"
        )
    return out


def _check_part(no: int, members: list[Member], prev: bytes) -> str | None:
    """Why shard ``no``'s part file does not describe a shard this packer wrote, or None."""
    if not members:
        return "no members"
    end = 0
    for m in members:
        k = key_order(m.path)
        if m.shard != no:
            return f"{m.path!r} names shard {m.shard}"
        if k <= prev:
            return f"{m.path!r} out of key order"
        if m.offset < end + BLOCK or m.size < 0:
            return f"{m.path!r} overlaps the member before it"
        end = m.offset + m.size + len(padding(m.size))
        prev = k
    return None
