"""The gateway's shared state as handlers see it: exports, handles, the data reader, and the
helpers every handler uses (resolve a handle, apply export rules, build attributes).

Owns: the mapping from namespace entries to NFS attributes and from credentials to squashed
identities. Must not: touch sockets or encode replies.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field

import structlog

from gateway.backend.base import ObjectStore
from gateway.config import ExportConfig, ServerConfig, export_id_for
from gateway.datacache import ObjectReader
from gateway.dispatch import CallContext
from gateway.errors import AccessDenied, BadHandle, CrossDevice, NotFound, StaleHandle
from gateway.namespace.handles import HandleCodec, fileid
from gateway.namespace.index import Entry, EntryKind, Namespace
from gateway.writes import WriteConfig, WriteManager
from nfsproto.nfs3 import Fattr3, Ftype3, NfsTime3, Specdata3

_FTYPE = {
    EntryKind.FILE: Ftype3.NF3REG,
    EntryKind.DIR: Ftype3.NF3DIR,
    EntryKind.SYMLINK: Ftype3.NF3LNK,
}
_TYPE_BITS = {EntryKind.FILE: 0o100000, EntryKind.DIR: 0o040000, EntryKind.SYMLINK: 0o120000}


log = structlog.get_logger(__name__)


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
class GatewayStats:
    """Counters read by ``gateway.metrics``. ``files_opened``: READs at offset 0, what opening
    and reading a file produces (NFSv3 has no OPEN), so backend requests per file opened is
    ``nfsgw_s3_requests_total / nfsgw_files_opened_total``."""

    files_opened: int = 0
    clients_denied: int = 0  # calls refused by an export's client list or port rule
    mounts_denied: int = 0
    permission_denied: int = 0  # LOOKUP/READDIR/READ refused by mode bits after squashing


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
    stats: GatewayStats = field(default_factory=GatewayStats)
    # Staged writes and object mutations (gateway.writes); its spool lives in the state dir.
    writes: WriteManager = field(init=False)

    def __post_init__(self) -> None:
        self.writes = WriteManager(WriteConfig.from_server(self.config), self.reader)

    def add_export(self, e: Export) -> None:
        if e.id in self.exports:
            raise ValueError(f"export id collision for {e.cfg.path}; rename an export")
        self.exports[e.id] = e
        self.by_path[e.cfg.path] = e
        e.root_handle = self.handles.encode(e.id, "")

    def remove_export(self, e: Export) -> None:
        """Handles of a removed export answer STALE from now on."""
        if self.exports.get(e.id) is e:
            del self.exports[e.id]
        if self.by_path.get(e.cfg.path) is e:
            del self.by_path[e.cfg.path]

    async def resolve(
        self, ctx: CallContext, fh: bytes, *, current: bool = False
    ) -> tuple[Export, Entry]:
        """Handle -> (export, entry), with the export's client check; maps the caller's
        credentials by the export's squash rule (``ctx.export_id`` records it, so every
        procedure sees the mapped identity). A second handle of another export in the same
        call (RENAME, LINK) is NFS3ERR_XDEV. A handle whose object is gone is STALE; a forged
        or foreign one BADHANDLE. ``current``: attributes not older than the TTL (see
        ``Namespace.getattr``)."""
        export_id, path = await self.handles.decode(fh)
        export = self.exports.get(export_id)
        if export is None:
            raise StaleHandle(f"no export with id {export_id}")
        if ctx.export_id != export_id:
            if ctx.export_id is not None:
                raise CrossDevice(f"handles of two exports ({ctx.export_id}, {export_id})")
            try:
                check_client(ctx, export)
            except AccessDenied:
                self.stats.clients_denied += 1
                raise
            squash(ctx, export.cfg)
            ctx.export_id = export_id
        try:
            entry = await export.ns.getattr(path, current=current)
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


def client_denied(cfg: ExportConfig, host: str, port: int) -> str | None:
    """Why ``host:port`` may not use the export (None: it may)."""
    if not cfg.allows(host):
        return f"client {host} is not in the clients of {cfg.path}"
    if cfg.secure_port and port >= 1024:
        return f"client port {port} is not privileged (secure_port on {cfg.path})"
    return None


def check_client(ctx: CallContext, export: Export) -> None:
    why = client_denied(export.cfg, ctx.peer.host, ctx.peer.port)
    if why is not None:
        raise AccessDenied(why)


def squash(ctx: CallContext, cfg: ExportConfig) -> None:
    """Map ``ctx``'s credentials by the export's rule, in place: ``all`` (and AUTH_NONE) ->
    anonuid/anongid and no groups; ``root`` -> uid 0 becomes anonuid, gid 0 (primary or
    supplementary) anongid; ``none`` keeps them."""
    if cfg.squash == "all" or ctx.flavor == 0:
        ctx.uid, ctx.gid, ctx.gids = cfg.anonuid, cfg.anongid, ()
    elif cfg.squash == "root":
        if ctx.uid == 0:
            ctx.uid = cfg.anonuid
        if ctx.gid == 0:
            ctx.gid = cfg.anongid
        if 0 in ctx.gids:
            ctx.gids = tuple(cfg.anongid if g == 0 else g for g in ctx.gids)


def creds(ctx: CallContext, export: Export) -> tuple[int, int, tuple[int, ...]]:
    """(uid, gid, gids) after the export's squash rule (``resolve`` has applied it)."""
    if ctx.export_id != export.id:
        check_client(ctx, export)
        squash(ctx, export.cfg)
        ctx.export_id = export.id
    return ctx.uid, ctx.gid, ctx.gids


R_OK, W_OK, X_OK = 4, 2, 1


def permits(ctx: CallContext, export: Export, e: Entry, want: int, *, read: bool = False) -> bool:
    """Whether the caller's mapped identity has ``want`` (R_OK/W_OK/X_OK bits) on ``e`` by
    its mode bits (RFC 1813 §4.4: the server checks permission on every call). Root (when not
    squashed) passes. ``read``: a READ, which the owner may always do (a file opened before a
    chmod) and which execute permission also allows (clients read binaries to run them)."""
    uid = ctx.uid
    if uid == 0:
        return True
    cfg = export.cfg
    mode = e.mode
    if mode is None:
        kind = e.kind
        mode = (
            cfg.dir_mode
            if kind is EntryKind.DIR
            else 0o777
            if kind is EntryKind.SYMLINK
            else cfg.file_mode
        )
    owner = cfg.uid if e.uid is None else e.uid
    if uid == owner:
        if read:
            return True
        bits = mode >> 6
    else:
        group = cfg.gid if e.gid is None else e.gid
        bits = mode >> 3 if group == ctx.gid or group in ctx.gids else mode
    if bits & want == want:
        return True
    return read and e.kind is EntryKind.FILE and bool(bits & X_OK)


def deny(ctx: CallContext, gw: Gateway, e: Entry, why: str) -> None:
    """Count (and log at debug) a permission refusal."""
    gw.stats.permission_denied += 1
    log.debug("permission_denied", path=e.path, uid=ctx.uid, why=why)


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
    "GatewayStats",
    "Mount",
    "check_client",
    "client_denied",
    "creds",
    "export_id_for",
    "fattr",
    "permits",
    "squash",
]
