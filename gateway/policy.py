"""Export access policy: which clients may use an export, how their credentials are squashed,
and what the mode bits permit (RFC 1813 §4.4: the server checks permission on every call).
Which class of a mode a caller gets is decided once, in ``mode_bits`` (``permits`` and ACCESS
use it); the RFC's exceptions (root, READ by the owner, execute on directories) stay with them.

Must not: count, log or resolve handles (``gateway.registry`` does).
"""

from __future__ import annotations

from gateway.attrs import default_mode
from gateway.dispatch import AuthRefused, CallContext
from gateway.errors import AccessDenied
from gateway.exports import Export, ExportConfig
from gateway.namespace import Entry, EntryKind
from nfsproto.rpc import AuthStat


def client_denied(cfg: ExportConfig, host: str, port: int) -> str | None:
    """Why ``host:port`` may not use the export (None: it may): not in ``clients``, or on an
    unprivileged source port when the export is secure (knfsd's ``secure``, the default)."""
    if not cfg.allows(host):
        return f"client {host} is not in the clients of {cfg.path}"
    if cfg.secure and port >= 1024:
        return (
            f"client port {port} is not privileged ({cfg.path} is secure; insecure = true "
            "accepts any port)"
        )
    return None


def flavor_denied(cfg: ExportConfig, flavor: int) -> str | None:
    """Why a call with auth ``flavor`` may not use the export (None: it may): the flavour is
    not in its ``sec`` (knfsd's ``sec=``; AUTH_NONE only where listed)."""
    if flavor in cfg.flavors:
        return None
    return f"auth flavor {flavor} is not in the sec of {cfg.path} ({', '.join(cfg.sec)})"


def check_client(ctx: CallContext, export: Export) -> None:
    """Refuse a caller the export does not admit: ``AuthRefused`` (RPC AUTH_ERROR
    AUTH_TOOWEAK, RFC 5531 §9) for a flavour not in ``sec``, ``AccessDenied`` (NFS3ERR_ACCES)
    for a client or port rule."""
    why = client_denied(export.cfg, ctx.peer.host, ctx.peer.port)
    if why is not None:
        raise AccessDenied(why)
    why = flavor_denied(export.cfg, ctx.flavor)
    if why is not None:
        raise AuthRefused(AuthStat.AUTH_TOOWEAK, why)


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
S_ISUID, S_ISGID, S_ISVTX, S_IXGRP = 0o4000, 0o2000, 0o1000, 0o010


def killed_mode(mode: int) -> int:
    """``mode`` after a write or truncate by a non-root caller, or a chown (POSIX, as Linux
    and knfsd do it): set-user-ID cleared, set-group-ID cleared when group execute is set
    (without it, the bit means mandatory locking and stays)."""
    mode &= ~S_ISUID
    if mode & S_IXGRP:
        mode &= ~S_ISGID
    return mode


def sticky_denied(ctx: CallContext, export: Export, d: Entry, victim: Entry) -> bool:
    """Whether removing or renaming ``victim`` out of directory ``d`` is refused by ``d``'s
    sticky bit (POSIX: then only root, the directory's owner and the victim's owner may)."""
    uid = ctx.uid
    if uid == 0:
        return False
    cfg = export.cfg
    mode = cfg.dir_mode if d.mode is None else d.mode
    if not mode & S_ISVTX:
        return False
    owners = (cfg.uid if d.uid is None else d.uid, cfg.uid if victim.uid is None else victim.uid)
    return uid not in owners


def mode_bits(mode: int, owner: int, group: int, uid: int, gid: int, gids: tuple[int, ...]) -> int:
    """The R_OK/W_OK/X_OK bits ``mode`` gives a caller (``uid``, ``gid``, ``gids``) on an
    object of ``owner``:``group``: the owner's class, else the group's when the caller is in
    the group, else the others' (POSIX; root's exceptions are the callers')."""
    if uid == owner:
        return (mode >> 6) & 7
    if group == gid or group in gids:
        return (mode >> 3) & 7
    return mode & 7


def permits(ctx: CallContext, export: Export, e: Entry, want: int, *, read: bool = False) -> bool:
    """Whether the caller's mapped identity has ``want`` (R_OK/W_OK/X_OK bits) on ``e`` by
    its mode bits (RFC 1813 §4.4: the server checks permission on every call). Root (when not
    squashed) passes. ``read``: a READ, which the owner may always do (a file opened before a
    chmod) and which execute permission also allows (clients read binaries to run them)."""
    uid = ctx.uid
    if uid == 0:
        return True
    cfg = export.cfg
    owner = cfg.uid if e.uid is None else e.uid
    if read and uid == owner:
        return True
    mode = default_mode(cfg, e) if e.mode is None else e.mode
    group = cfg.gid if e.gid is None else e.gid
    bits = mode_bits(mode, owner, group, uid, ctx.gid, ctx.gids)
    if bits & want == want:
        return True
    return read and e.kind is EntryKind.FILE and bool(bits & X_OK)
