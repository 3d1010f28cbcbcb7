"""The write path (DESIGN §3 "Writes"): staging WRITE data in spool files under a byte
budget, committing it as objects (one PUT, or a multipart upload whose full parts are streamed
as they fill), and the object-level mutations behind CREATE, MKDIR, SYMLINK, SETATTR, REMOVE,
RMDIR and RENAME, each followed by the index update that makes it visible at once.

``extents.py`` tracks written byte ranges, ``spool.py`` owns the spool directory, its budget
and its thread pool, ``manager.py`` everything else. Must not: know about NFS wire types or
permissions (handlers own those).
"""

from gateway.writes.config import WriteConfig
from gateway.writes.manager import (
    META_CREATEVERF,
    META_GID,
    META_MODE,
    META_MTIME,
    META_SYMLINK,
    META_UID,
    FileTooBig,
    StagedFile,
    WriteManager,
    WriteStats,
    mtime_value,
)

__all__ = [
    "META_CREATEVERF",
    "META_GID",
    "META_MODE",
    "META_MTIME",
    "META_SYMLINK",
    "META_UID",
    "FileTooBig",
    "StagedFile",
    "WriteConfig",
    "WriteManager",
    "WriteStats",
    "mtime_value",
]
