"""The namespace layer: file handles and the directory index of each export.

Owns: mapping NFS file handles to export-relative paths and paths to attributes, built from
object listings. Must not: speak XDR or know about RPC (handlers translate ``Entry`` to wire
attributes and dispatch maps the ``GatewayError``s raised here), or import the write path or
``gateway.exports`` (both import this layer).

Modules: ``handles`` (handle format, MAC, long-path map), ``paths`` (path form, name rules),
``objmeta`` (the object-metadata schema the write path writes and the index reads),
``entries`` (``Entry``, ``DirPage``, stats, memory constants), ``columns`` (one directory's
entries packed in a few buffers), ``cookies`` (READDIR cookies and verifiers), ``listing``
(LIST requests: whole-directory listings and re-lists compared as they arrive, targeted
lookups), ``directory`` (one cached directory), ``index`` (``Namespace``: the cache of
directories, TTLs), ``config``. Other layers import the names below from ``gateway.namespace``.
"""

from gateway.namespace.config import NamespaceConfig
from gateway.namespace.cookies import FIRST_COOKIE, cookie_hash
from gateway.namespace.entries import DIR_SIZE, DirPage, Entry, EntryKind, NamespaceStats
from gateway.namespace.handles import HandleCodec, fileid, load_or_create_secret
from gateway.namespace.index import Namespace
from gateway.namespace.objmeta import (
    META_CREATEVERF,
    META_GID,
    META_MODE,
    META_MTIME,
    META_SYMLINK,
    META_UID,
    mtime_value,
    parse_metadata,
)
from gateway.namespace.paths import bad_name, join_path, split_path

__all__ = [
    "DIR_SIZE",
    "FIRST_COOKIE",
    "META_CREATEVERF",
    "META_GID",
    "META_MODE",
    "META_MTIME",
    "META_SYMLINK",
    "META_UID",
    "bad_name",
    "cookie_hash",
    "join_path",
    "mtime_value",
    "parse_metadata",
    "split_path",
    "DirPage",
    "Entry",
    "EntryKind",
    "HandleCodec",
    "Namespace",
    "NamespaceConfig",
    "NamespaceStats",
    "fileid",
    "load_or_create_secret",
]
