"""CREATE (RFC 1813 §3.3.8), MKDIR (§3.3.9) and SYMLINK (§3.3.10): one PUT each, recorded in
the index before the reply (the parent's mtime and cookie verifier change).

- CREATE puts an empty object carrying the creator's uid/gid (after squashing) and the
  requested mode, so a client that resends its writes after a restart finds the file.
  UNCHECKED on an existing file applies only ``size`` (O_TRUNC), not the mode; GUARDED on an
  existing name is NFS3ERR_EXIST; EXCLUSIVE stores the client's verifier as ``createverf``
  metadata, and a retransmitted EXCLUSIVE CREATE with the same verifier succeeds (§3.3.8).
- MKDIR puts the ``dir/`` marker object.
- SYMLINK puts an object whose body is the target and whose ``symlink-target`` metadata makes
  it a symlink; targets must be printable ASCII (S3 metadata is ASCII).
"""

from __future__ import annotations

from gateway.attrs import fattr
from gateway.dispatch import CallContext
from gateway.errors import Exists, GatewayError, InvalidArgument, NameTooLong
from gateway.exports import Export
from gateway.handlers.mutate import (
    check_dir,
    check_dir_write,
    check_writable,
    lookup_opt,
    new_name,
    new_object_metadata,
    pre_op,
    wcc_after,
    wcc_unchanged,
)
from gateway.handlers.setattr import apply_sattr
from gateway.namespace import Entry, EntryKind
from gateway.registry import Gateway
from gateway.writes import META_CREATEVERF, META_SYMLINK
from nfsproto.nfs3 import (
    DONT_CHANGE,
    Create3Args,
    Create3Res,
    CreateMode3,
    Diropargs3,
    Mkdir3Args,
    Mkdir3Res,
    NfsStat3,
    Sattr3,
    Symlink3Args,
    Symlink3Res,
    TimeHow,
    WccAttr,
    WccData,
)

MAX_SYMLINK = 4096


async def _prepare(
    gw: Gateway, ctx: CallContext, where: Diropargs3, *, is_dir: bool = False
) -> tuple[Export, Entry, WccAttr, str]:
    export, d = await gw.resolve(ctx, where.dir)
    before = pre_op(export, d)
    try:
        check_writable(export)
        check_dir(d)
        path = new_name(export, d.path, where.name, is_dir=is_dir)
        check_dir_write(gw, ctx, export, d)
    except GatewayError as e:
        raise _WithWcc(e, wcc_unchanged(export, d)) from e
    return export, d, before, path


class _WithWcc(Exception):
    """A failure that carries the directory's wcc_data for the reply."""

    def __init__(self, error: GatewayError, wcc: WccData) -> None:
        self.error = error
        self.wcc = wcc


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
    try:
        export, d, before, path = await _prepare(gw, ctx, args.where)
    except _WithWcc as w:
        return Create3Res(w.error.status, dir_wcc=w.wcc)
    how = args.how
    name = path.rsplit("/", 1)[-1]
    try:
        async with gw.writes.lock(export, path):
            e = await lookup_opt(export, d.path, name)
            if e is not None:
                if how.mode is CreateMode3.GUARDED or e.kind is not EntryKind.FILE:
                    raise Exists(path)
                if how.mode is CreateMode3.EXCLUSIVE:
                    if not await _verifier_matches(gw, export, e, how.verf):
                        raise Exists(path)
                elif how.obj_attributes is not None and how.obj_attributes.size is not None:
                    # UNCHECKED on an existing file: the attributes are for a new file; only
                    # a size (O_TRUNC) applies, as knfsd does
                    e = await apply_sattr(gw, export, e, Sattr3(size=how.obj_attributes.size))
            else:
                sattr = how.obj_attributes if how.mode is not CreateMode3.EXCLUSIVE else None
                meta = new_object_metadata(ctx, export, sattr)
                if how.mode is CreateMode3.EXCLUSIVE:
                    meta[META_CREATEVERF] = how.verf.hex()
                e = await gw.writes.put_object(export, path, b"", meta)
                rest = _sattr_rest(sattr)
                if rest is not None:
                    e = await apply_sattr(gw, export, e, rest)
    except GatewayError as err:
        return Create3Res(err.status, dir_wcc=await wcc_after(export, before, d.path))
    fh = gw.handle_for(export, path)
    await gw.persist_handles()
    return Create3Res(
        NfsStat3.NFS3_OK, fh, fattr(export, e), await wcc_after(export, before, d.path)
    )


async def mkdir3(gw: Gateway, ctx: CallContext, args: Mkdir3Args) -> Mkdir3Res:
    try:
        export, d, before, path = await _prepare(gw, ctx, args.where, is_dir=True)
    except _WithWcc as w:
        return Mkdir3Res(w.error.status, dir_wcc=w.wcc)
    name = path.rsplit("/", 1)[-1]
    try:
        async with gw.writes.lock(export, path):
            if await lookup_opt(export, d.path, name) is not None:
                raise Exists(path)
            meta = new_object_metadata(ctx, export, args.attributes)
            e = await gw.writes.put_object(export, path + "/", b"", meta)
    except GatewayError as err:
        return Mkdir3Res(err.status, dir_wcc=await wcc_after(export, before, d.path))
    fh = gw.handle_for(export, path)
    await gw.persist_handles()
    return Mkdir3Res(
        NfsStat3.NFS3_OK, fh, fattr(export, e), await wcc_after(export, before, d.path)
    )


def _check_target(raw: bytes) -> str:
    if not raw:
        raise InvalidArgument("empty symlink target")
    if len(raw) > MAX_SYMLINK:
        raise NameTooLong(f"symlink target of {len(raw)} bytes")
    if not all(0x20 <= b < 0x7F for b in raw):
        raise InvalidArgument("symlink target is not printable ASCII (S3 metadata is ASCII)")
    return raw.decode("ascii")


async def symlink3(gw: Gateway, ctx: CallContext, args: Symlink3Args) -> Symlink3Res:
    try:
        export, d, before, path = await _prepare(gw, ctx, args.where)
    except _WithWcc as w:
        return Symlink3Res(w.error.status, dir_wcc=w.wcc)
    name = path.rsplit("/", 1)[-1]
    try:
        target = _check_target(args.symlink.symlink_data)
        async with gw.writes.lock(export, path):
            if await lookup_opt(export, d.path, name) is not None:
                raise Exists(path)
            meta = new_object_metadata(ctx, export, None)
            meta[META_SYMLINK] = target
            e = await gw.writes.put_object(export, path, target.encode("ascii"), meta)
    except GatewayError as err:
        return Symlink3Res(err.status, dir_wcc=await wcc_after(export, before, d.path))
    fh = gw.handle_for(export, path)
    await gw.persist_handles()
    return Symlink3Res(
        NfsStat3.NFS3_OK, fh, fattr(export, e), await wcc_after(export, before, d.path)
    )


def create3_fail(e: GatewayError, args: Create3Args) -> Create3Res:
    return Create3Res(e.status)


def mkdir3_fail(e: GatewayError, args: Mkdir3Args) -> Mkdir3Res:
    return Mkdir3Res(e.status)


def symlink3_fail(e: GatewayError, args: Symlink3Args) -> Symlink3Res:
    return Symlink3Res(e.status)
