"""REMOVE (RFC 1813 §3.3.12) and RMDIR (§3.3.13): one DELETE each, gone from the index before
the reply (no ghost in LOOKUP or READDIR; the parent's mtime and cookie verifier change).

- Staged writes of a removed file are dropped (their multipart upload aborted).
- Removing the last entry of a directory first writes the directory's marker when it may
  have none, so the directory stays (POSIX); an implicit directory would vanish otherwise.
- REMOVE of a directory is NFS3ERR_ISDIR; RMDIR of a file NFS3ERR_NOTDIR.
- In a sticky directory only root and the owners of the directory or of the entry may remove
  it (NFS3ERR_PERM).
- RMDIR answers NFS3ERR_NOTEMPTY when the index shows an entry or the backend holds any key
  under ``dir/`` besides the marker (one LIST of at most two keys), including keys that
  cannot be a path and so are not shown.
"""

from __future__ import annotations

from gateway.dispatch import CallContext
from gateway.errors import IsDirectory, NotDirectory, NotEmpty
from gateway.handlers.common import on_failure
from gateway.handlers.mutate import check_sticky, lists_entries, prepare
from gateway.namespace import EntryKind
from gateway.registry import Gateway
from nfsproto.nfs3 import NfsStat3, Remove3Args, Remove3Res, Rmdir3Args, Rmdir3Res


async def remove3(gw: Gateway, ctx: CallContext, args: Remove3Args) -> Remove3Res:
    op = await prepare(gw, ctx, args.object, Remove3Res)
    export, path = op.export, op.path
    async with on_failure(op.failed), gw.writes.lock(export, path):
        e = await export.ns.lookup(op.d.path, op.name)
        if e.kind is EntryKind.DIR:
            raise IsDirectory(path)
        check_sticky(gw, ctx, export, op.d, e)
        await gw.writes.keep_parent(export, path)
        await gw.writes.delete_object(export, path, is_dir=False)
    return Remove3Res(NfsStat3.NFS3_OK, await op.dir_wcc())


async def rmdir3(gw: Gateway, ctx: CallContext, args: Rmdir3Args) -> Rmdir3Res:
    op = await prepare(gw, ctx, args.object, Rmdir3Res, is_dir=True)
    export, path = op.export, op.path
    writes = gw.writes
    async with on_failure(op.failed), writes.lock(export, path):
        e = await export.ns.lookup(op.d.path, op.name)
        if e.kind is not EntryKind.DIR:
            raise NotDirectory(path)
        check_sticky(gw, ctx, export, op.d, e)
        if await lists_entries(export, path):
            raise NotEmpty(path)
        if writes.staged_under(export, path) or await writes.dir_has_entries(export, path):
            raise NotEmpty(path)
        await writes.keep_parent(export, path)
        await writes.delete_object(export, path, is_dir=True)
    return Rmdir3Res(NfsStat3.NFS3_OK, await op.dir_wcc())
