"""The disk tier's directory as a whole: the blocking functions ``DiskStore`` runs on its
executor to create it, measure it, evict from it and keep its access times.

Owns: the creation of the layout (and the proof that it is writable, hard links included:
``prepare``), the free space of its filesystem, the scan (every name, each inode charged once,
the oldest bundles kept as eviction candidates, a crashed writer's temporary names removed,
the owner's name filter built), eviction by unlink, the mtime touches of hits, and the
removal of an older layout's directory. Must not: keep state (each function takes what it
needs and returns a result), run on the event loop, or read an entry's bytes (``entries``).
"""

from __future__ import annotations

import array
import contextlib
import errno
import heapq
import os
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from gateway.data.disk.fileformat import LAYOUT, LOCKS, SUBDIRS, charge_of
from gateway.data.disk.sharing import NameFilter, guests_present

__all__ = [
    "OLD_LAYOUTS",
    "Scan",
    "Victim",
    "evict",
    "fs_free",
    "prepare",
    "scan",
    "sweep_old_layouts",
    "touch",
]

OLD_LAYOUTS: Final = ("v1",)  # removed in the background (``sweep_old_layouts``)
STALE_TMP_NS: Final = 3600 * 10**9  # a temporary file this old is a crashed writer's


@dataclass(slots=True)
class Victim:
    """An eviction candidate: one bundle (inode) with the names a scan saw for it."""

    mtime_ns: int
    charge: int
    names: list[str] = field(default_factory=list)
    estimate: int = -1  # the admission duel's: the most visited name's count (cached)


@dataclass(slots=True)
class Scan:
    used: int  # each inode charged once
    entries: int  # names
    free: int
    oldest: list[Victim]  # oldest first
    seconds: float
    bundles: int = 0  # inodes
    names: NameFilter | None = None  # every entry name seen (``scan(..., names=True)``)


def fs_free(path: str) -> tuple[int, int]:
    """(size, free bytes for unprivileged users) of the filesystem holding ``path``."""
    vfs = os.statvfs(path)
    return vfs.f_blocks * vfs.f_frsize, vfs.f_bavail * vfs.f_frsize


def _stale_tmp(name: str, st: os.stat_result, now_ns: int) -> bool:
    """A temporary name's writer crashed: it is older than ``STALE_TMP_NS`` by the birth time
    in its name (``.tmp.<pid>.<n>.<unix s>``; the inode's mtime, shared with the entries'
    names once linked, moves with every touch of them), else by its mtime."""
    born = st.st_mtime_ns
    parts = name.split(".")
    if len(parts) == 5 and parts[1] == "tmp":
        with contextlib.suppress(ValueError):
            born = int(parts[4]) * 10**9
    return now_ns - born > STALE_TMP_NS


def scan(root: str, keep: int, guests_fd: int = -1) -> Scan:
    """Every name under ``root``: the budget used (each inode once, by ``st_ino``: a bundle's
    names share it), and as eviction candidates the oldest inodes (by mtime) holding at most
    ``keep`` names in all, each with every name this scan saw for it. Removes temporary
    names of crashed writers. The tier's owner passes ``guests_fd``: when no guest is there
    as the scan starts, ``names`` is a ``NameFilter`` of every entry name it saw."""
    t0 = time.monotonic()
    seen: array.array[int] | None = None  # 8 bytes a name until the filter is sized
    if guests_fd >= 0 and not guests_present(guests_fd):
        seen = array.array("Q")
    now_ns = time.time_ns()
    used = n = inodes = 0
    more: dict[int, int] = {}  # inode -> its names not seen yet (a bundle's)
    cands: dict[int, Victim] = {}
    heap: list[tuple[int, int]] = []  # (-mtime_ns, inode): the newest candidate on top
    held = 0  # names of the candidates
    for sub in SUBDIRS:
        try:
            it = os.scandir(os.path.join(root, sub))
        except FileNotFoundError:
            continue
        with it:
            for e in it:
                try:
                    st = e.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if not stat.S_ISREG(st.st_mode):
                    continue
                if e.name.startswith("."):  # a temporary file; a crashed writer's when old
                    if _stale_tmp(e.name, st, now_ns):
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(e.path)
                    continue
                n += 1
                if seen is not None:
                    with contextlib.suppress(ValueError):  # not an entry's name: no entry
                        seen.append(int(e.name[:16], 16))
                ino = st.st_ino
                v = cands.get(ino)
                if v is not None:
                    v.names.append(e.name)
                    held += 1
                left = more.get(ino)
                if left is not None:  # another name of a bundle already charged
                    if left <= 1:
                        del more[ino]
                    else:
                        more[ino] = left - 1
                    if v is None:
                        continue  # not a candidate (or no longer one)
                else:
                    if st.st_nlink > 1:
                        more[ino] = st.st_nlink - 1
                    c = charge_of(st.st_size)
                    used += c
                    inodes += 1
                    if v is None and (held < keep or (heap and -heap[0][0] > st.st_mtime_ns)):
                        cands[ino] = Victim(st.st_mtime_ns, c, [e.name])
                        heapq.heappush(heap, (-st.st_mtime_ns, ino))
                        held += 1
                while held > keep and len(heap) > 1:  # drop the newest candidates
                    _, gone = heapq.heappop(heap)
                    held -= len(cands.pop(gone).names)
    oldest = sorted(cands.values(), key=lambda v: v.mtime_ns)
    names = None
    if seen is not None:
        names = NameFilter.sized_for(len(seen))
        for h in seen:
            names.add(h)
    return Scan(used, n, fs_free(root)[1], oldest, time.monotonic() - t0, inodes, names)


def evict(root: str, victims: list[Victim]) -> tuple[int, int]:
    """Unlink the victims' names not touched since they were scanned: (names unlinked, bytes
    freed). A bundle's bytes are freed when its last name goes (``st_nlink``): a name the
    scan did not see, or a crashed writer's temporary name, keeps them."""
    names = freed = 0
    for v in victims:
        for name in v.names:
            path = os.path.join(root, name[:2], name)
            try:
                st = os.stat(path)
                if st.st_mtime_ns > v.mtime_ns:
                    continue  # hit (by any worker) since the scan: not a victim any more
                os.unlink(path)
            except FileNotFoundError:
                continue
            names += 1
            if st.st_nlink == 1:
                freed += charge_of(st.st_size)
    return names, freed


def touch(root: str, names: list[str]) -> None:
    now = time.time_ns()
    for name in names:
        with contextlib.suppress(FileNotFoundError):
            os.utime(os.path.join(root, name[:2], name), ns=(now, now))


def sweep_old_layouts(cache_dir: str, limit: int) -> bool:
    """Remove up to ``limit`` files of an older layout's directory (``OLD_LAYOUTS`` under
    ``cache_dir``: never read by this version), then its directories once empty. True when
    there is nothing (more) this can remove. Symbolic links are not followed."""
    left = limit
    for layout in OLD_LAYOUTS:
        old = os.path.join(cache_dir, layout)
        if not os.path.isdir(old) or os.path.islink(old):
            continue
        with os.scandir(old) as top:
            subs = [e.path for e in top if e.is_dir(follow_symlinks=False)]
            files = [e.path for e in top if e.is_file(follow_symlinks=False)]
        for sub in subs:
            with contextlib.suppress(FileNotFoundError), os.scandir(sub) as it:
                for e in it:
                    if e.is_file(follow_symlinks=False):
                        files.append(e.path)
                        if len(files) >= left:
                            break
            if len(files) >= left:
                break
        for p in files[:left]:
            with contextlib.suppress(OSError):
                os.unlink(p)
        left -= len(files[:left])
        if left <= 0:
            return False
        for sub in subs:
            with contextlib.suppress(OSError):
                os.rmdir(sub)
        with contextlib.suppress(OSError):
            os.rmdir(old)
    return True


def prepare(cache_dir: Path) -> tuple[str, int, int]:
    """Create the layout and prove it writable, hard links included; (root, fs size, fs
    free). Raises OSError."""
    cache_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not cache_dir.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "not a directory", str(cache_dir))
    root = cache_dir / LAYOUT
    root.mkdir(mode=0o700, exist_ok=True)
    for sub in (*SUBDIRS, LOCKS):
        (root / sub).mkdir(mode=0o700, exist_ok=True)
    probe = root / f".probe.{os.getpid()}"
    linked = root / f".probe.{os.getpid()}.link"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        os.close(fd)
        try:
            os.link(probe, linked)  # bundles need hard links (not every filesystem has them)
            os.unlink(linked)
        finally:
            os.unlink(probe)
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):  # full: start, refuse new entries
            raise
    size, free = fs_free(str(root))
    return str(root), size, free
