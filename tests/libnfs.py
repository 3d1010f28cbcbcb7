"""A synchronous ctypes wrapper over libnfs (``libnfs.so.13``, libnfs 4.0): an independent NFSv3
client for integration tests, so the gateway is never proven right by our own client alone.

Owns: loading the library, the struct layouts it returns, and turning its ``-errno`` results
into ``OSError(errno, nfs_get_error text)``. Must not: import anything from the gateway.

    with LibNfs("nfs://127.0.0.1/data?nfsport=P&mountport=P&version=3&auto-traverse-mounts=0")
        as nfs:
        size, mode = nfs.stat("/a/b.jpg")[:2]
        data = nfs.read_file("/a/b.jpg")

Every call blocks until the server answers: never call it on the event loop that runs the
gateway under test (``tests.harness.thread`` runs it on its own thread). One ``LibNfs`` is
one libnfs context (one TCP connection); use one per thread.

What libnfs 4.0 does on the wire, which request counts in tests must allow for:

- It skips the portmapper only when the URL has both ``nfsport=`` and ``mountport=``; it
  silently ignores unknown URL keys; without ``auto-traverse-mounts=0`` it calls MOUNT EXPORT
  after MNT.
- Every path is resolved from the mount root on each call: ``stat("/d/f")`` sends LOOKUP "d",
  LOOKUP "f" and a GETATTR of the result; ``open`` adds an ACCESS (and fails unless the
  server grants exactly what was asked).
- ``opendir`` reads the whole directory at once with READDIRPLUS of at most 8 KiB per reply,
  so a large directory takes many cookies; the wrapper turns off libnfs's directory cache so
  each ``opendir`` really lists.
- ``read``/``pread`` send one READ of ``min(count, readmax)`` bytes (the server's FSINFO
  ``rtmax``); ``read_file`` loops until EOF.
"""

from __future__ import annotations

import ctypes
import errno as errno_mod
import os
from ctypes import (
    POINTER,
    Structure,
    byref,
    c_char_p,
    c_int,
    c_int64,
    c_uint32,
    c_uint64,
    c_void_p,
)
from dataclasses import dataclass
from types import TracebackType
from typing import Any, ClassVar

__all__ = [
    "NF3DIR",
    "NF3LNK",
    "NF3REG",
    "DirEntry",
    "LibNfs",
    "Stat",
    "libnfs_available",
    "load_libnfs",
]

LIBNFS_SONAME = "libnfs.so.13"

# ftype3 (RFC 1813 §2.5), as nfsdirent.type carries it.
NF3REG, NF3DIR, NF3LNK = 1, 2, 5

SEEK_SET, SEEK_CUR, SEEK_END = os.SEEK_SET, os.SEEK_CUR, os.SEEK_END


class _NfsUrl(Structure):
    # include/nfsc/libnfs.h (4.0): struct nfs_url
    _fields_: ClassVar[list[tuple[str, Any]]] = [
        ("server", c_char_p),
        ("path", c_char_p),
        ("file", c_char_p),
    ]


class _NfsStat64(Structure):
    # include/nfsc/libnfs.h (4.0): struct nfs_stat_64, seventeen uint64_t
    _fields_: ClassVar[list[tuple[str, Any]]] = [
        (name, c_uint64)
        for name in (
            "nfs_dev",
            "nfs_ino",
            "nfs_mode",
            "nfs_nlink",
            "nfs_uid",
            "nfs_gid",
            "nfs_rdev",
            "nfs_size",
            "nfs_blksize",
            "nfs_blocks",
            "nfs_atime",
            "nfs_mtime",
            "nfs_ctime",
            "nfs_atime_nsec",
            "nfs_mtime_nsec",
            "nfs_ctime_nsec",
            "nfs_used",
        )
    ]


class _Timeval(Structure):
    _fields_: ClassVar[list[tuple[str, Any]]] = [
        ("tv_sec", ctypes.c_long),
        ("tv_usec", ctypes.c_long),
    ]


class _NfsDirent(Structure):
    pass


# include/nfsc/libnfs.h (4.0): struct nfsdirent
_NfsDirent._fields_ = [
    ("next", POINTER(_NfsDirent)),
    ("name", c_char_p),
    ("inode", c_uint64),
    ("type", c_uint32),
    ("mode", c_uint32),
    ("size", c_uint64),
    ("atime", _Timeval),
    ("mtime", _Timeval),
    ("ctime", _Timeval),
    ("uid", c_uint32),
    ("gid", c_uint32),
    ("nlink", c_uint32),
    ("dev", c_uint64),
    ("rdev", c_uint64),
    ("blksize", c_uint64),
    ("blocks", c_uint64),
    ("used", c_uint64),
    ("atime_nsec", c_uint32),
    ("mtime_nsec", c_uint32),
    ("ctime_nsec", c_uint32),
]


@dataclass(frozen=True, slots=True)
class Stat:
    """``nfs_stat64`` result; ``mode`` includes the file-type bits (S_IFREG, S_IFDIR)."""

    size: int
    mode: int
    ino: int
    nlink: int
    uid: int
    gid: int
    mtime: int
    mtime_nsec: int
    dev: int


@dataclass(frozen=True, slots=True)
class DirEntry:
    """One ``nfsdirent`` (READDIRPLUS attributes). ``type`` is an ftype3 (NF3REG, NF3DIR)."""

    name: str
    inode: int
    type: int
    mode: int
    size: int


_lib: ctypes.CDLL | None = None


def load_libnfs() -> ctypes.CDLL:
    """Load libnfs once and declare the prototypes used here (libnfs.h, 4.0)."""
    global _lib
    if _lib is not None:
        return _lib
    lib = ctypes.CDLL(os.environ.get("NFSGW_LIBNFS") or LIBNFS_SONAME)
    ctx = c_void_p
    fh = c_void_p

    def proto(fn: str, restype: Any, *argtypes: Any) -> None:
        f = getattr(lib, fn)
        f.restype = restype
        f.argtypes = list(argtypes)

    proto("nfs_init_context", ctx)
    proto("nfs_destroy_context", None, ctx)
    proto("nfs_get_error", c_char_p, ctx)
    proto("nfs_parse_url_dir", POINTER(_NfsUrl), ctx, c_char_p)
    proto("nfs_destroy_url", None, POINTER(_NfsUrl))
    proto("nfs_mount", c_int, ctx, c_char_p, c_char_p)
    proto("nfs_umount", c_int, ctx)
    proto("nfs_set_timeout", None, ctx, c_int)
    proto("nfs_set_dircache", None, ctx, c_int)
    proto("nfs_get_readmax", c_uint64, ctx)
    proto("nfs_stat64", c_int, ctx, c_char_p, POINTER(_NfsStat64))
    proto("nfs_open", c_int, ctx, c_char_p, c_int, POINTER(fh))
    proto("nfs_close", c_int, ctx, fh)
    proto("nfs_read", c_int, ctx, fh, c_uint64, c_void_p)
    proto("nfs_pread", c_int, ctx, fh, c_uint64, c_uint64, c_void_p)
    proto("nfs_lseek", c_int, ctx, fh, c_int64, c_int, POINTER(c_uint64))
    proto("nfs_opendir", c_int, ctx, c_char_p, POINTER(c_void_p))
    proto("nfs_readdir", POINTER(_NfsDirent), ctx, c_void_p)
    proto("nfs_closedir", None, ctx, c_void_p)
    _lib = lib
    return lib


def libnfs_available() -> bool:
    try:
        load_libnfs()
    except OSError:
        return False
    return True


def _encode(path: str) -> bytes:
    return path.encode("utf-8")


class LibNfs:
    """One mounted libnfs context. Not thread-safe: one per thread."""

    def __init__(self, url: str, *, timeout_ms: int = 60_000, dircache: bool = False) -> None:
        self.url = url
        self._lib = lib = load_libnfs()
        ctx = lib.nfs_init_context()
        if not ctx:
            raise OSError(errno_mod.ENOMEM, "nfs_init_context failed")
        self._ctx: int | None = ctx
        self._mounted = False
        try:
            lib.nfs_set_timeout(ctx, timeout_ms)
            lib.nfs_set_dircache(ctx, int(dircache))
            purl = lib.nfs_parse_url_dir(ctx, _encode(url))
            if not purl:
                raise OSError(errno_mod.EINVAL, f"{url}: {self._error()}")
            try:
                rc = lib.nfs_mount(ctx, purl.contents.server, purl.contents.path)
            finally:
                lib.nfs_destroy_url(purl)
            self._check(rc, f"mount {url}")
        except BaseException:
            lib.nfs_destroy_context(ctx)
            self._ctx = None
            raise
        self._mounted = True

    # ----------------------------------------------------------------------------- plumbing

    @property
    def ctx(self) -> int:
        if self._ctx is None:
            raise ValueError("libnfs context is closed")
        return self._ctx

    def _error(self) -> str:
        if self._ctx is None:
            return ""
        raw = self._lib.nfs_get_error(self._ctx)
        return raw.decode("utf-8", "replace") if raw else ""

    def _check(self, rc: int, what: str) -> int:
        if rc < 0:
            raise OSError(-rc, f"{what}: {self._error() or os.strerror(-rc)}")
        return rc

    @property
    def readmax(self) -> int:
        return int(self._lib.nfs_get_readmax(self.ctx))

    # ----------------------------------------------------------------------------- files

    def stat(self, path: str) -> Stat:
        st = _NfsStat64()
        self._check(self._lib.nfs_stat64(self.ctx, _encode(path), byref(st)), f"stat {path}")
        return Stat(
            size=st.nfs_size,
            mode=st.nfs_mode,
            ino=st.nfs_ino,
            nlink=st.nfs_nlink,
            uid=st.nfs_uid,
            gid=st.nfs_gid,
            mtime=st.nfs_mtime,
            mtime_nsec=st.nfs_mtime_nsec,
            dev=st.nfs_dev,
        )

    def open(self, path: str, flags: int = os.O_RDONLY) -> int:
        """A libnfs file handle (an opaque pointer) for ``read``/``pread``/``lseek``/``close``."""
        fh = c_void_p()
        self._check(self._lib.nfs_open(self.ctx, _encode(path), flags, byref(fh)), f"open {path}")
        assert fh.value is not None
        return fh.value

    def close_file(self, fh: int) -> None:
        self._check(self._lib.nfs_close(self.ctx, c_void_p(fh)), "close")

    def read(self, fh: int, n: int) -> bytes:
        """One READ of up to ``n`` bytes at the file position (advances it)."""
        buf = ctypes.create_string_buffer(n)
        got = self._check(self._lib.nfs_read(self.ctx, c_void_p(fh), n, buf), "read")
        return buf.raw[:got]

    def pread(self, fh: int, offset: int, n: int) -> bytes:
        buf = ctypes.create_string_buffer(n)
        got = self._check(self._lib.nfs_pread(self.ctx, c_void_p(fh), offset, n, buf), "pread")
        return buf.raw[:got]

    def lseek(self, fh: int, offset: int, whence: int = SEEK_SET) -> int:
        pos = c_uint64()
        self._check(
            self._lib.nfs_lseek(self.ctx, c_void_p(fh), offset, whence, byref(pos)), "lseek"
        )
        return int(pos.value)

    def read_file(self, path: str, chunk: int = 1 << 20) -> bytes:
        """The whole file: open, READ until a zero-byte (EOF) reply, close."""
        fh = self.open(path)
        try:
            parts: list[bytes] = []
            off = 0
            while True:
                data = self.pread(fh, off, chunk)
                if not data:
                    break
                parts.append(data)
                off += len(data)
            return b"".join(parts)
        finally:
            self.close_file(fh)

    # ----------------------------------------------------------------------------- directories

    def scandir(self, path: str, *, dots: bool = False) -> list[DirEntry]:
        """Every entry of ``path`` in the order the server sent them (libnfs reads the whole
        directory in ``opendir``); "." and ".." only with ``dots``."""
        d = c_void_p()
        self._check(self._lib.nfs_opendir(self.ctx, _encode(path), byref(d)), f"opendir {path}")
        out: list[DirEntry] = []
        try:
            while True:
                ent = self._lib.nfs_readdir(self.ctx, d)
                if not ent:
                    break
                e = ent.contents
                name = (e.name or b"").decode("utf-8", "surrogateescape")
                if not dots and name in (".", ".."):
                    continue
                out.append(DirEntry(name, int(e.inode), int(e.type), int(e.mode), int(e.size)))
        finally:
            self._lib.nfs_closedir(self.ctx, d)
        return out

    def listdir(self, path: str) -> list[str]:
        return [e.name for e in self.scandir(path)]

    # ----------------------------------------------------------------------------- life cycle

    def close(self) -> None:
        ctx, self._ctx = self._ctx, None
        if ctx is None:
            return
        try:
            if self._mounted:
                self._lib.nfs_umount(ctx)  # MOUNT UMNT; its result does not matter here
        finally:
            self._lib.nfs_destroy_context(ctx)

    def __enter__(self) -> LibNfs:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __del__(self) -> None:
        # A forgotten context leaks a socket; closing from a finaliser is the last resort.
        if getattr(self, "_ctx", None) is not None:
            self.close()
