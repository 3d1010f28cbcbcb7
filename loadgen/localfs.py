"""``local:DIR`` targets: the workload's calls answered from a local directory, so every report
can carry local disk as its yardstick with the same sampler, patterns, node processes,
data-loader workers and byte checks as the NFS targets (``loadgen.workload.Node`` drives both).

Owns: ``local:DIR`` URLs; ``LocalClient``, which answers the five calls a training data loader
makes through an NFS mount (READDIRPLUS, LOOKUP, GETATTR, ACCESS, READ) with the system calls
a local ``ImageFolder`` makes (``scandir``, ``stat``, ``access``, ``open``+``pread``); its
counts per system call; and ``drop_page_cache``, which writes back and evicts a tree's pages so
that a first epoch reads from the disk like a cold NFS epoch reads from the backend.

Every system call runs in a thread pool bounded at one thread per data-loader worker (a
PyTorch worker blocks in ``read()``; the node's event loop must not). Handles are paths
relative to DIR, never names the client made up: LOOKUP refuses ``/``, ``.`` and ``..``.
Must not: know about epochs or reports, or write to DIR.
"""

from __future__ import annotations

import asyncio
import errno
import os
import stat
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from nfsproto import nfs3
from nfsproto.nfs3 import Fattr3, Ftype3, NfsStat3, NfsTime3, Specdata3

__all__ = ["LOCAL_SCHEME", "LocalClient", "drop_page_cache", "is_local", "local_dir"]

LOCAL_SCHEME = "local:"
# What nfsgw offers as rtpref and the Linux client's largest rsize: a file up to 1 MiB is one
# READ, as a local read() of the whole file.
READ_SIZE = 1 << 20
T = TypeVar("T")


def is_local(url: str) -> bool:
    return url.startswith(LOCAL_SCHEME)


def local_dir(url: str) -> Path:
    """``local:DIR`` -> DIR (resolved); ``ValueError`` if it is not an existing directory."""
    if not is_local(url):
        raise ValueError(f"{url!r}: expected local:DIR")
    raw = url[len(LOCAL_SCHEME) :]
    if not raw:
        raise ValueError(f"{url!r}: local: needs a directory, e.g. local:/data/imagenet/train")
    path = Path(raw).expanduser().resolve()
    if not path.is_dir():
        raise ValueError(f"{url!r}: {path} is not a directory")
    return path


def _time(ns: int) -> NfsTime3:
    return NfsTime3(ns // 1_000_000_000, ns % 1_000_000_000)


def _fattr(st: os.stat_result) -> Fattr3:
    if stat.S_ISDIR(st.st_mode):
        kind = Ftype3.NF3DIR
    elif stat.S_ISREG(st.st_mode):
        kind = Ftype3.NF3REG
    elif stat.S_ISLNK(st.st_mode):
        kind = Ftype3.NF3LNK
    else:
        kind = Ftype3.NF3FIFO
    return Fattr3(
        type=kind,
        mode=stat.S_IMODE(st.st_mode),
        nlink=st.st_nlink,
        uid=st.st_uid,
        gid=st.st_gid,
        size=st.st_size,
        used=st.st_blocks * 512,
        rdev=Specdata3(0, 0),
        fsid=st.st_dev,
        fileid=st.st_ino,
        atime=_time(st.st_atime_ns),
        mtime=_time(st.st_mtime_ns),
        ctime=_time(st.st_ctime_ns),
    )


class LocalClient:
    """A local directory with ``NfsClient``'s calls. ``await LocalClient.open("local:DIR",
    threads=workers)``; ``counts`` holds the system calls made, by name."""

    def __init__(self, root_dir: Path, *, threads: int, timeout_s: float = 60.0) -> None:
        if threads < 1:
            raise ValueError("threads must be >= 1")
        self.dir = root_dir
        self.root = b""
        self.fsinfo = nfs3.Fsinfo3Res(NfsStat3.NFS3_OK, rtmax=READ_SIZE, rtpref=READ_SIZE)
        self.timeout_s = timeout_s
        self.counts: Counter[str] = Counter()
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="loadgen-local")

    @classmethod
    async def open(cls, url: str, *, threads: int = 8, timeout_s: float = 60.0) -> LocalClient:
        return cls(local_dir(url), threads=threads, timeout_s=timeout_s)

    async def close(self) -> None:
        # Waits for the calls still running in the pool (bounded: one per thread).
        await asyncio.get_running_loop().run_in_executor(None, self._pool.shutdown)

    def _path(self, fh: bytes) -> str:
        return os.path.join(self.dir, os.fsdecode(fh)) if fh else str(self.dir)

    async def _call(self, name: str, fn: Callable[[], T]) -> T:
        self.counts[name] += 1
        async with asyncio.timeout(self.timeout_s):
            return await asyncio.get_running_loop().run_in_executor(self._pool, fn)

    # ------------------------------------------------------------------ the calls

    async def readdirplus(
        self, dir_fh: bytes, *, maxcount: int = 65536, max_calls: int = 1_000_000
    ) -> list[nfs3.Entryplus3]:
        """Every entry of a directory with its attributes (one ``scandir`` and a ``stat`` per
        entry, as READDIRPLUS carries them)."""
        path = self._path(dir_fh)

        def scan() -> list[nfs3.Entryplus3]:
            out: list[nfs3.Entryplus3] = []
            with os.scandir(path) as it:
                for i, e in enumerate(it, start=1):
                    st = e.stat(follow_symlinks=True)
                    name = os.fsencode(e.name)
                    fh = os.path.join(dir_fh, name) if dir_fh else name
                    out.append(nfs3.Entryplus3(st.st_ino, name, i, _fattr(st), fh))
            return out

        return await self._call("scandir", scan)

    async def lookup(self, dir_fh: bytes, name: bytes) -> tuple[bytes, Fattr3 | None]:
        if not name or b"/" in name or name in (b".", b".."):
            raise OSError(errno.EINVAL, f"not a file name: {name!r}")
        fh = os.path.join(dir_fh, name) if dir_fh else name
        path = self._path(fh)
        st = await self._call("stat", lambda: os.stat(path))
        return fh, _fattr(st)

    async def getattr(self, fh: bytes) -> Fattr3:
        path = self._path(fh)
        return _fattr(await self._call("stat", lambda: os.stat(path)))

    async def access(self, fh: bytes, mask: int) -> int:
        """The NFS ACCESS bits this process holds, from ``access(2)`` for read (and search)."""
        path = self._path(fh)

        def check() -> int:
            if not os.access(path, os.R_OK):
                raise PermissionError(errno.EACCES, "no read permission", path)
            granted = nfs3.ACCESS3_READ
            if os.access(path, os.X_OK):
                granted |= nfs3.ACCESS3_LOOKUP | nfs3.ACCESS3_EXECUTE
            return granted & mask

        return await self._call("access", check)

    async def read(self, fh: bytes, offset: int, count: int) -> tuple[bytes, bool]:
        """(data, eof): ``open`` + ``pread`` + ``close``, like a reader without a kept fd."""
        path = self._path(fh)

        def pread() -> tuple[bytes, bool]:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                data = os.pread(fd, count, offset)
                return data, offset + len(data) >= os.fstat(fd).st_size
            finally:
                os.close(fd)

        return await self._call("pread", pread)


def drop_page_cache(root: Path) -> int:
    """Write back and evict every regular file under ``root`` from the page cache
    (``fdatasync`` then ``POSIX_FADV_DONTNEED``: no privileges, and nothing outside the tree
    is touched); returns the number of files. Blocking: run it in a thread."""
    n = 0
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            try:
                fd = os.open(os.path.join(dirpath, f), os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                continue  # unreadable: the epoch reports it
            try:
                os.fdatasync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                n += 1
            finally:
                os.close(fd)
    return n
