r"""The disk tier's files: their names, their format, and the blocking operations on them
that ``gateway.data.disk.DiskStore`` runs on its executor (never on the event loop).

Owns: the layout ``<cache_dir>/v2/<2 hex>/<32 hex>`` (the name is the BLAKE2b-128 of the
entry's identity) and ``<cache_dir>/v2/locks/<3 hex>`` (the fetch claims), the bundle format
(below), ``<cache_dir>/v2/locks/owner`` and ``guests`` (who else uses the directory), the
name filter of a sole user (``NameFilter``), the read-and-verify (into bytes, or as a
read-only shared mapping), the publish of a bundle (write a temporary file, hard-link it under
each entry's name, unlink the temporary name), the claims (``flock`` on a lock file), the
directory scan (per inode), eviction by unlink, the mtime touches, and the removal of an older
layout's directory. Must not: keep state (each function takes what it needs and returns a
result; ``Presence`` holds the locks it took) or run on the event loop.

Bundles (layout v2). The file behind an entry's name is a *bundle*: one inode holding up to
``MAX_BUNDLE_ENTRIES`` entries, each of them a hard link to it. Creating, renaming and
evicting an inode costs a filesystem far more CPU than appending to one (ext4 without a
journal scans for recently deleted inodes on every allocation: 180-270 us per 110 kB entry
file here, 47 us per entry in bundles of 64), so entries are published in batches, one inode
per batch. A bundle is:

* a table at its start, within its first 4 KiB page: magic ``NFGB``, format version (2),
  entry count (u16), then per entry the 16 bytes of its name (the BLAKE2b-128), its offset
  and its length in bytes (u64 each), then a CRC-32 of all of it (``encode_table``:
  ``table_bytes(n)`` = 12 + 32 n bytes, so at most ``MAX_BUNDLE_ENTRIES`` = 127 entries);
* its entries, in the entry format: a 36-byte header (magic ``NFGC``, format version,
  identity length, start, length, CRC-32 of the body, CRC-32 of the header and identity:
  ``encode_header``), the identity bytes, then the body. The first entry starts right after
  the table (a bundle of one entry, a warm-up's, is then no bigger on disk than the entry
  alone would be, and the table's page is read anyway), each later one at a 4 KiB-aligned
  offset (its pages are its own).

A reader opens the entry's name, reads the table, finds its own name in it, and checks the
entry's header, identity, size and body CRC (``read_entry``). A name whose bundle does not
list it, a table or an entry that fails a check: that one name is BAD and unlinked (if it is
still the same inode); the bundle's other entries are verified on their own when read.

Mappings. A body served as a mapping (``map_entry``, ``write_bundle(..., mapped=True)``) is a
``MAP_SHARED``, ``PROT_READ`` view of the pages the body spans in its bundle, and no more
(``_map``: a fault maps as much of a large page-cache folio as the mapping reaches;
``fastwire.map_file``: no file descriptor kept per mapping, unless the Python twin has to
use ``mmap.mmap``), whose pages are the page cache's: every worker process mapping the
same entry reads the same physical pages, so the host holds a file once however many
workers serve it. nfsgw never changes a bundle in place: a new entry is a new inode linked
under the name, eviction and a failed verification unlink names, and an unlinked inode lives
on until its last mapping is gone (a mapping of one entry keeps its whole bundle's disk space
until then). What breaks a mapping is outside nfsgw: a file under the cache directory
truncated by another program, or the disk failing under a page the kernel has to read again.
A user-space touch of such a page raises SIGBUS, which would kill the worker, so none is
made unguarded: a mapped entry's body CRC is computed by ``pread`` calls reading the file into a
per-thread scratch buffer (kernel-side copies: an I/O error is an ``OSError``), never through
the mapping; the mapping is made once the entry verified, and a range the file no longer
covers by then is refused by ``map_file`` (ValueError: the entry is BAD). Later readers of the
mapping check it before each use (``gateway.data.reader``: ``fastwire.mapped_readable``,
``fastwire.copy_mapped``) and drop a broken one (``drop``).
"""

from __future__ import annotations

import array
import contextlib
import errno
import fcntl
import hashlib
import heapq
import mmap
import os
import stat
import struct
import threading
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from gateway import fastwire
from gateway.fileio import pread_all

__all__ = [
    "LAYOUT",
    "MAX_BUNDLE_ENTRIES",
    "DiskKey",
    "NameFilter",
    "Presence",
    "Scan",
    "Victim",
    "charge_of",
    "claim",
    "disk_key",
    "drop",
    "encode_header",
    "encode_table",
    "evict",
    "exists",
    "fs_free",
    "guests_present",
    "map_entry",
    "presence",
    "prepare",
    "read_entry",
    "scan",
    "sweep_old_layouts",
    "table_bytes",
    "table_charge",
    "touch",
    "verify",
    "write_bundle",
]

LAYOUT: Final = "v2"
OLD_LAYOUTS: Final = ("v1",)  # removed in the background (``sweep_old_layouts``)
MAGIC: Final = b"NFGC"
FORMAT_VERSION: Final = 1
# magic, format version, flags, identity length, start, length, body CRC-32, header CRC-32
_HDR: Final = struct.Struct("<4sHHIQQII")
BUNDLE_MAGIC: Final = b"NFGB"
BUNDLE_VERSION: Final = 2
_TABLE_HEAD: Final = struct.Struct("<4sHH")  # magic, format version, entry count
_TABLE_ROW: Final = struct.Struct("<16sQQ")  # name, offset, entry bytes
_CRC: Final = struct.Struct("<I")
_FS_BLOCK: Final = 4096
TABLE_BYTES: Final = _FS_BLOCK  # the page holding a bundle's table (what a reader reads first)
MAX_BUNDLE_ENTRIES: Final = (TABLE_BYTES - _TABLE_HEAD.size - _CRC.size) // _TABLE_ROW.size
_ZEROS: Final = bytes(_FS_BLOCK)
STALE_TMP_NS: Final = 3600 * 10**9  # a temporary file this old is a crashed writer's
_SUBDIRS: Final = tuple(f"{i:02x}" for i in range(256))

HIT, MISS, BAD = 0, 1, 2  # read_entry outcomes
WRITTEN, FULL, PRESENT = 0, 1, 2  # write_bundle outcomes, per entry
LOCKS: Final = "locks"  # under the layout directory: the fetch claims' lock files
LOCK_STRIPES: Final = 4096  # lock files (3 hex digits of the entry name)
OWNER_LOCK: Final = "owner"  # under LOCKS: held by the directory's first unshared user
GUESTS_LOCK: Final = "guests"  # under LOCKS: held shared by every other unshared user


def charge_of(file_bytes: int) -> int:
    """What a file of ``file_bytes`` is charged against the budget (whole 4 KiB blocks)."""
    return -(-file_bytes // _FS_BLOCK) * _FS_BLOCK


def table_bytes(entries: int) -> int:
    """The length of a bundle's table of ``entries`` rows."""
    return _TABLE_HEAD.size + entries * _TABLE_ROW.size + _CRC.size


def table_charge(first_entry_bytes: int, entries: int) -> int:
    """What a bundle of ``entries`` costs beyond its entries' own charges (``DiskKey.charge``):
    its table, in the first entry's last page when it fits there, else one more page."""
    return charge_of(table_bytes(entries) + first_entry_bytes) - charge_of(first_entry_bytes)


@dataclass(frozen=True, slots=True)
class DiskKey:
    """One entry: bytes ``[start, start + length)`` of the object version ``ident``."""

    name: str
    ident: bytes
    start: int
    length: int

    @property
    def file_bytes(self) -> int:
        """The entry's bytes in its bundle (header, identity, body)."""
        return _HDR.size + len(self.ident) + self.length

    @property
    def charge(self) -> int:
        """Its share of a bundle: its bytes rounded up to 4 KiB (later entries are 4 KiB
        aligned; the table is charged to the bundle: ``table_charge``)."""
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


def encode_table(rows: list[tuple[str, int, int]]) -> bytes:
    """A bundle's table for entries (name, offset, entry bytes): ``table_bytes(len(rows))``."""
    if not 0 < len(rows) <= MAX_BUNDLE_ENTRIES:
        raise ValueError(f"a bundle holds 1 to {MAX_BUNDLE_ENTRIES} entries")
    parts = [_TABLE_HEAD.pack(BUNDLE_MAGIC, BUNDLE_VERSION, len(rows))]
    parts += [_TABLE_ROW.pack(bytes.fromhex(n), off, nb) for n, off, nb in rows]
    table = b"".join(parts)
    return table + _CRC.pack(zlib.crc32(table))


def find_in_table(page: bytes, name: str) -> tuple[str, int, int]:
    """("", offset, entry bytes) of ``name`` in the table at the start of ``page`` (a
    bundle's first bytes), else (why, 0, 0); the offset is past the table. Never raises:
    any bytes are a table or a reason."""
    if len(page) < table_bytes(1):
        return "short table", 0, 0
    magic, version, count = _TABLE_HEAD.unpack_from(page)
    if magic != BUNDLE_MAGIC or version != BUNDLE_VERSION:
        return "not a bundle of this format", 0, 0
    end = table_bytes(count) - _CRC.size
    if not 0 < count <= MAX_BUNDLE_ENTRIES or end + _CRC.size > len(page):
        return "entry count", 0, 0
    if zlib.crc32(memoryview(page)[:end]) != _CRC.unpack_from(page, end)[0]:
        return "table checksum", 0, 0
    want = bytes.fromhex(name)
    pos = page.find(want, _TABLE_HEAD.size, end)
    while pos >= 0 and (pos - _TABLE_HEAD.size) % _TABLE_ROW.size:
        pos = page.find(want, pos + 1, end)  # a match across two rows' fields
    if pos < 0:
        return "not in its bundle", 0, 0
    _, off, nbytes = _TABLE_ROW.unpack_from(page, pos)
    if off < end + _CRC.size:
        return f"entry at {off}, inside the table", 0, 0
    return "", off, nbytes


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
    why) when it failed verification (then its name is unlinked, unless already replaced)."""
    status, body, why, _ = verify(path, k, mapped=False)
    assert isinstance(body, bytes)
    return status, body, why


def map_entry(path: str, k: DiskKey) -> tuple[int, memoryview | bytes, str]:
    """``read_entry`` with the body as a read-only shared mapping of its pages (the module
    docstring's "Mappings"), verified once here; an empty body is ``b""``."""
    status, body, why, _ = verify(path, k, mapped=True)
    return status, body, why


def drop(path: str, k: DiskKey) -> tuple[int, str, int]:
    """Check the entry of ``k`` again after a mapping of it was found broken (its file
    truncated, or a page unreadable): verified from the file (no mapping), so a BAD one is
    unlinked as ``verify`` does (unless its name was replaced meanwhile), and a good copy
    published since by another process stays. (status, why, bytes freed)."""
    status, _, why, freed = verify(path, k, mapped=False)
    return status, why, freed


def _map(fd: int, start: int, end: int) -> memoryview | None:
    """Bytes ``[start, end)`` of ``fd`` as a read-only shared mapping of the pages they span
    and no more: a fault maps as much of a large page-cache folio as the mapping reaches (a
    freshly written bundle's folios are up to MiBs), so a mapping of a whole bundle made one
    body's hit resident for its neighbours too. None when the kernel refuses one (ENOMEM:
    the process is at ``vm.max_map_count``) or the file no longer reaches ``end`` (another
    program truncated it: ValueError): the caller reads a copy, which sees the same."""
    first = start - start % mmap.PAGESIZE
    try:
        return memoryview(fastwire.map_file(fd, end - first, first))[start - first :]
    except (OSError, ValueError):
        return None


_SCRATCH: Final = 256 * 1024  # bytes read at a time to check a mapped body's CRC
_scratch = threading.local()


def _crc_of(fd: int, length: int, offset: int) -> int | None:
    """The CRC-32 of ``length`` bytes of ``fd`` at ``offset``, read with ``preadv`` into this
    thread's scratch buffer (no allocation per read, and no user-space touch of a mapping);
    None when the file ends first."""
    buf: bytearray | None = getattr(_scratch, "buf", None)
    if buf is None:
        buf = _scratch.buf = bytearray(_SCRATCH)
    view = memoryview(buf)
    crc = 0
    done = 0
    while done < length:
        n = os.preadv(fd, [view[: min(_SCRATCH, length - done)]], offset + done)
        if n <= 0:
            return None
        crc = zlib.crc32(view[:n], crc)
        done += n
    return crc


def verify(path: str, k: DiskKey, mapped: bool) -> tuple[int, memoryview | bytes, str, int]:
    """``read_entry``/``map_entry`` and, for a BAD entry, the bytes its unlink freed (its
    bundle's charge when that was the bundle's last name, else 0)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return MISS, b"", "", 0
    try:
        st = os.fstat(fd)
        page = pread_all(fd, TABLE_BYTES, 0)
        why, off, nbytes = find_in_table(page, k.name)
        hlen = _HDR.size + len(k.ident)
        if why:
            pass
        elif nbytes != hlen + k.length:
            why = f"table row: {nbytes} B at {off}, expected {hlen + k.length} B"
        elif off + nbytes > st.st_size:
            why = f"bundle of {st.st_size} B ends before the entry ({nbytes} B at {off})"
        else:
            # The first entry's header is in the table's page, read already.
            head = page[off : off + hlen] if off + hlen <= len(page) else b""
            why, crc = _check_header(head or pread_all(fd, hlen, off), k)
            if not why:
                body: memoryview | bytes | None = b""
                if k.length and mapped:
                    # The CRC from the file, then the mapping (module docstring, "Mappings").
                    got = _crc_of(fd, k.length, off + hlen)
                    if got is None:
                        why = "short read"
                    elif got != crc:
                        why = "body checksum"
                    else:
                        body = _map(fd, off + hlen, off + nbytes)
                        if body is not None:
                            return HIT, body, "", 0
                if not why and k.length:  # not mapped, or the mapping was refused: a copy
                    body = pread_all(fd, k.length, off + hlen)
                    if len(body) != k.length:
                        why = "short read"
                    elif zlib.crc32(body) != crc:
                        why = "body checksum"
                if not why:
                    assert body is not None
                    return HIT, body, "", 0
        freed = 0
        with contextlib.suppress(FileNotFoundError):
            if os.stat(path).st_ino == st.st_ino:  # not replaced by a good copy meanwhile
                os.unlink(path)
                if os.fstat(fd).st_nlink == 0:  # its last name: the bundle's space returns
                    freed = charge_of(st.st_size)
    finally:
        os.close(fd)
    return BAD, b"", why, freed


def _write_all(fd: int, bufs: list[bytes | memoryview]) -> None:
    views = [memoryview(b) for b in bufs if b]
    while views:
        n = os.writev(fd, views[:1024])  # IOV_MAX
        while views and n >= len(views[0]):
            n -= len(views[0])
            views.pop(0)
        if views and n:
            views[0] = views[0][n:]


def bundle_charge(keys: list[DiskKey]) -> int:
    """What a bundle of ``keys`` is charged: its entries' charges and its table's."""
    return table_charge(keys[0].file_bytes, len(keys)) + sum(k.charge for k in keys)


def write_bundle(
    root: str,
    keys: list[DiskKey],
    data: list[bytes | memoryview],
    min_free: int,
    tmp_name: str,
    mapped: bool = False,
) -> tuple[list[int], int, list[memoryview | None], int]:
    """Publish ``data[i]`` as ``keys[i]``, all in one bundle: (per entry WRITTEN, or PRESENT
    when an entry of that name is already there (another process fetched it too), or FULL
    when the bundle would take the filesystem below ``min_free`` (nothing written); free
    bytes after; per entry the body mapped when ``mapped`` asks for it and it was written;
    the bundle's charge, 0 when no name of it was linked).
    The bundle is written as ``tmp_name`` in the first entry's directory (one ``writev``),
    hard-linked under each entry's name, then the temporary name is unlinked. Raises OSError
    (the temporary file removed; names already linked stay: each is a verified entry)."""
    n = len(keys)
    vfs = os.statvfs(os.path.join(root, keys[0].name[:2]))
    free = vfs.f_bavail * vfs.f_frsize
    dests = [os.path.join(root, k.name[:2], k.name) for k in keys]
    status = [PRESENT if exists(d) else WRITTEN for d in dests]
    todo = [i for i in range(n) if status[i] == WRITTEN]
    views: list[memoryview | None] = [None] * n
    if not todo:
        return status, free, views, 0
    charge = bundle_charge([keys[i] for i in todo])
    if free - charge < min_free:
        return [FULL if s == WRITTEN else s for s in status], free, views, 0
    rows: list[tuple[str, int, int]] = []
    bufs: list[bytes | memoryview] = []
    off = table_bytes(len(todo))
    for i in todo:
        k, body = keys[i], data[i]
        header = encode_header(k, zlib.crc32(body))
        pad = -off % _FS_BLOCK if rows else 0
        if pad:
            bufs.append(memoryview(_ZEROS)[:pad])
            off += pad
        rows.append((k.name, off, len(header) + len(body)))
        bufs += [header, body]
        off += len(header) + len(body)
    bufs.insert(0, encode_table(rows))
    tmp = os.path.join(root, keys[todo[0]].name[:2], tmp_name)
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        try:
            _write_all(fd, bufs)
            if mapped:
                # The inode about to be the bundle: its pages are the ones every other process
                # maps; this process drops its private copies for them (each body its own
                # mapping: ``_map``).
                for i, (_, eoff, nbytes) in zip(todo, rows, strict=True):
                    if keys[i].length:
                        views[i] = _map(fd, eoff + nbytes - keys[i].length, eoff + nbytes)
        finally:
            os.close(fd)
        for i in todo:
            try:
                os.link(tmp, dests[i])
            except FileExistsError:  # published by another process since the look above
                status[i] = PRESENT
                views[i] = None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    if WRITTEN not in status:
        charge = 0  # the unlink above freed it
    return status, free - charge, views, charge


def claim(root: str, k: DiskKey) -> tuple[int, bool]:
    """Try to claim the fetch of ``k`` among the processes sharing ``root``: (fd, False) when
    this process now holds the claim (an exclusive ``flock`` on ``k``'s lock stripe, released
    by closing ``fd``, or by the kernel when the process dies, even by SIGKILL); (-1, True)
    when the entry's name is already there (read it: a read verifies); (-1, False) when
    another process holds the stripe (try again later). Stripes are never unlinked (no
    lock-then-unlink race); two entries on one stripe (1 in 4,096) serialise their fetches,
    which is all it costs."""
    path = os.path.join(root, k.name[:2], k.name)
    if exists(path):
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
    if exists(path):  # published between the first look and the lock
        os.close(fd)
        return -1, True
    return fd, False


def exists(path: str) -> bool:
    """Whether an entry's name is there (a hint: its bundle is bigger than the entry, and a
    read verifies it)."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except FileNotFoundError:
        return False


# -- who else uses the directory, and what a sole user knows is there ----------------------


class Presence:
    """This process's place among the users of the tier that do not share it (``presence``):
    the *owner* (``owner_fd`` >= 0: holds ``locks/owner``) or a *guest* (holds ``locks/guests``
    shared for its life, and wrote a fresh nonce into it on arrival). The owner maps the
    first 8 bytes of ``locks/guests`` (``mark``): a guest's arrival changes them before it
    writes any entry, so the owner sees it without a system call (same host: one page cache)."""

    __slots__ = ("_map", "guests_fd", "owner_fd")

    def __init__(self, owner_fd: int, guests_fd: int) -> None:
        self.owner_fd = owner_fd
        self.guests_fd = guests_fd
        self._map = mmap.mmap(guests_fd, _MARK, prot=mmap.PROT_READ) if owner_fd >= 0 else None

    @property
    def owner(self) -> bool:
        return self.owner_fd >= 0

    def mark(self) -> bytes:
        """The owner's view of the last guest's nonce (b"" for a guest)."""
        return self._map[:_MARK] if self._map is not None else b""

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None
        for fd in (self.owner_fd, self.guests_fd):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)  # drops the flock
        self.owner_fd = self.guests_fd = -1


_MARK: Final = 8  # bytes of the guests' nonce at the start of locks/guests


def presence(root: str) -> Presence:
    """Take this process's place (``Presence``): the first unshared user to take
    ``locks/owner`` (an exclusive ``flock``, non-blocking, held for the process's life and
    dropped by the kernel when it dies) is the owner; any other (a second gateway on the same
    directory, a second store in one process: each open is its own lock) takes
    ``locks/guests`` shared, held likewise (the owner's ``guests_present``), then writes a
    fresh nonce at its start (the owner's ``Presence.mark``). Blocking (a guest may wait out
    an owner's check): the executor's."""
    flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC
    owner = os.open(os.path.join(root, LOCKS, OWNER_LOCK), flags, 0o600)
    guests = -1
    try:
        try:
            fcntl.flock(owner, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(owner)
            owner = -1
        guests = os.open(os.path.join(root, LOCKS, GUESTS_LOCK), flags, 0o600)
        if owner >= 0:
            if os.fstat(guests).st_size < _MARK:
                os.ftruncate(guests, _MARK)  # extends with zeros: never overwrites a nonce
        else:
            fcntl.flock(guests, fcntl.LOCK_SH)
            os.pwrite(guests, os.urandom(_MARK), 0)
        return Presence(owner, guests)
    except BaseException:
        for fd in (owner, guests):
            if fd >= 0:
                os.close(fd)
        raise


def guests_present(guests_fd: int) -> bool:
    """Whether any guest holds ``locks/guests`` (the owner's question): an exclusive,
    non-blocking ``flock`` that is dropped at once when it was granted."""
    try:
        fcntl.flock(guests_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    fcntl.flock(guests_fd, fcntl.LOCK_UN)
    return False


class NameFilter:
    """The entry names a sole user of the tier knows are there: a Bloom filter over the names'
    first 64 bits (``DiskKey.hash64``; the names are BLAKE2b, so those bits are uniform),
    ``bits`` (a power of two) and 4 probes by double hashing. Never a false "absent" for a
    name added; a false "present" (< 1 % while it holds at most ``bits / 10`` names, the
    size ``sized_for`` picks) only costs the look-up it would have made anyway. Names are never
    removed (an evicted or dropped name stays "present" until the next scan rebuilds it)."""

    __slots__ = ("_bits", "_mask", "count")

    PROBES: Final = 4
    MIN_BITS: Final = 1 << 20  # 128 KiB
    MAX_BITS: Final = 1 << 27  # 16 MiB

    def __init__(self, bits: int) -> None:
        if bits <= 0 or bits & (bits - 1):
            raise ValueError("bits must be a power of two")
        self._bits = bytearray(bits >> 3)
        self._mask = bits - 1
        self.count = 0

    @classmethod
    def sized_for(cls, names: int) -> NameFilter:
        """A filter for ``names`` now and as many more written before the next scan: ~10-20
        bits per name, within ``MIN_BITS``..``MAX_BITS``."""
        want = 20 * max(names, 1)
        bits = cls.MIN_BITS
        while bits < want and bits < cls.MAX_BITS:
            bits <<= 1
        return cls(bits)

    @property
    def nbytes(self) -> int:
        return len(self._bits)

    @property
    def capacity(self) -> int:
        """Names it holds at < 1 % false "present" (10 bits each)."""
        return (self._mask + 1) // 10

    def add(self, h: int) -> None:
        m, b = self._mask, self._bits
        x, step = h & 0xFFFFFFFF, (h >> 32) | 1
        for _ in range(self.PROBES):
            i = x & m
            b[i >> 3] |= 1 << (i & 7)
            x += step
        self.count += 1

    def __contains__(self, h: int) -> bool:
        m, b = self._mask, self._bits
        x, step = h & 0xFFFFFFFF, (h >> 32) | 1
        for _ in range(self.PROBES):
            i = x & m
            if not b[i >> 3] & (1 << (i & 7)):
                return False
            x += step
        return True


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
    for sub in (*_SUBDIRS, LOCKS):
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
