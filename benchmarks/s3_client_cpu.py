"""Client CPU per S3 request: the gateway's own S3 client (``S3Store``: aiohttp + our SigV4
signer + ``s3wire.parse_list``; GET and HEAD over its lean HTTP/1.1 wire, ``http1.py``, or
over aiohttp) against botocore (a boto3 client), on a local SeaweedFS.

    .venv/bin/python benchmarks/s3_client_cpu.py [--objects 300] [--size 4096] [--pages 5]
        [--wire both|lean|aiohttp] [--no-botocore] [--profile-lean SECONDS]

Starts a throw-away SeaweedFS (``loadgen.seaweed``), uploads ``--objects`` objects of
``--size`` bytes and a prefix with ``--pages`` pages of 1,000 keys, then measures this process's CPU
time (``time.process_time``: user + system, all threads; the server's CPU is not counted) per
whole-object GET and per 1,000-key ListObjectsV2 page (``Delimiter='/'``), one request at a
time, best of ``--repeat`` passes; and per HEAD of the same objects. ``--wire`` picks the
store's GET/HEAD wire (``lean_http``): ``both`` measures the lean one and aiohttp, alternating
passes in one process so both see the same machine. The lean target (issue 25): a 110 kB
GET (``--size 112640``) at <= 60 µs. ``--uvloop`` runs our client on uvloop, the gateway's
loop. ``--profile-lean S`` only runs lean GETs for S seconds (to attach ``py-spy record
--pid``). It also times ``parse_list`` alone on the page bodies
our client received: the share of our LIST cost that is the XML parse.

This is why the gateway has its own S3 client (STYLE.md §5). obstore and awscrt are not
measured here: the project does not depend on them.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

from gateway.backend import s3wire
from gateway.backend.base import ListPage
from gateway.backend.s3 import S3Store
from gateway.backend.s3wire import parse_list
from loadgen.seaweed import SeaweedServer

BUCKET = "cpu-bench"
GET_PREFIX = "get/"
LIST_PREFIX = "list/"
PAGE_KEYS = 1000


@contextmanager
def gc_paused() -> Iterator[None]:
    """Collect first, then keep the collector out of the measured window."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def best_cpu_per_op(run_pass: Callable[[], int], repeat: int) -> float:
    """Seconds of process CPU per operation: the best of ``repeat`` passes."""
    best = float("inf")
    for _ in range(repeat):
        with gc_paused():
            t0 = time.process_time()
            n = run_pass()
            best = min(best, (time.process_time() - t0) / n)
    return best


# ------------------------------------------------------------------------------- ours


async def upload(store: S3Store, keys: list[str], data: bytes) -> None:
    sem = asyncio.Semaphore(32)

    async def one(k: str) -> None:
        async with sem:
            await store.put(k, data)

    await asyncio.gather(*(one(k) for k in keys))


async def list_pages(store: S3Store) -> int:
    token: str | None = None
    pages = 0
    while True:
        page = await store.list_page(LIST_PREFIX, token=token, max_keys=PAGE_KEYS)
        pages += 1
        token = page.next_token
        if token is None:
            return pages


async def capture_list_bodies(store: S3Store) -> list[bytes]:
    """The page bodies our client parses, captured by wrapping the store's parse_list."""
    bodies: list[bytes] = []

    def capturing(body: bytes) -> ListPage:
        bodies.append(body)
        return parse_list(body)

    # The store parses pages in s3wire.list_reply (which digests them first).
    setattr(s3wire, "parse_list", capturing)  # noqa: B010 - benchmark-only instrumentation
    try:
        await list_pages(store)
    finally:
        setattr(s3wire, "parse_list", parse_list)  # noqa: B010
    return bodies


async def in_flight(keys: list[str], n: int, call: Callable[[str], Awaitable[object]]) -> int:
    """``call`` every key, ``n`` at a time (as the data prefetcher runs its GETs)."""
    it = iter(keys)

    async def worker() -> None:
        for k in it:
            await call(k)

    await asyncio.gather(*(worker() for _ in range(n)))
    return len(keys)


async def measure_ours(
    sw: SeaweedServer, get_keys: list[str], repeat: int, wires: list[bool], inflight: int = 1
) -> tuple[dict[bool, tuple[float, float]], float, list[bytes]]:
    """{lean: (CPU per GET, CPU per HEAD)}, CPU per LIST page and the page bodies; the
    wires' passes alternate. GETs and HEADs run ``inflight`` at a time."""
    stores = {lean: S3Store(BUCKET, lean_http=lean, **sw.store_kwargs()) for lean in wires}
    try:
        for store in stores.values():
            for k in get_keys[:20]:  # warm-up: connections, caches, code paths
                await store.get(k)
                await store.head(k)
        store = next(iter(stores.values()))
        await list_pages(store)

        async def get_pass(store: S3Store) -> int:
            return await in_flight(get_keys, inflight, store.get)

        async def head_pass(store: S3Store) -> int:
            return await in_flight(get_keys, inflight, store.head)

        best = {lean: [float("inf"), float("inf")] for lean in wires}
        best_list = float("inf")
        for _ in range(repeat):
            for lean, s in stores.items():
                for i, one_pass in enumerate((get_pass, head_pass)):
                    with gc_paused():
                        t0 = time.process_time()
                        n = await one_pass(s)
                        best[lean][i] = min(best[lean][i], (time.process_time() - t0) / n)
            with gc_paused():
                t0 = time.process_time()
                n = await list_pages(store)
                best_list = min(best_list, (time.process_time() - t0) / n)
        bodies = await capture_list_bodies(store)
    finally:
        for s in stores.values():
            await s.close()
    return {lean: (g, h) for lean, (g, h) in best.items()}, best_list, bodies


async def profile_lean(sw: SeaweedServer, get_keys: list[str], seconds: float) -> int:
    """Lean GETs in a loop for ``seconds`` (for py-spy); the number done."""
    store = S3Store(BUCKET, lean_http=True, **sw.store_kwargs())
    n = 0
    try:
        t_end = time.monotonic() + seconds
        while time.monotonic() < t_end:
            for k in get_keys:
                await store.get(k)
            n += len(get_keys)
    finally:
        await store.close()
    return n


# --------------------------------------------------------------------------- botocore


def measure_botocore(sw: SeaweedServer, get_keys: list[str], repeat: int) -> tuple[float, float]:
    client: Any = sw.boto3_client()

    def get_pass() -> int:
        for k in get_keys:
            client.get_object(Bucket=BUCKET, Key=k)["Body"].read()
        return len(get_keys)

    def list_pass() -> int:
        kw: dict[str, Any] = {
            "Bucket": BUCKET,
            "Prefix": LIST_PREFIX,
            "Delimiter": "/",
            "MaxKeys": PAGE_KEYS,
        }
        pages = 0
        while True:
            resp = client.list_objects_v2(**kw)
            pages += 1
            if not resp.get("IsTruncated"):
                return pages
            kw["ContinuationToken"] = resp["NextContinuationToken"]

    for k in get_keys[:20]:
        client.get_object(Bucket=BUCKET, Key=k)["Body"].read()
    list_pass()
    try:
        return best_cpu_per_op(get_pass, repeat), best_cpu_per_op(list_pass, repeat)
    finally:
        client.close()


# ------------------------------------------------------------------------------- main


def parse_cpu_per_page(bodies: list[bytes], repeat: int) -> float:
    def one_pass() -> int:
        for b in bodies:
            parse_list(b)
        return len(bodies)

    return best_cpu_per_op(one_pass, max(repeat, 5))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--objects", type=int, default=300, help="objects to GET (default 300)")
    p.add_argument("--size", type=int, default=4096, help="bytes per object (default 4096)")
    p.add_argument(
        "--pages", type=int, default=5, help="1,000-key LIST pages under the prefix (default 5)"
    )
    p.add_argument("--repeat", type=int, default=3, help="passes; the best counts (default 3)")
    p.add_argument(
        "--wire",
        choices=("both", "lean", "aiohttp"),
        default="both",
        help="GET/HEAD wire of S3Store (default both)",
    )
    p.add_argument(
        "--inflight",
        type=int,
        default=1,
        help="our client's GETs and HEADs at once (default 1; a cold epoch runs 28-64)",
    )
    p.add_argument("--no-botocore", action="store_true", help="skip the botocore client")
    p.add_argument(
        "--uvloop",
        action="store_true",
        help="run our client on uvloop (the gateway's default loop) instead of asyncio's",
    )
    p.add_argument(
        "--profile-lean",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="only run lean GETs for this long (attach py-spy), then exit",
    )
    a = p.parse_args()
    if a.objects < 1 or a.pages < 1 or a.repeat < 1 or a.size < 0 or a.inflight < 1:
        p.error("--objects, --pages, --repeat and --inflight must be >= 1, --size >= 0")

    get_keys = [f"{GET_PREFIX}obj-{i:06d}.jpg" for i in range(a.objects)]
    list_keys = [f"{LIST_PREFIX}img-{i:06d}.jpg" for i in range(a.pages * PAGE_KEYS)]
    t_start = time.monotonic()
    with SeaweedServer() as sw:
        sw.create_bucket(BUCKET)

        async def setup() -> None:
            store = S3Store(BUCKET, **sw.store_kwargs())
            try:
                await upload(store, get_keys, b"x" * a.size)
                await upload(store, list_keys, b"")
            finally:
                await store.close()

        asyncio.run(setup())
        run: Any = asyncio.run
        if a.uvloop:
            import uvloop

            run = uvloop.run
        if a.profile_lean > 0:
            n = run(profile_lean(sw, get_keys, a.profile_lean))
            print(f"{n} lean GETs in {a.profile_lean:.0f} s")
            return
        wires = {"both": [True, False], "lean": [True], "aiohttp": [False]}[a.wire]
        ours, ours_list, bodies = run(measure_ours(sw, get_keys, a.repeat, wires, a.inflight))
        boto = None if a.no_botocore else measure_botocore(sw, get_keys, a.repeat)
    parse = parse_cpu_per_page(bodies, a.repeat)
    pages = len(bodies)
    elapsed = time.monotonic() - t_start

    print(
        f"S3 client CPU per request: SeaweedFS on 127.0.0.1, {a.objects} GETs and HEADs of "
        f"{a.size} B objects, {pages} LIST pages of {PAGE_KEYS:,} keys, {a.inflight} GET/HEAD "
        f"at a time (botocore and LIST: one), best of {a.repeat}"
    )
    print()
    print(f"{'client':<32}{'µs CPU / GET':>14}{'µs CPU / HEAD':>15}{'ms CPU / LIST page':>20}")
    names = {True: "nfsgw S3Store (lean GET/HEAD)", False: "nfsgw S3Store (aiohttp)"}
    for lean, (g, h) in ours.items():
        print(f"{names[lean]:<32}{g * 1e6:>14.0f}{h * 1e6:>15.0f}{ours_list * 1e3:>20.2f}")
    if True in ours and False in ours:
        (lg, lh), (ag, ah) = ours[True], ours[False]
        print(f"{'aiohttp / lean':<32}{ag / lg:>13.1f}x{ah / lh:>14.1f}x")
    if boto is not None:
        boto_get, boto_list = boto
        ours_get = min(g for g, _ in ours.values())
        print(
            f"{'botocore (boto3 client)':<32}{boto_get * 1e6:>14.0f}{'':>15}"
            f"{boto_list * 1e3:>20.2f}"
        )
        print(
            f"{'botocore / ours (best)':<32}{boto_get / ours_get:>13.1f}x{'':>15}"
            f"{boto_list / ours_list:>19.1f}x"
        )
    print()
    print(
        f"XML parse alone (s3wire.parse_list) on our {pages} page bodies: "
        f"{parse * 1e3:.2f} ms / page = {parse / ours_list:.0%} of our LIST page CPU"
    )
    print(f"(total run {elapsed:.0f} s, set-up and uploads included)")


if __name__ == "__main__":
    main()
