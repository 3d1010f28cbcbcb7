"""What the data prefetcher leaves for the garbage collector (issue 25;
``benchmarks/gc_scale.py`` at ImageNet scale).

A full collection walks every tracked object not frozen at start-up, and one happens every
ten young collections of the old generation's while objects allocated per GET survive young
collections. At 717,000 prefetched objects an epoch, a Task per object (its coroutine,
context, weak reference, shield future and callbacks) made one every ~2,000 GETs. Guarded
here: Tasks started per prefetched object, tracked objects left behind per object, and the
tracked objects the fast path keeps per file (most of what a full collection walks).
"""

from __future__ import annotations

import asyncio
import gc
from collections import Counter
from collections.abc import Generator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.unit.gateway.test_data_prefetch import gateway, prefetcher, scan, settle, tree

FILES = 4 * 100


@contextmanager
def counting_tasks() -> Generator[Counter[str], None, None]:
    """Tasks created on the running loop, by their coroutine's name."""
    loop = asyncio.get_running_loop()
    created: Counter[str] = Counter()

    def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kw: Any) -> asyncio.Future[Any]:
        created[getattr(coro, "__qualname__", type(coro).__name__)] += 1
        return asyncio.Task(coro, loop=loop, **kw)

    old = loop.get_task_factory()
    loop.set_task_factory(factory)
    try:
        yield created
    finally:
        loop.set_task_factory(old)


@pytest.mark.parametrize(("disk", "bound"), [(0, 1.1), (64 << 20, 2.1)])
async def test_tasks_per_prefetched_object(tmp_path: Path, disk: int, bound: float) -> None:
    """One Task per GET (the reader's fetch), and with the disk tier one per publish; none for
    the prefetcher's own wait (it was 2 and 4, before the disk look-up of one block stopped
    going through ``gather``)."""
    files = tree(4, 100, size=64)
    async with gateway(tmp_path, files, cache_disk=disk) as gw:
        with counting_tasks() as created:
            await scan(gw, 4)
            await settle(gw)
        n = prefetcher(gw).stats.objects
        assert n == FILES
        per_object = sum(created.values()) / n
        assert per_object <= bound, created.most_common(6)
        assert created["DataPrefetcher._one"] == 0  # memory had room: no disk-path Task


async def test_prefetched_objects_leave_no_tracked_objects(tmp_path: Path) -> None:
    """What a prefetch allocates is gone once it ended (cache entries are tuples of untracked
    values): 700 prefetched objects in 7 directories leave what the index and the fast path
    keep per directory (~13 objects each), nothing per object."""
    files = tree(8, 100, size=64)
    async with gateway(tmp_path, files) as gw:
        root = await gw.mount(b"/data")

        async def listed(c: int) -> None:
            d = await gw.walk(root, f"c{c}")
            await gw.lookup(d, b"img_000.jpg")

        await listed(0)  # first use: what the process keeps once (caches, code, ...)
        await settle(gw)
        gc.collect()
        before = len(gc.get_objects())
        for c in range(1, 8):
            await listed(c)
        await settle(gw)
        await asyncio.sleep(0)
        gc.collect()
        grown = len(gc.get_objects()) - before
        assert prefetcher(gw).stats.objects == 800
        assert grown < 7 * 20, grown


async def test_the_fast_path_keeps_two_tracked_objects_per_file(tmp_path: Path) -> None:
    """A file the fast path answered a LOOKUP for costs its tables a ``Hot`` and its
    ``Entry`` (the LOOKUP table maps to the child's ``Hot``; a third object per file, up to
    32,768 files, made every full collection walk ~20,000 more objects in gc_scale.py)."""
    files = tree(8, 100, size=64)
    async with gateway(tmp_path, files, cache_data_prefetch=False) as gw:
        root = await gw.mount(b"/data")

        async def looked_up(c: int) -> None:
            d = await gw.walk(root, f"c{c}")
            for i in range(100):
                await gw.lookup(d, f"img_{i:03d}.jpg".encode())

        await looked_up(0)  # first use
        gc.collect()
        before = len(gc.get_objects())
        for c in range(1, 8):
            await looked_up(c)
        gc.collect()
        grown = len(gc.get_objects()) - before
        assert grown < 700 * 2 + 7 * 20, grown  # it was 2,176
