"""The disk tier's entries, read and written: the blocking functions that
``DiskStore`` runs on its executor (never on the event loop).

Owns: the read-and-verify of an entry (into bytes, or as a read-only shared mapping of its
pages), its check again after a mapping of it broke (``drop``), and the publish of a bundle
(write a temporary file, hard-link it under each entry's name, unlink the temporary name).
Must not: keep state (each function takes what it needs and returns a result) or run on the
event loop; decide what is written or kept (``writes`` and ``budget`` do, on the loop).

Verified on every read. A read opens the name, finds the entry in its bundle's table (CRC-32
of the table), then checks the entry's 36-byte header (magic ``NFGC``, format version,
identity length, start, length, CRC-32 of the body, CRC-32 of the header and identity), the
identity (a hash collision cannot serve another object), the size, and the body's CRC-32
(``zlib.crc32``, 4 GB/s here: 27 us for a 110 kB image, on the executor's thread, which
releases the GIL for it). A whole disk hit of a 110 kB entry in the page cache costs ~85 us
of CPU (thread hop, open, fstat, preads, CRC, close). A bad entry (or a name its bundle does
not list) has its name unlinked (if it is still the same inode): the bundle's other entries
stay, each verified when read; it is counted (``nfsgw_disk_cache_corrupt_total``) and the READ
fetches it again.

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

import contextlib
import mmap
import os
import stat
import threading
import zlib
from typing import Final

from gateway import fastwire
from gateway.data.disk.fileformat import (
    FS_BLOCK,
    HEADER,
    TABLE_BYTES,
    DiskKey,
    bundle_charge,
    charge_of,
    check_header,
    encode_header,
    encode_table,
    find_in_table,
    table_bytes,
)
from gateway.fileio import pread_all

__all__ = [
    "BAD",
    "FULL",
    "HIT",
    "MISS",
    "PRESENT",
    "WRITTEN",
    "drop",
    "exists",
    "map_entry",
    "read_entry",
    "verify",
    "write_bundle",
]

HIT, MISS, BAD = 0, 1, 2  # read_entry outcomes
WRITTEN, FULL, PRESENT = 0, 1, 2  # write_bundle outcomes, per entry
_ZEROS: Final = bytes(FS_BLOCK)


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
        hlen = HEADER.size + len(k.ident)
        if why:
            pass
        elif nbytes != hlen + k.length:
            why = f"table row: {nbytes} B at {off}, expected {hlen + k.length} B"
        elif off + nbytes > st.st_size:
            why = f"bundle of {st.st_size} B ends before the entry ({nbytes} B at {off})"
        else:
            # The first entry's header is in the table's page, read already.
            head = page[off : off + hlen] if off + hlen <= len(page) else b""
            why, crc = check_header(head or pread_all(fd, hlen, off), k)
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
        pad = -off % FS_BLOCK if rows else 0
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


def exists(path: str) -> bool:
    """Whether an entry's name is there (a hint: its bundle is bigger than the entry, and a
    read verifies it)."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except FileNotFoundError:
        return False
