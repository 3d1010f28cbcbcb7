"""``NamespaceConfig(prefetch=False)`` (``nfsgw serve --no-prefetch``, the baseline of
``nfsgw-loadgen compare``): a lookup or getattr costs one targeted LIST per name, kept for one
TTL, and never lists or uses a whole directory; READDIR still lists."""

from __future__ import annotations

import pytest

from gateway.backend.memory import MemoryStore
from gateway.clock import FakeClock
from gateway.errors import NotFound
from gateway.namespace import EntryKind, Namespace
from gateway.namespace.config import NamespaceConfig

P = "exp/"


def make(**cfg: object) -> tuple[MemoryStore, Namespace, FakeClock]:
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    ns = Namespace(store, P, clock=clock, config=NamespaceConfig(prefetch=False, **cfg))  # type: ignore[arg-type]
    for i in range(20):
        store.seed(f"{P}c/f{i:02d}.jpg", b"x" * i)
    store.seed(f"{P}c/sub/x.jpg", b"y")
    return store, ns, clock


async def test_each_name_costs_one_targeted_list_then_is_cached():
    store, ns, clock = make(attr_ttl_s=60.0)
    for i in range(20):
        e = await ns.lookup("c", f"f{i:02d}.jpg")
        assert e.kind is EntryKind.FILE and e.size == i
    assert store.requests == {"list": 20}
    assert all(op == "list" and key.startswith(f"{P}c/f") for op, key in store.log)
    # Repeated lookups and getattrs of the same names: answered from the probe cache.
    for i in range(20):
        await ns.getattr(f"c/f{i:02d}.jpg")
    assert store.requests == {"list": 20}
    assert (await ns.lookup("c", "sub")).kind is EntryKind.DIR
    with pytest.raises(NotFound):
        await ns.lookup("c", "missing.jpg")
    assert store.requests == {"list": 22}
    assert ns.stats.prefetches == 0 and ns.stats.targeted_lookups == 22
    # After the TTL a name costs a request again.
    clock.advance(61.0)
    await ns.lookup("c", "f00.jpg")
    assert store.requests == {"list": 23}


async def test_readdir_still_lists_but_lookups_stay_targeted():
    store, ns, _ = make()
    page = await ns.readdir("c", 0, 1000)
    assert len(page.entries) == 21 and page.eof
    assert store.requests == {"list": 1} and ns.stats.prefetches == 1
    await ns.lookup("c", "f03.jpg")
    assert store.requests == {"list": 2} and ns.stats.targeted_lookups == 1


async def test_immutable_probes_never_expire():
    store, ns, clock = make(immutable=True)
    await ns.getattr("c/f01.jpg")
    clock.advance(10**6)
    await ns.getattr("c/f01.jpg")
    assert store.requests == {"list": 1}
