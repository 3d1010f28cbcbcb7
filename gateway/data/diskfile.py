"""The disk tier's files: their names, their format, and the blocking operations on them
that ``gateway.data.disk.DiskStore`` runs on its executor (never on the event loop).

Owns: the layout ``<cache_dir>/v1/<2 hex>/<32 hex>`` (the name is the BLAKE2b-128 of the
entry's identity) and ``<cache_dir>/v1/locks/<3 hex>`` (the fetch claims), the entry format
(36-byte header, identity, body: ``encode_header``), the read-and-verify (into bytes, or as a
read-only shared mapping), the write-then-rename, the claims (``flock`` on a lock file), the
directory scan, eviction by unlink and the mtime touches. Must not: keep state (each function
takes what it needs and returns a result) or run on the event loop.

Mappings. A body served as a mapping (``map_entry``, ``write_entry(..., mapped=True)``) is a
``MAP_SHARED``, ``PROT_READ`` view of the entry file's pages (``fastwire.map_file``: no file
descriptor kept per mapping, unless the Python twin has to use ``mmap.mmap``), which are the
page cache's: every worker process mapping the same entry reads the same physical pages, so
the host holds a file once however many workers serve it. It is safe because nfsgw never
changes an entry file in place: a new entry is a new inode renamed over the name, eviction
and a failed verification unlink it, and an unlinked inode lives on until its last mapping
is gone. What would break a mapping is outside nfsgw: a file under the cache directory
truncated or rewritten in place by another program (delete files there, never edit them),
or the disk failing under a page the kernel has to read again; either raises SIGBUS in the
process that touches it (docs/operations.md, "Disk cache tier").
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import heapq
import os
import stat
import struct
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from gateway import fastwire
from gateway.fileio import pread_all

__all__ = [
    "LAYOUT",
    "DiskKey",
    "Scan",
    "charge_of",
    "disk_key",
    "encode_header",
    "evict",
    "exists",
    "claim",
    "fs_free",
    "map_entry",
    "prepare",
    "read_entry",
    "scan",
    "touch",
    "write_entry",
]

LAYOUT: Final = "v1"
MAGIC: Final = b"NFGC"
FORMAT_VERSION: Final = 1
# magic, format version, flags, identity length, start, length, body CRC-32, header CRC-32
_HDR: Final = struct.Struct("<4sHHIQQII")
_FS_BLOCK: Final = 4096
STALE_TMP_NS: Final = 3600 * 10**9  # a temporary file this old is a crashed writer's
_SUBDIRS: Final = tuple(f"{i:02x}" for i in range(256))

HIT, MISS, BAD = 0, 1, 2  # read_entry outcomes
WRITTEN, FULL, PRESENT = 0, 1, 2  # write_entry outcomes
LOCKS: Final = "locks"  # under the layout directory: the fetch claims' lock files
LOCK_STRIPES: Final = 4096  # lock files (3 hex digits of the entry name)


def charge_of(file_bytes: int) -> int:
    """What a file of ``file_bytes`` is charged against the budget (whole 4 KiB blocks)."""
    return -(-file_bytes // _FS_BLOCK) * _FS_BLOCK


@dataclass(frozen=True, slots=True)
class DiskKey:
    """One entry: bytes ``[start, start + length)`` of the object version ``ident``."""

    name: str
    ident: bytes
    start: int
    length: int

    @property
    def file_bytes(self) -> int:
        return _HDR.size + len(self.ident) + self.length

    @property
    def charge(self) -> int:
        return charge_of(self.file_bytes)

    @property
    def hash64(self) -> int:
        return int(self.name[:16], 16)


def disk_key(store: str, key: str, etag: str, start: int, length: int) -> DiskKey:
    ident = f"{store}\0{key}\0{etag}".encode("utf-8", "surrogatepass")
    h = hashlib.blake2b(ident, digest_size=16)
    h.update(struct.pack("<QQ", start, length))
    return DiskKey(h.hexdigest(), ident, start, length)


def encode_header(k: DiskKey, body_crc: int) -> bytes:
    fixed = _HDR.pack(MAGIC, FORMAT_VERSION, 0, len(k.ident), k.start, k.length, body_crc, 0)
    hcrc = zlib.crc32(k.ident, zlib.crc32(fixed[:-4]))
    return fixed[:-4] + struct.pack("<I", hcrc) + k.ident


def _check_header(head: bytes, k: DiskKey) -> tuple[str, int]:
    """("", body CRC) when ``head`` is a valid header of ``k``, else (why, 0)."""
    if len(head) != _HDR.size + len(k.ident):
        return "short header", 0
    magic, version, _, ilen, start, length, body_crc, hcrc = _HDR.unpack_from(head)
    if magic != MAGIC or version != FORMAT_VERSION:
        return "not an entry of this format", 0
    if zlib.crc32(head[_HDR.size :], zlib.crc32(head[: _HDR.size - 4])) != hcrc:
        return "header checksum", 0
    if (
        ilen != len(k.ident)
        or head[_HDR.size :] != k.ident
        or (start, length)
        != (
            k.start,
            k.length,
        )
    ):
        return "another entry's identity", 0
    return "", body_crc


# ---------------------------------------------------------------------- executor functions


def read_entry(path: str, k: DiskKey) -> tuple[int, bytes, str]:
    """(HIT, body, "") of a verified entry; (MISS, b"", "") when there is none; (BAD, b"",
    why) when it failed verification (then it is unlinked, unless already replaced)."""
    status, body, why = _open_verified(path, k, mapped=False)
    assert isinstance(body, bytes)
    return status, body, why


def map_entry(path: str, k: DiskKey) -> tuple[int, memoryview | bytes, str]:
    """``read_entry`` with the body as a read-only shared mapping of the file (the module
    docstring's "Mappings"), verified once here; an empty body is ``b""``."""
    return _open_verified(path, k, mapped=True)


def _map(fd: int, size: int, offset: int) -> memoryview | None:
    """``[offset, size)`` of ``fd`` as a read-only shared mapping; None when the kernel
    refuses one (ENOMEM: the process is at ``vm.max_map_count``): the caller copies."""
    try:
        m = fastwire.map_file(fd, size)
    except OSError:
        return None
    return memoryview(m)[offset:]


def _open_verified(path: str, k: DiskKey, mapped: bool) -> tuple[int, memoryview | bytes, str]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return MISS, b"", ""
    try:
        st = os.fstat(fd)
        hlen = _HDR.size + len(k.ident)
        why = ""
        if st.st_size != hlen + k.length:
            why = f"size {st.st_size}, expected {hlen + k.length}"
        else:
            why, crc = _check_header(pread_all(fd, hlen, 0), k)
            if not why:
                body: memoryview | bytes
                if not k.length:
                    body = b""
                else:
                    body = (_map(fd, st.st_size, hlen) if mapped else None) or pread_all(
                        fd, k.length, hlen
                    )
                if len(body) != k.length:
                    why = "short read"
                elif zlib.crc32(body) != crc:
                    why = "body checksum"
                else:
                    return HIT, body, ""
    finally:
        os.close(fd)
    with contextlib.suppress(FileNotFoundError):
        if os.stat(path).st_ino == st.st_ino:  # not replaced by a good copy meanwhile
            os.unlink(path)
    return BAD, b"", why


def _write_all(fd: int, bufs: list[bytes | memoryview]) -> None:
    views = [memoryview(b) for b in bufs if b]
    while views:
        n = os.writev(fd, views)
        while views and n >= len(views[0]):
            n -= len(views[0])
            views.pop(0)
        if views and n:
            views[0] = views[0][n:]


def write_entry(
    root: str,
    k: DiskKey,
    data: bytes | memoryview,
    min_free: int,
    tmp_name: str,
    mapped: bool = False,
) -> tuple[int, int, memoryview | None]:
    """Publish ``data`` as ``k``: (WRITTEN, free bytes after, the body mapped when ``mapped``
    asks for it), (FULL, free, None) below the floor, or (PRESENT, free, None) when an entry
    of the right size is already there (another process fetched it too: nothing written)."""
    d = os.path.join(root, k.name[:2])
    vfs = os.statvfs(d)
    free = vfs.f_bavail * vfs.f_frsize
    if free - k.charge < min_free:
        return FULL, free, None
    dest = os.path.join(d, k.name)
    if exists(dest, k.file_bytes):
        return PRESENT, free, None
    header = encode_header(k, zlib.crc32(data))
    tmp = os.path.join(d, tmp_name)
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    view: memoryview | None = None
    try:
        try:
            _write_all(fd, [header, data])
            if mapped and data:
                # The inode about to become the entry: its pages are the ones every other
                # process maps; this process drops its private copy for them.
                view = _map(fd, len(header) + len(data), len(header))
        finally:
            os.close(fd)
        os.rename(tmp, dest)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return WRITTEN, free - k.charge, view


def claim(root: str, k: DiskKey) -> tuple[int, bool]:
    """Try to claim the fetch of ``k`` among the processes sharing ``root``: (fd, False) when
    this process now holds the claim (an exclusive ``flock`` on ``k``'s lock stripe, released
    by closing ``fd``, or by the kernel when the process dies, even by SIGKILL); (-1, True)
    when the entry is already there (read it); (-1, False) when another process holds the
    stripe (try again later). Stripes are never unlinked (no lock-then-unlink race); two
    entries on one stripe (1 in 4,096) serialise their fetches, which is all it costs."""
    path = os.path.join(root, k.name[:2], k.name)
    if exists(path, k.file_bytes):
        return -1, True
    lock = os.path.join(root, LOCKS, k.name[:3])
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return -1, False
    except BaseException:
        os.close(fd)
        raise
    if exists(path, k.file_bytes):  # published between the first look and the lock
        os.close(fd)
        return -1, True
    return fd, False


def exists(path: str, file_bytes: int) -> bool:
    try:
        return os.stat(path).st_size == file_bytes
    except FileNotFoundError:
        return False


@dataclass(slots=True)
class Scan:
    used: int
    entries: int
    free: int
    oldest: list[tuple[int, str, int]]  # (mtime_ns, name, charge), oldest first
    seconds: float


def fs_free(path: str) -> tuple[int, int]:
    """(size, free bytes for unprivileged users) of the filesystem holding ``path``."""
    vfs = os.statvfs(path)
    return vfs.f_blocks * vfs.f_frsize, vfs.f_bavail * vfs.f_frsize


def scan(root: str, keep: int) -> Scan:
    t0 = time.monotonic()
    now_ns = time.time_ns()
    used = n = 0
    heap: list[tuple[int, str, int]] = []  # (-mtime_ns, ...): the newest of the kept on top
    for sub in _SUBDIRS:
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
                    if now_ns - st.st_mtime_ns > STALE_TMP_NS:
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(e.path)
                    continue
                c = charge_of(st.st_size)
                used += c
                n += 1
                item = (-st.st_mtime_ns, e.name, c)
                if len(heap) < keep:
                    heapq.heappush(heap, item)
                elif item > heap[0]:
                    heapq.heapreplace(heap, item)
    oldest = sorted((-m, name, c) for m, name, c in heap)
    return Scan(used, n, fs_free(root)[1], oldest, time.monotonic() - t0)


def evict(root: str, victims: list[tuple[int, str, int]]) -> list[int]:
    """Unlink the victims not touched since they were scanned; their charges."""
    out: list[int] = []
    for mtime_ns, name, _ in victims:
        path = os.path.join(root, name[:2], name)
        try:
            st = os.stat(path)
            if st.st_mtime_ns > mtime_ns:
                continue  # hit (by any worker) since the scan: not a victim any more
            os.unlink(path)
        except FileNotFoundError:
            continue
        out.append(charge_of(st.st_size))
    return out


def touch(root: str, names: list[str]) -> None:
    now = time.time_ns()
    for name in names:
        with contextlib.suppress(FileNotFoundError):
            os.utime(os.path.join(root, name[:2], name), ns=(now, now))


def prepare(cache_dir: Path) -> tuple[str, int, int]:
    """Create the layout and prove it writable; (root, fs size, fs free). Raises OSError."""
    cache_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not cache_dir.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "not a directory", str(cache_dir))
    root = cache_dir / LAYOUT
    root.mkdir(mode=0o700, exist_ok=True)
    for sub in (*_SUBDIRS, LOCKS):
        (root / sub).mkdir(mode=0o700, exist_ok=True)
    probe = root / f".probe.{os.getpid()}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):  # full: start, refuse new entries
            raise
    size, free = fs_free(str(root))
    return str(root), size, free
