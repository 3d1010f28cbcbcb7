"""RENAME (RFC 1813 §3.3.14). Object stores cannot rename, so:

- A file or symlink is copied server-side (metadata kept) over the target, then the source
  is deleted. The copy replaces the target in one step, so from the client's point of view
  the target is replaced atomically; others may briefly see both names. Staged writes of the
  source are committed first; staged writes of the target are dropped.
- A directory is copied key by key (at most ``rename_max_entries`` keys, else
  NFS3ERR_NOTSUPP), then its keys are deleted; the index shows the result at once. It is not
  atomic for other clients.
- POSIX rules: renaming onto itself succeeds and does nothing; a directory into its own
  subtree is NFS3ERR_INVAL; a file over a directory NFS3ERR_ISDIR; a directory over a file
  NFS3ERR_NOTDIR; a directory over a non-empty directory NFS3ERR_NOTEMPTY; across exports
  NFS3ERR_XDEV (``Gateway.resolve`` refuses the second export's handle).
- Sticky directories (source and target): only root and the owners of the directory or of
  the entry may move or replace it (NFS3ERR_PERM). Moving a directory to another parent needs
  write permission on it (its ".." changes; NFS3ERR_ACCES), as Linux's vfs_rename asks.
- File handles name keys (DESIGN §3); the index remembers where a file went
  (``namespace.moved``), so the handle of the old name (an open file, the Linux client's silly
  rename of an open file that is removed) keeps working. A renamed directory's old handles,
  and those of everything under it, are stale (docs/posix.md).
"""

from __future__ import annotations

from gateway.dispatch import CallContext
from gateway.errors import (
    InvalidArgument,
    IsDirectory,
    NotDirectory,
    NotEmpty,
    NotSupported,
)
from gateway.exports import Export
from gateway.handlers.common import on_failure
from gateway.handlers.mutate import (
    check_dir,
    check_dir_write,
    check_may_move_dir,
    check_sticky,
    check_writable,
    lookup_opt,
    new_name,
    pre_op,
    wcc_after,
    wcc_unchanged,
)
from gateway.namespace import Entry, EntryKind, split_path
from gateway.registry import Gateway
from nfsproto.nfs3 import NfsStat3, Rename3Args, Rename3Res


async def rename3(gw: Gateway, ctx: CallContext, args: Rename3Args) -> Rename3Res:
    export, fd = await gw.resolve(ctx, args.from_.dir)
    _, td = await gw.resolve(ctx, args.to.dir)  # another export's handle: CrossDevice
    fbefore, tbefore = pre_op(export, fd), pre_op(export, td)

    async def result(status: NfsStat3) -> Rename3Res:  # after the change (or its failure)
        return Rename3Res(
            status,
            await wcc_after(export, fbefore, fd.path),
            await wcc_after(export, tbefore, td.path),
        )

    async with on_failure(
        lambda s: Rename3Res(s, wcc_unchanged(export, fd), wcc_unchanged(export, td))
    ):
        check_writable(export)
        check_dir(fd)
        check_dir(td)
        src = new_name(export, fd.path, args.from_.name)
        dst = new_name(export, td.path, args.to.name, is_dir=True)
        check_dir_write(gw, ctx, export, fd)
        check_dir_write(gw, ctx, export, td)
    async with on_failure(result), gw.writes.lock(export, src, dst):
        moved = await export.ns.lookup(fd.path, split_path(src)[1])
        if src != dst:
            check_sticky(gw, ctx, export, fd, moved)
            if moved.kind is EntryKind.DIR and fd.path != td.path:
                check_may_move_dir(gw, ctx, export, moved)
            t = await lookup_opt(export, td.path, split_path(dst)[1])
            if t is not None:
                check_sticky(gw, ctx, export, td, t)
            await _rename(gw, export, moved, dst)
    return await result(NfsStat3.NFS3_OK)


async def _rename(gw: Gateway, export: Export, moved: Entry, dst: str) -> None:
    writes = gw.writes
    kind, src = moved.kind, moved.path
    dparent, dname = split_path(dst)
    t = await lookup_opt(export, dparent, dname)
    if kind is EntryKind.DIR:
        if dst.startswith(src + "/"):
            raise InvalidArgument(f"{src!r} into its own subtree {dst!r}")
        if t is not None:
            if t.kind is not EntryKind.DIR:
                raise NotDirectory(dst)
            page = await export.ns.readdir(dst, 0, 1)
            if page.entries or await writes.dir_has_entries(export, dst):
                raise NotEmpty(dst)
        for sf in writes.staged_under(export, src):
            await writes.commit(export, sf.path)
        keys = await writes.list_tree(export, src, writes.cfg.rename_max_entries)
        if keys is None:
            raise NotSupported(
                f"directory {src!r} has more than {writes.cfg.rename_max_entries} keys"
            )
        await writes.rename_tree(export, src, dst, keys)
        return
    if t is not None and t.kind is EntryKind.DIR:
        raise IsDirectory(dst)
    committed = await writes.commit_locked(export, src)
    await writes.rename_object(export, moved if committed is None else committed, dst)
