"""LocalStore: the ObjectStore contract over a directory (no network)."""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path

import pytest

from gateway.backend import StoreUrlError, check_store_url, open_store, parse_store_url
from gateway.backend.base import (
    BackendError,
    ListPage,
    ObjectNotFound,
    ObjectStore,
    PreconditionFailed,
    StoreTraits,
    StoreWrapper,
)
from gateway.backend.local import InvalidKey, LocalStore
from gateway.backend.memory import MemoryStore


async def list_all(
    store: ObjectStore, prefix: str, delimiter: str | None = "/", max_keys: int = 1000
) -> tuple[list[str], list[str], int, int]:
    """(keys, prefixes, pages, skipped) over all pages."""
    keys: list[str] = []
    prefixes: list[str] = []
    token: str | None = None
    pages = skipped = 0
    while True:
        page: ListPage = await store.list_page(
            prefix, delimiter=delimiter, token=token, max_keys=max_keys
        )
        pages += 1
        skipped += page.skipped
        keys += [o.key for o in page.objects]
        prefixes += page.prefixes
        token = page.next_token
        if token is None:
            return keys, prefixes, pages, skipped


async def test_put_get_head_roundtrip(local_store: LocalStore) -> None:
    info = await local_store.put("a/b/c.txt", b"hello world", {"Mtime": "123", "mode": "644"})
    assert info.size == 11 and info.etag and '"' not in info.etag
    head = await local_store.head("a/b/c.txt")
    assert (head.size, head.etag, head.mtime_ns) == (11, info.etag, info.mtime_ns)
    assert head.metadata == {"mtime": "123", "mode": "644"}
    got = await local_store.get("a/b/c.txt")
    assert got.data == b"hello world" and got.size == 11 and got.etag == info.etag
    assert got.metadata == {"mtime": "123", "mode": "644"}
    part = await local_store.get("a/b/c.txt", 2, 5)
    assert part.data == b"llo" and part.size == 11
    assert (await local_store.get("a/b/c.txt", 6)).data == b"world"
    assert (await local_store.get("a/b/c.txt", 6, 100)).data == b"world"
    assert (await local_store.get("a/b/c.txt", 50)).data == b""
    assert (await local_store.get("a/b/c.txt", 3, 3)).data == b""


async def test_if_match_and_overwrite(local_store: LocalStore) -> None:
    old = await local_store.put("k", b"v1")
    assert (await local_store.get("k", if_match=old.etag)).data == b"v1"
    new = await local_store.put("k", b"v2!")
    assert new.etag != old.etag
    with pytest.raises(PreconditionFailed):
        await local_store.get("k", 0, 1, if_match=old.etag)
    # put without metadata drops the old metadata (S3 replaces it too)
    await local_store.put("m", b"x", {"a": "1"})
    await local_store.put("m", b"y")
    assert (await local_store.head("m")).metadata == {}


async def test_metadata_of_replaced_file_is_not_inherited(
    local_store: LocalStore, tmp_path: Path
) -> None:
    await local_store.put("f", b"one", {"mtime": "1"})
    (tmp_path / "export" / "f").write_bytes(b"changed behind our back")
    assert (await local_store.head("f")).metadata == {}


async def test_not_found(local_store: LocalStore) -> None:
    with pytest.raises(ObjectNotFound):
        await local_store.head("nope")
    with pytest.raises(ObjectNotFound):
        await local_store.get("nope/deeper")
    await local_store.put("d/file", b"x")
    with pytest.raises(ObjectNotFound):
        await local_store.head("d")  # a prefix, not an object
    with pytest.raises(ObjectNotFound):
        await local_store.head("d/file/")
    await local_store.delete("nope")  # S3 semantics: deleting a missing key succeeds


@pytest.mark.parametrize(
    "key", ["../x", "a/../../x", "/etc/passwd", "a//b", "./a", "", "a/.nfsgw-meta/x", "a\0b"]
)
async def test_refuses_keys_outside_root(local_store: LocalStore, key: str) -> None:
    with pytest.raises(InvalidKey):
        await local_store.put(key, b"x")
    with pytest.raises(BackendError):
        await local_store.get(key)


async def test_symlink_escape_refused(local_store: LocalStore, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(b"s")
    os.symlink(outside, tmp_path / "export" / "link")
    with pytest.raises(InvalidKey):
        await local_store.get("link/secret")
    with pytest.raises(InvalidKey):
        await local_store.put("link/new", b"x")
    _, prefixes, _, skipped = await list_all(local_store, "")
    assert "link/" not in prefixes and skipped == 1


async def test_listing_delimiter_and_markers(local_store: LocalStore) -> None:
    for k in ["a-b", "a/x", "a/y/z", "b", "c d/e", "ü/1", "dir/"]:
        await local_store.put(k, b"" if k.endswith("/") else b"data")
    keys, prefixes, _, _ = await list_all(local_store, "")
    assert keys == ["a-b", "b"]
    assert prefixes == ["a/", "c d/", "dir/", "ü/"]
    keys, prefixes, _, _ = await list_all(local_store, "a/")
    assert keys == ["a/", "a/x"] and prefixes == ["a/y/"]
    keys, prefixes, _, _ = await list_all(local_store, "dir/")
    assert keys == ["dir/"] and prefixes == []
    keys, prefixes, _, _ = await list_all(local_store, "a")
    assert keys == ["a-b"] and prefixes == ["a/"]
    keys, prefixes, _, _ = await list_all(local_store, "", delimiter=None)
    # UTF-8 byte order over full keys: '-' (0x2d) < '/' (0x2f)
    assert keys == ["a-b", "a/", "a/x", "a/y/", "a/y/z", "b", "c d/", "c d/e", "dir/", "ü/", "ü/1"]
    keys, prefixes, _, _ = await list_all(local_store, "a/", delimiter=None)
    assert keys == ["a/", "a/x", "a/y/", "a/y/z"]
    assert (await list_all(local_store, "missing/"))[:2] == ([], [])


async def test_listing_pages_and_start_after(local_store: LocalStore, tmp_path: Path) -> None:
    d = tmp_path / "export" / "many"
    d.mkdir()
    for i in range(2500):
        (d / f"f{i:05d}").write_bytes(b"")
    for i in range(3):
        (d / f"sub{i}").mkdir()
    keys, prefixes, pages, _ = await list_all(local_store, "many/", max_keys=1000)
    assert pages == 3 and len(keys) == 2501 and len(prefixes) == 3  # + the many/ marker
    assert keys == sorted(keys)
    page = await local_store.list_page("many/", start_after="many/f02497", max_keys=10)
    assert [o.key for o in page.objects] == ["many/f02498", "many/f02499"]
    assert page.prefixes == ["many/sub0/", "many/sub1/", "many/sub2/"]
    assert page.next_token is None
    with pytest.raises(BackendError):
        await local_store.list_page("many/", token="!!not-a-token")


async def test_listing_skips_non_utf8_names(local_store: LocalStore, tmp_path: Path) -> None:
    root = os.fsencode(tmp_path / "export")
    os.close(os.open(os.path.join(root, b"bad\xff"), os.O_CREAT | os.O_WRONLY))
    (tmp_path / "export" / "good").write_bytes(b"")
    page = await local_store.list_page("")
    assert [o.key for o in page.objects] == ["good"] and page.skipped == 1


async def test_hidden_entries_not_listed(local_store: LocalStore) -> None:
    await local_store.put("x", b"1", {"a": "b"})
    uid = await local_store.create_multipart("y")
    keys, prefixes, _, _ = await list_all(local_store, "", delimiter=None)
    assert keys == ["x"] and prefixes == []
    await local_store.abort_multipart("y", uid)


async def test_multipart(local_store: LocalStore) -> None:
    uid = await local_store.create_multipart("big/obj", {"mtime": "42"})
    e2 = await local_store.upload_part("big/obj", uid, 2, b"world")
    e1 = await local_store.upload_part("big/obj", uid, 1, b"hello ")
    info = await local_store.complete_multipart("big/obj", uid, [(2, e2), (1, e1)])
    assert info.size == 11
    got = await local_store.get("big/obj")
    assert got.data == b"hello world" and got.metadata == {"mtime": "42"}
    uid2 = await local_store.create_multipart("big/obj2")
    await local_store.upload_part("big/obj2", uid2, 1, b"x")
    with pytest.raises(BackendError):
        await local_store.complete_multipart("big/obj2", uid2, [(1, "wrong")])
    await local_store.abort_multipart("big/obj2", uid2)
    with pytest.raises(ObjectNotFound):
        await local_store.upload_part("big/obj2", uid2, 2, b"y")
    with pytest.raises(ObjectNotFound):
        await local_store.head("big/obj2")


async def test_copy_and_delete(local_store: LocalStore) -> None:
    await local_store.put("src", b"payload", {"mode": "600"})
    info = await local_store.copy("src", "dst/copied")
    assert info.size == 7 and info.metadata == {"mode": "600"}
    assert (await local_store.get("dst/copied")).data == b"payload"
    info = await local_store.copy("src", "dst/replaced", {"mode": "644"})
    assert (await local_store.head("dst/replaced")).metadata == {"mode": "644"}
    with pytest.raises(ObjectNotFound):
        await local_store.copy("missing", "x")
    await local_store.delete("src")
    with pytest.raises(ObjectNotFound):
        await local_store.head("src")
    await local_store.delete("dst/")  # not empty: the prefix stays
    assert (await local_store.head("dst/")).size == 0
    await local_store.put("empty/", b"")
    await local_store.delete("empty/")
    with pytest.raises(ObjectNotFound):
        await local_store.head("empty/")


async def test_object_and_prefix_conflict(local_store: LocalStore) -> None:
    await local_store.put("f", b"x")
    with pytest.raises(BackendError):
        await local_store.put("f/child", b"y")
    await local_store.put("d/child", b"y")
    with pytest.raises(BackendError):
        await local_store.put("d", b"z")


async def test_observer_and_concurrency(tmp_path: Path) -> None:
    calls: list[tuple[str, str]] = []
    store = LocalStore(tmp_path, workers=2, observer=lambda op, out, s: calls.append((op, out)))
    try:
        await asyncio.gather(*(store.put(f"k{i}", b"x" * i) for i in range(20)))
        sizes = await asyncio.gather(*(store.head(f"k{i}") for i in range(20)))
        assert [s.size for s in sizes] == list(range(20))
        with pytest.raises(ObjectNotFound):
            await store.get("none")
    finally:
        await store.close()
    assert calls.count(("put", "ok")) == 20 and calls.count(("head", "ok")) == 20
    assert calls[-1] == ("get", "not_found")


async def test_open_store_file_url(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/exp?create=1"
    assert parse_store_url(url).prefix == ""
    store = open_store(url)
    try:
        assert isinstance(store, LocalStore)
        await store.put("a", b"1")
        assert (tmp_path / "exp" / "a").read_bytes() == b"1"
    finally:
        await store.close()
    with pytest.raises(ValueError):
        open_store("file://otherhost/x")
    with pytest.raises(ValueError):
        open_store("ftp://x/y")


async def test_traits_and_url_helpers(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path}")
    try:
        assert store.traits == StoreTraits("local", latency_to_hide=False, endpoint="local")
        assert StoreWrapper(store).traits is store.traits
    finally:
        await store.close()
    assert MemoryStore().traits.latency_to_hide is True
    s3 = parse_store_url("s3://bkt/a/b?region=x")
    assert s3.space() == ("s3:bkt", "a/b/") and s3.canonical() == "s3://bkt/a/b/"
    f = parse_store_url("file:///srv/data?create=1")
    assert f.space() == ("file", "/srv/data/") and f.canonical() == "file:///srv/data?create=1"
    assert check_store_url("s3://bkt/p/", object_store=True) == parse_store_url("s3://bkt/p/")
    for url, says, object_store in (
        ("ftp://x/y", "unsupported store URL", False),
        ("s3://b%20d/", "is not a bucket name", False),
        ("file://localhost/srv", "is not s3://BUCKET[/PREFIX] or file:///DIR", False),
        ("file:///srv", "a pack is in S3", True),
    ):
        with pytest.raises(StoreUrlError, match=re.escape(says)) as e:
            check_store_url(url, object_store=object_store)
        assert e.value.hint


def test_parse_s3_url() -> None:
    u = parse_store_url("s3://bucket/train%20set?endpoint=http://127.0.0.1:8333&region=eu")
    assert (u.scheme, u.location, u.prefix) == ("s3", "bucket", "train set/")
    assert u.options == {"endpoint": "http://127.0.0.1:8333", "region": "eu"}
    assert parse_store_url("s3://bucket").prefix == ""
    assert parse_store_url("s3://bucket/").prefix == ""
    assert parse_store_url("s3://bucket/a/b/").prefix == "a/b/"


async def test_listing_continues_without_rescanning_a_quiet_directory(
    local_store: LocalStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 2,500-file directory unchanged for a while is scanned once per listing, not once per
    page; an entry added or removed between pages is seen as a fresh scan would see it."""
    d = tmp_path / "export" / "quiet"
    d.mkdir()
    for i in range(2500):
        (d / f"f{i:05d}").write_bytes(b"x" * (i % 7))
    old = os.stat(d).st_mtime_ns - 10**10
    os.utime(d, ns=(old, old))
    local_store._list_process = False  # the scans are counted in this process
    scans: list[str] = []
    lister = local_store._listing
    entries = lister._entries
    monkeypatch.setattr(lister, "_entries", lambda p, s: scans.append(p) or entries(p, s))

    keys, _, pages, _ = await list_all(local_store, "quiet/")
    assert pages == 3 and len(scans) == 1
    assert keys == ["quiet/"] + [f"quiet/f{i:05d}" for i in range(2500)]

    # Changed between pages: the rest is not reused, the next page scans again.
    scans.clear()
    first = await local_store.list_page("quiet/", max_keys=1000)
    (d / "f01500").unlink()
    (d / "g-new").write_bytes(b"new")
    token = first.next_token
    rest: list[str] = []
    while token is not None:
        page = await local_store.list_page("quiet/", token=token, max_keys=1000)
        rest += [o.key for o in page.objects]
        token = page.next_token
    assert "quiet/f01500" not in rest and rest[-1] == "quiet/g-new"
    assert len(scans) >= 2

    # A directory changed within the last second is scanned for every page.
    scans.clear()
    keys, _, pages, _ = await list_all(local_store, "quiet/")
    assert pages == 3 and len(scans) == 3 and len(keys) == 2501


async def test_the_lister_process_is_restarted_after_it_dies(tmp_path: Path) -> None:
    """A lister process killed behind the store's back fails one listing with a
    BackendError (the index retries it), and the next listing starts a new one."""
    root = tmp_path / "export"
    (root / "d").mkdir(parents=True)
    (root / "d" / "f").write_bytes(b"x")
    store = LocalStore(root, list_process=True)
    try:
        assert [o.key for o in (await store.list_page("d/")).objects] == ["d/", "d/f"]
        assert store._lister is not None
        for pid in list(store._lister._processes):  # type: ignore[attr-defined]
            os.kill(pid, 9)
        with pytest.raises(BackendError):
            for _ in range(50):  # until the executor notices
                await store.list_page("d/")
                await asyncio.sleep(0.05)
        assert [o.key for o in (await store.list_page("d/")).objects] == ["d/", "d/f"]
        assert (await store.list_page("nope/")).objects == []
        with pytest.raises(BackendError):  # a bad token, decoded before the process is asked
            await store.list_page("d/", token="!!not-a-token")
    finally:
        await store.close()
