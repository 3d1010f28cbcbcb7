"""``DataCache`` and slices of one shared buffer (a pack group's members): the bytes held
alive by surviving slices beyond their charge stay bounded (``slack_bytes``)."""

from __future__ import annotations

import random

from gateway.data.cache import DataCache
from gateway.data.mappings import shared_buffer

KiB = 1024
MiB = 1024 * KiB


def held_slack(cache: DataCache) -> int:
    """What the cache counts: per buffer still held by a cached slice, the bytes of its slices
    that left; checked against the buffers the entries do reference."""
    held = {id(b) for e in cache._entries.values() if (b := shared_buffer(e[0])) is not None}
    assert held == set(cache._shared), "a tracked buffer no entry holds, or the reverse"
    return sum(sh.departed for sh in cache._shared.values())


def group(n: int, member: int, seed: int) -> tuple[bytes, list[memoryview]]:
    buf = random.Random(seed).randbytes(n * member)
    view = memoryview(buf)
    return buf, [view[i * member : (i + 1) * member] for i in range(n)]


def test_survivors_of_a_mostly_evicted_buffer_are_copied_out() -> None:
    cache = DataCache(4 * MiB)
    cache.slack_bytes = 256 * KiB
    _, members = group(100, 10 * KiB, seed=1)  # a 1,000 KiB group
    for i, m in enumerate(members):
        assert cache.insert(("s", f"g/{i}", "e", 0), m, whole=True)
    assert cache._slack == 0 and cache.stats.slices_copied == 0
    # Members leave (a new version, an invalidation) while their neighbours stay.
    for i in range(0, 40):
        cache.invalidate("s", f"g/{i}")
    assert cache.stats.slices_copied > 0  # the 400 KiB left held passed the bound
    assert cache._slack == held_slack(cache) <= cache.slack_bytes
    for i in range(40, 100):
        got = cache.lookup(("s", f"g/{i}", "e", 0))
        assert got is not None and bytes(got) == bytes(members[i])
        assert shared_buffer(got) is None  # its own bytes now: the group may be freed
    assert cache._shared == {} and cache._slack == 0


def test_the_slack_bound_holds_through_random_use() -> None:
    rng = random.Random(7)
    cache = DataCache(2 * MiB)
    cache.slack_bytes = 192 * KiB
    groups = [group(rng.randint(2, 40), rng.choice((3, 8, 20)) * KiB, seed=s) for s in range(30)]
    copies_seen = 0
    for step in range(3000):
        g = rng.randrange(len(groups))
        i = rng.randrange(len(groups[g][1]))
        k = ("s", f"{g}/{i}", "e", 0)
        op = rng.random()
        if op < 0.6:
            cache.insert(k, groups[g][1][i], whole=True, ahead=rng.random() < 0.3)
        elif op < 0.75:
            cache.insert(("s", f"plain/{step}", "e", 0), rng.randbytes(rng.choice((1, 30)) * KiB))
        elif op < 0.9:
            got = cache.lookup(k)
            assert got is None or bytes(got) == bytes(groups[g][1][i])
        else:
            cache.invalidate("s", f"{g}/{i}")
        assert cache._slack == held_slack(cache), step
        assert cache._slack <= cache.slack_bytes, step
        assert cache.used_bytes <= cache.budget_bytes
        copies_seen = cache.stats.slices_copied
    assert copies_seen > 0
    cache.clear()
    assert cache._slack == 0 and cache._shared == {}


def test_whole_buffers_and_plain_bytes_are_not_tracked() -> None:
    cache = DataCache(1 * MiB)
    whole = b"w" * 5000
    cache.insert(("s", "a", "e", 0), memoryview(whole))  # the whole buffer: no slack possible
    cache.insert(("s", "b", "e", 0), b"b" * 5000)
    assert cache._shared == {} and cache._slack == 0
