"""MOUNT v3 (RFC 1813 Appendix I): MNT hands out an export's root handle (or a subdirectory's),
after the export's client check; its failures are raised like NFS ones and answered with the
mountstat3 of the same number (``handlers.register_all``). DUMP/UMNT/UMNTALL keep an
advisory, bounded mount list."""

from __future__ import annotations

import structlog

from gateway.dispatch import CallContext
from gateway.errors import AccessDenied, InvalidArgument, NotDirectory, NotFound
from gateway.exports import Export, Mount
from gateway.namespace import EntryKind
from gateway.policy import client_denied
from gateway.registry import Gateway
from nfsproto.limits import MNTNAMLEN
from nfsproto.mount3 import ExportNode, Mnt3Args, Mnt3Res, MountBody, MountStat3
from nfsproto.rpc import AuthFlavor

log = structlog.get_logger(__name__)

MAX_MOUNT_RECORDS = 4096
_FLAVORS = [int(AuthFlavor.AUTH_SYS), int(AuthFlavor.AUTH_NONE)]


async def mnt(gw: Gateway, ctx: CallContext, args: Mnt3Args) -> Mnt3Res:
    try:
        path = args.dirpath.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidArgument(f"mount path {args.dirpath!r} is not UTF-8") from None
    path = "/" + "/".join(c for c in path.split("/") if c)
    found = gw.find_export(path)
    if found is None:
        raise NotFound(f"no export at or above {path!r}")
    export, rel = found
    why = client_denied(export.cfg, ctx.peer.host, ctx.peer.port)
    if why is not None:
        gw.stats.mounts_denied += 1
        log.warning("mount_denied", path=path, export=export.cfg.path, reason=why)
        raise AccessDenied(why)
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
    return Mnt3Res(MountStat3.MNT3_OK, fh, list(_FLAVORS))


async def dump(gw: Gateway, ctx: CallContext, args: None) -> list[MountBody]:
    return [MountBody(m.host.encode()[:MNTNAMLEN], m.path.encode()) for m in gw.mounts]


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
    return [ExportNode(p.encode(), _groups(e)) for p, e in sorted(gw.by_path.items())]
