"""MOUNT v3 (RFC 1813 Appendix I): MNT hands out an export's root handle (or a subdirectory's),
after the export's client check; its failures are raised like NFS ones and answered with the
mountstat3 of the same number (``handlers.register_all``). DUMP/UMNT/UMNTALL keep an
advisory, bounded mount list.

What a caller learns of exports it may not mount (``[server] mount_lists``, "allowed" by
default, like knfsd's mountd): MNT of an export that refuses the caller answers exactly what
MNT of a path no export covers answers (MNT3ERR_ACCES, one log event, no await before
either), EXPORT lists only the exports whose ``clients`` hold the caller, DUMP only their
mounts and nothing to a host no export admits. ``mount_lists = "all"``: every export, client
list and mount, to anyone.
"""

from __future__ import annotations

import structlog

from gateway.dispatch import CallContext
from gateway.errors import AccessDenied, InvalidArgument, NotDirectory
from gateway.exports import Export, Mount
from gateway.namespace import EntryKind
from gateway.policy import client_denied
from gateway.registry import Gateway
from nfsproto.limits import MNTNAMLEN
from nfsproto.mount3 import ExportNode, Mnt3Args, Mnt3Res, MountBody, MountStat3

log = structlog.get_logger(__name__)

MAX_MOUNT_RECORDS = 4096


async def mnt(gw: Gateway, ctx: CallContext, args: Mnt3Args) -> Mnt3Res:
    try:
        path = args.dirpath.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidArgument(f"mount path {args.dirpath!r} is not UTF-8") from None
    path = "/" + "/".join(c for c in path.split("/") if c)
    found = gw.find_export(path)
    # No export, or one that refuses this caller: the same answer (MNT3ERR_ACCES), the same
    # log event and no await before it, so a caller cannot tell which exports exist.
    why = "no export at or above it" if found is None else None
    if found is not None:
        why = client_denied(found[0].cfg, ctx.peer.host, ctx.peer.port)
    if found is None or why is not None:
        gw.stats.mounts_denied += 1
        log.warning("mount_denied", path=path, reason=why)
        raise AccessDenied(f"mount of {path!r} refused")
    export, rel = found
    if rel:
        entry = await export.ns.getattr(rel)
        if entry.kind != EntryKind.DIR:
            raise NotDirectory(rel)
    m = Mount(ctx.peer.host, path)
    if m not in gw.mounts:
        if len(gw.mounts) >= MAX_MOUNT_RECORDS:
            gw.mounts.pop(0)
        gw.mounts.append(m)
    fh = gw.handle_for(export, rel)
    # RFC 1813 Appendix I mountres3_ok.auth_flavors: the flavours the export accepts (its
    # ``sec``), the client picks one it supports; NFS calls with another are AUTH_TOOWEAK.
    return Mnt3Res(MountStat3.MNT3_OK, fh, list(export.cfg.flavors))


def _shows_all(gw: Gateway) -> bool:
    return gw.config.mount_lists == "all"


def _visible(gw: Gateway, ctx: CallContext) -> list[tuple[str, Export]]:
    """(path, export) of the exports EXPORT and DUMP show this caller, by path."""
    exports = sorted(gw.by_path.items())
    if _shows_all(gw):
        return exports
    return [(p, e) for p, e in exports if e.cfg.allows(ctx.peer.host)]


async def dump(gw: Gateway, ctx: CallContext, args: None) -> list[MountBody]:
    """The mount list; with ``mount_lists = "allowed"`` only the mounts of exports the caller
    may mount (nothing to a host no export admits)."""
    if _shows_all(gw):
        mounts = gw.mounts
    else:
        paths = [p for p, _ in _visible(gw, ctx)]
        mounts = [m for m in gw.mounts if any(_under(m.path, p) for p in paths)]
    return [MountBody(m.host.encode()[:MNTNAMLEN], m.path.encode()) for m in mounts]


def _under(path: str, export_path: str) -> bool:
    return path == export_path or export_path == "/" or path.startswith(export_path + "/")


async def umnt(gw: Gateway, ctx: CallContext, args: Mnt3Args) -> None:
    path = args.dirpath.decode("utf-8", "replace")
    gw.mounts[:] = [m for m in gw.mounts if not (m.host == ctx.peer.host and m.path == path)]


async def umntall(gw: Gateway, ctx: CallContext, args: None) -> None:
    gw.mounts[:] = [m for m in gw.mounts if m.host != ctx.peer.host]


def _groups(export: Export) -> list[bytes]:
    nets = [str(n) for n in export.cfg.clients]
    if nets and all(n in ("0.0.0.0/0", "::/0") for n in nets):
        return [b"*"]
    return [n.encode() for n in nets]


async def export_list(gw: Gateway, ctx: CallContext, args: None) -> list[ExportNode]:
    """The exports this caller may mount (``mount_lists = "all"``: every export)."""
    return [ExportNode(p.encode(), _groups(e)) for p, e in _visible(gw, ctx)]
