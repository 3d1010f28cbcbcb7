"""Change notification for a local export's directories (Linux inotify): a ``file://``
export re-lists a directory whose TTL has passed only when something in it changed.

Why: re-listing an unchanged local folder of 1,281 files costs ~10 ms of CPU (a ``scandir``,
a ``stat`` per file in the lister process, the comparison with the index), every TTL, for
every folder a training job keeps reading; the kernel can say instead that nothing changed.

Owns: one inotify instance per store (opened on first use, non-blocking), a watch per
directory armed by a listing (at most ``max_watches``, the least recently armed dropped
first), and the question ``unchanged(token)``. Must not: block (every read of the instance
is non-blocking and drains only what is queued), or answer "unchanged" unless the kernel
watched the directory all along.

- **Tokens.** ``arm(path)`` is called when a listing of ``path`` starts and returns a token
  (the watch and the count of events seen on it), or None when the directory cannot be
  watched (no inotify, the instance limit, a watch limit, not a directory). A listing that
  starts after ``arm`` sees every change made before; the kernel queues an event for every
  change made after (in the same system call), so ``unchanged(token)`` -- after draining the
  queue -- is true only if nothing changed in ``path`` since that listing started.
- **What counts as a change**: an entry created, deleted, moved in or out, written, closed
  after writing, or its attributes changed; the directory itself deleted or moved (its watch
  and every watch under its path are then dead: their paths name something else now, so an
  event about a subdirectory moved or deleted kills the watches under it too); the kernel's
  queue overflowing (every token is then dead). A dead token means: re-list, as without
  notification.
- **Only filesystems whose changes the kernel sees.** inotify reports what this machine
  does; on a network or FUSE filesystem another machine's changes go unseen, so a directory
  is watched only on a local filesystem (``LOCAL_FILESYSTEMS``, by the mount table read when
  the first watch is armed); elsewhere ``arm`` returns None and the TTL decides, as for S3.
- **Bounds**: ``max_watches`` (default 8,192, at most half the kernel's
  ``fs.inotify.max_user_watches``); the kernel's queue (``max_queued_events``) drained at
  every ``arm`` and ``unchanged``; when it overflowed in between, everything re-lists.
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import struct
import sys
from collections import OrderedDict
from dataclasses import dataclass
from typing import Final

import structlog

__all__ = ["DirWatch", "WatchToken"]

log = structlog.get_logger("nfsgw.backend")

IN_MODIFY: Final = 0x002
IN_ATTRIB: Final = 0x004
IN_CLOSE_WRITE: Final = 0x008
IN_MOVED_FROM: Final = 0x040
IN_MOVED_TO: Final = 0x080
IN_CREATE: Final = 0x100
IN_DELETE: Final = 0x200
IN_DELETE_SELF: Final = 0x400
IN_MOVE_SELF: Final = 0x800
IN_Q_OVERFLOW: Final = 0x4000
IN_IGNORED: Final = 0x8000
IN_ONLYDIR: Final = 0x01000000
IN_ISDIR: Final = 0x40000000
IN_NONBLOCK: Final = os.O_NONBLOCK
IN_CLOEXEC: Final = os.O_CLOEXEC

MASK: Final = (
    IN_MODIFY
    | IN_ATTRIB
    | IN_CLOSE_WRITE
    | IN_MOVED_FROM
    | IN_MOVED_TO
    | IN_CREATE
    | IN_DELETE
    | IN_DELETE_SELF
    | IN_MOVE_SELF
    | IN_ONLYDIR
)
_SELF_GONE: Final = IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED
_CHILD_DIR_GONE: Final = IN_MOVED_FROM | IN_MOVED_TO | IN_DELETE | IN_CREATE
_EVENT: Final = struct.Struct("iIII")
MAX_WATCHES: Final = 8192
# Filesystems whose every change is made through this kernel (so inotify sees it).
LOCAL_FILESYSTEMS: Final = frozenset(
    {
        "bcachefs", "btrfs", "exfat", "ext2", "ext3", "ext4", "f2fs", "hfsplus", "jfs",
        "nilfs2", "ntfs3", "overlay", "ramfs", "reiserfs", "tmpfs", "vfat", "xfs", "zfs",
    }
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class WatchToken:
    """A watch as it was when a listing started."""

    wd: int
    serial: int  # which watch of that descriptor number (the kernel may reuse numbers)
    events: int  # events seen on it by then
    era: int  # queue overflows (and instance resets) by then


class _Watch:
    __slots__ = ("wd", "serial", "path", "events")

    def __init__(self, wd: int, serial: int, path: str) -> None:
        self.wd = wd
        self.serial = serial
        self.path = path
        self.events = 0


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def mount_table(path: str = "/proc/self/mountinfo") -> list[tuple[str, str]]:
    """(mount point, filesystem type), longest mount point first."""
    out = []
    try:
        with open(path) as f:
            for line in f:
                fields, _, rest = line.partition(" - ")
                parts = fields.split()
                if len(parts) < 5 or not rest:
                    continue
                point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), parts[4])
                out.append((point, rest.split()[0]))
    except OSError:
        return []
    out.sort(key=lambda pf: len(pf[0]), reverse=True)
    return out


def fs_type(path: str, table: list[tuple[str, str]]) -> str | None:
    """The type of the filesystem ``path`` (absolute, resolved) is on, per ``table``."""
    for point, fstype in table:
        if path == point or point == "/" or path.startswith(point + "/"):
            return fstype
    return None


def _watch_limit() -> int:
    try:
        with open("/proc/sys/fs/inotify/max_user_watches") as f:
            return max(0, int(f.read()) // 2)
    except (OSError, ValueError):
        return MAX_WATCHES


class DirWatch:
    """inotify watches on directories under ``root`` (absolute paths are passed in)."""

    def __init__(self, max_watches: int = MAX_WATCHES) -> None:
        self.max_watches = min(max_watches, _watch_limit())
        self._libc = _libc()
        self._fd: int | None = None
        self._file: object = None  # owns the descriptor: closed with it, or when collected
        self._failed = self._libc is None or self.max_watches <= 0
        self._by_path: OrderedDict[str, _Watch] = OrderedDict()
        self._by_wd: dict[int, _Watch] = {}
        self._serial = 0
        self._mounts: list[tuple[str, str]] | None = None  # read on the first arm
        self.era = 0
        self.overflows = 0

    @property
    def watches(self) -> int:
        return len(self._by_wd)

    def arm(self, path: str) -> WatchToken | None:
        """Watch ``path`` (a directory) from now on; the token for ``unchanged``, or None."""
        fd = self._instance()
        if fd is None:
            return None
        self._drain(fd)
        w = self._by_path.get(path)
        if w is None:
            if self._mounts is None:
                self._mounts = mount_table()
            if fs_type(path, self._mounts) not in LOCAL_FILESYSTEMS:
                return None
            assert self._libc is not None
            wd: int = self._libc.inotify_add_watch(fd, os.fsencode(path), MASK)
            if wd < 0:
                err = ctypes.get_errno()
                if err == errno.ENOSPC:  # the user's watch limit: fall back, say it once
                    self._give_up("inotify watch limit reached (fs.inotify.max_user_watches)")
                return None
            w = self._by_wd.get(wd)
            if w is not None:  # the same directory under another path (a symlink)
                self._forget(w)
            self._serial += 1
            w = _Watch(wd, self._serial, path)
            self._by_wd[wd] = w
            self._by_path[path] = w
            while len(self._by_path) > self.max_watches:
                _, oldest = self._by_path.popitem(last=False)
                self._by_wd.pop(oldest.wd, None)
                self._libc.inotify_rm_watch(fd, oldest.wd)
        else:
            self._by_path.move_to_end(path)
        return WatchToken(w.wd, w.serial, w.events, self.era)

    def unchanged(self, token: WatchToken) -> bool:
        """Whether nothing changed in the directory since ``token`` was armed."""
        if self._fd is None or token.era != self.era:
            return False
        self._drain(self._fd)
        if token.era != self.era:
            return False
        w = self._by_wd.get(token.wd)
        return w is not None and w.serial == token.serial and w.events == token.events

    def close(self) -> None:
        if self._fd is not None:
            self._close_instance()
        self._failed = True

    # -- internals ----------------------------------------------------------------------

    def _instance(self) -> int | None:
        if self._fd is not None:
            return self._fd
        if self._failed:
            return None
        assert self._libc is not None
        fd: int = self._libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            self._give_up(f"inotify: {os.strerror(ctypes.get_errno())}")
            return None
        self._fd = fd
        self._file = open(fd, "rb", buffering=0, closefd=True)  # noqa: SIM115 - owns the fd
        return fd

    def _give_up(self, why: str) -> None:
        if not self._failed:
            log.info("dir_change_notification_off", reason=why, fallback="re-list on TTL")
        self._failed = True

    def _close_instance(self) -> None:
        f = self._file
        self._file = None
        self._fd = None
        if f is not None:
            f.close()  # type: ignore[attr-defined]
        self._by_path.clear()
        self._by_wd.clear()
        self.era += 1

    def _drain(self, fd: int) -> None:
        while True:
            try:
                buf = os.read(fd, 65536)
            except BlockingIOError:
                return
            except OSError as exc:  # the instance is broken: drop it, everything re-lists
                log.warning("dir_change_notification_failed", error=repr(exc))
                self._close_instance()
                return
            if not buf:
                return
            self._events(buf)

    def _events(self, buf: bytes) -> None:
        off = 0
        size = _EVENT.size
        while off + size <= len(buf):
            wd, mask, _cookie, namelen = _EVENT.unpack_from(buf, off)
            name = buf[off + size : off + size + namelen].split(b"\0", 1)[0]
            off += size + namelen
            if mask & IN_Q_OVERFLOW:
                self.overflows += 1
                self.era += 1  # every token armed before is dead
                continue
            w = self._by_wd.get(wd)
            if w is None:
                continue
            w.events += 1
            if mask & _SELF_GONE:
                self._forget_tree(w.path)
            elif mask & IN_ISDIR and mask & _CHILD_DIR_GONE and name:
                self._forget_tree(os.path.join(w.path, os.fsdecode(name)))

    def _forget(self, w: _Watch) -> None:
        self._by_wd.pop(w.wd, None)
        if self._by_path.get(w.path) is w:
            del self._by_path[w.path]
        if self._fd is not None and self._libc is not None:
            self._libc.inotify_rm_watch(self._fd, w.wd)  # EINVAL when already gone: fine

    def _forget_tree(self, path: str) -> None:
        """``path`` was deleted or moved: its watch and those under it name something else."""
        under = path.rstrip("/") + "/"
        for p in [p for p in self._by_path if p == path or p.startswith(under)]:
            self._forget(self._by_path[p])
