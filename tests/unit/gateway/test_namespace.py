"""The index layer over the in-memory store: request counts, TTLs, budget, cookies, hooks.

Also the fake store's ListObjectsV2 semantics, which every request-count assertion relies on.
"""

from __future__ import annotations

import asyncio
import random

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
)

from gateway.backend.base import (
    AccessDeniedError,
    BackendError,
    BackendUnavailable,
    PreconditionFailed,
)
from gateway.backend.memory import MemoryStore
from gateway.clock import FakeClock
from gateway.errors import (
    AccessDenied,
    BadCookie,
    Busy,
    IoError,
    NameTooLong,
    NotDirectory,
    NotFound,
    StaleHandle,
)
from gateway.namespace import (
    DIR_SIZE,
    FIRST_COOKIE,
    DirPage,
    Entry,
    EntryKind,
    Namespace,
    NamespaceConfig,
    bad_name,
    cookie_hash,
    parse_metadata,
)

P = "exp/"


def make(
    *,
    prefix: str = P,
    latency: float = 0.0,
    **cfg: object,
) -> tuple[MemoryStore, Namespace, FakeClock]:
    clock = FakeClock()
    store = MemoryStore(clock=clock, latency_s=latency)
    ns = Namespace(store, prefix, clock=clock, config=NamespaceConfig(**cfg))  # type: ignore[arg-type]
    return store, ns, clock


async def readdir_all(ns: Namespace, path: str, page: int = 1000) -> list[tuple[int, Entry]]:
    out: list[tuple[int, Entry]] = []
    cookie = 0
    while True:
        res = await ns.readdir(path, cookie, page)
        out += res.entries
        if res.eof:
            return out
        cookie = res.entries[-1][0]


# -- the fake store --------------------------------------------------------------------------


async def list_all(store: MemoryStore, prefix: str, **kw: object) -> tuple[list[str], list[str]]:
    objs: list[str] = []
    cps: list[str] = []
    token = None
    while True:
        page = await store.list_page(prefix, token=token, **kw)  # type: ignore[arg-type]
        objs += [o.key for o in page.objects]
        cps += page.prefixes
        if page.next_token is None:
            return objs, cps
        token = page.next_token


async def test_memory_list_order_delimiter_and_paging():
    s = MemoryStore()
    keys = ["a", "a-x", "a.jpg", "a/", "a/1", "a/2/3", "a0", "b c", "é", "z/😀", "z/\uffff"]
    for k in keys:
        s.seed(k)
    # UTF-8 byte order (0x2D '-' < 0x2E '.' < 0x2F '/' < 0x30 '0').
    objs, cps = await list_all(s, "", delimiter=None)
    assert objs == sorted(keys, key=lambda k: k.encode())
    objs, cps = await list_all(s, "", delimiter="/")
    assert objs == ["a", "a-x", "a.jpg", "a0", "b c", "é"]
    assert cps == ["a/", "z/"]
    # Every common prefix counts as one key, pages resume after a rolled-up prefix.
    for mk in (1, 2, 3, 5):
        assert await list_all(s, "", delimiter="/", max_keys=mk) == (objs, cps)
    page = await s.list_page("", max_keys=4)
    assert [o.key for o in page.objects] == ["a", "a-x", "a.jpg"]
    assert page.prefixes == ["a/"]
    assert page.next_token is not None
    last = await s.list_page("", max_keys=8)
    assert last.next_token is None  # exactly 8 items: not truncated
    objs2, cps2 = await list_all(s, "a/", delimiter="/")
    assert objs2 == ["a/", "a/1"] and cps2 == ["a/2/"]
    objs3, _ = await list_all(s, "", delimiter="/", start_after="a0")
    assert objs3 == ["b c", "é"]
    assert (await s.list_page("a", delimiter="/", max_keys=2)).next_token is not None
    page = await s.list_page("", max_keys=0)
    assert page.objects == [] and page.next_token is None
    with pytest.raises(BackendError):
        await s.list_page("", token="!!!")
    assert s.requests["list"] >= 10


async def test_memory_objects_counts_latency_failures():
    clock = FakeClock()
    s = MemoryStore(clock=clock, latency_s={"head": 0.001})
    info = await s.put("k", b"hello world", {"mode": "644"})
    assert (await s.head("k")).metadata == {"mode": "644"}
    page = await s.list_page("")
    assert page.objects[0].metadata == {}  # listings carry no user metadata, as on S3
    got = await s.get("k", 6, 11, if_match=info.etag)
    assert got.data == b"world" and got.size == 11
    with pytest.raises(PreconditionFailed):
        await s.get("k", if_match='"nope"')
    uid = await s.create_multipart("m")
    e1 = await s.upload_part("m", uid, 1, b"ab")
    e2 = await s.upload_part("m", uid, 2, b"cd")
    done = await s.complete_multipart("m", uid, [(1, e1), (2, e2)])
    assert done.etag.endswith('-2"') and (await s.get("m")).data == b"abcd"
    await s.copy("m", "n")
    await s.delete("m")
    await s.delete("m")
    assert s.keys() == ["k", "n"]
    assert s.requests["head"] == 1 and s.requests["delete"] == 2
    s.fail = lambda op, key: BackendUnavailable(key) if op == "get" else None
    with pytest.raises(BackendUnavailable):
        await s.get("k")


# -- prefetch and request counts -------------------------------------------------------------


async def test_1300_lookups_cost_two_lists_and_no_head():
    store, ns, _ = make()
    names = [f"n01440764_{i:05d}.JPEG" for i in range(1300)]
    for n in names:
        store.seed(f"{P}train/n01440764/{n}", b"x" * 10)
    random.Random(1).shuffle(names)
    for n in names:
        e = await ns.lookup("train/n01440764", n)
        assert e.kind is EntryKind.FILE and e.size == 10 and e.path == f"train/n01440764/{n}"
    assert store.requests == {"list": 2}
    with pytest.raises(NotFound):
        await ns.lookup("train/n01440764", "missing.JPEG")
    with pytest.raises(NotFound):
        await ns.lookup("train/n01440764", "n01440764_99999.JPEG")
    assert store.requests == {"list": 2}
    assert ns.stats.hits == 1300 and ns.stats.negative_hits == 2
    assert ns.stats.prefetches == 1 and ns.stats.list_pages == 2


async def test_getattr_lists_parent_and_warms_siblings():
    store, ns, _ = make()
    for i in range(5):
        store.seed(f"{P}d/f{i}", b"abc")
    store.seed(f"{P}d/sub/x")
    e = await ns.getattr("d/f1")
    assert e.size == 3 and e.kind is EntryKind.FILE
    assert store.log == [("list", f"{P}d/")]
    for i in range(5):
        await ns.lookup("d", f"f{i}")
    assert (await ns.getattr("d/sub")).kind is EntryKind.DIR
    assert store.requests == {"list": 1}
    root = await ns.getattr("")
    assert root.kind is EntryKind.DIR and root.path == ""
    assert store.requests == {"list": 1}
    with pytest.raises(NotFound):
        await ns.getattr("d/nope")
    with pytest.raises(NotFound):
        await ns.getattr("nodir/nope")


async def test_concurrent_lookups_in_cold_dir_share_one_listing():
    store, ns, _ = make(latency=0.01)
    for i in range(1500):
        store.seed(f"{P}c/{i:04d}")
    results = await asyncio.gather(*(ns.lookup("c", f"{i * 15:04d}") for i in range(100)))
    assert [r.name for r in results] == [f"{i * 15:04d}" for i in range(100)]
    assert store.requests == {"list": 2}
    assert ns.stats.prefetches == 1


async def test_cancelled_waiter_does_not_cancel_listing():
    store, ns, _ = make(latency=0.01)
    store.seed(f"{P}c/a")
    t = asyncio.ensure_future(ns.lookup("c", "a"))
    await asyncio.sleep(0)
    t.cancel()
    with pytest.raises(asyncio.CancelledError):
        await t
    assert (await ns.lookup("c", "a")).name == "a"
    assert store.requests == {"list": 1}


async def test_huge_directory_targeted_lookup():
    store, ns, _ = make(latency=0.005, list_page_keys=100, huge_dir_pages=3)
    for i in range(2000):
        store.seed(f"{P}h/f{i:05d}")
    store.seed(f"{P}h/zz/inner")
    # A name on the first page is answered as soon as that page is in.
    assert (await ns.lookup("h", "f00001")).name == "f00001"
    assert ns.stats.list_pages == 1
    while ns.stats.list_pages <= 3:  # noqa: ASYNC110
        await asyncio.sleep(0.001)
    pages_before = ns.stats.list_pages
    e = await ns.lookup("h", "f01999")
    assert e.kind is EntryKind.FILE
    d = await ns.lookup("h", "zz")
    assert d.kind is EntryKind.DIR
    with pytest.raises(NotFound):
        await ns.lookup("h", "f09999")
    assert ns.stats.targeted_lookups == 3
    assert ns.stats.list_pages < 20  # did not wait for the whole listing
    assert pages_before <= ns.stats.list_pages
    targeted = [k for op, k in store.log if op == "list" and k != f"{P}h/"]
    assert targeted == [f"{P}h/f01999", f"{P}h/zz", f"{P}h/f09999"]
    # The same miss again is answered from the probe cache.
    with pytest.raises(NotFound):
        await ns.lookup("h", "f09999")
    assert ns.stats.targeted_lookups == 3
    await ns.quiesce()
    assert ns.stats.list_pages == 21
    with pytest.raises(NotFound):
        await ns.lookup("h", "f09998")
    assert ns.stats.targeted_lookups == 3
    assert store.requests.keys() == {"list"}


async def test_targeted_lookup_sort_order_name_dash_dot_slash():
    store, ns, _ = make(latency=0.002, list_page_keys=10, huge_dir_pages=1, targeted_max_keys=2)
    for i in range(100):
        store.seed(f"{P}h/a{i:03d}")
    for k in ("h/name-1", "h/name-2", "h/name.jpg", "h/name/x", "h/other-1", "h/other.jpg"):
        store.seed(P + k)
    store.seed(f"{P}h/other")
    await ns.lookup("h", "a000")
    while ns.stats.list_pages <= 1:  # noqa: ASYNC110
        await asyncio.sleep(0.001)
    assert (await ns.lookup("h", "name")).kind is EntryKind.DIR  # needs the second request
    assert (await ns.lookup("h", "other")).kind is EntryKind.FILE
    assert ns.stats.targeted_lookups == 4
    assert (await ns.lookup("h", "name.jpg")).kind is EntryKind.FILE
    await ns.quiesce()


async def test_partial_mode_after_max_list_pages():
    store, ns, _ = make(list_page_keys=10, max_list_pages=3)
    for i in range(100):
        store.seed(f"{P}big/{i:03d}")
    e = await ns.lookup("big", "005")
    assert e.name == "005"
    assert ns.stats.list_pages == 3 and ns.stats.truncated_dirs == 1
    with pytest.raises(NotFound):
        await ns.lookup("big", "00x")  # inside the listed range: negative from memory
    assert ns.stats.targeted_lookups == 0
    assert (await ns.lookup("big", "077")).name == "077"  # beyond: targeted
    assert ns.stats.targeted_lookups == 1
    res = await ns.readdir("big", 0, 1000)
    assert [e.name for _, e in res.entries] == [f"{i:03d}" for i in range(30)]
    assert res.eof and res.truncated


# -- keys and attributes ---------------------------------------------------------------------


async def test_awkward_keys():
    store, ns, _ = make()
    good = ["with space.jpg", "ünïcødé.png", "日本語", "emoji😀", "x" * 255, "-dash", "a.b"]
    for n in good:
        store.seed(f"{P}w/{n}", b"1")
    store.seed(f"{P}w/marker/")  # empty directory marker
    store.seed(f"{P}w/both", b"file")  # both an object and a prefix: shown as the directory
    store.seed(f"{P}w/both/child")
    store.seed(f"{P}w/dironly/")  # marker and children
    store.seed(f"{P}w/dironly/c")
    bad = [
        f"{P}w//empty",
        f"{P}w/./dot",
        f"{P}w/../up",
        f"{P}w/.",
        f"{P}w/..",
        f"{P}w/" + "y" * 256,
        f"{P}w/nul\0byte",
        f"{P}w/bad\udcffutf8",
    ]
    for k in bad:
        store.seed(k)
    ents = {e.name: e for _, e in await readdir_all(ns, "w")}
    assert set(ents) == {*good, "marker", "both", "dironly"}
    for n in good:
        assert (await ns.lookup("w", n)).kind is EntryKind.FILE
    assert ents["marker"].kind is EntryKind.DIR and ents["both"].kind is EntryKind.DIR
    assert ents["both"].size == DIR_SIZE
    assert ns.stats.skipped_keys == len(bad)
    assert (await ns.readdir("w/marker", 0)).entries == []
    assert [e.name for _, e in (await ns.readdir("w/both", 0)).entries] == ["child"]
    assert [e.name for _, e in (await ns.readdir("w/dironly", 0)).entries] == ["c"]
    with pytest.raises(NameTooLong):
        await ns.lookup("w", "z" * 256)
    for n in ("", "a/b", "nul\0"):
        with pytest.raises(NotFound):
            await ns.lookup("w", n)


async def test_dot_dotdot_notdir_stale():
    store, ns, _ = make()
    store.seed(f"{P}a/b/file", b"12")
    assert (await ns.lookup("a/b", ".")).path == "a/b"
    assert (await ns.lookup("a/b", "..")).path == "a"
    assert (await ns.lookup("a", "..")).path == ""
    assert (await ns.lookup("", "..")).path == ""
    assert (await ns.lookup("", ".")).path == ""
    with pytest.raises(NotDirectory):
        await ns.lookup("a/b/file", "x")
    with pytest.raises(NotDirectory):
        await ns.readdir("a/b/file", 0)
    with pytest.raises(NotDirectory):
        await ns.lookup("a/b/file", ".")
    # A fresh namespace (no parent cached) finds out through the parent's listing.
    store2, ns2, _ = make()
    store2.seed(f"{P}a/file")
    with pytest.raises(NotDirectory):
        await ns2.lookup("a/file", "x")
    with pytest.raises(StaleHandle):
        await ns2.lookup("gone", "x")
    with pytest.raises(StaleHandle):
        await ns2.readdir("gone/deeper", 0)
    assert (await ns2.readdir("", 0)).entries[0][1].name == "a"  # root always exists


async def test_metadata_from_head_and_symlinks():
    store, ns, _ = make()
    store.seed(
        f"{P}m/link",
        b"",
        metadata={"symlink-target": "../target", "mode": "777", "uid": "5", "gid": "6"},
    )
    store.seed(f"{P}m/f", b"abc", metadata={"mtime": "1600000000.5", "mode": "100640"})
    listed = await ns.lookup("m", "link")
    assert listed.kind is EntryKind.FILE and listed.mode is None  # listings carry no metadata
    assert store.requests == {"list": 1}
    e = await ns.refresh("m/link")
    assert e.kind is EntryKind.SYMLINK and e.symlink_target == "../target"
    assert (e.mode, e.uid, e.gid) == (0o777, 5, 6)
    assert (await ns.lookup("m", "link")).kind is EntryKind.SYMLINK
    f = await ns.refresh("m/f")
    assert f.mtime_ns == 1_600_000_000_500_000_000 and f.mode == 0o640
    assert store.requests == {"list": 1, "head": 2}
    assert (await ns.refresh("m")).kind is EntryKind.DIR
    store.unseed(f"{P}m/f")
    with pytest.raises(NotFound):
        await ns.refresh("m/f")
    with pytest.raises(NotFound):
        await ns.lookup("m", "f")


def test_parse_metadata():
    assert parse_metadata({}) == (None, None, None, None, None)
    assert parse_metadata({"mtime": "1700000000"})[3] == 1_700_000_000 * 10**9
    assert parse_metadata({"mtime": "1700000000123456789"})[3] == 1_700_000_000_123_456_789
    assert parse_metadata({"mtime": "nan", "mode": "9z", "uid": "-1", "gid": "x"}) == (
        None,
        None,
        None,
        None,
        None,
    )
    assert parse_metadata({"mode": "0755"})[0] == 0o755


def test_bad_name_and_cookie_hash():
    assert bad_name("") and bad_name(".") and bad_name("..") and bad_name("a/b")
    assert bad_name("\udcff") and bad_name("a\0") and bad_name("é" * 128)
    assert not bad_name("é" * 127) and not bad_name("...")
    assert cookie_hash("a") == cookie_hash("a") >= FIRST_COOKIE
    assert cookie_hash("a") != cookie_hash("a", 1)
    assert cookie_hash("a") < 2**63


async def test_directory_times_are_stable():
    store, ns, clock = make(attr_ttl_s=1.0)
    store.seed(f"{P}d/sub/x")
    t1 = (await ns.getattr("d/sub")).mtime_ns
    clock.advance(100)
    await ns.quiesce()
    t2 = (await ns.getattr("d/sub")).mtime_ns
    await ns.quiesce()
    assert t1 == t2 == (await ns.getattr("d")).mtime_ns
    info = store.seed(f"{P}d/sub/y")
    ns.upsert(info)
    t3 = (await ns.getattr("d/sub")).mtime_ns
    assert t3 > t2


# -- TTL ---------------------------------------------------------------------------------------


async def test_ttl_relist_serves_old_view_then_new():
    store, ns, clock = make(attr_ttl_s=10.0)
    store.seed(f"{P}d/old", b"1")
    await ns.lookup("d", "old")
    store.seed(f"{P}d/new", b"2")  # changed behind our back
    store.unseed(f"{P}d/old")
    clock.advance(5)
    with pytest.raises(NotFound):
        await ns.lookup("d", "new")
    assert store.requests == {"list": 1}
    clock.advance(6)  # past the TTL: the old view is served, a re-list starts
    assert (await ns.lookup("d", "old")).name == "old"
    with pytest.raises(NotFound):
        await ns.lookup("d", "new")
    await ns.quiesce()
    assert store.requests == {"list": 2} and ns.stats.relists == 1
    assert (await ns.lookup("d", "new")).size == 1
    with pytest.raises(NotFound):
        await ns.getattr("d/old")  # the handler maps this to STALE


async def test_hard_expiry_waits_for_relist():
    store, ns, clock = make(attr_ttl_s=1.0, hard_ttl_factor=10.0)
    store.seed(f"{P}d/a")
    await ns.lookup("d", "a")
    store.seed(f"{P}d/b")
    clock.advance(11)
    assert (await ns.lookup("d", "b")).name == "b"
    assert store.requests == {"list": 2}


async def test_immutable_never_expires():
    store, ns, clock = make(immutable=True)
    store.seed(f"{P}d/a")
    await ns.lookup("d", "a")
    clock.advance(10**9)
    await ns.lookup("d", "a")
    await ns.readdir("d", 0)
    assert store.requests == {"list": 1}


async def test_listing_errors_are_mapped_and_retried():
    store, ns, clock = make(attr_ttl_s=1.0)
    store.seed(f"{P}d/a")
    store.fail = lambda op, key: BackendUnavailable("slow down")
    with pytest.raises(Busy):
        await ns.lookup("d", "a")
    store.fail = None
    assert (await ns.lookup("d", "a")).name == "a"
    # A failed background re-list keeps the old view.
    store.fail = lambda op, key: BackendError("boom")
    clock.advance(2)
    assert (await ns.lookup("d", "a")).name == "a"
    await ns.quiesce()
    assert ns.stats.list_errors == 2
    assert (await ns.lookup("d", "a")).name == "a"
    store.fail = None


async def test_failed_first_listing_reaches_every_waiter():
    store, ns, _ = make(latency=0.005)
    store.seed(f"{P}d/a")
    store.fail = lambda op, key: AccessDeniedError(key)
    got = await asyncio.gather(*(ns.lookup("d", "a") for _ in range(10)), return_exceptions=True)
    assert all(isinstance(g, AccessDenied) for g in got)
    assert store.requests == {"list": 1}
    store.fail = lambda op, key: BackendError("io")
    with pytest.raises(IoError):
        await ns.readdir("d", 0)
    store.fail = None
    assert len((await ns.readdir("d", 0)).entries) == 1


# -- budget ------------------------------------------------------------------------------------


async def test_eviction_under_tiny_budget():
    store, ns, _ = make(memory_bytes=20_000)
    for d in range(10):
        for i in range(10):
            store.seed(f"{P}d{d}/f{i}")
    for d in range(10):
        await ns.lookup(f"d{d}", "f0")
        assert ns.stats.bytes <= 20_000 or len(ns.cached_dirs()) == 1
    assert ns.stats.evictions > 0
    assert "d9" in ns.cached_dirs() and "d0" not in ns.cached_dirs()
    assert ns.stats.entries == sum(ns._dirs[p].count() for p in ns.cached_dirs())
    before = store.requests["list"]
    await ns.lookup("d0", "f1")  # evicted: listed again
    assert store.requests["list"] == before + 1


async def test_dir_being_listed_is_not_evicted():
    store, ns, _ = make(memory_bytes=5_000, list_page_keys=5, latency=0.001)
    for i in range(40):
        store.seed(f"{P}big/{i:03d}")
    store.seed(f"{P}small/x")
    t = asyncio.ensure_future(ns.readdir("big", 0))
    await asyncio.sleep(0.003)
    await ns.lookup("small", "x")
    res = await t
    assert len(res.entries) == 40


# -- READDIR cookies ---------------------------------------------------------------------------


async def test_readdir_cookies_paging_and_verifier():
    store, ns, _ = make()
    names = [f"f{i:03d}" for i in range(50)]
    for n in names:
        store.seed(f"{P}d/{n}")
    got = await readdir_all(ns, "d", page=7)
    assert [e.name for _, e in got] == names
    cookies = [c for c, _ in got]
    assert len(set(cookies)) == 50 and min(cookies) >= FIRST_COOKIE
    assert cookies[10] == cookie_hash("f010")
    first = await ns.readdir("d", 0, 5)
    again = await ns.readdir("d", cookies[4], 5)
    assert [e.name for _, e in again.entries] == names[5:10] and not again.eof
    with pytest.raises(BadCookie):
        await ns.readdir("d", 12345)
    # A change moves the verifier; the old one still works while its cookie resolves.
    ns.upsert(store.seed(f"{P}d/f004a"))
    res = await ns.readdir("d", cookies[4], 2)
    assert res.verifier != first.verifier
    assert [e.name for _, e in res.entries] == ["f004a", "f005"]
    # Resuming from a removed name continues after it.
    ns.remove("d/f010")
    res = await ns.readdir("d", cookies[10], 1)
    assert res.entries[0][1].name == "f011"
    assert (await ns.readdir("d", 1, 1)).entries[0][1].name == "f000"  # "." cookie
    assert store.requests == {"list": 1}


async def test_cookie_collisions_are_probed(monkeypatch: pytest.MonkeyPatch) -> None:
    import gateway.namespace.cookies as cookies

    def weak(name: str, salt: int = 0) -> int:  # every name collides with many others
        return FIRST_COOKIE + len(name) % 3 + 10 * salt

    monkeypatch.setattr(cookies, "cookie_hash", weak)
    store, ns, _ = make()
    names = [f"{'x' * (i % 5)}{i:02d}" for i in range(30)]
    for n in names:
        store.seed(f"{P}d/{n}")
    got = await readdir_all(ns, "d", page=4)
    assert [e.name for _, e in got] == sorted(names)
    assert len({c for c, _ in got}) == 30
    cookie = next(c for c, e in got if e.name == "xx12")
    ns.remove("d/xx12")
    res = await ns.readdir("d", cookie, 1)
    assert res.entries[0][1].name == sorted(names)[sorted(names).index("xx12") + 1]


async def test_removed_cookies_are_bounded():
    store, ns, _ = make(removed_cookies_per_dir=3)
    for i in range(10):
        store.seed(f"{P}d/{i}")
    got = await readdir_all(ns, "d")
    for i in range(5):
        ns.remove(f"d/{i}")
    assert (await ns.readdir("d", got[4][0])).entries[0][1].name == "5"
    with pytest.raises(BadCookie):
        await ns.readdir("d", got[0][0])  # forgotten
    ns.upsert(store.seed(f"{P}d/0"))
    assert (await ns.readdir("d", got[0][0])).entries[0][1].name == "5"


async def test_cookies_survive_eviction():
    store, ns, _ = make(memory_bytes=4_000)  # one directory of 10, not two
    for i in range(10):
        store.seed(f"{P}a/{i}")
        store.seed(f"{P}b/{i}")
    page = await ns.readdir("a", 0, 3)
    await ns.readdir("b", 0)
    assert "a" not in ns.cached_dirs()
    rest = await ns.readdir("a", page.entries[-1][0], 100)
    assert [e.name for _, e in rest.entries] == [str(i) for i in range(3, 10)]


async def test_readdirplus_sequence_across_relist_5000():
    store, ns, clock = make(attr_ttl_s=30.0)
    names = [f"img_{i:05d}.jpg" for i in range(5000)]
    for n in names:
        store.seed(f"{P}big/{n}")
    seen: list[str] = []
    cookie = 0
    pages = 0
    removed: set[str] = set()
    added: set[str] = set()
    first_verf = None
    settled = 0
    while True:
        res = await ns.readdir("big", cookie, 97)
        first_verf = first_verf or res.verifier
        seen += [e.name for _, e in res.entries]
        pages += 1
        if pages == 20:
            # Half-way: the bucket changes, including the very name we resume from, and the
            # TTL runs out; the re-list happens in the background.
            rnd = random.Random(7)
            for n in [*rnd.sample(names, 300), res.entries[-1][1].name]:
                store.unseed(f"{P}big/{n}")
                removed.add(n)
            for i in range(200):
                n = f"img_{rnd.randrange(5000):05d}.jpg.new{i}"
                store.seed(f"{P}big/{n}")
                added.add(n)
            clock.advance(31)
        if pages == 22:
            # Pages 21-22 came from the old view (served while re-listing).
            await ns.quiesce()
            assert ns.stats.relists == 1
            settled = len(seen)
        if res.eof:
            break
        cookie = res.entries[-1][0]
    assert len(seen) == len(set(seen)), "an entry was returned twice"
    cut = seen[20 * 97 - 1]
    before = [n for n in names if n <= cut]
    after_survivors = [n for n in names if n > cut and n not in removed]
    assert seen[: len(before)] == before
    assert set(after_survivors) <= set(seen)
    assert not (set(seen) - set(names) - added)
    assert not (set(seen[settled:]) & removed)
    assert set(seen[settled:]) & added
    assert res.verifier != first_verf
    assert store.requests["list"] == 10


# -- mutation hooks ----------------------------------------------------------------------------


async def test_hooks_upsert_remove_without_requests():
    store, ns, _ = make()
    store.seed(f"{P}d/a")
    with pytest.raises(NotFound):
        await ns.lookup("d", "b")  # negative from the complete listing
    info = await store.put(f"{P}d/b", b"xyz")
    e = ns.upsert(info)
    assert e.size == 3
    assert (await ns.lookup("d", "b")).size == 3  # no stale negative entry
    assert [e.name for _, e in (await ns.readdir("d", 0)).entries] == ["a", "b"]
    ns.remove("d/a")
    with pytest.raises(NotFound):
        await ns.lookup("d", "a")  # no ghost
    assert [e.name for _, e in (await ns.readdir("d", 0)).entries] == ["b"]
    # New subdirectories appear in their cached ancestors.
    ns.upsert(await store.put(f"{P}d/new/deep/f", b""))
    assert (await ns.lookup("d", "new")).kind is EntryKind.DIR
    ns.upsert(await store.put(f"{P}d/mk/", b""))
    assert (await ns.lookup("d", "mk")).kind is EntryKind.DIR
    assert store.requests == {"list": 1, "put": 3}
    # Removing a directory drops its cached subtree.
    assert (await ns.lookup("d/new/deep", "f")).name == "f"
    ns.remove("d/new")
    assert not [p for p in ns.cached_dirs() if p.startswith("d/new")]
    await ns.readdir("", 0)
    ns.upsert(Entry("r", "r", EntryKind.FILE, 1, 0, 0, "e"))
    assert (await ns.lookup("", "r")).size == 1


async def test_upsert_during_listing_is_not_undone():
    store, ns, _ = make(latency=0.01)
    store.seed(f"{P}d/a")
    t = asyncio.ensure_future(ns.readdir("d", 0))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    # The listing request is in flight; the write path removes a and adds b.
    ns.remove("d/a")
    ns.upsert(Entry("b", "d/b", EntryKind.FILE, 7, 0, 0, "e"))
    res = await t
    assert [e.name for _, e in res.entries] == ["b"]
    with pytest.raises(NotFound):
        await ns.lookup("d", "a")


async def test_invalidate_forces_relist():
    store, ns, _ = make()
    store.seed(f"{P}d/a")
    store.seed(f"{P}d/s/x")
    await ns.lookup("d", "a")
    await ns.lookup("d/s", "x")
    store.unseed(f"{P}d/a")
    store.seed(f"{P}d/c")
    store.seed(f"{P}d/s/y")
    ns.invalidate("d/a")
    with pytest.raises(NotFound):
        await ns.lookup("d", "a")
    assert (await ns.lookup("d", "c")).name == "c"
    ns.invalidate("d", subtree=True)
    assert (await ns.lookup("d/s", "y")).name == "y"
    assert store.requests == {"list": 4}


async def test_invalidate_during_listing_lists_again():
    store, ns, _ = make(latency=0.01)
    store.seed(f"{P}d/a")
    t = asyncio.ensure_future(ns.lookup("d", "a"))
    await asyncio.sleep(0.001)  # the first LIST is in flight and has read the bucket
    store.seed(f"{P}d/b")
    ns.invalidate("d/b")
    assert (await ns.lookup("d", "b")).name == "b"
    assert (await t).name == "a"
    assert store.requests == {"list": 2}


# -- hypothesis: the namespace against a dict model --------------------------------------------


def join(d: str, name: str) -> str:
    return f"{d}/{name}" if d else name


NAMES = st.sampled_from(["a", "b", "a b", "é", "a-1", "a.x", "z"])
DIRS = st.sampled_from(["", "a", "b", "a/a"])


class NamespaceMachine(RuleBasedStateMachine):
    """Gateway writes (store + hook) are visible at once; outside writes (store only) are
    visible once the TTL is past its hard limit. The model is the store's file set."""

    config = NamespaceConfig(attr_ttl_s=5.0, memory_bytes=4000, list_page_keys=2)

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.clock = FakeClock()
        self.store = MemoryStore(clock=self.clock)
        self.ns = Namespace(self.store, P, clock=self.clock, config=self.config)
        self.files: dict[str, bytes] = {}
        self.dirty = False  # outside writes the namespace may not show yet
        # Implicit directories emptied by a gateway delete: S3 drops them, the namespace keeps
        # showing them until their parent is listed again (the write path decides on markers).
        self.ghosts: set[str] = set()

    def teardown(self) -> None:
        self.loop.run_until_complete(self.ns.close())
        self.loop.close()

    def run(self, coro):
        return self.loop.run_until_complete(coro)

    def _blocked(self, path: str) -> bool:
        # A file may not sit where a directory is, nor below a file.
        parts = path.split("/")
        for i in range(1, len(parts)):
            if "/".join(parts[:i]) in self.files:
                return True
        return any(f.startswith(path + "/") for f in self.files)

    def model_dirs(self) -> set[str]:
        out = {""}
        for f in self.files:
            parts = f.split("/")
            for i in range(1, len(parts)):
                out.add("/".join(parts[:i]))
        return out

    def children(self, d: str) -> dict[str, EntryKind]:
        lead = d + "/" if d else ""
        out: dict[str, EntryKind] = {}
        for f in self.files:
            if f.startswith(lead):
                rest = f[len(lead) :]
                head, sep, _ = rest.partition("/")
                out[head] = EntryKind.DIR if sep else EntryKind.FILE
        return out

    @rule(d=DIRS, name=NAMES, size=st.integers(0, 3), outside=st.booleans())
    def write(self, d: str, name: str, size: int, outside: bool) -> None:
        path = f"{d}/{name}" if d else name
        if self._blocked(path):
            return
        data = b"x" * size
        self.files[path] = data
        if outside:
            self.store.seed(P + path, data)
            self.dirty = True
        else:
            info = self.run(self.store.put(P + path, data))
            self.ns.upsert(info)

    @precondition(lambda self: bool(self.files))
    @rule(data=st.data(), outside=st.booleans())
    def delete(self, data: st.DataObject, outside: bool) -> None:
        path = data.draw(st.sampled_from(sorted(self.files)))
        before = self.model_dirs()
        del self.files[path]
        if not outside:
            self.ghosts |= before - self.model_dirs()
        self.run(self.store.delete(P + path))
        if outside:
            self.dirty = True
        else:
            self.ns.remove(path)

    @rule(hard=st.booleans())
    def expire(self, hard: bool) -> None:
        self.clock.advance(60.0 if hard else 5.5)
        if hard:
            self.dirty = False
            self.ghosts.clear()

    def _ghostly(self, path: str) -> bool:
        return any(path == g or path.startswith(g + "/") for g in self.ghosts)

    @rule()
    def settle(self) -> None:
        self.run(self.ns.quiesce())

    @rule(d=DIRS, name=NAMES)
    def lookup(self, d: str, name: str) -> None:
        path = f"{d}/{name}" if d else name

        async def go() -> Entry | type[Exception]:
            try:
                return await self.ns.lookup(d, name)
            except (NotFound, StaleHandle, NotDirectory) as exc:
                return type(exc)

        got = self.run(go())
        if self.dirty or self._ghostly(path):
            return
        if d not in self.model_dirs():
            assert got in (StaleHandle, NotDirectory), (d, name, got)
        elif path in self.files:
            assert isinstance(got, Entry) and got.kind is EntryKind.FILE, (path, got)
            assert got.size == len(self.files[path])
        elif path in self.model_dirs():
            assert isinstance(got, Entry) and got.kind is EntryKind.DIR, (path, got)
        else:
            assert got is NotFound, (path, got)

    @rule(d=DIRS, page=st.integers(1, 4))
    def readdir(self, d: str, page: int) -> None:
        if d not in self.model_dirs() and not self.dirty and not self._ghostly(d):
            return

        async def go() -> list[tuple[int, Entry]] | None:
            try:
                return await readdir_all(self.ns, d, page)
            except (StaleHandle, NotDirectory):
                return None

        got = self.run(go())
        if got is None:
            assert self.dirty or self._ghostly(d)
            return
        names = [e.name for _, e in got]
        assert names == sorted(names, key=lambda n: n.encode())
        assert len(set(names)) == len(names)
        if not self.dirty and not self._ghostly(d):
            kids = {n: k for n, k in self.children(d).items() if not self._ghostly(join(d, n))}
            shown = {e.name: e.kind for _, e in got if not self._ghostly(e.path)}
            assert shown == kids

    @invariant()
    def accounting(self) -> None:
        ns = self.ns
        live = 0
        for p in ns.cached_dirs():
            d = ns._dirs[p]
            live += d.count()
            live += d.listing.count() if d.listing is not None else 0
        assert ns.stats.entries == live
        assert ns.stats.bytes >= 0


class HugeDirMachine(NamespaceMachine):
    """Every lookup that a first page does not settle goes through targeted requests."""

    config = NamespaceConfig(
        attr_ttl_s=5.0, memory_bytes=1_000_000, list_page_keys=1, huge_dir_pages=0
    )


_MACHINE_SETTINGS = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestNamespaceMachine = NamespaceMachine.TestCase
TestNamespaceMachine.settings = _MACHINE_SETTINGS
TestHugeDirMachine = HugeDirMachine.TestCase
TestHugeDirMachine.settings = _MACHINE_SETTINGS


def test_dirpage_shape():
    p = DirPage(b"v" * 8, [], True)
    assert p.truncated is False
