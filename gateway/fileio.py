"""Blocking file helpers shared by the stores that keep files (the local backend, the disk
tier): whole reads at an offset and directory fsync.

Owns: nothing but these functions. Must not: import any other gateway module (backend and
data both import it), or run on the event loop (callers run them in their threads).
"""

from __future__ import annotations

import os


def pread_all(fd: int, n: int, offset: int) -> bytes:
    """``n`` bytes of ``fd`` at ``offset``; fewer only at the end of the file (``os.pread``
    may return less than asked before that, e.g. on a signal or a network file system)."""
    if n <= 0:
        return b""
    data = os.pread(fd, n, offset)
    if len(data) == n or not data:
        return data
    chunks = [data]
    got = len(data)
    while got < n:
        more = os.pread(fd, n - got, offset + got)
        if not more:
            break
        chunks.append(more)
        got += len(more)
    return b"".join(chunks)


def fsync_dir(path: str) -> None:
    """Make the directory ``path``'s entries (a rename into it) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
