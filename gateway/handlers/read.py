"""READ (RFC 1813 §3.3.6): served by the data layer (whole-object fetch for small files,
aligned read-ahead for large ones), pinned to the version the attributes describe."""

from __future__ import annotations

from gateway.attrs import fattr
from gateway.backend.base import PreconditionFailed
from gateway.dispatch import CallContext
from gateway.errors import GatewayError, NotFound, StaleHandle
from gateway.exports import Export
from gateway.namespace import Entry, EntryKind
from gateway.policy import R_OK, permits
from gateway.registry import Gateway
from nfsproto.nfs3 import NfsStat3, Read3Args, Read3Res
from nfsproto.xdr import Buffer


async def _read(
    gw: Gateway, export: Export, e: Entry, offset: int, count: int
) -> tuple[Buffer, bool]:
    return await gw.reader.read(export.store, export.prefix + e.path, e.etag, e.size, offset, count)


async def read3(gw: Gateway, ctx: CallContext, args: Read3Args) -> Read3Res:
    # current: past the TTL, wait for the parent's re-list rather than serve cached bytes of
    # an object that may be gone (one LIST per directory per TTL).
    export, entry = await gw.resolve(ctx, args.file, current=True)
    if entry.kind == EntryKind.DIR:
        return Read3Res(NfsStat3.NFS3ERR_ISDIR, file_attributes=fattr(export, entry))
    if entry.kind != EntryKind.FILE:
        return Read3Res(NfsStat3.NFS3ERR_INVAL, file_attributes=fattr(export, entry))
    if not permits(ctx, export, entry, R_OK, read=True):
        gw.deny(ctx, entry, "read needs r (or x) on the file")
        return Read3Res(NfsStat3.NFS3ERR_ACCES, file_attributes=fattr(export, entry))
    if args.offset == 0:
        gw.stats.files_opened += 1
    count = min(args.count, gw.config.rsize)
    try:
        data, eof = await _read(gw, export, entry, args.offset, count)
    except PreconditionFailed:
        # The object was replaced since it was listed: refresh its attributes and read the
        # new version (never bytes of two versions).
        try:
            entry = await export.ns.refresh(entry.path)  # one HEAD, not a re-list
        except NotFound:
            raise StaleHandle(entry.path) from None
        data, eof = await _read(gw, export, entry, args.offset, count)
    return Read3Res(NfsStat3.NFS3_OK, fattr(export, entry), len(data), eof, data)


def read3_fail(e: GatewayError, args: Read3Args) -> Read3Res:
    return Read3Res(e.status)
