"""The gateway's shared state as handlers see it: exports, handles, the data reader, and the
helpers every handler uses (resolve a handle, apply export rules, build attributes).

Owns: the mapping from namespace entries to NFS attributes and from credentials to squashed
identities. Must not: touch sockets or encode replies.
"""

from __future__ import annotations

import os
import struct
import zlib
from dataclasses import dataclass, field

from gateway.backend.base import ObjectStore
from gateway.config import ExportConfig, ServerConfig
from gateway.datacache import ObjectReader
from gateway.dispatch import CallContext
from gateway.errors import AccessDenied, BadHandle, NotFound, StaleHandle
from gateway.namespace.handles import HandleCodec, fileid
from gateway.namespace.index import Entry, EntryKind, Namespace
from nfsproto.nfs3 import Fattr3, Ftype3, NfsTime3, Specdata3

_FTYPE = {
    EntryKind.FILE: Ftype3.NF3REG,
    EntryKind.DIR: Ftype3.NF3DIR,
    EntryKind.SYMLINK: Ftype3.NF3LNK,
}
_TYPE_BITS = {EntryKind.FILE: 0o100000, EntryKind.DIR: 0o040000, EntryKind.SYMLINK: 0o120000}


def export_id_for(path: str) -> int:
    """A stable 16-bit id from the export path, so handles survive restarts and are the same
    on every gateway of a fleet with the same exports."""
    return zlib.crc32(path.encode()) & 0xFFFF or 1


@dataclass(slots=True)
class Export:
    id: int
    cfg: ExportConfig
    store: ObjectStore
    ns: Namespace
    prefix: str
    root_handle: bytes = b""

    @property
    def fsid(self) -> int:
        return self.id


@dataclass(slots=True)
class Mount:
    host: str
    path: str


@dataclass(slots=True)
class Gateway:
    config: ServerConfig
    handles: HandleCodec
    reader: ObjectReader
    exports: dict[int, Export] = field(default_factory=dict)
    by_path: dict[str, Export] = field(default_factory=dict)
    mounts: list[Mount] = field(default_factory=list)
    # WRITE/COMMIT verifier: changes at every start (RFC 1813 §3.3.7)
    write_verf: bytes = field(default_factory=lambda: os.urandom(8))
    port: int = 0
    portmap_port: int = 0

    def add_export(self, e: Export) -> None:
        if e.id in self.exports:
            raise ValueError(f"export id collision for {e.cfg.path}; rename an export")
        self.exports[e.id] = e
        self.by_path[e.cfg.path] = e
        e.root_handle = self.handles.encode(e.id, "")

    async def resolve(self, ctx: CallContext, fh: bytes) -> tuple[Export, Entry]:
        """Handle -> (export, entry), with the export's client check. A handle whose object is
        gone is STALE; a forged or foreign one BADHANDLE."""
        export_id, path = await self.handles.decode(fh)
        export = self.exports.get(export_id)
        if export is None:
            raise StaleHandle(f"no export with id {export_id}")
        check_client(ctx, export)
        try:
            entry = await export.ns.getattr(path)
        except NotFound:
            raise StaleHandle(path) from None
        return export, entry

    def handle_for(self, export: Export, path: str) -> bytes:
        """A handle for ``path`` (synchronous). A long path's handle is only durable after
        ``persist_handles``: handlers that hand out handles await it before replying."""
        return self.handles.encode(export.id, path)

    async def persist_handles(self) -> None:
        if self.handles.needs_flush:
            await self.handles.flush()


def check_client(ctx: CallContext, export: Export) -> None:
    if not export.cfg.allows(ctx.peer.host):
        raise AccessDenied(f"client {ctx.peer.host} not allowed on {export.cfg.path}")
    if export.cfg.secure_port and ctx.peer.port >= 1024:
        raise AccessDenied(f"client port {ctx.peer.port} is not privileged")


def creds(ctx: CallContext, export: Export) -> tuple[int, int, tuple[int, ...]]:
    """(uid, gid, gids) after the export's squash rule."""
    cfg = export.cfg
    if cfg.squash == "all" or ctx.flavor == 0:
        return cfg.anonuid, cfg.anongid, ()
    if cfg.squash == "root" and ctx.uid == 0:
        return cfg.anonuid, cfg.anongid, ()
    return ctx.uid, ctx.gid, ctx.gids


def _ts(ns: int) -> NfsTime3:
    s, n = divmod(ns, 1_000_000_000)
    return NfsTime3(s & 0xFFFFFFFF, n)


_NO_DEV = Specdata3(0, 0)


def fattr(export: Export, e: Entry) -> Fattr3:
    cfg = export.cfg
    kind = e.kind
    if e.mode is not None:
        mode = e.mode & 0o7777
    elif kind == EntryKind.DIR:
        mode = cfg.dir_mode
    elif kind == EntryKind.SYMLINK:
        mode = 0o777
    else:
        mode = cfg.file_mode
    size = e.size if kind != EntryKind.DIR else 4096
    m = _ts(e.mtime_ns)
    return Fattr3(
        _FTYPE[kind],
        mode,
        2 if kind == EntryKind.DIR else 1,
        cfg.uid if e.uid is None else e.uid,
        cfg.gid if e.gid is None else e.gid,
        size,
        (size + 4095) & ~4095,
        _NO_DEV,
        export.fsid,
        fileid(export.id, e.path),
        m,
        m,
        _ts(e.ctime_ns) if e.ctime_ns else m,
    )


def mode_bits(export: Export, e: Entry) -> tuple[int, int, int]:
    a = fattr(export, e)
    return a.mode, a.uid, a.gid


_U64 = struct.Struct(">Q")


def cookieverf_bytes(v: int | bytes) -> bytes:
    return v if isinstance(v, bytes) else _U64.pack(v & 0xFFFFFFFFFFFFFFFF)


__all__ = [
    "BadHandle",
    "Export",
    "Gateway",
    "Mount",
    "check_client",
    "creds",
    "export_id_for",
    "fattr",
]
