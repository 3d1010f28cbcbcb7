"""A local export's directories are re-listed after their TTL only when the kernel saw a
change in them (``Namespace`` + ``LocalStore.watch_listing``/``unchanged_since``)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from gateway.backend.base import StoreWrapper
from gateway.backend.local import LocalStore
from gateway.clock import FakeClock
from gateway.errors import NotFound
from gateway.namespace import Namespace, NamespaceConfig

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inotify")

TTL = 60.0


def tree(root: Path, n: int = 20) -> None:
    d = root / "train" / "c0"
    d.mkdir(parents=True)
    for i in range(n):
        (d / f"{i}.jpg").write_bytes(b"x" * (i + 1))


async def lookup_after_ttl(ns: Namespace, clock: FakeClock, name: str) -> int | None:
    """Past the hard TTL (a caller waits for the re-list, if there is one): the size."""
    clock.advance(100_000.0)
    try:
        e = await ns.lookup("train/c0", name)
    except NotFound:
        return None
    await ns.quiesce()
    return e.size


@pytest.fixture
async def local(tmp_path: Path) -> LocalStore:
    tree(tmp_path)
    return LocalStore(tmp_path)


async def test_unchanged_directories_are_not_listed_again(local: LocalStore) -> None:
    clock = FakeClock()
    ns = Namespace(local, "", clock=clock, config=NamespaceConfig(attr_ttl_s=TTL))
    try:
        assert (await ns.lookup("train/c0", "3.jpg")).size == 4
        pages = ns.stats.list_pages
        for _ in range(5):
            assert await lookup_after_ttl(ns, clock, "3.jpg") == 4
        assert ns.stats.relists == 0 and ns.stats.relists_avoided >= 5
        assert ns.stats.list_pages == pages
    finally:
        await ns.close()
        await local.close()


@pytest.mark.parametrize("change", ["add", "remove", "rewrite", "chmod"])
async def test_a_change_made_behind_the_gateway_is_listed(
    local: LocalStore, tmp_path: Path, change: str
) -> None:
    clock = FakeClock()
    ns = Namespace(local, "", clock=clock, config=NamespaceConfig(attr_ttl_s=TTL))
    d = tmp_path / "train" / "c0"
    try:
        assert (await ns.lookup("train/c0", "3.jpg")).size == 4
        with pytest.raises(NotFound):
            await ns.lookup("train/c0", "new.jpg")
        assert await lookup_after_ttl(ns, clock, "3.jpg") == 4  # unchanged so far
        relists = ns.stats.relists
        if change == "add":
            (d / "new.jpg").write_bytes(b"new")
        elif change == "remove":
            (d / "3.jpg").unlink()
        elif change == "rewrite":
            (d / "3.jpg").write_bytes(b"rewritten")
        else:
            os.chmod(d / "3.jpg", 0o600)
        # Within the TTL the view stands (as for any export)...
        if change == "add":
            with pytest.raises(NotFound):
                await ns.lookup("train/c0", "new.jpg")
        # ...past it, the change is listed.
        got = await lookup_after_ttl(ns, clock, "3.jpg")
        assert ns.stats.relists == relists + 1
        if change == "add":
            assert (await ns.lookup("train/c0", "new.jpg")).size == 3
        elif change == "remove":
            assert got is None
        elif change == "rewrite":
            assert got == len(b"rewritten")
        # Then quiet again: the re-list armed a new watch.
        before = ns.stats.relists
        await lookup_after_ttl(ns, clock, "0.jpg")
        assert ns.stats.relists == before
    finally:
        await ns.close()
        await local.close()


async def test_an_invalidate_lists_again_even_when_unchanged(local: LocalStore) -> None:
    clock = FakeClock()
    ns = Namespace(local, "", clock=clock, config=NamespaceConfig(attr_ttl_s=TTL))
    try:
        await ns.lookup("train/c0", "3.jpg")
        relists = ns.stats.relists
        ns.invalidate("train/c0", subtree=True)
        await ns.lookup("train/c0", "3.jpg")
        await ns.quiesce()
        assert ns.stats.relists == relists + 1
    finally:
        await ns.close()
        await local.close()


async def test_a_store_that_cannot_watch_relists_on_ttl(local: LocalStore) -> None:
    """Behind a wrapper (which does not forward the capability) it is the TTL, as before."""
    clock = FakeClock()
    ns = Namespace(StoreWrapper(local), "", clock=clock, config=NamespaceConfig(attr_ttl_s=TTL))
    try:
        await ns.lookup("train/c0", "3.jpg")
        for _ in range(3):
            assert await lookup_after_ttl(ns, clock, "3.jpg") == 4
        assert ns.stats.relists == 3 and ns.stats.relists_avoided == 0
    finally:
        await ns.close()
        await local.close()
