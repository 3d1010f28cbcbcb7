"""READ (RFC 1813 §3.3.6): served by the data layer (whole-object fetch for small files,
aligned read-ahead for large ones), pinned to the version the attributes describe; an object
replaced since it was listed is re-read once at its new version
(``ObjectReader.read_current``), never as bytes of two versions."""

from __future__ import annotations

from functools import partial

from gateway.attrs import fattr
from gateway.dispatch import CallContext
from gateway.errors import AccessDenied, InvalidArgument, IsDirectory
from gateway.handlers.common import handle_entry, on_failure
from gateway.namespace import EntryKind
from gateway.policy import R_OK, permits
from gateway.registry import Gateway
from nfsproto.nfs3 import NfsStat3, Read3Args, Read3Res


async def read3(gw: Gateway, ctx: CallContext, args: Read3Args) -> Read3Res:
    # current: past the TTL, the parent's re-list's answer once it has passed the name (never
    # a wait for the whole re-list), so a deleted object turns STALE with that re-list.
    export, entry = await gw.resolve(ctx, args.file, current=True)
    async with on_failure(lambda s: Read3Res(s, file_attributes=fattr(export, entry))):
        if entry.kind == EntryKind.DIR:
            raise IsDirectory(entry.path)
        if entry.kind != EntryKind.FILE:
            raise InvalidArgument(f"READ of {entry.kind.value} {entry.path!r}")
        if not permits(ctx, export, entry, R_OK, read=True):
            gw.deny(ctx, entry, "read needs r (or x) on the file")
            raise AccessDenied(f"no read permission on {entry.path!r}")
    if args.offset == 0:
        gw.stats.files_opened += 1
    count = min(args.count, gw.config.rsize)
    # Replaced since listed: refresh its attributes (one HEAD, not a re-list; gone: STALE).
    refresh = partial(handle_entry, export, entry.path, head=True)
    entry, data, eof = await gw.reader.read_current(
        export.store, export.prefix + entry.path, entry, args.offset, count, refresh
    )
    return Read3Res(NfsStat3.NFS3_OK, fattr(export, entry), len(data), eof, data)
