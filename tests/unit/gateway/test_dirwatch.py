"""``gateway.backend.dirwatch``: a token says "unchanged" only while the kernel saw nothing
change in the directory since it was armed."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gateway.backend.dirwatch import _EVENT, IN_Q_OVERFLOW, DirWatch, fs_type, mount_table

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inotify")


@pytest.fixture
def watch() -> Iterator[DirWatch]:
    w = DirWatch()
    try:
        yield w
    finally:
        w.close()


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    d = tmp_path / "dir"
    (d / "sub" / "deep").mkdir(parents=True)
    for i in range(3):
        (d / f"f{i}").write_bytes(b"x" * i)
    return d


def test_nothing_changed_is_said_again_and_again(watch: DirWatch, tree: Path) -> None:
    token = watch.arm(str(tree))
    assert token is not None
    os.listdir(tree)  # reading is not a change
    (tree / "f1").read_bytes()
    assert all(watch.unchanged(token) for _ in range(3))
    assert watch.watches == 1


def move_in(d: Path) -> None:
    (d.parent / "in").write_bytes(b"i")
    os.rename(d.parent / "in", d / "in")


def rmdir(d: Path) -> None:
    (d / "sub" / "deep").rmdir()
    (d / "sub").rmdir()


CHANGES: dict[str, Callable[[Path], object]] = {
    "create": lambda d: (d / "new").write_bytes(b"n"),
    "delete": lambda d: (d / "f0").unlink(),
    "write": lambda d: (d / "f2").write_bytes(b"changed"),
    "append": lambda d: open(d / "f1", "ab").write(b"more"),  # noqa: SIM115
    "chmod": lambda d: os.chmod(d / "f1", 0o600),
    "mtime": lambda d: os.utime(d / "f1", (1, 1)),
    "rename within": lambda d: os.rename(d / "f1", d / "g1"),
    "move out": lambda d: os.rename(d / "f1", d.parent / "out"),
    "move in": move_in,
    "mkdir": lambda d: (d / "newdir").mkdir(),
    "rmdir": rmdir,
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_every_kind_of_change_is_seen_then_a_new_token_is_quiet(
    watch: DirWatch, tree: Path, change: str
) -> None:
    token = watch.arm(str(tree))
    assert token is not None and watch.unchanged(token)
    CHANGES[change](tree)
    assert not watch.unchanged(token)
    again = watch.arm(str(tree))  # the re-list that follows arms it again
    assert again is not None and watch.unchanged(again)


def test_a_change_in_a_subdirectory_is_not_the_parents(watch: DirWatch, tree: Path) -> None:
    top, sub = watch.arm(str(tree)), watch.arm(str(tree / "sub"))
    assert top is not None and sub is not None
    (tree / "sub" / "x").write_bytes(b"x")
    assert watch.unchanged(top) and not watch.unchanged(sub)


def test_a_directory_moved_or_deleted_kills_the_watches_under_its_path(
    watch: DirWatch, tree: Path
) -> None:
    sub = watch.arm(str(tree / "sub"))
    deep = watch.arm(str(tree / "sub" / "deep"))
    top = watch.arm(str(tree))
    assert sub and deep and top
    os.rename(tree / "sub", tree / "moved")
    # The watches follow the inodes, but the paths they were armed for name nothing now.
    assert not watch.unchanged(top) and not watch.unchanged(sub) and not watch.unchanged(deep)
    assert str(tree / "sub" / "deep") not in watch._by_path
    # A directory created at the old path is a new one: watched afresh.
    (tree / "sub").mkdir()
    fresh = watch.arm(str(tree / "sub"))
    assert fresh is not None and watch.unchanged(fresh)


def test_an_ancestor_moved_without_its_parent_watched(watch: DirWatch, tree: Path) -> None:
    """Only the moved directory itself is watched (its parent is not): its own move event
    kills it and every watch below its old path."""
    sub = watch.arm(str(tree / "sub"))
    deep = watch.arm(str(tree / "sub" / "deep"))
    assert sub and deep
    os.rename(tree / "sub", tree / "elsewhere")
    assert not watch.unchanged(deep) and not watch.unchanged(sub)


def test_the_least_recently_armed_watch_goes_first(tmp_path: Path) -> None:
    w = DirWatch(max_watches=2)
    try:
        dirs = [tmp_path / f"d{i}" for i in range(3)]
        for d in dirs:
            d.mkdir()
        t0 = w.arm(str(dirs[0]))
        t1 = w.arm(str(dirs[1]))
        assert t0 is not None and w.arm(str(dirs[0])) == t0  # armed again: most recent
        t2 = w.arm(str(dirs[2]))
        assert t1 is not None and t2 is not None
        assert w.watches == 2
        assert w.unchanged(t0) and w.unchanged(t2) and not w.unchanged(t1)
    finally:
        w.close()


def test_a_queue_overflow_kills_every_token(watch: DirWatch, tree: Path) -> None:
    token = watch.arm(str(tree))
    assert token is not None
    watch._events(_EVENT.pack(-1, IN_Q_OVERFLOW, 0, 0))  # what the kernel sends then
    assert not watch.unchanged(token) and watch.overflows == 1
    again = watch.arm(str(tree))
    assert again is not None and watch.unchanged(again)


def test_what_cannot_be_watched_gets_no_token(watch: DirWatch, tree: Path) -> None:
    assert watch.arm(str(tree / "f1")) is None  # not a directory
    assert watch.arm(str(tree / "missing")) is None


def test_closed_it_says_changed_and_arms_nothing(tree: Path) -> None:
    w = DirWatch()
    token = w.arm(str(tree))
    assert token is not None
    w.close()
    assert not w.unchanged(token) and w.arm(str(tree)) is None


def test_without_inotify_nothing_is_armed(tree: Path) -> None:
    w = DirWatch(max_watches=0)
    assert w.arm(str(tree)) is None


def test_only_local_filesystems_are_watched(tmp_path: Path) -> None:
    """A network or FUSE filesystem's changes made elsewhere never reach inotify: no token."""
    table = tmp_path / "mountinfo"
    table.write_text(
        "22 1 8:1 / / rw - ext4 /dev/sda1 rw\n"
        "40 22 0:40 / /mnt/nfs rw - nfs4 server:/x rw\n"
        "41 22 0:41 / /mnt/s3\\040fuse rw - fuse.s3fs s3fs rw\n"
        "42 40 0:42 / /mnt/nfs/local rw - tmpfs tmpfs rw\n"
    )
    mounts = mount_table(str(table))
    assert fs_type("/data/x", mounts) == "ext4"
    assert fs_type("/mnt/nfs", mounts) == fs_type("/mnt/nfs/a/b", mounts) == "nfs4"
    assert fs_type("/mnt/nfsx", mounts) == "ext4"
    assert fs_type("/mnt/s3 fuse/train", mounts) == "fuse.s3fs"
    assert fs_type("/mnt/nfs/local/d", mounts) == "tmpfs"
    w = DirWatch()
    try:
        w._mounts = [(str(tmp_path), "nfs4"), ("/", "ext4")]
        assert w.arm(str(tmp_path)) is None
        w._mounts = [(str(tmp_path), "tmpfs"), ("/", "ext4")]
        assert w.arm(str(tmp_path)) is not None
    finally:
        w.close()
