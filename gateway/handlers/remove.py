"""REMOVE (RFC 1813 §3.3.12) and RMDIR (§3.3.13): one DELETE each, gone from the index before
the reply (no ghost in LOOKUP or READDIR; the parent's mtime and cookie verifier change).

- Staged writes of a removed file are dropped (their multipart upload aborted).
- Removing the last entry of a directory first writes the directory's marker when it may
  have none, so the directory stays (POSIX); an implicit directory would vanish otherwise.
- REMOVE of a directory is NFS3ERR_ISDIR; RMDIR of a file NFS3ERR_NOTDIR.
- RMDIR answers NFS3ERR_NOTEMPTY when the index shows an entry or the backend holds any key
  under ``dir/`` besides the marker (one LIST of at most two keys), including keys that
  cannot be a path and so are not shown.
"""

from __future__ import annotations

from gateway.dispatch import CallContext
from gateway.errors import GatewayError, IsDirectory, NotDirectory, NotEmpty, NotFound
from gateway.handlers.mutate import (
    check_dir,
    check_dir_write,
    check_writable,
    new_name,
    pre_op,
    wcc_after,
    wcc_unchanged,
)
from gateway.namespace import EntryKind, split_path
from gateway.registry import Gateway
from nfsproto.nfs3 import NfsStat3, Remove3Args, Remove3Res, Rmdir3Args, Rmdir3Res


async def remove3(gw: Gateway, ctx: CallContext, args: Remove3Args) -> Remove3Res:
    export, d = await gw.resolve(ctx, args.object.dir)
    before = pre_op(export, d)
    try:
        check_writable(export)
        check_dir(d)
        path = new_name(export, d.path, args.object.name)
        check_dir_write(gw, ctx, export, d)
    except GatewayError as err:
        return Remove3Res(err.status, wcc_unchanged(export, d))
    try:
        async with gw.writes.lock(export, path):
            e = await export.ns.lookup(d.path, split_path(path)[1])
            if e.kind is EntryKind.DIR:
                raise IsDirectory(path)
            await gw.writes.keep_parent(export, path)
            await gw.writes.delete_object(export, path, is_dir=False)
    except GatewayError as err:
        return Remove3Res(err.status, await wcc_after(export, before, d.path))
    return Remove3Res(NfsStat3.NFS3_OK, await wcc_after(export, before, d.path))


async def rmdir3(gw: Gateway, ctx: CallContext, args: Rmdir3Args) -> Rmdir3Res:
    export, d = await gw.resolve(ctx, args.object.dir)
    before = pre_op(export, d)
    try:
        check_writable(export)
        check_dir(d)
        path = new_name(export, d.path, args.object.name, is_dir=True)
        check_dir_write(gw, ctx, export, d)
    except GatewayError as err:
        return Rmdir3Res(err.status, wcc_unchanged(export, d))
    try:
        async with gw.writes.lock(export, path):
            e = await export.ns.lookup(d.path, split_path(path)[1])
            if e.kind is not EntryKind.DIR:
                raise NotDirectory(path)
            try:
                page = await export.ns.readdir(path, 0, b"\0" * 8, 1)
            except NotFound:
                page = None
            if page is not None and page.entries:
                raise NotEmpty(path)
            if gw.writes.staged_under(export, path) or await gw.writes.dir_has_entries(
                export, path
            ):
                raise NotEmpty(path)
            await gw.writes.keep_parent(export, path)
            await gw.writes.delete_object(export, path, is_dir=True)
    except GatewayError as err:
        return Rmdir3Res(err.status, await wcc_after(export, before, d.path))
    return Rmdir3Res(NfsStat3.NFS3_OK, await wcc_after(export, before, d.path))


def remove3_fail(e: GatewayError, args: Remove3Args) -> Remove3Res:
    return Remove3Res(e.status)


def rmdir3_fail(e: GatewayError, args: Rmdir3Args) -> Rmdir3Res:
    return Rmdir3Res(e.status)
