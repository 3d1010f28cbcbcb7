"""The directory index at ImageNet scale, in-process: memory per entry, garbage-collection
pauses, the cost of re-listing unchanged directories and lookups/s (issue 11, DESIGN §3 "Index
at ImageNet scale").

    .venv/bin/python benchmarks/index_memory.py [--dirs 1000] [--files 1281] [--store synthetic]

Builds ``--dirs`` directories of ``--files`` entries into one ``Namespace`` (FakeClock, no
budget pressure): each directory is listed (one lookup) and then read whole with READDIR, as a
client's full listing does (that builds the cookie maps). The store is ``synthetic`` (pages
generated on request, ImageNet-like names, sizes and 32-hex ETags, so the process holds
nothing but the index) or ``memory`` (``MemoryStore``: its own objects are measured before the
index and subtracted). Then:

- RSS (psutil) and, with ``--tracemalloc``, traced bytes per entry;
- gc pauses while building, and full ``gc.collect()``s with the index in memory (min, max of 5);
- lookups/s of random names (``Namespace.lookup``, hits), and calls/s when each name gets a
  LOOKUP, a GETATTR and a READ's ``getattr(current=True)`` in a row, as a client's open+read;
- a re-list of every directory, unchanged (the clock is moved past the TTL, each directory
  touched once, then ``quiesce``): seconds per directory, and the gc pauses meanwhile.

Figures are for one CPython process; run it alone (it takes ~1 minute at the defaults).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import hashlib
import json
import logging
import random
import sys
import time
import tracemalloc
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import psutil
import structlog

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/: _common
import _common  # noqa: F401 (puts the repository on sys.path)

from gateway.backend.base import ListPage, ObjectInfo, ObjectStore
from gateway.backend.memory import MemoryStore
from gateway.clock import FakeClock
from gateway.namespace import Namespace, NamespaceConfig

MTIME_NS = 1_650_000_000 * 10**9


def dir_name(i: int) -> str:
    return f"n{1440764 + i * 7919:08d}"


def file_name(d: str, j: int) -> str:
    return f"{d}_{j:05d}.JPEG"  # 20 characters, like n01440764_10026.JPEG


def file_size(d: str, j: int) -> int:
    return 20_000 + (j * 2_654_435_761 + int(d[1:])) % 200_000


class SyntheticStore:
    """A read-only bucket of ``dirs`` folders x ``files`` objects whose pages are generated on
    request (ListObjectsV2 semantics for the two listings the index makes)."""

    name = "synthetic"

    def __init__(self, dirs: int, files: int) -> None:
        self.dirs = [dir_name(i) for i in range(dirs)]
        self.files = files
        self.lists = 0

    async def list_page(
        self,
        prefix: str,
        *,
        delimiter: str | None = "/",
        token: str | None = None,
        start_after: str | None = None,
        max_keys: int = 1000,
    ) -> ListPage:
        self.lists += 1
        start = int(token) if token else 0
        if prefix == "":
            names = self.dirs[start : start + max_keys]
            more = start + max_keys < len(self.dirs)
            return ListPage([], [f"{n}/" for n in names], str(start + max_keys) if more else None)
        d = prefix[:-1]
        stop = min(self.files, start + max_keys)
        objs = []
        for j in range(start, stop):
            key = f"{prefix}{file_name(d, j)}"
            etag = hashlib.md5(key.encode()).hexdigest()
            objs.append(ObjectInfo(key, file_size(d, j), etag, MTIME_NS + j))
        return ListPage(objs, [], str(stop) if stop < self.files else None)

    async def close(self) -> None:
        return None


@dataclass
class GcPauses:
    """Collections seen through ``gc.callbacks``: count and pause seconds per generation."""

    counts: list[int] = field(default_factory=lambda: [0, 0, 0])
    total: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    worst: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    _t0: float = 0.0

    def __call__(self, phase: str, info: Mapping[str, int]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
            return
        g = info["generation"]
        dt = time.perf_counter() - self._t0
        self.counts[g] += 1
        self.total[g] += dt
        self.worst[g] = max(self.worst[g], dt)

    def report(self) -> dict[str, object]:
        return {
            "collections": self.counts,
            "max_ms": [round(w * 1e3, 2) for w in self.worst],
            "total_ms": [round(t * 1e3, 1) for t in self.total],
        }


def rss() -> int:
    return int(psutil.Process().memory_info().rss)


async def run(args: argparse.Namespace) -> dict[str, object]:
    clock = FakeClock()
    dirs = [dir_name(i) for i in range(args.dirs)]
    store: SyntheticStore | MemoryStore
    if args.store == "memory":
        store = MemoryStore(clock=clock)
        for d in dirs:
            for j in range(args.files):
                store.seed(f"{d}/{file_name(d, j)}", mtime_ns=MTIME_NS + j)
    else:
        store = SyntheticStore(args.dirs, args.files)
    cfg = NamespaceConfig(attr_ttl_s=60.0, memory_bytes=1 << 40)
    ns = Namespace(cast(ObjectStore, store), "", clock=clock, config=cfg)
    entries = args.dirs * args.files
    out: dict[str, object] = {"dirs": args.dirs, "files_per_dir": args.files, "entries": entries}

    gc.collect()
    rss0 = rss()
    if args.tracemalloc:
        tracemalloc.start()
    traced0 = tracemalloc.get_traced_memory()[0] if args.tracemalloc else 0
    pauses = GcPauses()
    gc.callbacks.append(pauses)
    t0 = time.perf_counter()
    await ns.readdir("", 0, 4096)
    for d in dirs:
        await ns.lookup(d, file_name(d, 0))
        cookie = 0
        while True:
            page = await ns.readdir(d, cookie, 4096)
            if page.eof:
                break
            cookie = page.entries[-1][0]
    build_s = time.perf_counter() - t0
    gc.callbacks.remove(pauses)
    rss1 = rss()
    out["build_s"] = round(build_s, 2)
    out["build_gc"] = pauses.report()
    out["rss_mib"] = round((rss1 - rss0) / 2**20, 1)
    out["rss_per_entry_b"] = round((rss1 - rss0) / entries, 1)
    if args.tracemalloc:
        traced = tracemalloc.get_traced_memory()[0] - traced0
        out["traced_per_entry_b"] = round(traced / entries, 1)
        tracemalloc.stop()
    out["budget_bytes_per_entry"] = round(ns.stats.bytes / entries, 1)
    out["gc_tracked_objects"] = len(gc.get_objects())

    full = []
    for _ in range(5):
        t0 = time.perf_counter()
        gc.collect()
        full.append((time.perf_counter() - t0) * 1e3)
    out["full_gc_ms_min_max"] = [round(min(full), 1), round(max(full), 1)]

    rnd = random.Random(1)
    picks = [(rnd.choice(dirs), rnd.randrange(args.files)) for _ in range(args.lookups)]
    names = [(d, file_name(d, j)) for d, j in picks]
    pauses = GcPauses()
    gc.callbacks.append(pauses)
    t0 = time.perf_counter()
    for d, n in names:
        await ns.lookup(d, n)
    lookup_s = time.perf_counter() - t0
    gc.callbacks.remove(pauses)
    out["lookups_per_s"] = round(args.lookups / lookup_s)
    out["lookup_gc"] = pauses.report()
    # A client's LOOKUP, then GETATTR and READ of the same file: three calls per name.
    t0 = time.perf_counter()
    for d, n in names[: args.lookups // 3]:
        await ns.lookup(d, n)
        await ns.getattr(f"{d}/{n}")
        await ns.getattr(f"{d}/{n}", current=True)
    out["lookup_getattr_getattr_per_s"] = round(args.lookups // 3 * 3 / (time.perf_counter() - t0))

    lists_before = ns.stats.list_pages
    clock.advance(cfg.attr_ttl_s * 1.01)
    pauses = GcPauses()
    gc.callbacks.append(pauses)
    t0 = time.perf_counter()
    for d in dirs:
        await ns.lookup(d, file_name(d, 1))  # stale: served, starts the re-list
    await ns.quiesce()
    relist_s = time.perf_counter() - t0
    gc.callbacks.remove(pauses)
    out["relists"] = ns.stats.relists
    out["relist_pages"] = ns.stats.list_pages - lists_before
    out["relist_ms_per_dir"] = round(relist_s / args.dirs * 1e3, 3)
    out["relist_gc"] = pauses.report()
    t0 = time.perf_counter()
    for d in dirs:  # the LIST pages alone, for comparison
        token = None
        while True:
            lp = await store.list_page(f"{d}/", token=token)
            if (token := lp.next_token) is None:
                break
    out["store_list_ms_per_dir"] = round((time.perf_counter() - t0) / args.dirs * 1e3, 3)
    out["rss_after_relist_per_entry_b"] = round((rss() - rss0) / entries, 1)
    await ns.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--dirs", type=int, default=1000)
    ap.add_argument("--files", type=int, default=1281)
    ap.add_argument("--store", choices=["synthetic", "memory"], default="synthetic")
    ap.add_argument("--lookups", type=int, default=200_000)
    ap.add_argument("--tracemalloc", action="store_true", help="also traced bytes (slower)")
    ap.add_argument("--json", action="store_true", help="one JSON object instead of lines")
    args = ap.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    out = asyncio.run(run(args))
    if args.json:
        print(json.dumps(out))
        return
    for k, v in out.items():
        print(f"{k:32} {v}")


if __name__ == "__main__":
    main()
