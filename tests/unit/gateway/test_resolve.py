"""Hashed handles resolved on a gateway that did not issue them (fail-over, a lost state
directory): through the index's listings, with walks counted, over ``MemoryStore``."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from gateway.backend.base import BackendUnavailable
from gateway.backend.memory import MemoryStore
from gateway.clock import FakeClock
from gateway.errors import GatewayError, NotFound, StaleHandle
from gateway.namespace.config import NamespaceConfig
from gateway.namespace.handles import (
    FORM_HASHED,
    FORM_INLINE,
    FORM_MAPPED,
    FORM_NAMED,
    dir_hash,
    mapped_hash,
    name_hash,
)
from gateway.namespace.index import Namespace
from gateway.namespace.legacymap import LEGACY_FILE, LegacyMap
from gateway.namespace.resolve import Handles

SECRET = b"k" * 32
P = "ds/"
EXPORT = 4
CAT = "category-" + "c" * 40  # a long directory name: its files' paths are long
UUID = "0f8fad5b-d9cb-469f-a165-70867728950e"


def tree() -> dict[str, bytes]:
    """Keys of ~30 and ~200 bytes, nested: short paths, long dirs with short names (named
    form), long names (hashed form), deep directories."""
    files: dict[str, bytes] = {}
    for c in range(3):
        for i in range(4):
            files[f"train/c{c}/{i}.jpg"] = f"short {c} {i}".encode()  # ~15 bytes
            files[f"train/{CAT}{c}/{UUID[:-2]}{i:02d}.jpg"] = f"named {c} {i}".encode()
            files[f"train/{CAT}{c}/{'n' * 150}{i}.jpg"] = f"hashed {c} {i}".encode()  # ~210 B
    deep = "/".join(f"level{d}-{'d' * 20}" for d in range(6))
    files[f"{deep}/leaf.bin"] = b"deep"
    files[f"{deep}/{'L' * 200}"] = b"deep long"
    return files


def no_export(export_id: int) -> Namespace | None:
    return None


def make(files: dict[str, bytes]) -> tuple[MemoryStore, Namespace, FakeClock]:
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    for k, v in files.items():
        store.seed(P + k, v)
    return store, Namespace(store, P, clock=clock, config=NamespaceConfig()), clock


def issue(files: dict[str, bytes]) -> dict[str, bytes]:
    """Handles as gateway A issues them (no namespace needed to encode)."""
    a = Handles(SECRET)
    return {p: a.encode(EXPORT, p) for p in files}


async def test_every_form_resolves_on_another_gateway() -> None:
    files = tree()
    fhs = issue(files)
    forms = {fh[1] for fh in fhs.values()}
    assert forms == {FORM_INLINE, FORM_NAMED, FORM_HASHED}
    assert max(len(p.encode()) for p in files) > 200
    store, ns, _ = make(files)
    b = Handles(SECRET)  # gateway B: same secret, nothing else shared
    for path, fh in fhs.items():
        assert await b.decode(fh, {EXPORT: ns}.get) == (EXPORT, path)
        assert (await ns.getattr(path)).size == len(files[path])
    # Walks: the first one lists the root and train (every category is then known); the deep
    # file's parent needs walking further down. Each directory was listed once.
    assert 1 <= b.stats.walks <= 2
    assert b.stats.walk_misses == 0 and b.stats.collisions == 0
    assert b.stats.dir_scans == 4  # three categories and the deep directory (long names)
    lists = store.requests["list"]
    assert lists <= len({p.rsplit("/", 1)[0] for p in files}) + 8
    # Everything is cached now: no request, no walk, no scan.
    store.reset_counts()
    walks, scans = b.stats.walks, b.stats.dir_scans
    for path, fh in fhs.items():
        assert await b.decode(fh, {EXPORT: ns}.get) == (EXPORT, path)
    assert sum(store.requests.values()) == 0
    assert (b.stats.walks, b.stats.dir_scans) == (walks, scans)


async def test_concurrent_unknown_handles_share_one_walk() -> None:
    files = {f"top/{CAT}{c}/{UUID}": b"x" for c in range(40)}
    fhs = issue(files)
    assert all(fh[1] == FORM_NAMED for fh in fhs.values())
    store, ns, _ = make(files)
    b = Handles(SECRET)
    got = await asyncio.gather(*(b.decode(fh, {EXPORT: ns}.get) for fh in fhs.values()))
    assert [p for _, p in got] == list(fhs)
    assert b.stats.walks == 1
    assert b.stats.walk_dirs == 2  # the root and top: the categories are found, never listed
    assert store.requests["list"] == 2


async def test_renamed_directory_old_handles_are_stale_never_another_file() -> None:
    files = {f"d/{CAT}/{UUID}": b"old", f"d/{CAT}/{'z' * 80}": b"old long"}
    fhs = issue(files)
    store, ns, clock = make(files)
    # The directory is renamed (copy + delete) before gateway B sees any handle; a directory
    # of another name holds files of the same names.
    for k, v in files.items():
        store.unseed(P + k)
        store.seed(P + k.replace(CAT, CAT + "-renamed"), v)
    b = Handles(SECRET, absent_ttl_s=30)
    for fh in fhs.values():
        with pytest.raises(StaleHandle):
            await b.decode(fh, {EXPORT: ns}.get)
    assert b.stats.walks == 1 and b.stats.walk_misses == 1
    # Asked again within the TTL: the remembered miss, no walk, no listing.
    store.reset_counts()
    with pytest.raises(StaleHandle):
        await b.decode(fhs[f"d/{CAT}/{UUID}"], {EXPORT: ns}.get)
    assert b.stats.walks == 1 and sum(store.requests.values()) == 0
    # A directory created again at the old path: the handle names that path again.
    for k, v in files.items():
        store.seed(P + k, b"new " + v)
    ns.invalidate("d", subtree=True)
    clock.advance(31)
    for path, fh in fhs.items():
        assert await b.decode(fh, {EXPORT: ns}.get) == (EXPORT, path)
    assert b.stats.walks == 2


async def test_renamed_directory_known_to_the_map_is_stale_too() -> None:
    """Gateway A issued the handles and knows the old directory: the path is gone, STALE at
    getattr (the registry's step), never the renamed directory's file."""
    files = {f"d/{CAT}/{UUID}": b"old"}
    store, ns, _ = make(files)
    a = Handles(SECRET)
    fh = a.encode(EXPORT, f"d/{CAT}/{UUID}")
    store.unseed(P + f"d/{CAT}/{UUID}")
    store.seed(P + f"d/{CAT}-2/{UUID}", b"other")
    ns.invalidate(f"d/{CAT}")
    _, path = await a.decode(fh, {EXPORT: ns}.get)
    assert path == f"d/{CAT}/{UUID}"
    with pytest.raises(NotFound):
        await ns.getattr(path)


async def test_directory_hash_collision_is_detected() -> None:
    files = {f"x/{CAT}/{UUID}": b"a", f"y/{CAT}/{UUID}": b"b"}
    store, ns, _ = make(files)
    b = Handles(SECRET)
    fh = issue(files)[f"x/{CAT}/{UUID}"]
    key = EXPORT.to_bytes(2, "big") + dir_hash(EXPORT, f"x/{CAT}")
    b._learn_dir(key, f"x/{CAT}")
    b._learn_dir(key, f"y/{CAT}")  # as if y/CAT hashed the same
    assert b.stats.collisions == 1
    with pytest.raises(StaleHandle):  # both candidates hold the name: ambiguous
        await b.decode(fh, {EXPORT: ns}.get)
    assert b.stats.collisions == 2
    store.unseed(P + f"y/{CAT}/{UUID}")
    ns.invalidate(f"y/{CAT}")
    assert await b.decode(fh, {EXPORT: ns}.get) == (EXPORT, f"x/{CAT}/{UUID}")


async def test_name_hash_collision_is_detected(monkeypatch: pytest.MonkeyPatch) -> None:
    long_a, long_b = "a" * 60, "b" * 60
    files = {f"d/{long_a}": b"a", f"d/{long_b}": b"b"}
    fhs = issue(files)
    _, ns, _ = make(files)
    collide = name_hash(long_a)  # every name hashes the same
    monkeypatch.setattr("gateway.namespace.resolve.name_hash", lambda n: collide)
    b = Handles(SECRET)
    with pytest.raises(StaleHandle):
        await b.decode(fhs[f"d/{long_a}"], {EXPORT: ns}.get)
    assert b.stats.collisions == 1
    with pytest.raises(StaleHandle):  # remembered as ambiguous: no second scan
        await b.decode(fhs[f"d/{long_a}"], {EXPORT: ns}.get)
    assert b.stats.dir_scans == 1


async def test_walk_is_bounded_and_truncation_is_stale() -> None:
    files = {f"w{i}/x/{CAT}/{UUID}": b"x" for i in range(20)}
    fhs = issue(files)
    store, ns, _ = make(files)
    b = Handles(SECRET, walk_max_dirs=5, walk_concurrency=2)
    with pytest.raises(StaleHandle):
        await b.decode(fhs[f"w19/x/{CAT}/{UUID}"], {EXPORT: ns}.get)
    assert b.stats.walks_truncated == 1
    assert b.stats.walk_dirs <= 5 and store.requests["list"] <= 5


async def test_maps_stay_within_their_bounds() -> None:
    files = {f"t/{CAT}{i}/{'n' * 50}": b"x" for i in range(50)}
    b = Handles(SECRET, dir_entries=8, hashed_entries=8)
    for p in files:
        b.encode(EXPORT, p)
    assert len(b._dirs) == 8 and len(b._hashed) == 8
    assert b.stats.dir_hashes == 8 and b.stats.hashed_cached == 8
    # Dropped entries come back through a walk and a scan.
    _, ns, _ = make(files)
    first = next(iter(files))
    assert await b.decode(b.codec.encode(EXPORT, first), {EXPORT: ns}.get) == (EXPORT, first)
    assert len(b._dirs) <= 8 and len(b._hashed) <= 8


async def test_backend_error_during_a_walk_is_not_stale() -> None:
    files = {f"d/{CAT}/{UUID}": b"x"}
    fhs = issue(files)
    clock = FakeClock()
    down = True

    def fail(op: str, key: str) -> Exception | None:
        return BackendUnavailable("503") if down and op == "list" else None

    store = MemoryStore(clock=clock, fail=fail)
    for k, v in files.items():
        store.seed(P + k, v)
    ns = Namespace(store, P, clock=clock, config=NamespaceConfig())
    b = Handles(SECRET)
    with pytest.raises(GatewayError) as err:
        await b.decode(fhs[f"d/{CAT}/{UUID}"], {EXPORT: ns}.get)
    assert not isinstance(err.value, StaleHandle)
    assert b.stats.walk_misses == 0
    down = False
    clock.advance(60)  # past the namespace's retry-after-error
    assert await b.decode(fhs[f"d/{CAT}/{UUID}"], {EXPORT: ns}.get) == (EXPORT, f"d/{CAT}/{UUID}")


async def test_unknown_export_is_stale() -> None:
    fh = issue({f"d/{CAT}/{UUID}": b""})[f"d/{CAT}/{UUID}"]
    with pytest.raises(StaleHandle):
        await Handles(SECRET).decode(fh, no_export)


async def test_old_mapped_handles_resolve_from_the_legacy_map(tmp_path: Path) -> None:
    """A handle the previous release issued for a long path (its SQLite map in the state
    directory) keeps resolving, read-only."""
    path = "a/very/long/directory/name/that/does/not/fit/inline/file-000001.jpg"
    db = tmp_path / LEGACY_FILE
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(
        "CREATE TABLE handle_paths (hash BLOB PRIMARY KEY, export_id INTEGER NOT NULL,"
        " path TEXT NOT NULL) WITHOUT ROWID"
    )
    digest = mapped_hash(EXPORT, path)
    conn.execute("INSERT INTO handle_paths VALUES (?, ?, ?)", (digest, EXPORT, path))
    bogus = mapped_hash(EXPORT, "x")
    conn.execute("INSERT INTO handle_paths VALUES (?, ?, ?)", (bogus, EXPORT, "not x"))
    conn.commit()
    conn.close()
    assert LegacyMap.open_if_present(tmp_path / "nothing") is None
    legacy = LegacyMap.open_if_present(tmp_path)
    assert legacy is not None
    b = Handles(SECRET, legacy=legacy)

    def mapped(export_id: int, digest: bytes) -> bytes:
        head = bytes([1, FORM_MAPPED]) + export_id.to_bytes(2, "big")
        return head + b.codec._mac(head, digest) + digest

    assert await b.decode(mapped(EXPORT, digest), no_export) == (EXPORT, path)
    assert await b.decode(mapped(EXPORT, digest), no_export) == (EXPORT, path)
    assert b.stats.legacy_lookups == 1  # cached
    for fh in (mapped(EXPORT + 1, digest), mapped(EXPORT, bogus), mapped(EXPORT, bytes(16))):
        with pytest.raises(StaleHandle):
            await b.decode(fh, no_export)
    before = db.stat().st_size
    await b.close()
    assert db.stat().st_size == before  # never written
