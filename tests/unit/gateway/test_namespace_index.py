"""The index at scale (DESIGN §3 "Index at ImageNet scale"), at a size that runs in
seconds: 100 folders x 1,281 entries over the in-memory store and a fake clock.

What must hold: an unchanged re-list keeps the directory's columns (the same objects) and
builds no entry; re-lists of directories listed together are spread over time; a directory's
TTL grows while it is found unchanged and is back at ``attr_ttl_s`` after a change; a READ's
``getattr(current=True)`` never waits for a re-list; a change in the bucket is seen within
the documented bound; the budget counts what the index really holds. Plus the columns
themselves (``gateway.namespace.columns``).
"""

from __future__ import annotations

import asyncio
import gc
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import gateway.namespace.entries as entries_mod
from gateway.backend.base import ListPage, ObjectInfo, StoreWrapper
from gateway.backend.local import LocalStore
from gateway.backend.memory import MemoryStore
from gateway.clock import FakeClock
from gateway.errors import NotFound
from gateway.namespace import NO_WATCHER, DirWatcher, Entry, EntryKind, Namespace, NamespaceConfig
from gateway.namespace.columns import Columns, fold
from gateway.namespace.index import JITTER
from tests.harness.stores import GatedStore

P = "exp/"
DIRS = 100
FILES = 1281


def dir_name(i: int) -> str:
    return f"n{i:08d}"


def file_name(d: str, j: int) -> str:
    return f"{d}_{j:05d}.JPEG"


def make(
    dirs: int = DIRS, files: int = FILES, *, watcher: DirWatcher = NO_WATCHER, **cfg: object
) -> tuple[GatedStore, Namespace, FakeClock]:
    clock = FakeClock()
    store = GatedStore(clock=clock)
    for i in range(dirs):
        d = dir_name(i)
        for j in range(files):
            store.seed(f"{P}{d}/{file_name(d, j)}", b"", mtime_ns=1_650_000_000 * 10**9 + j)
    # The seeded files are years old: without age_ttl_factor=0 every TTL would start at the
    # maximum (the age rule has its own tests below).
    config = NamespaceConfig(**{"memory_bytes": 1 << 34, "age_ttl_factor": 0.0, **cfg})  # type: ignore[arg-type]
    ns = Namespace(store, P, clock=clock, config=config, watcher=watcher)
    ns._schedule.random.seed(11)
    return store, ns, clock


async def list_everything(ns: Namespace, dirs: int = DIRS) -> None:
    """Each folder listed and read whole with READDIR (as a client's full listing)."""
    await ns.readdir("", 0, 4096)
    for i in range(dirs):
        d = dir_name(i)
        cookie = 0
        while True:
            page = await ns.readdir(d, cookie, 4096)
            if page.eof:
                break
            cookie = page.entries[-1][0]


class EntryCounter:
    """Counts ``Entry`` objects built while armed."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.built = 0
        self.armed = False
        init = entries_mod.Entry.__init__

        def counting(e: Entry, *args: object, **kw: object) -> None:
            if self.armed:
                self.built += 1
            init(e, *args, **kw)  # type: ignore[arg-type]

        monkeypatch.setattr(entries_mod.Entry, "__init__", counting)


@pytest.fixture
def counter(monkeypatch: pytest.MonkeyPatch) -> Iterator[EntryCounter]:
    yield EntryCounter(monkeypatch)


# -- revalidation costs what changed -----------------------------------------------------------


async def test_unchanged_relists_keep_columns_and_build_no_entry(counter: EntryCounter) -> None:
    store, ns, clock = make(background_relists=DIRS)
    await list_everything(ns)
    dirs = [ns._dirs[dir_name(i)] for i in range(DIRS)]
    before = [(d.cols, d.cookies.col if d.cookies else None) for d in dirs]
    assert all(c is not None for _, c in before)
    stats = (ns.stats.entries, ns.stats.bytes)
    verfs = [d.verf for d in dirs]
    lists = store.requests["list"]
    clock.advance(60.0 + 1)
    for i in range(DIRS):
        d = dir_name(i)
        await ns.lookup(d, file_name(d, 7))  # stale: served from the view, starts the re-list
    counter.armed = True
    await ns.quiesce()
    counter.armed = False
    assert ns.stats.relists == DIRS
    assert store.requests["list"] - lists == 2 * DIRS  # their LIST pages, nothing else
    assert set(store.requests) == {"list"}
    assert counter.built == 0
    for dd, (cols, col) in zip(dirs, before, strict=True):  # the same objects, untouched
        assert dd.cols is cols and dd.cookies is not None and dd.cookies.col is col
    assert (ns.stats.entries, ns.stats.bytes) == stats
    assert [d.verf for d in dirs] == verfs  # no change: cached READDIR pages stay valid
    # ... and the views still answer
    e = await ns.lookup(dir_name(5), file_name(dir_name(5), 1280))
    assert e.kind is EntryKind.FILE and e.mtime_ns == 1_650_000_000 * 10**9 + 1280


async def test_a_relist_builds_only_from_the_first_difference() -> None:
    store, ns, clock = make(dirs=3, files=3000, list_page_keys=1000)
    await list_everything(ns, 3)
    a, b, c = (ns._dirs[dir_name(i)] for i in range(3))
    old = a.cols, b.cols, c.cols
    cookies_before = {
        cookie: e.name for cookie, e in (await ns.readdir(dir_name(1), 0, 3000)).entries
    }
    # one object changed on the last page of a, one removed from b, one added to c
    store.seed(f"{P}{dir_name(0)}/{file_name(dir_name(0), 2999)}", b"new")
    store.unseed(f"{P}{dir_name(1)}/{file_name(dir_name(1), 1500)}")
    store.seed(f"{P}{dir_name(2)}/zzz", b"z")
    clock.advance(61)
    for i in range(3):
        await ns.lookup(dir_name(i), file_name(dir_name(i), 0))
    await ns.quiesce()
    assert (a.cols, b.cols, c.cols) != old and all(
        x is not y for x, y in zip((a.cols, b.cols, c.cols), old, strict=True)
    )
    assert (await ns.getattr(f"{dir_name(0)}/{file_name(dir_name(0), 2999)}")).size == 3
    with pytest.raises(NotFound):
        await ns.getattr(f"{dir_name(1)}/{file_name(dir_name(1), 1500)}")
    assert (await ns.getattr(f"{dir_name(2)}/zzz")).size == 1
    assert (a.count(), b.count(), c.count()) == (3000, 2999, 3001)
    # cookies of the names that stayed are the same
    after = {cookie: e.name for cookie, e in (await ns.readdir(dir_name(1), 0, 3000)).entries}
    gone = file_name(dir_name(1), 1500)
    assert {k: v for k, v in cookies_before.items() if v != gone} == after
    for d in (a, b, c):  # a change resets the TTL
        assert d.ttl == 60.0


async def test_relists_are_spread_over_time() -> None:
    _store, ns, clock = make(files=10, background_relists=DIRS)
    await list_everything(ns)
    t0 = clock.monotonic()
    dirs = [ns._dirs[dir_name(i)] for i in range(DIRS)]
    until = sorted(d.fresh_until - t0 for d in dirs)
    ttl = 60.0
    assert until[-1] <= ttl  # never fresh longer than the TTL
    assert until[0] >= ttl * (1 - JITTER)
    assert until[-1] - until[0] > ttl * JITTER / 2  # spread over the jitter window
    # Touching every folder as time passes: re-lists start a few at a time, not all at once.
    started: list[int] = []
    for step in range(1, 13):
        clock.advance(ttl * JITTER / 10 if step > 1 else ttl * (1 - JITTER))
        before = ns.stats.relists
        for i in range(DIRS):
            await ns.lookup(dir_name(i), file_name(dir_name(i), 0))
        await ns.quiesce()
        started.append(ns.stats.relists - before)
    assert sum(started) == DIRS
    assert max(started) < DIRS // 3, started


async def test_ttl_grows_while_unchanged_and_resets_on_change() -> None:
    store, ns, clock = make(dirs=1, files=5, attr_ttl_s=10.0, attr_ttl_max_s=50.0)
    d = dir_name(0)
    await ns.lookup(d, file_name(d, 0))
    dd = ns._dirs[d]
    seen: list[float] = []
    for _ in range(5):
        clock.advance(dd.ttl + 0.01)  # just past this directory's TTL: a re-list
        await ns.lookup(d, file_name(d, 0))
        await ns.quiesce()
        seen.append(dd.ttl)
    assert seen == [20.0, 40.0, 50.0, 50.0, 50.0]
    lists = store.requests["list"]
    clock.advance(20.0)  # past attr_ttl_s, within the grown TTL: no re-list
    await ns.lookup(d, file_name(d, 0))
    await ns.quiesce()
    assert store.requests["list"] == lists
    # A change in the bucket is seen within the grown TTL, and the TTL is back at the minimum.
    store.seed(f"{P}{d}/new.JPEG", b"n")
    clock.advance(30.0 + 0.01)
    await ns.lookup(d, file_name(d, 0))
    await ns.quiesce()
    assert (await ns.lookup(d, "new.JPEG")).size == 1
    assert dd.ttl == 10.0
    # invalidate() also starts again from the minimum
    clock.advance(10.01)
    await ns.lookup(d, "new.JPEG")
    await ns.quiesce()
    assert dd.ttl == 20.0
    ns.invalidate(d)
    assert dd.ttl == 10.0


async def test_ttl_starts_from_the_age_of_the_newest_file() -> None:
    """A directory of files last modified long ago starts at age / 10 (within the bounds);
    one written recently, or one with subdirectories, at attr_ttl_s; a change still resets
    the TTL to attr_ttl_s, whatever the age of the files."""
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    now = clock.time_ns()
    for d, age_s in (("old", 86_400), ("week", 7 * 86_400), ("mid", 1_000), ("new", 5)):
        for j in range(3):
            store.seed(f"{P}{d}/f{j}", b"x", mtime_ns=now - age_s * 10**9 - j)
    store.seed(f"{P}tree/sub/f", b"x", mtime_ns=now - 86_400 * 10**9)
    store.seed(f"{P}tree/f", b"x", mtime_ns=now - 86_400 * 10**9)
    cfg = NamespaceConfig(attr_ttl_s=60.0, attr_ttl_max_s=600.0)
    ns = Namespace(store, P, clock=clock, config=cfg)
    for d in ("old", "week", "mid", "new", "tree"):
        await ns.lookup(d, "f" if d == "tree" else "f0")
    ttl = {d: ns._dirs[d].ttl for d in ("old", "week", "mid", "new", "tree")}
    assert ttl == {"old": 600.0, "week": 600.0, "mid": 100.0, "new": 60.0, "tree": 60.0}
    # Unchanged re-list of "mid": doubling and the age rule, whichever is longer.
    clock.advance(100.01)
    await ns.lookup("mid", "f0")
    await ns.quiesce()
    assert ns._dirs["mid"].ttl == 200.0
    # A removal (the newest file is still old) resets "old" to attr_ttl_s all the same, and
    # the change is seen within the TTL it had.
    store.unseed(f"{P}old/f1")
    clock.advance(600.01)
    await ns.lookup("old", "f0")
    await ns.quiesce()
    with pytest.raises(NotFound):
        await ns.lookup("old", "f1")
    assert ns._dirs["old"].ttl == 60.0


async def test_background_relists_are_bounded() -> None:
    """Past the TTL, at most ``background_relists`` re-lists run at once (the others wait for
    a slot, served from their views); past the hard limit a caller's re-list is not held."""
    store, ns, clock = make(dirs=10, files=5, background_relists=2)
    await list_everything(ns, 10)
    clock.advance(61.0)
    gate = store.hold("list")
    for i in range(10):
        e = await ns.lookup(dir_name(i), file_name(dir_name(i), 0))  # stale: served at once
        assert e.kind is EntryKind.FILE
    assert ns.stats.relists == 2 and sum(d.listing is not None for d in ns._dirs.values()) == 2
    gate.open()
    await ns.quiesce()
    for i in range(10):
        await ns.lookup(dir_name(i), file_name(dir_name(i), 0))
    await ns.quiesce()
    assert ns.stats.relists == 4  # two more, now that the slots are free
    # Past the hard limit the caller waits for its own re-list, slots or not.
    gate = store.hold("list")
    clock.advance(10 * 60.0 + 1)
    waiting = asyncio.ensure_future(ns.lookup(dir_name(0), file_name(dir_name(0), 1)))
    await asyncio.sleep(0)
    assert not waiting.done() and ns._dirs[dir_name(0)].listing is not None
    gate.open()
    assert (await waiting).kind is EntryKind.FILE


async def test_no_growth_with_attr_ttl_max_zero() -> None:
    _store, ns, clock = make(dirs=1, files=3, attr_ttl_s=10.0, attr_ttl_max_s=0.0)
    d = dir_name(0)
    await ns.lookup(d, file_name(d, 0))
    for _ in range(3):
        clock.advance(10.01)
        await ns.lookup(d, file_name(d, 0))
        await ns.quiesce()
        assert ns._dirs[d].ttl == 10.0
    assert ns.stats.relists == 3
    assert NamespaceConfig(attr_ttl_s=60.0).ttl_max_s() == 300.0
    assert NamespaceConfig(attr_ttl_s=60.0, attr_ttl_max_s=30.0).ttl_max_s() == 60.0


class PagedStore(GatedStore):
    """A ``GatedStore`` that numbers each listing's pages (``page[prefix]``, 0 for the first),
    so that a gate can hold a listing from its page N on."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock=clock)
        self.page: dict[str, int] = {}

    async def list_page(self, prefix: str, **kw: Any) -> ListPage:
        self.page[prefix] = 0 if kw.get("token") is None else self.page.get(prefix, 0) + 1
        return await super().list_page(prefix, **kw)


async def test_read_getattr_does_not_wait_for_a_relist() -> None:
    clock = FakeClock()
    store = PagedStore(clock)
    for j in range(3000):
        store.seed(f"{P}d/f{j:05d}", b"x")
    ns = Namespace(store, P, clock=clock, config=NamespaceConfig(attr_ttl_s=60.0))
    assert (await ns.getattr("d/f02500", current=True)).size == 1
    store.unseed(f"{P}d/f00010")  # deleted in the bucket, on the re-list's first page
    gate = store.hold("list", lambda prefix: store.page[prefix] >= 1)
    clock.advance(61)
    # The view is past its TTL: served at once, without waiting for the LIST.
    e = await asyncio.wait_for(ns.getattr("d/f02500", current=True), 1.0)
    assert e.size == 1
    for _ in range(100):
        if gate.waiting:
            break
        await asyncio.sleep(0)
    assert gate.waiting == 1  # the re-list started, and is stuck on its second page
    assert (await asyncio.wait_for(ns.getattr("d/f02999", current=True), 1.0)).size == 1
    # The re-list has passed f00010: a READ (current) sees it gone; other calls see the view.
    with pytest.raises(NotFound):
        await asyncio.wait_for(ns.getattr("d/f00010", current=True), 1.0)
    assert (await ns.getattr("d/f00010")).size == 1
    assert (await ns.lookup("d", "f00010")).size == 1
    gate.open()
    await ns.quiesce()
    with pytest.raises(NotFound):
        await ns.lookup("d", "f00010")
    assert ns.stats.relists == 1


async def test_a_change_is_seen_within_the_documented_bound() -> None:
    """The bound (docs/operations.md): a change is served at most the directory's TTL (at most
    ``attr_ttl_max_s``) after its last listing, plus the one re-list the next call starts; a
    view older than the hard limit is never served."""
    store, ns, clock = make(dirs=1, files=20, attr_ttl_s=10.0, attr_ttl_max_s=40.0)
    d = dir_name(0)
    for _ in range(4):  # grow the TTL to its maximum
        await ns.lookup(d, file_name(d, 0))
        await ns.quiesce()
        clock.advance(ns._dirs[d].ttl + 0.01)
    await ns.lookup(d, file_name(d, 0))
    await ns.quiesce()
    dd = ns._dirs[d]
    assert dd.ttl == 40.0
    store.unseed(f"{P}{d}/{file_name(d, 3)}")
    clock.advance(40.0)  # the TTL (at most) after the last listing started
    await ns.lookup(d, file_name(d, 0))  # answered from the view; starts the re-list
    await ns.quiesce()
    with pytest.raises(NotFound):
        await ns.getattr(f"{d}/{file_name(d, 3)}", current=True)
    # Nobody touches the directory past the hard limit: the next call waits for a listing.
    store.unseed(f"{P}{d}/{file_name(d, 4)}")
    hard = max(10.0 * 10.0, 2 * 40.0)
    clock.advance(hard + 1)
    with pytest.raises(NotFound):
        await ns.getattr(f"{d}/{file_name(d, 4)}", current=True)


async def test_cookies_and_mutations_over_columns() -> None:
    store, ns, clock = make(dirs=1, files=50)
    d = dir_name(0)
    first = await ns.readdir(d, 0, 20)
    cookie = first.entries[-1][0]
    # gateway writes land on top of the columns at once, then are folded into new columns
    ns.upsert(store.seed(f"{P}{d}/{file_name(d, 19)}a", b"abc"))
    ns.remove(f"{d}/{file_name(d, 20)}")
    assert (await ns.lookup(d, f"{file_name(d, 19)}a")).size == 3
    with pytest.raises(NotFound):
        await ns.lookup(d, file_name(d, 20))
    nxt = await ns.readdir(d, cookie, 2)
    assert [e.name for _, e in nxt.entries] == [f"{file_name(d, 19)}a", file_name(d, 21)]
    assert nxt.verifier != first.verifier
    assert ns._dirs[d].count() == 50 == ns.stats.entries
    # a re-list of the same bucket content is unchanged (the writes are in the bucket)
    cols = ns._dirs[d].cols
    store.unseed(f"{P}{d}/{file_name(d, 20)}")
    clock.advance(61)
    await ns.lookup(d, file_name(d, 0))
    await ns.quiesce()
    assert ns._dirs[d].cols is cols
    assert ns._dirs[d].ttl == 120.0


# -- memory -----------------------------------------------------------------------------------


async def test_budget_counts_what_the_index_holds() -> None:
    """``stats.bytes`` within 25 % of what tracemalloc sees the index allocate (20 folders of
    1,281 ImageNet-like names, read whole), and about 80 B an entry."""
    _store, ns, _ = make(dirs=20)
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        await list_everything(ns, 20)
        gc.collect()
        traced = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    entries = 20 * FILES
    assert ns.stats.entries == entries + 20  # and the root's 20 folders
    assert 0.75 < ns.stats.bytes / traced < 1.25, (ns.stats.bytes, traced)
    assert ns.stats.bytes / entries < 100


def test_gc_sees_a_few_objects_per_directory() -> None:
    cols = Columns(
        [f"n{i:05d}.JPEG" for i in range(5000)],
        bytes(5000),
        [1] * 5000,
        [2] * 5000,
        ["0" * 32] * 5000,
    )
    assert not any(map(gc.is_tracked, (cols.names, cols.kinds, cols.etags)))
    assert cols.etag_offs is None and cols.etag_odd is None  # 16 raw bytes a row


# -- columns -----------------------------------------------------------------------------------


def info(key: str, size: int = 1, etag: str = "0" * 32, mtime: int = 5) -> ObjectInfo:
    return ObjectInfo(key, size, etag, mtime)


def test_columns_find_entries_and_etag_forms() -> None:
    names = ["a", "a b", "z", "é", "日本", "😀"]
    hexes = [f"{i:02x}" + "cd" * 15 for i in range(6)]
    for etags, mode in (
        (hexes, "raw"),
        ([f'"{h}"' for h in hexes], "raw quoted"),
        ([*hexes[:5], "abc-2"], "odd"),
        (["1a-2b-3c", "x", "y", "z", "w", "v"], "strings"),
        ([h.upper() for h in hexes], "strings"),
    ):
        cols = Columns(names, bytes([0, 0, 1, 0, 0, 0]), [1, 2, 0, 4, 5, 6], [7] * 6, etags)
        for r, n in enumerate(names):
            assert cols.find(n) == r and cols.name(r) == n
            e = cols.entry(r, n, f"d/{n}", lambda n, p: Entry(n, p, EntryKind.DIR, 0, 0, 0, ""))
            if n == "z":
                assert e.kind is EntryKind.DIR
            else:
                assert (e.kind, e.size, e.etag) == (EntryKind.FILE, cols.sizes[r], etags[r])
        assert cols.find("b") == -1 and cols.find("") == -1 and cols.find("\udcff") == -1
        assert cols.names_of(1, 4) == names[1:4] and cols.names_of(2, 2) == []
        assert cols.after("a") == 1 and cols.after("b") == 2 and cols.after("😀") == 6
        if mode.startswith("raw"):
            assert cols.etag_offs is None and cols.etag_odd is None
        elif mode == "odd":
            assert cols.etag_odd == {5: "abc-2"}
        else:
            assert cols.etag_offs is not None


def test_same_files_compares_exactly() -> None:
    names = [f"f{i:03d}" for i in range(10)]
    etags = [f"{i:02x}" + "ab" * 15 for i in range(10)]
    cols = Columns(names, bytes(10), list(range(10)), [5] * 10, etags)
    objs = [info(f"p/{n}", i, etags[i]) for i, n in enumerate(names)]
    assert cols.same_files(0, objs, "p/")
    assert cols.same_files(3, objs[3:7], "p/")
    assert not cols.same_files(4, objs[3:7], "p/")
    assert not cols.same_files(8, [*objs[8:], info("p/f010")], "p/")
    bad = [
        [*objs[:4], info("p/f004", 99, etags[4]), *objs[5:]],  # size
        [*objs[:4], info("p/f004", 4, etags[5]), *objs[5:]],  # etag
        [*objs[:4], info("p/f004", 4, etags[4], 6), *objs[5:]],  # mtime
        [*objs[:4], info("q/f004", 4, etags[4]), *objs[5:]],  # another prefix
        [*objs[:4], info("p/f004\0p/f005", 4, etags[4]), *objs[6:]],  # NUL in a key
        [*objs[:4], info("p/f004", 4, etags[4].upper()), *objs[5:]],
        [*objs[:4], info("p/f004", 4, etags[4] + " "), *objs[5:]],
    ]
    for objs2 in bad:
        assert not cols.same_files(0, objs2, "p/")
    meta = ObjectInfo("p/f000", 0, etags[0], 5, {"mode": "600"})
    assert not cols.same_files(0, [meta], "p/")
    q = Columns(names, bytes(10), list(range(10)), [5] * 10, [f'"{e}"' for e in etags])
    qobjs = [info(f"p/{n}", i, f'"{etags[i]}"') for i, n in enumerate(names)]
    assert q.same_files(0, qobjs, "p/")
    assert not q.same_files(0, [info("p/f000", 0, f'""{etags[0][:-1]}"')], "p/")


def test_fold_applies_mutations() -> None:
    cols = Columns(["a", "b", "c"], bytes([0, 1, 0]), [1, 0, 3], [1, 0, 3], ["e1", "", "e3"])
    e = Entry("bb", "bb", EntryKind.FILE, 7, 8, 8, "e7")
    new = fold(cols, {"a": None, "bb": e, "c": Entry("c", "c", EntryKind.DIR, 0, 0, 0, "")})
    assert new.names_of(0, new.n) == ["b", "bb", "c"]
    assert [new.kind(r) for r in range(3)] == [EntryKind.DIR, EntryKind.FILE, EntryKind.DIR]
    assert new.sizes[1] == 7 and new.etag(1) == "e7"
    assert fold(cols, {}) is cols
    assert new.equal(
        fold(cols, {"a": None, "bb": e, "c": Entry("c", "c", EntryKind.DIR, 0, 0, 0, "")})
    )
    assert not new.equal(cols)


async def test_local_backend_etags_relist_unchanged(tmp_path: Path) -> None:
    """The local backend's ETags ("inode-size-mtime") are kept as strings; an unchanged re-list
    of a file:// export keeps its columns too, a touched file is seen."""
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
        for j in range(300):
            (tmp_path / d / f"{j:04d}.jpg").write_bytes(b"x" * j)
    clock = FakeClock()
    store = LocalStore(tmp_path, workers=2)
    # The re-list itself: behind a wrapper the store's change notification (which would skip
    # the re-list of "a") is not seen, so every TTL re-lists.
    cfg = NamespaceConfig(list_page_keys=100)
    ns = Namespace(StoreWrapper(store), "", clock=clock, config=cfg)
    try:
        for d in ("a", "b"):
            assert (await ns.lookup(d, "0007.jpg")).size == 7
        await ns.quiesce()
        a, b = ns._dirs["a"], ns._dirs["b"]
        assert a.cols is not None and a.cols.etag_offs is not None
        old = a.cols, b.cols
        (tmp_path / "b" / "0150.jpg").write_bytes(b"changed")
        clock.advance(61)
        for d in ("a", "b"):
            await ns.lookup(d, "0001.jpg")
        await ns.quiesce()
        assert a.cols is old[0] and b.cols is not old[1]
        assert (await ns.lookup("b", "0150.jpg")).size == 7
        assert (a.ttl, b.ttl) == (120.0, 60.0)
    finally:
        await ns.close()
        await store.close()


async def test_a_client_reading_folders_in_order_has_the_next_ones_listed_ahead() -> None:
    """READDIR of a folder from the top (a client's) lists the next ``list_ahead`` sibling
    folders never listed, in the background: a client walking the tree in order (ls -R,
    ImageFolder) finds each folder listed or being listed. Not for a READDIR that resumes at a
    cookie, not for the gateway's own walks, not with list_ahead = 0."""
    store, ns, _clock = make(dirs=6, files=3, list_ahead=2)
    await ns.readdir_rows("", 0, client=True)  # the root: no parent to read ahead in
    assert ns.stats.listed_ahead == 0
    lists = store.requests["list"]
    await ns.readdir_rows(dir_name(0), 0, client=True)
    assert ns.stats.listed_ahead == 2
    await ns.quiesce()
    assert store.requests["list"] - lists == 3
    assert all(ns._dirs[dir_name(i)].cols is not None for i in (1, 2))
    # No watcher (NO_WATCHER): nobody to announce them to, so peek answers from them at once.
    assert not any(ns._dirs[dir_name(i)].unannounced for i in (1, 2))
    await ns.readdir_rows(dir_name(1), 0, client=True)  # already listed: only 3 is started
    await ns.quiesce()
    assert ns.stats.listed_ahead == 3 and store.requests["list"] - lists == 4
    await ns.readdir_rows(dir_name(3), 1, client=True)  # resumes at a cookie: nothing
    await ns.readdir_rows(dir_name(3), 0)  # the gateway's own walk: nothing
    await ns.quiesce()
    assert ns.stats.listed_ahead == 3 and dir_name(4) not in ns._dirs
    await ns.readdir_rows(dir_name(5), 0, client=True)  # the last folder: none after it
    assert ns.stats.listed_ahead == 3

    store, ns, _clock = make(dirs=4, files=3, list_ahead=0)
    await ns.readdir_rows("", 0, client=True)
    await ns.readdir_rows(dir_name(0), 0, client=True)
    assert ns.stats.listed_ahead == 0 and dir_name(1) not in ns._dirs


async def test_folders_listed_ahead_reach_the_watcher_on_first_use() -> None:
    """The data prefetcher hears of a folder listed ahead only once a client uses it: an
    ``ls`` of one folder does not make it fetch the files of the next eight."""

    class Watcher:
        def __init__(self) -> None:
            self.listed_dirs: list[str] = []

        def listed(self, store: object, key_prefix: str, cols: Columns) -> None:
            self.listed_dirs.append(key_prefix)

        def dropped(self, store: object, key_prefix: str) -> None:
            pass

        def browsing(self) -> None:
            pass

    w = Watcher()
    _store, ns, _clock = make(dirs=4, files=3, list_ahead=2, watcher=w)
    await ns.readdir_rows("", 0, client=True)
    await ns.readdir_rows(dir_name(0), 0, client=True)
    await ns.quiesce()
    assert ns.stats.listed_ahead == 2
    assert w.listed_dirs == [P, f"{P}{dir_name(0)}/"]
    assert ns._dirs[dir_name(2)].unannounced
    await ns.lookup(dir_name(2), file_name(dir_name(2), 1))  # first use of a folder listed ahead
    assert w.listed_dirs[-1] == f"{P}{dir_name(2)}/" and len(w.listed_dirs) == 3
    await ns.lookup(dir_name(2), file_name(dir_name(2), 2))  # told once
    await ns.readdir_rows(dir_name(1), 0, client=True)
    await ns.quiesce()
    assert w.listed_dirs[3:] == [f"{P}{dir_name(1)}/"]
