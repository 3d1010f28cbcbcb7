"""READDIR and READDIRPLUS (RFC 1813 §3.3.16-17): entries in name order from the prefetched
listing, filled to the client's ``count``/``maxcount`` exactly with nfsproto's ``size_*``.

"." and ".." come first (cookies 1 and 2, as knfsd does); the index's cookies are stable hashes
of names, so a sequence of calls survives a re-list. ``dircount`` is treated like knfsd does:
``maxcount`` alone bounds the reply (the Linux client sends dircount = maxcount / 8, which
would otherwise cost eight times the round trips)."""

from __future__ import annotations

from gateway.attrs import fattr
from gateway.dispatch import CallContext
from gateway.errors import AccessDenied, NotDirectory, TooSmall
from gateway.exports import Export
from gateway.handlers.common import on_failure
from gateway.namespace import Entry, EntryKind, split_path
from gateway.policy import R_OK, permits
from gateway.registry import Gateway
from nfsproto.nfs3 import (
    READDIR3RES_OVERHEAD,
    READDIRPLUS3RES_OVERHEAD,
    Entry3,
    Entryplus3,
    NfsStat3,
    Readdir3Args,
    Readdir3Res,
    Readdirplus3Args,
    Readdirplus3Res,
    size_entry3,
    size_entryplus3,
)

MAX_REPLY = 1 << 20  # we never build a READDIR(PLUS) reply larger than this
DOT_COOKIE, DOTDOT_COOKIE = 1, 2


async def _entries(
    export: Export, d: Entry, cookie: int, max_entries: int
) -> tuple[list[tuple[int, str, Entry]], bool, bytes]:
    """(cookie, name, entry) after ``cookie``, with "." and ".." first; eof; verifier."""
    out: list[tuple[int, str, Entry]] = []
    if cookie == 0:
        out.append((DOT_COOKIE, ".", d))
    if cookie <= DOT_COOKIE:
        parent = d if not d.path else await export.ns.getattr(split_path(d.path)[0])
        out.append((DOTDOT_COOKIE, "..", parent))
    page = await export.ns.readdir(
        d.path, 0 if cookie <= DOTDOT_COOKIE else cookie, max_entries=max_entries
    )
    out.extend((c, e.name, e) for c, e in page.entries)
    return out, page.eof, page.verifier


def _check_readable(gw: Gateway, ctx: CallContext, export: Export, d: Entry) -> None:
    if d.kind != EntryKind.DIR:
        raise NotDirectory(d.path)
    if not permits(ctx, export, d, R_OK):
        gw.deny(ctx, d, "readdir needs r on the directory")
        raise AccessDenied(f"no read permission on directory {d.path!r}")


async def readdir3(gw: Gateway, ctx: CallContext, args: Readdir3Args) -> Readdir3Res:
    export, d = await gw.resolve(ctx, args.dir)
    dattr = fattr(export, d)
    async with on_failure(lambda s: Readdir3Res(s, dattr)):
        _check_readable(gw, ctx, export, d)
    budget = min(args.count, MAX_REPLY) - READDIR3RES_OVERHEAD
    if budget < size_entry3(1):
        raise TooSmall(f"count {args.count}")
    items, eof, verf = await _entries(export, d, args.cookie, budget // size_entry3(0) + 1)
    entries: list[Entry3] = []
    for cookie, name, e in items:
        raw = name.encode()
        n = size_entry3(len(raw))
        if n > budget:
            eof = False
            break
        budget -= n
        entries.append(Entry3(fattr(export, e).fileid, raw, cookie))
    if not entries and not eof:
        raise TooSmall(f"count {args.count} too small for the next entry")
    return Readdir3Res(NfsStat3.NFS3_OK, dattr, verf, entries, eof)


async def readdirplus3(gw: Gateway, ctx: CallContext, args: Readdirplus3Args) -> Readdirplus3Res:
    export, d = await gw.resolve(ctx, args.dir)
    dattr = fattr(export, d)
    async with on_failure(lambda s: Readdirplus3Res(s, dattr)):
        _check_readable(gw, ctx, export, d)
    budget = min(args.maxcount, MAX_REPLY) - READDIRPLUS3RES_OVERHEAD
    if budget < size_entryplus3(1, True, 8):
        raise TooSmall(f"maxcount {args.maxcount}")
    items, eof, verf = await _entries(
        export, d, args.cookie, budget // size_entryplus3(0, True, 8) + 1
    )
    entries: list[Entryplus3] = []
    for cookie, name, e in items:
        raw = name.encode()
        fh = gw.handle_for(export, e.path)
        n = size_entryplus3(len(raw), True, len(fh))
        if n > budget:
            eof = False
            break
        budget -= n
        a = fattr(export, e)
        entries.append(Entryplus3(a.fileid, raw, cookie, a, fh))
    if not entries and not eof:
        raise TooSmall(f"maxcount {args.maxcount} too small for the next entry")
    await gw.persist_handles()
    return Readdirplus3Res(NfsStat3.NFS3_OK, dattr, verf, entries, eof)
