"""The namespace layer: file handles (``handles``) and the directory index (``index``).

Owns: mapping NFS file handles to export-relative paths and paths to attributes, built from
object listings. Must not: speak XDR or know about RPC; handlers translate ``Entry`` to wire
attributes and map the ``GatewayError``s raised here through ``dispatch``.
"""

from gateway.namespace.config import NamespaceConfig
from gateway.namespace.handles import HandleCodec, fileid, load_or_create_secret
from gateway.namespace.index import (
    DIR_SIZE,
    FIRST_COOKIE,
    DirPage,
    Entry,
    EntryKind,
    Namespace,
    NamespaceStats,
    bad_name,
    cookie_hash,
    join_path,
    parse_metadata,
    split_path,
)

__all__ = [
    "DIR_SIZE",
    "FIRST_COOKIE",
    "bad_name",
    "cookie_hash",
    "join_path",
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
