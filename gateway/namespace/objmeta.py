"""The object-metadata schema nfsgw writes and reads (DESIGN §3 "Attributes"): one place for
the keys, their value formats and their parsing, shared by the index (which reads them) and the
write path and handlers (which write them).

Owns: the ``META_*`` key names, ``parse_metadata`` and ``mtime_value``. Must not: know about
entries, listings or the backend (the S3 backend adds and strips ``x-amz-meta-`` itself).

Keys and formats (bad values are ignored, never an error: the bucket may hold anything):

- ``mode``: octal string, e.g. "100644" or "644"; only the permission bits (0o7777) are kept.
- ``uid``, ``gid``: decimal, 0 <= n < 2**32.
- ``mtime``: decimal integer nanoseconds if >= 10**12, else seconds, fractions allowed
  ("1700000000", "1700000000.5", "1700000000123456789"). It overrides LastModified.
- ``atime``, ``ctime``: as ``mtime``; absent, they equal the mtime. SETATTR of atime stores
  ``atime``; every metadata change (mode, owner, times, size) stores ``ctime`` (now).
- ``symlink-target``: makes the object a SYMLINK with that target.
- ``type``: makes the object a special file: ``fifo``, ``sock``, ``chr`` or ``blk``;
  ``rdev``: a device's numbers, "major,minor" (decimal, each < 2**32).
- ``createverf``: the CREATE EXCLUSIVE verifier (hex), so a resent CREATE finds its file.
- ``ino``: the file's ``fileid`` (decimal) when it differs from its path's: a renamed file
  keeps the number it had (POSIX rename keeps ``st_ino``; the Linux client treats a handle
  whose fileid changes as broken).

A data write drops ``mtime`` and ``ctime`` (LastModified is then both) and ``createverf``.
A directory's marker object (``dir/``) carries ``mode``, ``uid``, ``gid`` and the times of
the directory (``gateway.namespace.dirattrs``).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping
from typing import Final

META_MODE: Final = "mode"
META_UID: Final = "uid"
META_GID: Final = "gid"
META_MTIME: Final = "mtime"
META_ATIME: Final = "atime"
META_CTIME: Final = "ctime"
META_SYMLINK: Final = "symlink-target"
META_TYPE: Final = "type"
META_RDEV: Final = "rdev"
META_CREATEVERF: Final = "createverf"
META_INO: Final = "ino"

SPECIAL_TYPES: Final = frozenset({"fifo", "sock", "chr", "blk"})
"""``type`` values: a FIFO, a socket, a character device, a block device."""


def parse_metadata(
    meta: Mapping[str, str],
) -> tuple[int | None, int | None, int | None, int | None, str | None]:
    """(mode, uid, gid, mtime_ns, symlink target) from object metadata; bad values are ignored."""
    mode = uid = gid = mtime_ns = None
    v = meta.get(META_MODE)
    if v is not None:
        with contextlib.suppress(ValueError):
            mode = int(v, 8) & 0o7777
    v = meta.get(META_UID)
    if v is not None:
        with contextlib.suppress(ValueError):
            uid = int(v) if 0 <= int(v) < 2**32 else None
    v = meta.get(META_GID)
    if v is not None:
        with contextlib.suppress(ValueError):
            gid = int(v) if 0 <= int(v) < 2**32 else None
    mtime_ns = time_ns(meta.get(META_MTIME))
    return mode, uid, gid, mtime_ns, meta.get(META_SYMLINK)


def time_ns(v: str | None) -> int | None:
    """A time value (``mtime``, ``atime``, ``ctime``) in nanoseconds; None if absent or bad."""
    if v is None:
        return None
    with contextlib.suppress(ValueError, OverflowError):
        if "." in v or "e" in v.lower():
            f = float(v)
            return int(f * 1e9) if math.isfinite(f) and f >= 0 else None
        n = int(v)
        if n >= 0:
            return n if n >= 10**12 else n * 10**9
    return None


def parse_special(meta: Mapping[str, str]) -> tuple[str | None, int, int]:
    """(special file type or None, major, minor) from object metadata; bad values are
    ignored (a bad ``type`` makes a regular file, a bad ``rdev`` device 0,0)."""
    kind = meta.get(META_TYPE)
    if kind not in SPECIAL_TYPES:
        return None, 0, 0
    major = minor = 0
    v = meta.get(META_RDEV)
    if v is not None and kind in ("chr", "blk"):
        with contextlib.suppress(ValueError):
            a, b = (int(x) for x in v.split(","))
            if 0 <= a < 2**32 and 0 <= b < 2**32:
                major, minor = a, b
    return kind, major, minor


def parse_ino(meta: Mapping[str, str]) -> int | None:
    """``ino`` metadata (0 < n < 2**64), or None."""
    v = meta.get(META_INO)
    if v is None or not v.isdigit():
        return None
    n = int(v)
    return n if 0 < n < 2**64 else None


def rdev_value(major: int, minor: int) -> str:
    """``rdev`` metadata as ``parse_special`` reads it."""
    return f"{major},{minor}"


def mtime_value(ns: int) -> str:
    """``mtime`` metadata as ``parse_metadata`` reads it: integer nanoseconds when that is
    unambiguous (>= 10**12), else seconds with a fraction."""
    if ns >= 10**12:
        return str(ns)
    s, n = divmod(ns, 10**9)
    return f"{s}.{n:09d}"
