"""The export registry as handlers see it: exports by id and path, mounts, the handle codec,
the data reader, the write manager and the NFS settings (``NfsConfig``: READ/WRITE sizes), all
built and injected by ``gateway.ops.build``; and ``resolve``: handle -> (export, entry) with
the export's client check and squash rule.

Must not: build any of its parts, touch sockets or encode replies.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Final

import structlog

from gateway.data import ObjectReader
from gateway.dispatch import CallContext
from gateway.drc import DrcConfig
from gateway.errors import AccessDenied, CrossDevice, NotFound, StaleHandle
from gateway.exports import Export, Mount
from gateway.namespace import Entry
from gateway.namespace.resolve import Handles
from gateway.policy import check_client, squash
from gateway.settings import INLINE, MiB, choice, setting, size
from gateway.writes import WriteManager
from nfsproto.nfs3 import MAX_DATA

log = structlog.get_logger(__name__)


IO_MULT: Final = 4096  # FSINFO rtmult/wtmult: READ/WRITE sizes are multiples of it
MAX_IO: Final = min(MAX_DATA, 1 * MiB)  # the Linux client's largest rsize/wsize


@dataclass(frozen=True, slots=True)
class NfsConfig:
    """What handlers read of the configuration: the READ/WRITE sizes offered to clients
    (FSINFO), keys of the ``[server]`` table of ``nfsgw.toml`` (declared here); and the
    duplicate-request cache's bounds (``drc_*``, declared in ``gateway.drc``), which the
    server hands to the dispatcher."""

    rsize: int = field(
        default=MAX_IO,
        metadata=setting(size(IO_MULT, MAX_IO), "READ size offered to clients (FSINFO rtmax)"),
    )
    wsize: int = field(
        default=MAX_IO,
        metadata=setting(size(IO_MULT, MAX_IO), "WRITE size offered to clients (FSINFO wtmax)"),
    )
    # The duplicate-request cache's bounds (gateway.drc): drc_* keys of [server].
    drc: DrcConfig = field(default_factory=DrcConfig, metadata=INLINE)
    mount_lists: str = field(
        default="allowed",
        metadata=setting(
            choice(("allowed", "all")),
            "what MOUNT EXPORT and DUMP show: allowed = only the exports the caller may "
            "mount (DUMP: only their mounts, nothing to other hosts); all = every export, "
            "its clients and every mount, to anyone",
            reload="live",
        ),
    )


@dataclass(slots=True)
class GatewayStats:
    """Counters read by ``gateway.ops.metrics``. ``files_opened``: READs at offset 0, what opening
    and reading a file produces (NFSv3 has no OPEN), so backend requests per file opened is
    ``nfsgw_s3_requests_total / nfsgw_files_opened_total``."""

    files_opened: int = 0
    clients_denied: int = 0  # calls refused by an export's client list or port rule
    mounts_denied: int = 0
    permission_denied: int = 0  # LOOKUP/READDIR/READ refused by mode bits after squashing


@dataclass(slots=True)
class Gateway:
    config: NfsConfig
    handles: Handles
    reader: ObjectReader
    # Staged writes and object mutations (gateway.writes); built by the composition root.
    writes: WriteManager
    exports: dict[int, Export] = field(default_factory=dict)
    by_path: dict[str, Export] = field(default_factory=dict)
    mounts: list[Mount] = field(default_factory=list)
    # WRITE/COMMIT verifier: changes at every start (RFC 1813 §3.3.7)
    write_verf: bytes = field(default_factory=lambda: os.urandom(8))
    port: int = 0
    portmap_port: int = 0
    stats: GatewayStats = field(default_factory=GatewayStats)

    def add_export(self, e: Export) -> None:
        if e.id in self.exports:
            raise ValueError(f"export id collision for {e.cfg.path}; rename an export")
        self.exports[e.id] = e
        self.by_path[e.cfg.path] = e
        e.root_handle = self.handles.encode(e.id, "")

    def find_export(self, path: str) -> tuple[Export, str] | None:
        """The export whose path is ``path`` or its longest parent -> (export, path relative
        to it). ``path`` is normalised first (empty and repeated slashes dropped)."""
        clean = "/" + "/".join(p for p in path.split("/") if p)
        best: tuple[Export, str] | None = None
        for p, e in self.by_path.items():
            if clean == p:
                return e, ""
            base = p.rstrip("/") + "/"
            if clean.startswith(base) and (best is None or len(p) > len(best[0].cfg.path)):
                best = (e, clean[len(base) :])
        return best

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
        or foreign one BADHANDLE. ``current``: past the TTL, the answer of the re-list
        it starts once that has passed the name, never a wait for the whole re-list (see
        ``Namespace.getattr``)."""
        export_id, path, form, payload = self.handles.peek(fh)
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
        if path is None:  # a hashed handle not resolved here lately: after the client check
            path = await self.handles.resolve(export_id, form, payload, export.ns)
        try:
            entry = await export.ns.getattr(path, current=current)
        except NotFound:
            raise StaleHandle(path) from None
        return export, entry

    def handle_for(self, export: Export, path: str) -> bytes:
        """A handle for ``path`` (synchronous, stateless: any gateway with the secret
        resolves it)."""
        return self.handles.encode(export.id, path)

    def deny(self, ctx: CallContext, e: Entry, why: str) -> None:
        """Count (and log at debug) a permission refusal."""
        self.stats.permission_denied += 1
        log.debug("permission_denied", path=e.path, uid=ctx.uid, why=why)
