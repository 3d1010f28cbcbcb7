"""The fast path's wire mechanics in pure Python: the reference twin of ``gateway._fastwire``
(C, built by the package's own build), which must give the same results for the same bytes.

Owns: recognising a call the fast path may answer (``parse_call``) and assembling its reply
records (``reply_*``, each a complete record: mark, RPC accepted-reply header, NFSv3 result).
Must not: decide anything (handle validity, permissions, cache fills are ``gateway.fastpath``'s)
or accept what the ordinary path would reject: ``parse_call`` returns None for every record it
does not fully understand (another program, version or procedure, an auth flavour other than
AUTH_NONE/AUTH_SYS in the credential, a verifier other than an empty AUTH_NONE, a handle over
64 bytes, a name of 0 or over 255 bytes, non-zero XDR padding, a short or over-long record),
and the ordinary path then answers it as it always has. So a record either gets the reply the
ordinary path would give, or goes to it.

Wire layout of the calls accepted (RFC 5531 §9, RFC 1813 §3.3)::

    xid  CALL(0)  rpcvers(2)  prog(100003)  vers(3)  proc
    cred: flavor(0|1) length(<= 400) body pad
    verf: flavor(0) length(0)
    nfs_fh3: length(<= 64) bytes pad
    GETATTR: -          ACCESS: access u32       READ: offset u64, count u32
    LOOKUP: name: length(1..255) bytes pad

``parse_call`` returns ``(xid, proc, cred, fh, x, y)``: ``cred`` is the credential's flavor,
length and body (without padding) as bytes, a key for the per-connection identity cache;
``fh`` the handle's bytes; GETATTR ``x = y = 0``; ACCESS ``x`` the bits asked, ``y = 0``;
READ ``x`` the offset, ``y`` the count; LOOKUP ``x`` the name's bytes and ``y`` the bytes of
the whole arguments (handle and name, as XDR: the key of the LOOKUP table).
"""

from __future__ import annotations

import errno
import functools
import importlib
import mmap
import os
import struct
from types import ModuleType
from typing import Final, Protocol, cast

from nfsproto.limits import NAME_MAX
from nfsproto.rpc import RecordError, RecordReader
from nfsproto.xdr import Buffer

NFS_PROGRAM: Final = 100003
GETATTR: Final = 1
LOOKUP: Final = 3
ACCESS: Final = 4
READ: Final = 6
FATTR3_SIZE: Final = 84
NFS3ERR_NOENT: Final = 2
MAX_AUTH: Final = 400  # RFC 5531 §8.2: opaque_auth bodies are at most 400 bytes
MAX_FH: Final = 64  # NFS3_FHSIZE
MAX_NAME: Final = NAME_MAX
LAST_FRAGMENT: Final = 0x80000000

Call = tuple[int, int, bytes, bytes, int | bytes, int | bytes]

_CALL: Final = struct.Struct(">8I")  # xid, msg_type, rpcvers, prog, vers, proc, flavor, len
_U32: Final = struct.Struct(">I")
_U32X3: Final = struct.Struct(">3I")
_READ: Final = struct.Struct(">QI")
# mark, xid, REPLY, MSG_ACCEPTED, verf AUTH_NONE, verf length 0, SUCCESS, nfsstat3
_HEAD: Final = struct.Struct(">8I")
_HEAD_SIZE: Final = _HEAD.size - 4  # the record's bytes in the head (the mark is not counted)
_ONE: Final = b"\0\0\0\1"  # post_op_attr: attributes follow
_PAD: Final = (b"", b"\0\0\0", b"\0\0", b"\0")


def _zero(rec: memoryview, start: int, end: int) -> bool:
    return start == end or not any(rec[start:end])


def parse_call(record: bytes | bytearray | memoryview) -> Call | None:
    """``record`` (one RPC record, without its mark) as a fast-path call, or None."""
    rec = record if isinstance(record, memoryview) else memoryview(record)
    n = len(rec)
    if n < 44:  # the header, an empty credential and verifier, a handle's length
        return None
    xid, mtype, rpcvers, prog, vers, proc, flavor, clen = _CALL.unpack_from(rec, 0)
    if mtype != 0 or rpcvers != 2 or prog != NFS_PROGRAM or vers != 3:
        return None
    if proc != GETATTR and proc != LOOKUP and proc != ACCESS and proc != READ:
        return None
    if flavor > 1 or clen > MAX_AUTH:
        return None
    cend = 32 + clen
    p = cend + (-clen & 3)
    if p + 12 > n or not _zero(rec, cend, p):
        return None
    vflavor, vlen, fhlen = _U32X3.unpack_from(rec, p)
    if vflavor != 0 or vlen != 0 or fhlen > MAX_FH:
        return None
    args = p + 8
    q = p + 12
    fend = q + fhlen
    a = fend + (-fhlen & 3)
    if a > n or not _zero(rec, fend, a):
        return None
    cred = bytes(rec[24:cend])
    fh = bytes(rec[q:fend])
    if proc == GETATTR:
        return (xid, proc, cred, fh, 0, 0) if a == n else None
    if proc == ACCESS:
        if a + 4 != n:
            return None
        return (xid, proc, cred, fh, _U32.unpack_from(rec, a)[0], 0)
    if proc == READ:
        if a + 12 != n:
            return None
        offset, count = _READ.unpack_from(rec, a)
        return (xid, proc, cred, fh, offset, count)
    # LOOKUP
    if a + 4 > n:
        return None
    (nlen,) = _U32.unpack_from(rec, a)
    if nlen == 0 or nlen > MAX_NAME:
        return None
    nend = a + 4 + nlen
    if nend + (-nlen & 3) != n or not _zero(rec, nend, n):
        return None
    return (xid, proc, cred, fh, bytes(rec[a + 4 : nend]), bytes(rec[args:n]))


def _check_attr(attr: bytes) -> None:
    if len(attr) != FATTR3_SIZE:
        raise ValueError(f"fattr3 is {FATTR3_SIZE} bytes, not {len(attr)}")


def _head(length: int, xid: int, status: int) -> bytes:
    return _HEAD.pack(LAST_FRAGMENT | (_HEAD_SIZE + length), xid, 1, 0, 0, 0, 0, status)


def reply_getattr(xid: int, attr: bytes) -> bytes:
    """GETATTR3res, NFS3_OK: the attributes."""
    _check_attr(attr)
    return _head(FATTR3_SIZE, xid, 0) + attr


def reply_access(xid: int, attr: bytes, access: int) -> bytes:
    """ACCESS3res, NFS3_OK: post_op_attr and the bits allowed."""
    _check_attr(attr)
    return _head(4 + FATTR3_SIZE + 4, xid, 0) + _ONE + attr + _U32.pack(access)


def reply_lookup(xid: int, fh: bytes, attr: bytes, dir_attr: bytes) -> bytes:
    """LOOKUP3res, NFS3_OK: the handle, the object's and the directory's post_op_attr."""
    _check_attr(attr)
    _check_attr(dir_attr)
    n = len(fh)
    if n > MAX_FH:
        raise ValueError(f"a handle is at most {MAX_FH} bytes, not {n}")
    body = 4 + n + (-n & 3) + 2 * (4 + FATTR3_SIZE)
    return b"".join(
        (_head(body, xid, 0), _U32.pack(n), fh, _PAD[n & 3], _ONE, attr, _ONE, dir_attr)
    )


def reply_lookup_noent(xid: int, dir_attr: bytes) -> bytes:
    """LOOKUP3res, NFS3ERR_NOENT: the directory's post_op_attr."""
    _check_attr(dir_attr)
    return _head(4 + FATTR3_SIZE, xid, NFS3ERR_NOENT) + _ONE + dir_attr


def reply_read_head(xid: int, attr: bytes, count: int, eof: bool) -> bytes:
    """READ3res, NFS3_OK, up to the data: post_op_attr, count, eof and the data's length.
    The record's mark counts the ``count`` data bytes and their padding, which the caller
    sends after it (``pad(count)``)."""
    _check_attr(attr)
    if not 0 <= count <= 0x7FFFFF00:
        raise ValueError(f"bad READ count {count}")
    body = 4 + FATTR3_SIZE + 12 + count + (-count & 3)
    return _head(body, xid, 0) + _ONE + attr + _U32X3.pack(count, 1 if eof else 0, count)


def pad(n: int) -> bytes:
    """The XDR padding after ``n`` opaque bytes."""
    return _PAD[n & 3]


# -- which twin ------------------------------------------------------------------------------


@functools.cache
def compiled() -> ModuleType | None:
    """``gateway._fastwire``, or None: ``NFSGW_PURE_PYTHON=1`` asks for the Python twins, or
    the extension was not built (``compiled_error`` says why)."""
    if os.environ.get("NFSGW_PURE_PYTHON", "") not in ("", "0"):
        return None
    try:
        return importlib.import_module("gateway._fastwire")
    except ImportError:
        return None


def compiled_error() -> str | None:
    """Why the compiled twin is not used (None: it is)."""
    if compiled() is not None:
        return None
    if os.environ.get("NFSGW_PURE_PYTHON", "") not in ("", "0"):
        return "NFSGW_PURE_PYTHON is set"
    try:
        importlib.import_module("gateway._fastwire")
    except ImportError as e:
        return f"the extension is not built ({e})"
    return None


class Records(Protocol):
    """``nfsproto.rpc.RecordReader``'s interface (the C twin has the same)."""

    def feed(self, data: Buffer, /) -> list[Buffer]: ...

    def pending_bytes(self) -> int: ...


def record_reader(max_record: int) -> Records:
    """A record reader for one connection: the C one unless the Python twins are asked for
    or missing; both raise ``RecordError`` for a record over ``max_record``."""
    c = compiled()
    if c is None:
        return RecordReader(max_record)
    reader: Records = c.RecordReader(max_record, RecordError)
    return reader


class _FileMap(mmap.mmap):
    """The Python twin's mapping: ``mmap.mmap``, plus a descriptor of its own on the file
    (``fd``, closed with it) and the mapped range's place in the file (``offset``, ``end``),
    so that its bytes can be read with ``pread`` instead of through the mapping
    (``copy_mapped``) and the file's size checked (``mapped_readable``)."""

    fd: int = -1
    offset: int = 0
    end: int = 0

    def __del__(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


_MADV_POPULATE_READ: Final = 22  # Linux 5.14; mmap has no name for it before Python 3.13


def map_file(fd: int, size: int, offset: int = 0) -> Buffer:
    """``size`` (> 0) bytes of the file open on ``fd`` from ``offset`` (a multiple of
    ``mmap.PAGESIZE``), mapped read-only and shared, as a buffer (``memoryview`` it). The C
    twin keeps no file descriptor; the Python twin keeps two (``mmap.mmap``'s duplicate of
    ``fd``, and its own for ``copy_mapped``: ``mapping_fds``). OSError when the kernel
    refuses the mapping (an unaligned offset: EINVAL), ValueError for a range past the
    file's end.

    A page of the mapping that the file no longer covers (another program truncated it) or
    that the kernel cannot read back (an I/O error) raises SIGBUS when user space touches it,
    which kills the process: read a mapping's bytes with ``copy_mapped``, and check it with
    ``mapped_readable`` just before a kernel-side copy (``send``: EFAULT there, not SIGBUS)."""
    c = compiled()
    if c is None:
        if size > os.fstat(fd).st_size - offset:
            raise ValueError("mmap length is greater than file size")
        m = _FileMap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ, offset=offset)
        m.fd = os.dup(fd)
        m.offset, m.end = offset, offset + size
        return cast(Buffer, m)
    mapped: Buffer = c.Mapping(fd, size, offset)
    return mapped


def mapping_types() -> tuple[type, ...]:
    """The types ``map_file`` returns (a memoryview's ``obj`` is one of them)."""
    c = compiled()
    return (mmap.mmap,) if c is None else (mmap.mmap, c.Mapping)


def mapping_fds() -> bool:
    """Whether each mapping costs file descriptors (two: the Python twin's)."""
    return compiled() is None


def _file_range(data: memoryview, lo: int, hi: int) -> tuple[_FileMap, int, int] | None:
    """The Python twin's mapping behind ``data`` and where ``data[lo:hi]`` is in its file,
    when ``data`` reaches the end of that mapping (the disk tier's views do:
    ``gateway.data.disk.entries._map``)."""
    m = data.obj
    if not isinstance(m, _FileMap):
        return None
    at = m.end - len(data) + lo  # data ends where the mapping ends
    return m, at, at + (hi - lo)


def mapped_readable(data: memoryview, lo: int, hi: int) -> bool:
    """Whether every page of ``data[lo:hi]`` can be read now, without a signal; ``data`` is a
    view of a mapping from ``map_file`` that reaches the mapping's end (the disk tier's
    bodies: ``gateway.data.disk.entries._map``). The C twin asks the kernel to populate those
    pages (``madvise`` ``MADV_POPULATE_READ``: EFAULT where a touch would raise SIGBUS; on an
    older kernel it loads a byte of each page under a SIGBUS guard). The Python twin checks
    with ``fstat`` that the file still reaches the end of the range, then populates the
    whole mapping (a body's pages and no more) the same way; on a kernel without
    ``MADV_POPULATE_READ`` a page it cannot read back (an I/O error) goes unseen there."""
    c = compiled()
    if c is not None and not isinstance(data.obj, mmap.mmap):
        return bool(c.mapped_readable(data[lo:hi]))
    where = _file_range(data, lo, hi)
    if where is None:
        return True  # not a file mapping of ours: nothing can fault
    m, _, end = where
    try:
        if os.fstat(m.fd).st_size < end:
            return False
        m.madvise(_MADV_POPULATE_READ)
    except OSError as e:
        return e.errno == errno.EINVAL  # no MADV_POPULATE_READ: the size was checked
    except ValueError:  # closed
        return False
    return True


def copy_mapped(data: memoryview, lo: int, hi: int) -> bytes | None:
    """``data[lo:hi]`` copied into a ``bytes`` (``data`` as ``mapped_readable`` takes it), or
    None when one of its pages cannot be read (the file was truncated under the mapping, or an
    I/O error). The C twin copies from the mapping under a SIGBUS guard; the Python twin reads
    the same bytes from the file with ``pread`` (the same page cache pages; a short read or
    an ``OSError`` is None): neither can raise SIGBUS."""
    c = compiled()
    if c is not None and not isinstance(data.obj, mmap.mmap):
        got: bytes | None = c.copy_mapped(data[lo:hi])
        return got
    where = _file_range(data, lo, hi)
    if where is None:
        return bytes(data[lo:hi])
    m, start, end = where
    try:
        out = os.pread(m.fd, end - start, start)
        while 0 < len(out) < end - start:  # a short read before the end: go on
            more = os.pread(m.fd, end - start - len(out), start + len(out))
            if not more:
                break
            out += more
    except OSError:
        return None
    return out if len(out) == end - start else None
