"""SETATTR (RFC 1813 §3.3.2): size, mode, uid, gid and mtime are object state; atime is not
kept (it always equals mtime).

- A file with nothing staged gets its new metadata by one COPY of the object onto itself with
  REPLACE metadata (plus one HEAD when this gateway does not know the object's full metadata).
- A size change, or any change to a file with staged writes, is staged and committed before
  the reply: the upload carries the data and the new metadata together.
- ``guard`` (sattrguard3) is checked against the ctime the index shows: NFS3ERR_NOT_SYNC.
- Directories take no attributes: their mode, owner and times are the export's and the
  index's (docs/posix.md); mode/uid/gid/times on a directory are accepted and ignored, a size
  is NFS3ERR_ISDIR. A symlink keeps mode 777; its owner and mtime can change.
- Permission (after squashing): root may do anything; the owner may change mode, times and
  the group (to one of its groups); a size change needs write permission; setting times to
  the server's clock needs ownership or write permission.
"""

from __future__ import annotations

import time

from gateway.attrs import fattr
from gateway.dispatch import CallContext
from gateway.errors import InvalidArgument, IsDirectory, NotSync, PermissionDenied
from gateway.exports import Export
from gateway.handlers.common import handle_entry, on_failure
from gateway.handlers.mutate import check_writable, is_owner, pre_op
from gateway.namespace import (
    META_GID,
    META_MODE,
    META_MTIME,
    META_UID,
    Entry,
    EntryKind,
    mtime_value,
)
from gateway.policy import W_OK, creds, permits
from gateway.registry import Gateway
from nfsproto.nfs3 import NfsStat3, Sattr3, Setattr3Args, Setattr3Res, TimeHow, WccData


def _check_permission(ctx: CallContext, export: Export, e: Entry, s: Sattr3) -> None:
    uid, gid, gids = creds(ctx, export)
    if uid == 0:
        return
    owner = is_owner(ctx, export, e)
    a = fattr(export, e)
    if s.mode is not None and not owner:
        raise PermissionDenied(f"chmod of {e.path!r} by uid {uid}")
    if s.uid is not None and s.uid != a.uid:
        raise PermissionDenied(f"chown of {e.path!r} by uid {uid}")
    if s.gid is not None and s.gid != a.gid and not (owner and (s.gid == gid or s.gid in gids)):
        raise PermissionDenied(f"chgrp of {e.path!r} to {s.gid} by uid {uid}")
    client_time = TimeHow.SET_TO_CLIENT_TIME in (s.mtime.how, s.atime.how)
    if client_time and not owner:
        raise PermissionDenied(f"utimes of {e.path!r} by uid {uid}")
    writable = permits(ctx, export, e, W_OK)
    if TimeHow.SET_TO_SERVER_TIME in (s.mtime.how, s.atime.how) and not (owner or writable):
        raise PermissionDenied(f"touch of {e.path!r} by uid {uid}")
    if s.size is not None and not writable:
        raise PermissionDenied(f"truncate of {e.path!r} by uid {uid}")


def _changes(export: Export, e: Entry, s: Sattr3) -> dict[str, str | None]:
    """The metadata ``s`` sets, minus what the object already has."""
    a = fattr(export, e)
    out: dict[str, str | None] = {}
    if s.mode is not None and e.kind is EntryKind.FILE and (s.mode & 0o7777) != a.mode:
        out[META_MODE] = f"{s.mode & 0o7777:o}"
    if s.uid is not None and s.uid != a.uid:
        out[META_UID] = str(s.uid)
    if s.gid is not None and s.gid != a.gid:
        out[META_GID] = str(s.gid)
    if s.mtime.how is TimeHow.SET_TO_CLIENT_TIME and s.mtime.time is not None:
        t = s.mtime.time
        out[META_MTIME] = mtime_value(t.seconds * 10**9 + t.nseconds)
    elif s.mtime.how is TimeHow.SET_TO_SERVER_TIME:
        out[META_MTIME] = mtime_value(time.time_ns())
    return out


async def apply_sattr(gw: Gateway, export: Export, e: Entry, s: Sattr3) -> Entry:
    """Apply ``s`` to ``e`` (the caller holds the path's lock and checked permission);
    the entry afterwards."""
    if e.kind is EntryKind.DIR:
        if s.size is not None:
            raise IsDirectory(e.path)
        return e
    if e.kind is EntryKind.SYMLINK and s.size is not None:
        raise InvalidArgument(f"size of symlink {e.path!r}")
    writes = gw.writes
    changes = _changes(export, e, s)
    size = s.size
    staged = writes.staged(export, e.path)
    if size is not None and staged is None and size == e.size:
        size = None  # nothing to truncate
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
            e = await apply_sattr(gw, export, e, args.new_attributes)
    return Setattr3Res(NfsStat3.NFS3_OK, WccData(before, fattr(export, e)))
