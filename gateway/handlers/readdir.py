"""READDIR and READDIRPLUS (RFC 1813 §3.3.16-17): entries in name order from the prefetched
listing, filled to the client's ``count``/``maxcount`` exactly.

"." and ".." come first (cookies 1 and 2, as knfsd does); the index's cookies are stable hashes
of names, so a sequence of calls survives a re-list. ``dircount`` is treated like knfsd does:
``maxcount`` alone bounds the reply (the Linux client sends dircount = maxcount / 8, which
would otherwise cost eight times the round trips).

The hot path (``ls -lR`` of ImageNet is 1.28 M entries): the index hands out a page as rows
of the directory's columns (``Namespace.readdir_rows``: names, cookies, sizes, mtimes, and
whole entries only for the rows that need them, ``Rows.special``), and each row is encoded
straight into the reply's bytes (``nfs3.pack_entry3``/``pack_entryplus3`` into
``entries_xdr``), with no Entry, Entry3, Entryplus3, Fattr3 or NfsTime3 object: a listed
file's fileid and handle come from one UTF-8 path (``HandleCodec.listed_ids``), its attributes
as flat fields (``attrs.listed_file_fields_by_id``); a special row's from ``attrs.fattr``. The
bytes are those the object path gives (tests/unit/gateway/test_readdir_fast.py). Rows are
taken from the index a page at a time, sized for typical entries and topped up while the
reply has room, so few are read that do not fit.
"""

from __future__ import annotations

from collections.abc import Callable

from gateway.attrs import fattr, is_listed_file, listed_file_fields, listed_file_fields_by_id
from gateway.dispatch import CallContext
from gateway.errors import AccessDenied, BadCookie, NotDirectory, TooSmall
from gateway.exports import Export
from gateway.handlers.common import on_failure
from gateway.namespace import Entry, EntryKind, fileid, split_path
from gateway.namespace.directory import Rows
from gateway.policy import R_OK, permits
from gateway.registry import Gateway
from nfsproto.nfs3 import (
    FATTR3_FILEID,
    READDIR3RES_OVERHEAD,
    READDIRPLUS3RES_OVERHEAD,
    NfsStat3,
    Readdir3Args,
    Readdir3Res,
    Readdirplus3Args,
    Readdirplus3Res,
    fattr3_fields,
    pack_entry3,
    pack_entryplus3,
    size_entry3,
    size_entryplus3,
)

MAX_REPLY = 1 << 20  # we never build a READDIR(PLUS) reply larger than this
DOT_COOKIE, DOTDOT_COOKIE = 1, 2
# What a typical entry costs (a 20-byte name, a 40-byte handle): the first page asked of the
# index holds budget / this entries; a reply with room left asks for more.
_TYPICAL_ENTRY3 = size_entry3(20)
_TYPICAL_ENTRYPLUS3 = size_entryplus3(20, True, 40)

Encode = Callable[[int, str, Entry], bytes]
"""(cookie, name, entry) -> the entry's bytes in the reply."""
EncodeRows = Callable[[Rows, int], tuple[bytes, int]]
"""(rows, budget) -> (the bytes of the rows that fit in ``budget``, one after the other, up
to the first that does not; how many)."""


async def _fill(
    export: Export,
    d: Entry,
    cookie: int,
    budget: int,
    typical: int,
    encode: Encode,
    encode_rows: EncodeRows,
) -> tuple[bytes, int, bool, bytes]:
    """The entries after ``cookie`` that fit in ``budget`` bytes, encoded: (bytes, entries,
    eof, verifier); "." and ".." first (``encode``), then the index's rows (``encode_rows``).
    A page of the index that ends before the budget does is followed by another after its
    last cookie (the verifier is the last page's: any of them accepts the cookies handed
    out); should that cookie no longer resolve (a re-list in between), the reply ends there
    and the client's next call gets the answer for it."""
    ns = export.ns
    rows = await ns.readdir_rows(
        d.path,
        0 if cookie <= DOTDOT_COOKIE else cookie,
        max_entries=budget // typical + 1,
        client=True,
    )
    out = bytearray()
    count = 0
    dots: list[tuple[int, str, Entry]] = []
    if cookie == 0:
        dots.append((DOT_COOKIE, ".", d))
    if cookie <= DOT_COOKIE:
        parent = d if not d.path else await ns.getattr(split_path(d.path)[0])
        dots.append((DOTDOT_COOKIE, "..", parent))
    for c, name, e in dots:
        b = encode(c, name, e)
        if len(b) > budget:
            return bytes(out), count, False, rows.verifier
        budget -= len(b)
        out += b
        count += 1
    while True:
        raw, n = encode_rows(rows, budget)
        budget -= len(raw)
        out += raw
        count += n
        if n < len(rows.names):
            return bytes(out), count, False, rows.verifier
        if rows.eof or not n:
            return bytes(out), count, rows.eof, rows.verifier
        try:
            nxt = await ns.readdir_rows(
                d.path, rows.cookies[n - 1], max_entries=budget // (len(out) // count) + 1
            )
        except BadCookie:
            return bytes(out), count, False, rows.verifier
        rows = nxt


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
    listed = listed_file_fields(export)
    eid = export.id

    def encode(cookie: int, name: str, e: Entry) -> bytes:
        if is_listed_file(e):
            fid = listed(e.path, e.size, e.mtime_ns)[FATTR3_FILEID]
        else:
            fid = fattr(export, e).fileid
        return pack_entry3(fid, name.encode(), cookie)

    def encode_rows(rows: Rows, budget: int) -> tuple[bytes, int]:
        out = bytearray()
        special = rows.special
        d = rows.path
        prefix = d + "/" if d else ""
        for i, (c, name) in enumerate(zip(rows.cookies, rows.names, strict=True)):
            e = special.get(i) if special else None
            if e is None:
                b = pack_entry3(fileid(eid, prefix + name), name.encode(), c)
            else:
                b = encode(c, name, e)
            if len(b) > budget:
                return bytes(out), i
            budget -= len(b)
            out += b
        return bytes(out), len(rows.names)

    raw, n, eof, verf = await _fill(
        export, d, args.cookie, budget, _TYPICAL_ENTRY3, encode, encode_rows
    )
    if not n and not eof:
        raise TooSmall(f"count {args.count} too small for the next entry")
    return Readdir3Res(NfsStat3.NFS3_OK, dattr, verf, [], eof, raw)


async def readdirplus3(gw: Gateway, ctx: CallContext, args: Readdirplus3Args) -> Readdirplus3Res:
    export, d = await gw.resolve(ctx, args.dir)
    dattr = fattr(export, d)
    async with on_failure(lambda s: Readdirplus3Res(s, dattr)):
        _check_readable(gw, ctx, export, d)
    budget = min(args.maxcount, MAX_REPLY) - READDIRPLUS3RES_OVERHEAD
    if budget < size_entryplus3(1, True, 8):
        raise TooSmall(f"maxcount {args.maxcount}")
    listed = listed_file_fields(export)
    by_id = listed_file_fields_by_id(export)
    handle_for = gw.handle_for
    ids = gw.handles.codec.listed_ids(export.id)

    def encode(cookie: int, name: str, e: Entry) -> bytes:
        path = e.path
        if is_listed_file(e):
            a = listed(path, e.size, e.mtime_ns)
        else:
            a = fattr3_fields(fattr(export, e))
        return pack_entryplus3(name.encode(), cookie, a, handle_for(export, path))

    def encode_rows(rows: Rows, budget: int) -> tuple[bytes, int]:
        """The hot loop: a listed file's fileid and handle from one UTF-8 path, its
        attributes from its size and mtime."""
        out = bytearray()
        special = rows.special
        d = rows.path
        prefix = (d + "/").encode() if d else b""
        for i, (c, name, size, mtime) in enumerate(
            zip(rows.cookies, rows.names, rows.sizes(), rows.mtimes(), strict=True)
        ):
            e = special.get(i) if special else None
            if e is None:
                nb = name.encode()
                raw = prefix + nb
                fid, fh = ids(raw)
                if fh is None:
                    fh = handle_for(export, raw.decode())
                b = pack_entryplus3(nb, c, by_id(fid, size, mtime), fh)
            else:
                b = encode(c, name, e)
            if len(b) > budget:
                return bytes(out), i
            budget -= len(b)
            out += b
        return bytes(out), len(rows.names)

    raw, n, eof, verf = await _fill(
        export, d, args.cookie, budget, _TYPICAL_ENTRYPLUS3, encode, encode_rows
    )
    if not n and not eof:
        raise TooSmall(f"maxcount {args.maxcount} too small for the next entry")
    return Readdirplus3Res(NfsStat3.NFS3_OK, dattr, verf, [], eof, raw)
