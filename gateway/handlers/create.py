"""CREATE (RFC 1813 §3.3.8), MKDIR (§3.3.9), SYMLINK (§3.3.10) and MKNOD (§3.3.11): one PUT
each, recorded in the index before the reply (the parent's mtime and cookie verifier change).

- CREATE puts an empty object carrying the creator's uid/gid (after squashing) and the
  requested mode, so a client that resends its writes after a restart finds the file.
  UNCHECKED on an existing file applies only ``size`` (O_TRUNC), not the mode; GUARDED on an
  existing name is NFS3ERR_EXIST; EXCLUSIVE stores the client's verifier as ``createverf``
  metadata, and a retransmitted EXCLUSIVE CREATE with the same verifier succeeds (§3.3.8).
- MKDIR puts the ``dir/`` marker object, carrying the directory's mode and owner
  (``namespace.dirattrs``).
- MKNOD puts an empty object whose ``type`` metadata makes it a FIFO, socket, character or
  block device (``rdev``: its device numbers), as ``symlink-target`` makes a symlink; other
  types are NFS3ERR_NOTSUPP (a regular file comes by CREATE, a directory by MKDIR). What a
  FIFO or device does is the client's business: the server only keeps the name and attributes.
- New objects are owned by the caller (after squashing) and its gid, or the directory's gid
  when the directory is set-group-ID (a new directory then is set-group-ID too), as Linux does.
- SYMLINK puts an object whose body is the target and whose ``symlink-target`` metadata makes
  it a symlink; targets must be printable ASCII (S3 metadata is ASCII).
"""

from __future__ import annotations

from gateway.attrs import FTYPE_SPECIAL, fattr
from gateway.dispatch import CallContext
from gateway.errors import Exists, InvalidArgument, NameTooLong, NotSupported
from gateway.exports import Export
from gateway.handlers.common import on_failure
from gateway.handlers.mutate import lookup_opt, new_object_metadata, prepare
from gateway.handlers.set_attributes import apply_sattr
from gateway.namespace import (
    META_CREATEVERF,
    META_MTIME,
    META_RDEV,
    META_SYMLINK,
    META_TYPE,
    Entry,
    EntryKind,
    mtime_value,
    rdev_value,
)
from gateway.policy import creds
from gateway.registry import Gateway
from nfsproto.nfs3 import (
    DONT_CHANGE,
    Create3Args,
    Create3Res,
    CreateMode3,
    Mkdir3Args,
    Mkdir3Res,
    Mknod3Args,
    Mknod3Res,
    NfsStat3,
    Sattr3,
    Symlink3Args,
    Symlink3Res,
    TimeHow,
)

MAX_SYMLINK = 4096


def _sattr_rest(s: Sattr3 | None) -> Sattr3 | None:
    """What CREATE must apply after the PUT (size > 0, times)."""
    if s is None:
        return None
    client_time = s.mtime.how is TimeHow.SET_TO_CLIENT_TIME
    if not s.size and not client_time:
        return None  # a new object is empty and its mtime is now
    return Sattr3(size=s.size or None, mtime=s.mtime if client_time else DONT_CHANGE)


async def _verifier_matches(gw: Gateway, export: Export, e: Entry, verf: bytes) -> bool:
    if e.kind is not EntryKind.FILE:
        return False
    _, _, meta = await gw.writes.metadata(export, e)
    return meta.get(META_CREATEVERF) == verf.hex()


async def create3(gw: Gateway, ctx: CallContext, args: Create3Args) -> Create3Res:
    op = await prepare(gw, ctx, args.where, Create3Res)
    export, path, how = op.export, op.path, args.how
    async with on_failure(op.failed), gw.writes.lock(export, path):
        e = await lookup_opt(export, op.d.path, op.name)
        if e is not None:
            guarded = how.mode is CreateMode3.GUARDED
            if guarded or e.kind is not EntryKind.FILE or e.special is not None:
                raise Exists(path)
            if how.mode is CreateMode3.EXCLUSIVE:
                if not await _verifier_matches(gw, export, e, how.verf):
                    raise Exists(path)
            elif how.obj_attributes is not None and how.obj_attributes.size is not None:
                # UNCHECKED on an existing file: the attributes are for a new file; only
                # a size (O_TRUNC) applies, as knfsd does
                size = Sattr3(size=how.obj_attributes.size)
                e = await apply_sattr(gw, export, e, size, creds(ctx, export))
        else:
            sattr = how.obj_attributes if how.mode is not CreateMode3.EXCLUSIVE else None
            meta = new_object_metadata(ctx, export, sattr, op.d)
            if how.mode is CreateMode3.EXCLUSIVE:
                meta[META_CREATEVERF] = how.verf.hex()
            e = await gw.writes.put_object(export, path, b"", meta)
            rest = _sattr_rest(sattr)
            if rest is not None:
                e = await apply_sattr(gw, export, e, rest)
    fh = gw.handle_for(export, path)
    return Create3Res(NfsStat3.NFS3_OK, fh, fattr(export, e), await op.dir_wcc())


async def mkdir3(gw: Gateway, ctx: CallContext, args: Mkdir3Args) -> Mkdir3Res:
    op = await prepare(gw, ctx, args.where, Mkdir3Res, is_dir=True)
    export, path = op.export, op.path
    async with on_failure(op.failed), gw.writes.lock(export, path):
        if await lookup_opt(export, op.d.path, op.name) is not None:
            raise Exists(path)
        meta = new_object_metadata(ctx, export, args.attributes, op.d, is_dir=True)
        meta[META_MTIME] = mtime_value(export.ns.clock.time_ns())  # its times are now
        e = await gw.writes.put_object(export, path + "/", b"", meta)
    fh = gw.handle_for(export, path)
    return Mkdir3Res(NfsStat3.NFS3_OK, fh, fattr(export, e), await op.dir_wcc())


def _check_target(raw: bytes) -> str:
    if not raw:
        raise InvalidArgument("empty symlink target")
    if len(raw) > MAX_SYMLINK:
        raise NameTooLong(f"symlink target of {len(raw)} bytes")
    if not all(0x20 <= b < 0x7F for b in raw):
        raise InvalidArgument("symlink target is not printable ASCII (S3 metadata is ASCII)")
    return raw.decode("ascii")


async def symlink3(gw: Gateway, ctx: CallContext, args: Symlink3Args) -> Symlink3Res:
    op = await prepare(gw, ctx, args.where, Symlink3Res)
    export, path = op.export, op.path
    async with on_failure(op.failed):
        target = _check_target(args.symlink.symlink_data)
        async with gw.writes.lock(export, path):
            if await lookup_opt(export, op.d.path, op.name) is not None:
                raise Exists(path)
            meta = new_object_metadata(ctx, export, None, op.d)
            meta[META_SYMLINK] = target
            e = await gw.writes.put_object(export, path, target.encode("ascii"), meta)
    fh = gw.handle_for(export, path)
    return Symlink3Res(NfsStat3.NFS3_OK, fh, fattr(export, e), await op.dir_wcc())


async def mknod3(gw: Gateway, ctx: CallContext, args: Mknod3Args) -> Mknod3Res:
    op = await prepare(gw, ctx, args.where, Mknod3Res)
    export, path, what = op.export, op.path, args.what
    async with on_failure(op.failed):
        special = FTYPE_SPECIAL.get(what.type)
        if special is None:
            raise NotSupported(f"MKNOD of type {what.type.name}")
        async with gw.writes.lock(export, path):
            if await lookup_opt(export, op.d.path, op.name) is not None:
                raise Exists(path)
            meta = new_object_metadata(ctx, export, what.attributes, op.d)
            meta[META_TYPE] = special
            if what.spec is not None and special in ("chr", "blk"):
                meta[META_RDEV] = rdev_value(what.spec.specdata1, what.spec.specdata2)
            e = await gw.writes.put_object(export, path, b"", meta)
            rest = _sattr_rest(what.attributes)
            if rest is not None and rest.mtime is not DONT_CHANGE:
                e = await apply_sattr(gw, export, e, Sattr3(mtime=rest.mtime))
    fh = gw.handle_for(export, path)
    return Mknod3Res(NfsStat3.NFS3_OK, fh, fattr(export, e), await op.dir_wcc())
