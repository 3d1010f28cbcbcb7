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
- ``symlink-target``: makes the object a SYMLINK with that target.
- ``createverf``: the CREATE EXCLUSIVE verifier (hex), so a resent CREATE finds its file.

A data write drops ``mtime`` (LastModified is then the new mtime) and ``createverf``.
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
META_SYMLINK: Final = "symlink-target"
META_CREATEVERF: Final = "createverf"


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
    v = meta.get(META_MTIME)
    if v is not None:
        with contextlib.suppress(ValueError, OverflowError):
            if "." in v or "e" in v.lower():
                f = float(v)
                mtime_ns = int(f * 1e9) if math.isfinite(f) and f >= 0 else None
            else:
                n = int(v)
                if n >= 0:
                    mtime_ns = n if n >= 10**12 else n * 10**9
    return mode, uid, gid, mtime_ns, meta.get(META_SYMLINK)


def mtime_value(ns: int) -> str:
    """``mtime`` metadata as ``parse_metadata`` reads it: integer nanoseconds when that is
    unambiguous (>= 10**12), else seconds with a fraction."""
    if ns >= 10**12:
        return str(ns)
    s, n = divmod(ns, 10**9)
    return f"{s}.{n:09d}"
