"""File handle CPU: encode and decode per form on the gateway that issued the handle (the hot
path: every GETATTR/ACCESS/READ decodes one), and what a gateway that did not issue them pays
to resolve them (fail-over): the walk and the scans, over an in-memory ImageNet-shaped tree.

    .venv/bin/python benchmarks/handles_bench.py [--classes 1000] [--files 100] [--n 200000]

Prints µs per call, and for the fail-over: seconds and LIST requests to resolve one handle
from every class directory, then µs per handle once resolved.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/: _common
import _common  # noqa: F401 (puts the repository on sys.path)

from gateway.backend.memory import MemoryStore
from gateway.clock import FakeClock
from gateway.namespace.config import NamespaceConfig
from gateway.namespace.index import Namespace
from gateway.namespace.resolve import Handles

SECRET = b"b" * 32
UUID = "0f8fad5b-d9cb-469f-a165-70867728950e"
PATHS = {
    "inline (36 B)": "train/n01440764/n01440764_10026.JPEG",
    "named (~110 B)": f"train/{'category-name-' * 5}x/{UUID}.jpg",
    "hashed (~200 B)": f"train/{'category-name-' * 5}x/{'long-file-name-' * 6}.jpg",
}


def per_call_us(fn: object, n: int) -> float:
    f = fn  # a zero-argument callable
    assert callable(f)
    t0 = time.perf_counter()
    for _ in range(n):
        f()
    return (time.perf_counter() - t0) / n * 1e6


async def hot_path(n: int) -> None:
    h = Handles(SECRET)

    def no_ns(export_id: int) -> Namespace | None:
        raise AssertionError("cached handles need no namespace")

    print(f"{'form':18} {'encode µs':>10} {'peek µs':>10}")
    for label, path in PATHS.items():
        fh = h.encode(1, path)
        enc = per_call_us(lambda path=path: h.encode(1, path), n)
        dec = per_call_us(lambda fh=fh: h.peek(fh), n)  # what the registry calls per handle
        assert h.peek(fh)[1] == path and await h.decode(fh, no_ns) == (1, path)
        print(f"{label:18} {enc:10.2f} {dec:10.2f}   ({len(fh)} B handle)")


async def failover(classes: int, files: int) -> None:
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    cat = "category-name-" * 5
    paths: list[str] = []
    for c in range(classes):
        for i in range(files):
            name = f"{UUID[:-6]}{i:06d}.jpg" if i % 2 else f"{'long-file-name-' * 6}{i}.jpg"
            path = f"train/{cat}{c:04d}/{name}"
            store.seed("p/" + path, b"x")
            paths.append(path)
    issuer = Handles(SECRET)
    one_per_dir = [issuer.encode(1, p) for p in paths[::files]]  # hashed form (i == 0)
    named = [issuer.encode(1, p) for p in paths[1::files]]
    ns = Namespace(store, "p/", clock=clock, config=NamespaceConfig(memory_bytes=1 << 30))
    b = Handles(SECRET)
    ns_of = {1: ns}.get
    t0 = time.perf_counter()
    for fh in named:
        await b.decode(fh, ns_of)
    t1 = time.perf_counter()
    lists = store.requests["list"]
    print(
        f"fail-over, {classes} dirs x {files} files: first named handle of every dir "
        f"{t1 - t0:.3f} s in all, {lists} LIST requests, {b.stats.walks} walk(s), "
        f"{b.stats.walk_dirs} dirs walked"
    )
    t0 = time.perf_counter()
    for fh in one_per_dir:
        await b.decode(fh, ns_of)
    t1 = time.perf_counter()
    print(
        f"  first hashed handle of every dir: {t1 - t0:.3f} s ({b.stats.dir_scans} scans, "
        f"{(t1 - t0) / len(one_per_dir) * 1e3:.2f} ms per dir)"
    )
    t0 = time.perf_counter()
    for fh in one_per_dir + named:
        await b.decode(fh, ns_of)
    per = (time.perf_counter() - t0) / (len(one_per_dir) + len(named)) * 1e6
    print(f"  once resolved: {per:.2f} µs per decode")
    # The hot path of GETATTR/ACCESS/READ in the registry: peek, then the index's getattr.
    inline = f"train/c{0:04d}/x.jpg"
    store.seed("p/" + inline, b"x")
    ns.invalidate("train", subtree=True)
    samples = {"inline": issuer.encode(1, inline), "named": named[0], "hashed": one_per_dir[0]}
    for fh in samples.values():
        _, path = await b.decode(fh, ns_of)
        await ns.getattr(path)
    n = 100_000
    for label, fh in samples.items():
        t0 = time.perf_counter()
        for _ in range(n):
            got = b.peek(fh)[1]
            assert got is not None
            await ns.getattr(got)
        print(f"  peek + getattr, {label}: {(time.perf_counter() - t0) / n * 1e6:.2f} µs")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--classes", type=int, default=1000)
    ap.add_argument("--files", type=int, default=100)
    ap.add_argument("--n", type=int, default=200_000)
    a = ap.parse_args()
    asyncio.run(hot_path(a.n))
    asyncio.run(failover(a.classes, a.files))


if __name__ == "__main__":
    main()
