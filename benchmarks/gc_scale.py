"""What the garbage collector walks while the data prefetcher runs at ImageNet scale (issue 25):
an in-process probe of the objects the gateway builds, no network.

    PYTHONPATH=. .venv/bin/python benchmarks/gc_scale.py [--dirs 1000] [--files 1281]
        [--gets 200000] [--reads 50000] [--clients 8] [--no-readdir] [--memory SIZE]
        [--disk SIZE] [--sample 20] [--top 15] [--json FILE]

Set-up: the whole gateway (``gateway.ops.server.Server`` through ``tests.harness.memory``'s
``MemoryGateway``: the same ``build`` as ``nfsgw serve``, data prefetch on, the memory tier and
an unshared disk tier under a temporary directory in /var/tmp) over a synthetic bucket
(``SyntheticStore``: ``--dirs`` folders of ``--files`` objects of 4-10 bytes, ImageNet's
1,000 x 1,281 by default; listings and GETs answered at once from the key, nothing stored, so
the store itself adds nothing for the collector to walk). After start-up the probe calls
``gcwatch.freeze_long_lived()`` as ``nfsgw serve`` does, then:

1. **listing**: ImageFolder's scan, READDIRPLUS of every folder (``--no-readdir``: one LOOKUP
   per folder instead, and no epoch); the namespace lists each folder through its real code
   path, and the prefetcher registers each listing and starts fetching, as in the benchmark;
2. **epoch**: ``--reads`` random files opened and read whole (LOOKUP, ACCESS, READ) by
   ``--clients`` tasks while the prefetcher runs (through the fast path, as a client's are);
3. **prefetch**: until the store has answered ``--gets`` GETs in all (no READs).

Reported for each phase: full (generation 2) collections, their total and longest time, and
the GETs per full collection (``gc.callbacks``); for the last, young collections per 1,000
GETs and what generation 1 holds when it is collected (every ``--sample``-th time: what is
promoted to the old generation, counted towards the next full collection). At the end:
tracked objects per generation, ``gc.get_stats()``, the most common tracked types, the
references a full collection follows (``gc.get_referents`` of every tracked object), the
containers with the most referents (and what holds them), and the time of one
``gc.collect()``. Run it under ``flock /tmp/nfsgw-heavy.lock`` on a shared machine (a few
minutes of CPU at the defaults).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import hashlib
import json
import random
import sys
import tempfile
import time
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

from gateway.backend.base import GetResult, ListPage, ObjectInfo, ObjectNotFound
from gateway.backend.memory import MemoryStore
from gateway.exports import ExportConfig
from gateway.ops.config import default_cache_memory
from gateway.ops.gcwatch import freeze_long_lived
from nfsproto.nfs3 import NfsStat3
from tests.harness.memory import MemoryGateway

MTIME_NS = 1_700_000_000 * 10**9


class SyntheticStore(MemoryStore):
    """``dirs`` folders ``ds/cNNNN/`` of ``files`` objects ``img_NNNNN.JPEG`` each, 4-10 bytes,
    ETag the MD5 of the key: listings and GETs computed from the key, nothing held."""

    def __init__(self, dirs: int, files: int) -> None:
        super().__init__("synthetic")
        self.dirs = dirs
        self.files = files
        self.gets = 0

    async def _begin(self, op: str, key: str) -> None:
        self.requests[op] += 1  # no ``log``: it would grow by a tuple per request

    @staticmethod
    def _info(key: str) -> ObjectInfo:
        size = 4 + zlib.crc32(key.encode()) % 7
        return ObjectInfo(key, size, hashlib.md5(key.encode()).hexdigest(), MTIME_NS)

    async def _list_page(
        self, prefix: str, delimiter: str | None, token: str | None, after: str | None, limit: int
    ) -> ListPage:
        await self._begin("list", prefix)
        start = int(token) if token else 0
        if prefix == "ds/":
            stop = min(self.dirs, start + limit)
            names = [f"ds/c{d:04d}/" for d in range(start, stop)]
            more = str(stop) if stop < self.dirs else None
            return ListPage([], names, more)
        if prefix.startswith("ds/c") and prefix.endswith("/"):
            stop = min(self.files, start + limit)
            objs = [self._info(f"{prefix}img_{i:05d}.JPEG") for i in range(start, stop)]
            return ListPage(objs, [], str(stop) if stop < self.files else None)
        return ListPage([], [], None)

    async def head(self, key: str) -> ObjectInfo:
        await self._begin("head", key)
        if not key.startswith("ds/c"):
            raise ObjectNotFound(key)
        return self._info(key)

    async def _get(self, key: str, start: int, end: int | None, if_match: str | None) -> GetResult:
        self.requests["get"] += 1
        self.gets += 1
        info = self._info(key)
        data = (key.encode() * 2)[: info.size]
        return GetResult(data[start:end], info.etag, info.size, MTIME_NS)


class Collections:
    """Full collections and time in the collector (a ``gc.callbacks`` entry)."""

    def __init__(self) -> None:
        self.full = 0
        self.seconds = 0.0
        self.full_seconds = 0.0
        self.longest = 0.0
        self._t0 = 0.0
        self.sample_every = 0  # > 0: the types in generation 1 at every N-th young collection
        self._young = 0
        self.promoted: Counter[str] = Counter()
        self.samples = 0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            if self.sample_every and info.get("generation") == 1:
                self._young += 1
                if self._young % self.sample_every == 0:
                    # What survived a young collection and would be promoted to the old
                    # generation by this one if still alive (counted there as pending).
                    self.samples += 1
                    self.promoted.update(type(o).__qualname__ for o in gc.get_objects(1))
            self._t0 = time.perf_counter()
            return
        took = time.perf_counter() - self._t0
        self.seconds += took
        if info.get("generation") == 2:
            self.full += 1
            self.full_seconds += took
            self.longest = max(self.longest, took)

    def take(self) -> dict[str, float]:
        out = {
            "full": self.full,
            "full_s": round(self.full_seconds, 3),
            "longest_full_ms": round(1000 * self.longest, 1),
            "gc_s": round(self.seconds, 3),
        }
        self.full = 0
        self.seconds = self.full_seconds = self.longest = 0.0
        return out


def census(top: int) -> dict[str, Any]:
    """What a full collection walks now (the permanent generation excluded, as it is)."""
    gens = [len(gc.get_objects(generation=g)) for g in range(3)]
    objs = gc.get_objects()
    types = Counter(type(o).__qualname__ for o in objs)
    sizes = [(len(gc.get_referents(o)), o) for o in objs]
    refs = sum(n for n, _ in sizes)
    sizes.sort(key=lambda t: t[0], reverse=True)
    biggest = []
    for n, o in sizes[:top]:
        owners = [
            type(r).__qualname__ + ("." + k if isinstance(k, str) else "")
            for r in gc.get_referrers(o)
            if r is not objs and r is not sizes
            for k in (_slot_of(r, o),)
        ][:3]
        biggest.append({"type": type(o).__qualname__, "referents": n, "held_by": owners})
    del objs, sizes
    t0 = time.perf_counter()
    gc.collect()
    collect_ms = 1000 * (time.perf_counter() - t0)
    return {
        "tracked_by_generation": gens,
        "tracked": sum(gens),
        "referents": refs,
        "collect_ms": round(collect_ms, 1),
        "types": types.most_common(top),
        "biggest": biggest,
        "gc_stats": gc.get_stats(),
    }


def _slot_of(owner: object, o: object) -> str | None:
    """The attribute of ``owner`` that holds ``o`` (slots or ``__dict__``), if any."""
    names = list(getattr(type(owner), "__slots__", ()))
    d = getattr(owner, "__dict__", None)
    if isinstance(d, dict):
        names += list(d)
    for cls in type(owner).__mro__:
        names += list(getattr(cls, "__slots__", ()))
    for name in names:
        try:
            if getattr(owner, name) is o:
                return str(name)
        except AttributeError:
            continue
    return None


async def scan(
    gw: MemoryGateway, root: bytes, dirs: int, want: set[tuple[int, int]]
) -> dict[tuple[int, int], tuple[bytes, bytes]]:
    """ImageFolder's scan: READDIRPLUS of every folder; the (folder, file) handles of ``want``."""
    out: dict[tuple[int, int], tuple[bytes, bytes]] = {}
    for d in range(dirs):
        dh = await gw.walk(root, f"c{d:04d}")
        cookie, verf = 0, bytes(8)
        while True:
            res = await gw.readdirplus(dh, cookie, verf)
            assert res.status == NfsStat3.NFS3_OK, res.status
            for e in res.entries:
                if e.name.startswith(b"img_"):
                    i = int(e.name[4:9])
                    if (d, i) in want and e.name_handle is not None:
                        out[(d, i)] = (dh, e.name)
                cookie = e.cookie
            verf = res.cookieverf
            if res.eof or not res.entries:
                break
    return out


async def epoch(gw: MemoryGateway, order: list[tuple[bytes, bytes]], clients: int) -> None:
    """``order``'s files opened and read whole (LOOKUP, ACCESS, READ) by ``clients`` tasks."""
    queue = list(reversed(order))

    async def client() -> None:
        while queue:
            dh, name = queue.pop()
            res = await gw.lookup(dh, name)
            assert res.status == NfsStat3.NFS3_OK, (name, res.status)
            await gw.access(res.object)
            got = await gw.read(res.object)
            assert got.status == NfsStat3.NFS3_OK, (name, got.status)

    await asyncio.gather(*(client() for _ in range(clients)))


async def probe(a: argparse.Namespace) -> dict[str, Any]:
    store = SyntheticStore(a.dirs, a.files)
    memory = a.memory if a.memory is not None else default_cache_memory()
    settings: dict[str, Any] = {
        "cache_data_prefetch": True,
        "cache_disk": a.disk,
        "cache_memory": memory,
    }
    ec = ExportConfig("/data", "s3://b/ds/", read_only=True, insecure=True)
    results: dict[str, Any] = {"args": vars(a)}
    watch = Collections()
    with tempfile.TemporaryDirectory(dir="/var/tmp", prefix="nfsgw-gc-scale-") as tmp:
        async with MemoryGateway.of(Path(tmp), [ec], store=store, **settings) as gw:
            root = await gw.mount(b"/data")
            freeze_long_lived()  # as ``nfsgw serve`` does once the server is up
            gc.callbacks.append(watch)
            try:
                t0 = time.perf_counter()
                rng = random.Random(0)
                picked = rng.sample(range(a.dirs * a.files), min(a.reads, a.dirs * a.files))
                want = {divmod(i, a.files) for i in picked}
                handles = await scan(gw, root, a.dirs, want) if a.readdir else {}
                if not a.readdir:
                    for d in range(a.dirs):
                        dh = await gw.walk(root, f"c{d:04d}")
                        await gw.walk(dh, "img_00000.JPEG")  # lists the folder
                took = time.perf_counter() - t0
                results["listing"] = {"s": round(took, 1), "gets": store.gets, **watch.take()}
                print(f"listing: {results['listing']}", flush=True)
                if handles:
                    g0, t0 = store.gets, time.perf_counter()
                    order = [handles[divmod(i, a.files)] for i in picked]
                    await epoch(gw, order, a.clients)
                    took = time.perf_counter() - t0
                    ph: dict[str, Any] = {"s": round(took, 1), "files": len(order)}
                    order.clear()
                    ph["gets"] = store.gets - g0
                    ph |= watch.take()
                    results["epoch"] = ph
                    print(f"epoch: {ph}", flush=True)
                g0, t0 = store.gets, time.perf_counter()
                watch.sample_every = a.sample
                c0 = [g["collections"] for g in gc.get_stats()]
                while store.gets < a.gets:
                    await asyncio.sleep(0.2)
                    p = gw.server.prefetcher
                    if p is not None and p.idle and store.gets < a.gets:
                        print(f"prefetcher idle at {store.gets:,} GETs", flush=True)
                        break
                took = time.perf_counter() - t0
                ph = {"s": round(took, 1), "gets": store.gets - g0}
                ph |= watch.take()
                ph["gets_per_full"] = round(ph["gets"] / ph["full"]) if ph["full"] else None
                watch.sample_every = 0
                c1 = [g["collections"] for g in gc.get_stats()]
                k = max(1, ph["gets"]) / 1000
                ph["collections_per_1000_gets"] = [
                    round((y - x) / k, 2) for x, y in zip(c0, c1, strict=True)
                ]
                if watch.samples:
                    n = watch.samples
                    ph["gen1_per_sample"] = [
                        (t, c // n) for t, c in watch.promoted.most_common(a.top)
                    ]
                results["prefetch"] = ph
                print(f"prefetch: {ph}", flush=True)
                p = gw.server.prefetcher
                if p is not None:
                    await p.close()  # nothing in flight while counting
                picked.clear()  # the probe's own: not the gateway's
                want.clear()
                handles.clear()
                results["census"] = census(a.top)
            finally:
                gc.callbacks.remove(watch)
                gc.unfreeze()
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dirs", type=int, default=1000)
    ap.add_argument("--files", type=int, default=1281)
    ap.add_argument("--gets", type=int, default=200_000)
    ap.add_argument(
        "--memory", type=int, default=None, help="cache.memory (default: the gateway's, RAM / 4)"
    )
    ap.add_argument("--disk", type=int, default=4 << 30, help="cache.disk (0: no disk tier)")
    ap.add_argument("--reads", type=int, default=50_000, help="files the epoch reads")
    ap.add_argument("--clients", type=int, default=8, help="files read at once")
    ap.add_argument(
        "--no-readdir",
        dest="readdir",
        action="store_false",
        help="list by one LOOKUP per folder instead of READDIRPLUS; no epoch of READs",
    )
    ap.add_argument(
        "--sample", type=int, default=20, help="count generation 1 at every N-th gen-1 collection"
    )
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    res = asyncio.run(probe(a))
    c = res["census"]
    print(
        f"tracked {c['tracked']:,} (by generation {c['tracked_by_generation']}), "
        f"referents {c['referents']:,}, one gc.collect() {c['collect_ms']} ms"
    )
    print("types:", ", ".join(f"{t} {n:,}" for t, n in c["types"]))
    for b in c["biggest"]:
        print(f"  {b['referents']:>10,}  {b['type']:<24} held by {b['held_by']}")
    print("gc.get_stats():", c["gc_stats"])
    if a.json is not None:
        a.json.write_text(json.dumps(res, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
