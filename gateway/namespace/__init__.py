"""The namespace layer: file handles and the directory index of each export.

Owns: mapping NFS file handles to export-relative paths and paths to attributes, built from
object listings. Must not: speak XDR or know about RPC (handlers translate ``Entry`` to wire
attributes and dispatch maps the ``GatewayError``s raised here), or import the write path or
``gateway.exports`` (both import this layer). Of ``nfsproto`` it imports exactly
``nfsproto.limits`` (constants: a handle's size, a name's length).

Modules: ``handles`` (handle format, MAC, path hashes), ``resolve`` (``Handles``: hashed
handles back to paths through the index, walks), ``legacymap`` (old long-handle map),
``paths`` (path form, name rules),
``objmeta`` (the object-metadata schema the write path writes and the index reads),
``dirattrs`` (directory attributes from marker metadata), ``moved`` (renamed files' old paths),
``entries`` (``Entry``, ``DirPage``, stats, memory constants), ``columns`` (one directory's
entries packed in a few buffers), ``cookies`` (READDIR cookies and verifiers), ``listing``
(LIST requests: whole-directory listings and re-lists compared as they arrive, targeted
lookups), ``directory`` (one cached directory), ``index`` (``Namespace``: the cache of
directories), ``schedule`` (TTLs, when to re-list, listing ahead), ``probes`` (targeted lookups
of one name), ``config``. Other layers import the names below from ``gateway.namespace``.
"""

from gateway.namespace.config import NamespaceConfig
from gateway.namespace.cookies import FIRST_COOKIE, cookie_hash
from gateway.namespace.entries import DIR_SIZE, DirPage, Entry, EntryKind, NamespaceStats
from gateway.namespace.handles import HandleCodec, fileid, load_or_create_secret
from gateway.namespace.index import NO_WATCHER, DirWatcher, Namespace
from gateway.namespace.objmeta import (
    META_ATIME,
    META_CREATEVERF,
    META_CTIME,
    META_GID,
    META_INO,
    META_MODE,
    META_MTIME,
    META_RDEV,
    META_SYMLINK,
    META_TYPE,
    META_UID,
    mtime_value,
    parse_metadata,
    rdev_value,
)
from gateway.namespace.paths import bad_name, join_path, split_path
from gateway.namespace.resolve import Handles

__all__ = [
    "DIR_SIZE",
    "FIRST_COOKIE",
    "META_ATIME",
    "META_CREATEVERF",
    "META_CTIME",
    "META_GID",
    "META_INO",
    "META_MODE",
    "META_MTIME",
    "META_RDEV",
    "META_SYMLINK",
    "META_TYPE",
    "META_UID",
    "NO_WATCHER",
    "bad_name",
    "cookie_hash",
    "join_path",
    "mtime_value",
    "parse_metadata",
    "rdev_value",
    "split_path",
    "DirPage",
    "DirWatcher",
    "Entry",
    "EntryKind",
    "HandleCodec",
    "Handles",
    "Namespace",
    "NamespaceConfig",
    "NamespaceStats",
    "fileid",
    "load_or_create_secret",
]
