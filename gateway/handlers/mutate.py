"""Helpers shared by the mutating procedures: weak cache consistency data (RFC 1813 §2.6
wcc_data), the checks every mutation makes (read-only export, directory, name, key length,
permission by mode bits after squashing) and the metadata a new object carries.

A mutation's failure carries wcc_data whatever failed: handlers wrap their checks in
``on_failure`` with the unchanged wcc_data (``wcc_unchanged``) and their action with the
wcc_data read after it (``wcc_after``); see ``handlers.common.on_failure``.

Must not: touch the backend (``gateway.writes`` does) or encode replies.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from gateway.attrs import fattr
from gateway.dispatch import CallContext
from gateway.errors import (
    AccessDenied,
    InvalidArgument,
    NameTooLong,
    NotDirectory,
    NotFound,
    PermissionDenied,
    ReadOnly,
)
from gateway.exports import Export
from gateway.handlers.common import check_name, handle_entry, on_failure
from gateway.namespace import (
    META_CTIME,
    META_GID,
    META_MODE,
    META_UID,
    Entry,
    EntryKind,
    join_path,
    mtime_value,
)
from gateway.policy import S_ISGID, W_OK, X_OK, creds, killed_mode, permits, sticky_denied
from gateway.registry import Gateway
from nfsproto.nfs3 import Diropargs3, NfsStat3, Sattr3, WccAttr, WccData

# S3's key length limit (UTF-8 bytes).
MAX_KEY = 1024

R = TypeVar("R", covariant=True)


def pre_op(export: Export, e: Entry) -> WccAttr:
    """The wcc_attr of ``e`` now (before a mutation changes it)."""
    a = fattr(export, e)
    return WccAttr(a.size, a.mtime, a.ctime)


def wcc_unchanged(export: Export, e: Entry) -> WccData:
    """wcc_data for an object that was not modified: before == after."""
    a = fattr(export, e)
    return WccData(WccAttr(a.size, a.mtime, a.ctime), a)


async def wcc_after(export: Export, before: WccAttr, path: str) -> WccData:
    """wcc_data of the directory (or file) at ``path`` after a mutation; no post-op
    attributes if it is gone."""
    try:
        e = await export.ns.getattr(path)
    except NotFound:
        return WccData(before, None)
    return WccData(before, fattr(export, e))


def check_writable(export: Export) -> None:
    if export.cfg.read_only:
        raise ReadOnly(export.cfg.path)


def check_dir(e: Entry) -> None:
    if e.kind is not EntryKind.DIR:
        raise NotDirectory(e.path)


def new_name(export: Export, dir_path: str, raw: bytes, *, is_dir: bool = False) -> str:
    """A component name for a new or removed entry -> its path. "." and ".." are invalid
    here; the full key must fit S3's 1,024 bytes (a directory marker adds '/')."""
    if raw in (b".", b".."):
        raise InvalidArgument(f"name {raw!r}")
    path = join_path(dir_path, check_name(raw))
    if len((export.prefix + path).encode("utf-8")) + int(is_dir) > MAX_KEY:
        raise NameTooLong(path[:64])
    return path


def check_dir_write(gw: Gateway, ctx: CallContext, export: Export, d: Entry) -> None:
    """Adding or removing a name needs write and search permission on the directory (mode
    bits after squashing, ``core.permits``)."""
    creds(ctx, export)
    if not permits(ctx, export, d, W_OK | X_OK):
        gw.deny(ctx, d, "adding or removing a name needs w and x on the directory")
        raise AccessDenied(f"no write permission on directory {d.path!r}")


def check_may_write(gw: Gateway, ctx: CallContext, export: Export, e: Entry) -> None:
    """Write permission on ``e``, or ownership (a file opened for writing before a chmod
    stays writable to its owner, as on a local file system)."""
    creds(ctx, export)
    if permits(ctx, export, e, W_OK) or is_owner(ctx, export, e):
        return
    gw.deny(ctx, e, "write needs w on the file")
    raise AccessDenied(f"no write permission on {e.path!r}")


def check_may_move_dir(gw: Gateway, ctx: CallContext, export: Export, d: Entry) -> None:
    """Moving directory ``d`` to another parent rewrites its ".." entry: write permission on
    ``d`` (POSIX rename(2) EACCES; Linux's vfs_rename checks it on the server's side)."""
    creds(ctx, export)
    if not permits(ctx, export, d, W_OK):
        gw.deny(ctx, d, "moving a directory to another parent needs w on it")
        raise AccessDenied(f"no write permission on directory {d.path!r} to move it")


def check_sticky(gw: Gateway, ctx: CallContext, export: Export, d: Entry, victim: Entry) -> None:
    """Removing or renaming ``victim`` out of a sticky directory ``d`` needs root or owning
    ``d`` or ``victim`` (POSIX; NFS3ERR_PERM, as knfsd answers)."""
    creds(ctx, export)
    if sticky_denied(ctx, export, d, victim):
        gw.deny(ctx, victim, "sticky directory: not the owner")
        raise PermissionDenied(f"{victim.path!r} in sticky directory {d.path!r}")


async def clear_setid(gw: Gateway, ctx: CallContext, export: Export, e: Entry) -> Entry:
    """Before a non-root caller's WRITE: clear the file's set-user-ID and set-group-ID bits
    (``policy.killed_mode``; knfsd does it, and the Linux client leaves it to the server).
    One COPY in place (after committing what is staged), so the change shows at once."""
    if creds(ctx, export)[0] == 0 or e.kind is not EntryKind.FILE or e.special is not None:
        return e
    mode = fattr(export, e).mode
    if killed_mode(mode) == mode:
        return e
    async with gw.writes.lock(export, e.path):
        await gw.writes.commit_locked(export, e.path)
        e = await handle_entry(export, e.path)
        mode = fattr(export, e).mode
        if killed_mode(mode) == mode:
            return e
        changes = {META_MODE: f"{killed_mode(mode):o}", META_CTIME: mtime_value(time.time_ns())}
        return await gw.writes.copy_in_place(export, e, changes)


def is_owner(ctx: CallContext, export: Export, e: Entry) -> bool:
    uid = creds(ctx, export)[0]
    return uid == 0 or uid == fattr(export, e).uid


def new_object_metadata(
    ctx: CallContext,
    export: Export,
    sattr: Sattr3 | None,
    parent: Entry | None = None,
    *,
    is_dir: bool = False,
) -> dict[str, str]:
    """Owner (the caller after squashing; the group of a set-group-ID ``parent``, whose new
    subdirectories are set-group-ID too) and, when given, mode of a new object. Only root may
    give it another owner."""
    uid, gid, _ = creds(ctx, export)
    setgid = False
    if parent is not None:
        p = fattr(export, parent)
        if p.mode & S_ISGID:
            gid, setgid = p.gid, is_dir
    meta = {META_UID: str(uid), META_GID: str(gid)}
    if setgid:
        meta[META_MODE] = f"{export.cfg.dir_mode | S_ISGID:o}"
    if sattr is not None:
        if sattr.mode is not None:
            meta[META_MODE] = f"{sattr.mode & 0o7777 | (S_ISGID if setgid else 0):o}"
        if uid == 0:
            if sattr.uid is not None:
                meta[META_UID] = str(sattr.uid)
            if sattr.gid is not None:
                meta[META_GID] = str(sattr.gid)
    return meta


async def lookup_opt(export: Export, dir_path: str, name: str) -> Entry | None:
    with contextlib.suppress(NotFound):
        return await export.ns.lookup(dir_path, name)
    return None


async def lists_entries(export: Export, path: str) -> bool:
    """Whether the index shows an entry in directory ``path`` (one that vanished shows none)."""
    with contextlib.suppress(NotFound):
        return bool((await export.ns.readdir(path, 0, 1)).entries)
    return False


class DirWccRes(Protocol[R]):
    """A result whose failure arm is the directory's wcc_data (CREATE, MKDIR, SYMLINK, MKNOD,
    REMOVE, RMDIR): the result type itself."""

    def __call__(self, status: NfsStat3, *, dir_wcc: WccData) -> R: ...


@dataclass(slots=True)
class NameChange(Generic[R]):
    """A name being added to or removed from directory ``d`` (checked by ``prepare``); a
    failure of the change answers ``res`` with d's wcc_data read after it (``failed``)."""

    export: Export
    d: Entry
    before: WccAttr
    path: str
    res: DirWccRes[R]

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]

    async def dir_wcc(self) -> WccData:
        return await wcc_after(self.export, self.before, self.d.path)

    async def failed(self, status: NfsStat3) -> R:
        return self.res(status, dir_wcc=await self.dir_wcc())


async def prepare(
    gw: Gateway, ctx: CallContext, where: Diropargs3, res: DirWccRes[R], *, is_dir: bool = False
) -> NameChange[R]:
    """Resolve ``where.dir`` and make the checks every name change makes (writable export, a
    directory, a valid name that fits a key, w+x on the directory); their failures answer
    ``res`` with the unchanged wcc_data."""
    export, d = await gw.resolve(ctx, where.dir)
    before = pre_op(export, d)
    async with on_failure(lambda s: res(s, dir_wcc=wcc_unchanged(export, d))):
        check_writable(export)
        check_dir(d)
        path = new_name(export, d.path, where.name, is_dir=is_dir)
        check_dir_write(gw, ctx, export, d)
    return NameChange(export, d, before, path, res)
