"""The write path (DESIGN §3 "Writes"): staging WRITE data in spool files under a byte
budget, committing it as objects (one PUT, or a multipart upload whose full parts are streamed
as they fill), and the object-level mutations behind CREATE, MKDIR, SYMLINK, SETATTR, REMOVE,
RMDIR and RENAME, each followed by the index update that makes it visible at once.

Modules: ``manager`` (``WriteManager``, the facade handlers use, and the one place backend
errors become ``GatewayError``s), ``staging`` (the staged files, write-back), ``upload``
(``StagedFile`` and how it becomes an object version), ``objects`` (whole-object mutations),
``metadata`` (the full metadata of known object versions), ``locks`` (per-path locks),
``spool`` (spool directory, budget, thread pool), ``extents`` (written byte ranges), ``stats``,
``config``. The object-metadata schema is ``gateway.namespace.objmeta`` (the index reads it).

Must not: import ``nfsproto`` or know about NFS wire types or permissions (handlers own
those), or let a backend exception reach a handler. May import ``gateway.namespace``,
``gateway.data`` and ``gateway.exports``; none of them imports this.
"""

from gateway.writes.config import WriteConfig
from gateway.writes.manager import WriteManager
from gateway.writes.stats import WriteStats
from gateway.writes.upload import StagedFile

__all__ = [
    "StagedFile",
    "WriteConfig",
    "WriteManager",
    "WriteStats",
]
