"""What a ListObjectsV2 page costs the gateway: the XML parse (``gateway._s3list``, C, against
``s3wire.parse_list_reference``, ElementTree) and a whole re-list of an unchanged directory
through ``gateway.namespace`` (issue 25).

    .venv/bin/python benchmarks/list_parse.py [--files 1281] [--repeat 30] [--no-seaweed]

1. **Parse**: 1,000-key pages in SeaweedFS's form (numeric references for the ETag quotes,
   EncodingType after the Contents; the form benchmarks/s3_client_cpu.py receives) and in
   AWS's (Owner, StorageClass, fractions), ImageNet-like keys; CPU per entry, best of
   ``--repeat`` passes of 20 parses, the garbage collector paused.
2. **Re-list** of an unchanged directory of ``--files`` objects (two LIST pages at the
   default 1,000 keys a page) on a throw-away SeaweedFS (``loadgen.seaweed``; its CPU is not
   counted, ours is: ``time.process_time``, all threads): a ``Namespace`` over ``S3Store``
   lists it once, then the fake clock passes the TTL, one LOOKUP starts the re-list and
   ``quiesce`` waits for it; best and median CPU of ``--repeat`` re-lists, with the C parser
   and with ``NFSGW_PURE_PYTHON``'s reference, three ways in the same run:

   - ``now``: LIST over the lean wire (``http1.Pool``), pages whose digest is the previous
     listing's not parsed (``list_page_if_changed``; checked: no page parsed);
   - ``lean, parsed``: the same wire, every page parsed and compared (the store behind a
     ``StoreWrapper``, which hides ``list_page_if_changed``);
   - ``before``: LIST over aiohttp (``lean_http=False``), every page parsed and compared:
     the mechanism before issue 25's item 3.

   Split: the two ``S3Store.list_page`` calls alone (HTTP client + signing + parse) over each
   wire, the parse of the same two bodies alone, and the re-list over a store that replays
   the parsed pages (the namespace's part, no HTTP).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import logging
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import cast

import structlog

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/: _common
import _common  # noqa: F401 (puts the repository on sys.path)

from gateway.backend import checksums, s3wire
from gateway.backend.base import ListPage, ObjectInfo, ObjectStore, StoreWrapper
from gateway.clock import FakeClock
from gateway.namespace import Namespace, NamespaceConfig

DIR = "n01440764"
ETAG = "&#34;3e44107170a520582ade522fa73c1d15&#34;"


@contextmanager
def gc_paused() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@contextmanager
def pure_python(on: bool) -> Iterator[None]:
    """``s3wire.parse_list`` with the reference (on) or the C twin (off)."""
    old = os.environ.get("NFSGW_PURE_PYTHON")
    os.environ["NFSGW_PURE_PYTHON"] = "1" if on else "0"
    s3wire.compiled.cache_clear()
    checksums.compiled.cache_clear()
    try:
        yield
    finally:
        if old is None:
            del os.environ["NFSGW_PURE_PYTHON"]
        else:
            os.environ["NFSGW_PURE_PYTHON"] = old
        s3wire.compiled.cache_clear()
        checksums.compiled.cache_clear()


def seaweed_page(n: int) -> bytes:
    parts = [
        '<?xml version="1.0" encoding="UTF-8"?>\n<ListBucketResult xmlns="http://s3.amazonaws.com'
        f'/doc/2006-03-01/"><Name>b</Name><Prefix>ds/{DIR}/</Prefix><MaxKeys>1000</MaxKeys>'
        "<Delimiter>/</Delimiter><IsTruncated>true</IsTruncated>"
    ]
    for j in range(n):
        parts.append(
            f"<Contents><Key>ds/{DIR}/{DIR}_{j + 10000}.JPEG</Key><ETag>{ETAG}</ETag>"
            f"<Size>{20000 + j * 7919 % 200000}</Size><StorageClass>STANDARD</StorageClass>"
            f"<LastModified>2026-11-27T01:{j // 60 % 60:02d}:{j % 60:02d}Z</LastModified>"
            "</Contents>"
        )
    parts.append(
        f"<NextContinuationToken>ds/{DIR}/{DIR}_{n + 9999}.JPEG</NextContinuationToken>"
        f"<EncodingType>url</EncodingType><KeyCount>{n}</KeyCount></ListBucketResult>"
    )
    return "".join(parts).encode()


def aws_page(n: int) -> bytes:
    parts = [
        '<?xml version="1.0" encoding="UTF-8"?>\n<ListBucketResult xmlns="http://s3.amazonaws.com'
        f'/doc/2006-03-01/"><Name>b</Name><Prefix>ds%2F{DIR}%2F</Prefix><KeyCount>{n}'
        "</KeyCount><MaxKeys>1000</MaxKeys><Delimiter>%2F</Delimiter><EncodingType>url"
        "</EncodingType><IsTruncated>true</IsTruncated><NextContinuationToken>1ueGcxLPRx1Tr/"
        "XYExHnhbYLgveDs2J/wm36Hy4vbOwM=</NextContinuationToken>"
    ]
    for j in range(n):
        parts.append(
            f"<Contents><Key>ds/{DIR}/{DIR}_{j + 10000}.JPEG</Key><LastModified>2026-11-27T01:"
            f"{j // 60 % 60:02d}:{j % 60:02d}.000Z</LastModified><ETag>&quot;"
            f"{j:032x}&quot;</ETag><ChecksumAlgorithm>CRC32</ChecksumAlgorithm><Size>"
            f"{20000 + j * 7919 % 200000}</Size><Owner><ID>75aa57f09aa0c8caeab4f8c24e99d10f8e7"
            "faeebf76c078efc7c6caea54ba06a</ID></Owner><StorageClass>STANDARD</StorageClass>"
            "</Contents>"
        )
    parts.append("</ListBucketResult>")
    return "".join(parts).encode()


def cpu_per(fn: Callable[[], object], n: int, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        with gc_paused():
            t0 = time.process_time()
            for _ in range(20):
                fn()
            best = min(best, (time.process_time() - t0) / 20 / n)
    return best


def parse_costs(repeat: int) -> None:
    print("parse, µs CPU per entry (1,000-key page, best of", repeat, "x 20)")
    print(f"{'page form':<12}{'bytes':>9}{'ElementTree':>13}{'C':>8}{'ratio':>8}")
    for name, body in (("SeaweedFS", seaweed_page(1000)), ("AWS", aws_page(1000))):
        assert s3wire.parse_list(body) == s3wire.parse_list_reference(body)
        c = s3wire.compiled()
        assert c is not None and c.parse(body, ObjectInfo, s3wire._iso_date_ns)
        ref = cpu_per(functools.partial(s3wire.parse_list_reference, body), 1000, repeat)
        fast = cpu_per(functools.partial(s3wire.parse_list, body), 1000, repeat)
        print(f"{name:<12}{len(body):>9,}{ref * 1e6:>13.2f}{fast * 1e6:>8.2f}{ref / fast:>7.1f}x")


class Replay:
    """A store that answers the directory's listing with pages parsed from captured bodies."""

    def __init__(self, bodies: dict[str | None, bytes]) -> None:
        self.bodies = bodies

    async def list_page(
        self,
        prefix: str,
        *,
        delimiter: str | None = "/",
        token: str | None = None,
        start_after: str | None = None,
        max_keys: int = 1000,
    ) -> ListPage:
        return s3wire.parse_list(self.bodies[token])

    async def close(self) -> None:
        return None


class ParseCount:
    """Counts ``s3wire.parse_list`` calls (what a re-list parsed)."""

    def __init__(self) -> None:
        self.n = 0
        self.original = s3wire.parse_list

    def __enter__(self) -> ParseCount:
        def counting(body: bytes | bytearray) -> ListPage:
            self.n += 1
            return self.original(body)

        setattr(s3wire, "parse_list", counting)  # noqa: B010 - benchmark instrumentation
        return self

    def __exit__(self, *exc: object) -> None:
        setattr(s3wire, "parse_list", self.original)  # noqa: B010


async def relist_cpu(
    store: ObjectStore, repeat: int, prefix: str, name: str, *, parses: int | None = None
) -> tuple[float, float, int]:
    """(best, median) CPU seconds of a re-list of ``prefix`` + DIR, and LIST pages per re-list;
    ``parses``: how many pages the re-lists must have parsed in all (checked)."""
    clock = FakeClock()
    ns = Namespace(store, prefix, clock=clock, config=NamespaceConfig())
    await ns.lookup(DIR, name)
    await ns.quiesce()
    samples = []
    pages0, relists0 = ns.stats.list_pages, ns.stats.relists
    counter = ParseCount() if parses is not None else None
    if counter is not None:
        counter.__enter__()
    for _ in range(repeat):
        clock.advance(100_000.0)
        with gc_paused():
            t0 = time.process_time()
            await ns.lookup(DIR, name)  # stale: answered, starts the re-list
            await ns.quiesce()
            samples.append(time.process_time() - t0)
    if counter is not None:
        counter.__exit__()
        assert counter.n == parses, (counter.n, parses)
    relists = ns.stats.relists - relists0
    assert relists == repeat, (relists, repeat)
    per = (ns.stats.list_pages - pages0) // relists
    await ns.close()
    return min(samples), statistics.median(samples), per


async def timed(run: Callable[[], Awaitable[object]], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        with gc_paused():
            t0 = time.process_time()
            await run()
            best = min(best, time.process_time() - t0)
    return best


async def relist_costs(files: int, repeat: int) -> None:
    from gateway.backend.s3 import S3Store
    from loadgen.seaweed import SeaweedServer

    prefix = "ds/"
    keys = [f"{prefix}{DIR}/{DIR}_{j + 10000}.JPEG" for j in range(files)]
    name = keys[5].rsplit("/", 1)[1]
    with SeaweedServer() as sw:
        sw.create_bucket("relist")
        lean = S3Store("relist", lean_http=True, **sw.store_kwargs())
        old = S3Store("relist", lean_http=False, **sw.store_kwargs())
        sem = asyncio.Semaphore(32)

        async def put(k: str) -> None:
            async with sem:
                await lean.put(k, b"x" * 16)

        await asyncio.gather(*(put(k) for k in keys))
        bodies: dict[str | None, bytes] = {}
        original = s3wire.parse_list

        def list_dir(store: S3Store) -> Callable[[], Awaitable[None]]:
            async def run() -> None:
                token: str | None = None
                while True:
                    page = await store.list_page(f"{prefix}{DIR}/", token=token)
                    if (token := page.next_token) is None:
                        return

            return run

        def capturing(body: bytes | bytearray) -> ListPage:
            page = original(body)
            bodies[capturing.token] = bytes(body)  # type: ignore[attr-defined]
            capturing.token = page.next_token  # type: ignore[attr-defined]
            return page

        capturing.token = None  # type: ignore[attr-defined]
        setattr(s3wire, "parse_list", capturing)  # noqa: B010 - benchmark instrumentation
        try:
            await list_dir(lean)()
        finally:
            setattr(s3wire, "parse_list", original)  # noqa: B010
        sizes = ", ".join(f"{len(b):,}" for b in bodies.values())
        print(f"\nre-list of an unchanged {files:,}-entry directory on SeaweedFS")
        print(f"(pages of {sizes} bytes), ms CPU, best / median of {repeat}")
        print(
            f"{'parser':<13}{'mechanism':<15}{'re-list':>9}{'median':>8}{'LISTs':>7}"
            f"{'2x list_page':>14}{'parse':>8}{'replayed re-list':>18}"
        )
        for label, pure in (("C (_s3list)", False), ("ElementTree", True)):
            with pure_python(pure):
                parse = await timed(_parse_all(bodies), repeat)
                replay = Replay(bodies)
                rbest, _, _ = await relist_cpu(cast(ObjectStore, replay), repeat, prefix, name)
                ways = (
                    ("now", cast(ObjectStore, lean), 0, lean),
                    ("lean, parsed", cast(ObjectStore, StoreWrapper(lean)), None, lean),
                    ("before", cast(ObjectStore, StoreWrapper(old)), None, old),
                )
                for way, store, parses, wire in ways:
                    best, med, per = await relist_cpu(store, repeat, prefix, name, parses=parses)
                    lists = await timed(list_dir(wire), repeat)
                    print(
                        f"{label:<13}{way:<15}{best * 1e3:>9.2f}{med * 1e3:>8.2f}{per:>7}"
                        f"{lists * 1e3:>14.2f}{parse * 1e3:>8.2f}{rbest * 1e3:>18.2f}"
                    )
        await lean.close()
        await old.close()


def _parse_all(bodies: dict[str | None, bytes]) -> Callable[[], Awaitable[object]]:
    async def run() -> None:
        for b in bodies.values():
            s3wire.parse_list(b)

    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=1281)
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--no-seaweed", action="store_true", help="the parse figures only")
    args = ap.parse_args()
    # The per-re-list INFO line (dir_prefetched) goes to a JSON journal in production, not to
    # this console: kept out of the figures, as benchmarks/index_memory.py does.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    if s3wire.compiled() is None:
        sys.exit("gateway._s3list is not built (or NFSGW_PURE_PYTHON is set)")
    parse_costs(args.repeat)
    if not args.no_seaweed:
        asyncio.run(relist_costs(args.files, args.repeat))


if __name__ == "__main__":
    main()
