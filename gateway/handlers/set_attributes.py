"""SETATTR (RFC 1813 §3.3.2): size, mode, uid, gid, atime and mtime are object state, and every
change moves ctime (docs/posix.md "Times").

- A file with nothing staged gets its new metadata by one COPY of the object onto itself with
  REPLACE metadata (plus one HEAD when this gateway does not know the object's full metadata).
- A size change, or any change to a file with staged writes, is staged and committed before
  the reply: the upload carries the data and the new metadata together.
- A directory's attributes are its marker object's metadata (``namespace.dirattrs``): one PUT
  of the marker (plus one HEAD when this gateway has not seen it), which makes an implicit
  directory explicit. A size is NFS3ERR_ISDIR. The export's root keeps the export's
  attributes (it has no marker of its own). A symlink keeps mode 777; its owner and times can
  change.
- ``guard`` (sattrguard3) is checked against the ctime the index shows: NFS3ERR_NOT_SYNC.
- Permission (after squashing; POSIX chown/chmod/utimes, as knfsd applies them): root may do
  anything. Only the owner may chmod (else NFS3ERR_PERM); a set-group-ID bit for a group the
  caller is not in is dropped. Only root changes the owner: anyone else gets NFS3ERR_PERM,
  even for the owner it already has, except the owner naming itself. The owner may change the
  group to one of its groups (AUTH_SYS gid and gids) or keep it; else NFS3ERR_PERM. Explicit
  times need ownership (NFS3ERR_PERM); times set to the server's clock need ownership or
  write permission (NFS3ERR_ACCES). A size change needs write permission or ownership (the
  owner may truncate a file it created read-only, through the descriptor that created it:
  knfsd's owner override).
- Set-user-ID and set-group-ID (the latter only with group execute) are cleared from a
  non-directory whose owner or group is set, unless the same call sets the mode, and from a
  file a non-root caller truncates (``killed_mode``; WRITE does the same, ``clear_setid``).
"""

from __future__ import annotations

import time

from gateway.attrs import fattr
from gateway.dispatch import CallContext
from gateway.errors import (
    AccessDenied,
    InvalidArgument,
    IsDirectory,
    NotSync,
    PermissionDenied,
)
from gateway.exports import Export
from gateway.handlers.common import handle_entry, on_failure
from gateway.handlers.mutate import check_writable, pre_op
from gateway.namespace import (
    META_ATIME,
    META_CTIME,
    META_GID,
    META_MODE,
    META_MTIME,
    META_UID,
    Entry,
    EntryKind,
    mtime_value,
)
from gateway.policy import S_ISGID, W_OK, creds, killed_mode, permits
from gateway.registry import Gateway
from nfsproto.nfs3 import (
    NfsStat3,
    Sattr3,
    Setattr3Args,
    Setattr3Res,
    SetTime,
    TimeHow,
    WccData,
)

Creds = tuple[int, int, tuple[int, ...]]
ROOT: Creds = (0, 0, ())


def _check_permission(ctx: CallContext, export: Export, e: Entry, s: Sattr3) -> None:
    uid, gid, gids = creds(ctx, export)
    if uid == 0:
        return
    a = fattr(export, e)
    owner = uid == a.uid
    if s.mode is not None and not owner:
        raise PermissionDenied(f"chmod of {e.path!r} by uid {uid}")
    if s.uid is not None and not (owner and s.uid == a.uid):
        raise PermissionDenied(f"chown of {e.path!r} to {s.uid} by uid {uid}")
    if s.gid is not None and not (owner and (s.gid in (a.gid, gid) or s.gid in gids)):
        raise PermissionDenied(f"chgrp of {e.path!r} to {s.gid} by uid {uid}")
    client_time = TimeHow.SET_TO_CLIENT_TIME in (s.mtime.how, s.atime.how)
    if client_time and not owner:
        raise PermissionDenied(f"utimes of {e.path!r} by uid {uid}")
    writable = owner or permits(ctx, export, e, W_OK)
    if TimeHow.SET_TO_SERVER_TIME in (s.mtime.how, s.atime.how) and not writable:
        raise AccessDenied(f"touch of {e.path!r} by uid {uid}")
    if s.size is not None and not writable:
        raise AccessDenied(f"truncate of {e.path!r} by uid {uid}")


def _time(st: SetTime, now: int) -> str | None:
    if st.how is TimeHow.SET_TO_CLIENT_TIME and st.time is not None:
        return mtime_value(st.time.seconds * 10**9 + st.time.nseconds)
    if st.how is TimeHow.SET_TO_SERVER_TIME:
        return mtime_value(now)
    return None


def _changes(export: Export, e: Entry, s: Sattr3, who: Creds) -> dict[str, str | None]:
    """The metadata ``s`` sets (``who`` asks), with the new ctime if it sets anything."""
    a = fattr(export, e)
    uid, gid, gids = who
    out: dict[str, str | None] = {}
    mode = a.mode
    if s.mode is not None and e.kind is not EntryKind.SYMLINK:
        mode = s.mode & 0o7777
        group = a.gid if s.gid is None else s.gid
        if uid != 0 and mode & S_ISGID and group != gid and group not in gids:
            mode &= ~S_ISGID  # POSIX: not for a group the caller is not in
    elif e.kind is not EntryKind.DIR and (s.uid is not None or s.gid is not None):
        mode = killed_mode(mode)  # chown clears set-user-ID and set-group-ID
    elif s.size is not None and uid != 0:
        mode = killed_mode(mode)  # as a write does
    if mode != a.mode:
        out[META_MODE] = f"{mode:o}"
    if s.uid is not None and s.uid != a.uid:
        out[META_UID] = str(s.uid)
    if s.gid is not None and s.gid != a.gid:
        out[META_GID] = str(s.gid)
    now = time.time_ns()
    mtime = _time(s.mtime, now)
    if mtime is not None:
        out[META_MTIME] = mtime
    atime = _time(s.atime, now)
    if atime is not None:
        out[META_ATIME] = atime
    touched = s.mode is not None or s.uid is not None or s.gid is not None
    if out or touched or s.size is not None:
        out[META_CTIME] = mtime_value(now)
    return out


async def apply_sattr(gw: Gateway, export: Export, e: Entry, s: Sattr3, who: Creds = ROOT) -> Entry:
    """Apply ``s`` to ``e`` for caller ``who`` (uid, gid, gids after squashing; the caller
    holds the path's lock and checked permission); the entry afterwards."""
    if e.kind is EntryKind.DIR and s.size is not None:
        raise IsDirectory(e.path)
    if e.kind is EntryKind.SYMLINK and s.size is not None:
        raise InvalidArgument(f"size of symlink {e.path!r}")
    writes = gw.writes
    size = s.size
    staged = writes.staged(export, e.path)
    if size is not None and staged is None and size == e.size:
        size = None  # nothing to truncate (the Linux client sends the times it wants moved)
        s = Sattr3(s.mode, s.uid, s.gid, None, s.atime, s.mtime)
    changes = _changes(export, e, s, who)
    if size is not None:
        changes.pop(META_CTIME, None)  # the commit's LastModified is the new mtime and ctime
    if e.kind is EntryKind.DIR:
        if not changes or not e.path:
            return e  # the export's root keeps the export's attributes
        return await writes.set_dir_attrs(export, e, changes)
    if size is None and staged is None:
        if not changes:
            return e
        return await writes.copy_in_place(export, e, changes)
    if size is not None:
        await writes.set_size(export, e, size)
    if changes:
        await writes.stage_metadata(export, e, changes)
    got = await writes.commit_locked(export, e.path)
    return got if got is not None else e


async def setattr3(gw: Gateway, ctx: CallContext, args: Setattr3Args) -> Setattr3Res:
    export, e = await gw.resolve(ctx, args.object)
    before = pre_op(export, e)
    # A failure's wcc_data: the attributes of ``e`` as last read (late binding: after the
    # re-read under the lock, the re-read entry).
    async with on_failure(lambda s: Setattr3Res(s, WccData(before, fattr(export, e)))):
        check_writable(export)
        if args.guard is not None and args.guard != fattr(export, e).ctime:
            raise NotSync(f"guard of {e.path!r}")
        _check_permission(ctx, export, e, args.new_attributes)
        async with gw.writes.lock(export, e.path):
            e = await handle_entry(export, e.path)
            e = await apply_sattr(gw, export, e, args.new_attributes, creds(ctx, export))
    return Setattr3Res(NfsStat3.NFS3_OK, WccData(before, fattr(export, e)))
