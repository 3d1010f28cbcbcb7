"""READDIR/READDIRPLUS's fast encoding (``gateway.handlers.readdir``: entries packed straight
into bytes, listed files' attributes from ``attrs.listed_file_fields``) against the general
attribute path (``attrs.fattr`` -> ``Fattr3``/``Entryplus3`` objects -> the list packers),
byte for byte: whole replies at every cookie a client walks through, for several reply sizes,
over files, directories, symlinks and entries whose mode, owner or times come from object
metadata; and the flat attributes of listed files against ``fattr`` over many values.

The reference here is the handler as it was before the fast path, so any change of attribute
semantics in ``attrs.fattr`` that the fast path does not follow fails these tests.
"""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path
from typing import Any

import pytest

from gateway.attrs import fattr, is_listed_file, listed_file_fields
from gateway.backend.memory import MemoryStore
from gateway.clock import FakeClock
from gateway.errors import BadCookie
from gateway.exports import Export, ExportConfig
from gateway.handlers.readdir import DOT_COOKIE, DOTDOT_COOKIE, MAX_REPLY
from gateway.namespace import Entry, EntryKind, split_path
from gateway.namespace.columns import Columns
from gateway.namespace.cookies import Cookies
from nfsproto import nfs3, rpc
from nfsproto.client import decode_reply
from nfsproto.nfs3 import (
    READDIR3RES_OVERHEAD,
    READDIRPLUS3RES_OVERHEAD,
    Entry3,
    Entryplus3,
    Nfs3Proc,
    NfsStat3,
    Readdir3Res,
    Readdirplus3Res,
    fattr3_fields,
    size_entry3,
    size_entryplus3,
)
from nfsproto.xdr import Reader, Writer
from tests.harness.memory import MemoryGateway

MTIME = 1_700_000_000_123_456_789

# maxcount/count values: one or two entries a reply, a few, libnfs's 8 KiB, the kernel's
# 32 KiB, more than the whole directory.
SIZES = (512, 1000, 4096, 8192, 32768, 1 << 20)


def _files() -> dict[str, tuple[bytes, dict[str, str]]]:
    """key -> (data, metadata) under ``ds/d/``: plain files of many sizes and name lengths,
    files with mode/owner/time metadata, symlinks, special files, subdirectories (and a
    marker)."""
    out: dict[str, tuple[bytes, dict[str, str]]] = {}
    for i in range(150):
        name = f"f{i:03d}" + "x" * (i % 37) + (".JPEG" if i % 2 else "")
        out[f"ds/d/{name}"] = (b"y" * (i * 97 % 9000), {})
    out["ds/d/\u00e9t\u00e9-\u65e5\u672c.jpg"] = (b"utf8", {})
    out["ds/d/" + "L" * 200] = (b"long name, hashed handle", {})
    out["ds/d/m-mode"] = (b"m", {"mode": "600"})
    out["ds/d/m-owner"] = (b"o", {"uid": "1234", "gid": "5678"})
    out["ds/d/m-all"] = (b"a" * 5000, {"mode": "4755", "uid": "7", "gid": "8", "mtime": "1234"})
    out["ds/d/m-times"] = (b"t", {"mtime": "1600000000.5", "atime": "1500000000", "ctime": "17e8"})
    out["ds/d/s-link"] = (b"target", {"symlink-target": "f001", "mode": "777"})
    out["ds/d/s-link2"] = (b"../elsewhere/x", {"symlink-target": "../elsewhere/x"})
    out["ds/d/p-fifo"] = (b"", {"type": "fifo", "mode": "644"})
    out["ds/d/p-blk"] = (b"", {"type": "blk", "rdev": "8,1"})
    for sub in ("sub1", "sub2", "zz-last"):
        out[f"ds/d/{sub}/inner.jpg"] = (b"i", {})
    out["ds/d/marked/"] = (b"", {"mode": "700"})
    return out


def _gateway(tmp_path: Path, clock: FakeClock | None = None, **export: Any) -> MemoryGateway:
    store = MemoryStore("mem")
    for key, (data, meta) in _files().items():
        store.seed(key, data, metadata=meta, mtime_ns=MTIME + len(key) * 1_000_003)
    exports = [ExportConfig("/data", "s3://b/ds/", **export)]
    return MemoryGateway.of(tmp_path, exports, store=store, clock=clock or FakeClock())


async def _with_metadata(gw: MemoryGateway) -> None:
    """What a HEAD or a write would leave in the index: the metadata of the objects that
    have some (listings carry none)."""
    ns = gw.export("/data").ns
    for key, (_, meta) in _files().items():
        if meta and not key.endswith("/"):
            await ns.refresh(key.removeprefix("ds/"))


# -- the general path: the handler as it was, over attrs.fattr and the object packers --------


async def _items(
    export: Export, d: Entry, cookie: int
) -> tuple[list[tuple[int, str, Entry]], bool, bytes]:
    out: list[tuple[int, str, Entry]] = []
    if cookie == 0:
        out.append((DOT_COOKIE, ".", d))
    if cookie <= DOT_COOKIE:
        parent = d if not d.path else await export.ns.getattr(split_path(d.path)[0])
        out.append((DOTDOT_COOKIE, "..", parent))
    page = await export.ns.readdir(d.path, 0 if cookie <= DOTDOT_COOKIE else cookie, 1 << 20)
    out.extend((c, e.name, e) for c, e in page.entries)
    return out, page.eof, page.verifier


async def _general_plus(gw: MemoryGateway, d: Entry, cookie: int, maxcount: int) -> bytes:
    export = gw.export("/data")
    budget = min(maxcount, MAX_REPLY) - READDIRPLUS3RES_OVERHEAD
    items, eof, verf = await _items(export, d, cookie)
    entries: list[Entryplus3] = []
    for c, name, e in items:
        raw = name.encode()
        fh = gw.gateway.handle_for(export, e.path)
        n = size_entryplus3(len(raw), True, len(fh))
        if n > budget:
            eof = False
            break
        budget -= n
        a = fattr(export, e)
        entries.append(Entryplus3(a.fileid, raw, c, a, fh))
    w = Writer()
    res = Readdirplus3Res(NfsStat3.NFS3_OK, fattr(export, d), verf, entries, eof)
    nfs3.pack_readdirplus3res(w, res)
    return w.getvalue()


async def _general(gw: MemoryGateway, d: Entry, cookie: int, count: int) -> bytes:
    export = gw.export("/data")
    budget = min(count, MAX_REPLY) - READDIR3RES_OVERHEAD
    items, eof, verf = await _items(export, d, cookie)
    entries: list[Entry3] = []
    for c, name, e in items:
        raw = name.encode()
        n = size_entry3(len(raw))
        if n > budget:
            eof = False
            break
        budget -= n
        entries.append(Entry3(fattr(export, e).fileid, raw, c))
    w = Writer()
    nfs3.pack_readdir3res(w, Readdir3Res(NfsStat3.NFS3_OK, fattr(export, d), verf, entries, eof))
    return w.getvalue()


# -- the gateway's replies, as bytes ---------------------------------------------------------


async def _reply(gw: MemoryGateway, proc: Nfs3Proc, args: Any) -> bytes:
    """The result body of one call (what follows the RPC reply header)."""
    c = nfs3.PROCS[proc]
    gw.xid += 1
    w = Writer()
    rpc.pack_call(w, gw.xid, nfs3.PROGRAM, nfs3.VERSION, proc, gw.cred)
    c.pack_args(w, args)
    record = await gw.record(w.getvalue())
    assert record is not None
    _, r = decode_reply(record)
    return bytes(r.buffer[r.pos :])


async def _walk(gw: MemoryGateway, path: str, size: int, plus: bool) -> list[bytes]:
    """List directory ``path`` with replies of ``size`` bytes, checking each reply against
    the general path's for the same cookie; the names seen."""
    export = gw.export("/data")
    dfh = gw.gateway.handle_for(export, path)
    cookie, verf = 0, bytes(8)
    names: list[bytes] = []
    for _ in range(10_000):
        d = await export.ns.getattr(path)
        res: Any
        if plus:
            args = nfs3.Readdirplus3Args(dfh, cookie, verf, size, size)
            got = await _reply(gw, Nfs3Proc.READDIRPLUS, args)
            want = await _general_plus(gw, d, cookie, size)
            res = nfs3.unpack_readdirplus3res(Reader(got))
        else:
            got = await _reply(gw, Nfs3Proc.READDIR, nfs3.Readdir3Args(dfh, cookie, verf, size))
            want = await _general(gw, d, cookie, size)
            res = nfs3.unpack_readdir3res(Reader(got))
        assert res.status == NfsStat3.NFS3_OK
        assert got == want, (path, size, plus, cookie)
        assert res.entries, "a reply with room for an entry holds one"
        names += [e.name for e in res.entries]
        if res.eof:
            return names
        cookie, verf = res.entries[-1].cookie, res.cookieverf
    raise AssertionError("the listing did not end")


def _names(prefix: str) -> list[bytes]:
    """What listing ``ds/`` + ``prefix`` shows: ".", "..", then every child in name order."""
    kids = {k[len(prefix) :].split("/")[0] for k in _files() if k.startswith(prefix)}
    kids.discard("")
    return [b".", b"..", *sorted(k.encode() for k in kids)]


EXPORTS: tuple[dict[str, Any], ...] = (
    {},
    {"file_mode": 0o600, "dir_mode": 0o705, "uid": 1000, "gid": 2000},
)


@pytest.mark.parametrize("export", EXPORTS, ids=["defaults", "modes-owners"])
@pytest.mark.parametrize("plus", [True, False], ids=["READDIRPLUS", "READDIR"])
async def test_replies_are_the_general_paths_bytes(
    tmp_path: Path, plus: bool, export: dict[str, Any]
) -> None:
    async with _gateway(tmp_path, **export) as gw:
        await gw.mount(b"/data")
        await _walk(gw, "d", 8192, plus)  # listed; then metadata over some entries
        await _with_metadata(gw)
        for path, prefix in (("d", "ds/d/"), ("", "ds/"), ("d/sub1", "ds/d/sub1/")):
            for size in SIZES:
                assert await _walk(gw, path, size, plus) == _names(prefix)


async def test_replies_match_after_changes_and_across_a_relist(tmp_path: Path) -> None:
    """Mutations folded into the columns, a name removed under a client's cookie, and a
    re-list past the TTL: still the general path's bytes."""
    clock = FakeClock()
    async with _gateway(tmp_path, clock) as gw:
        await gw.mount(b"/data")
        ns = gw.export("/data").ns
        first = await _walk(gw, "d", 4096, True)
        await _with_metadata(gw)
        gw.store.seed("ds/d/new-file", b"n" * 10)
        ns.upsert(await gw.store.head("ds/d/new-file"))
        await gw.store.delete("ds/d/f010xxxxxxxxxx")
        ns.remove("d/f010xxxxxxxxxx")
        assert b"f010xxxxxxxxxx" in first
        for relist in (False, True):
            if relist:
                clock.advance(3600.0)
            for size in (1000, 8192):
                names = await _walk(gw, "d", size, True)
                assert b"new-file" in names and b"f010xxxxxxxxxx" not in names
                assert await _walk(gw, "d", size, False) == names


# -- listed files' flat attributes against fattr ---------------------------------------------


async def test_listed_file_fields_are_fattrs(tmp_path: Path) -> None:
    sizes = (0, 1, 4095, 4096, 4097, 123_456_789, 2**40 + 3)
    mtimes = (0, 1, 999_999_999, 10**9, MTIME, (2**32 + 7) * 10**9 + 11, -1)
    paths = ("a", "d/e.jpg", "d/" + "L" * 200, "\u00e9/\u65e5.jpg")
    for export_cfg in EXPORTS:
        async with _gateway(tmp_path / str(len(export_cfg)), **export_cfg) as gw:
            export = gw.export("/data")
            listed = listed_file_fields(export)
            for path, size, m in itertools.product(paths, sizes, mtimes):
                e = Entry(path.rsplit("/", 1)[-1], path, EntryKind.FILE, size, m, m, '"etag"')
                assert is_listed_file(e)
                assert listed(path, size, m) == fattr3_fields(fattr(export, e)), (path, size, m)


def _other_value(v: object) -> Any:
    if v is None or v == 0:
        return 1
    if isinstance(v, tuple):
        return tuple(x + 1 for x in v)
    if isinstance(v, str):
        return v + "x"
    return None


def test_only_entries_as_listed_take_the_fast_path() -> None:
    """Any optional field of Entry away from its default (whatever fields Entry has) sends
    the entry down the general path, as do other kinds and a ctime of its own."""
    e = Entry("n", "d/n", EntryKind.FILE, 5, MTIME, MTIME, "etag")
    assert is_listed_file(e)
    optional = [
        f
        for f in dataclasses.fields(Entry)
        if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
    ]
    assert {"mode", "uid", "gid", "symlink_target"} <= {f.name for f in optional}
    for f in optional:
        assert not is_listed_file(
            dataclasses.replace(e, **{f.name: _other_value(getattr(e, f.name))})
        ), f.name
    assert not is_listed_file(dataclasses.replace(e, ctime_ns=MTIME + 1))
    assert not is_listed_file(dataclasses.replace(e, kind=EntryKind.DIR))
    assert not is_listed_file(dataclasses.replace(e, kind=EntryKind.SYMLINK))


def test_resuming_short_of_the_hinted_cookie_finds_the_same_row() -> None:
    """Replies hold fewer entries than the page they were cut from: a client resumes from a
    cookie a few rows before the one hinted; every cookie resolves to the row after its own,
    whichever hints (fresh, repeated, stale) are held."""
    names = sorted(f"n{i:04d}.JPEG" for i in range(300))
    cols = Columns(names, bytes(300), [1] * 300, [MTIME] * 300, ["e"] * 300)
    cookies = Cookies(keep_removed=16)
    col = cookies.column(cols)
    for rep in range(2):  # the second pass hands out the same cookies again
        for last in range(44, 300, 44):
            cookies.handed_out(col[last], names[last])
            for back in (0, 1, 3, 63, 64, 65, 200):
                r = last - back
                if r >= 0:
                    assert cookies.start(cols, col[r]) == r + 1, (rep, last, back)
    assert cookies.start(cols, 12345) == -1


async def test_a_top_up_whose_cookie_is_gone_ends_the_reply(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The handler asks the index for a few entries, then for more after the last one; if
    that cookie no longer resolves in between, the reply ends with what it holds (not
    eof), and the client's next call gets the error for its own cookie."""
    async with _gateway(tmp_path) as gw:
        await gw.mount(b"/data")
        ns = gw.export("/data").ns
        real = ns.readdir_rows
        calls: list[int] = []

        async def readdir_rows(
            path: str, cookie: int, max_entries: int = 1024, *, client: bool = False
        ) -> Any:
            calls.append(cookie)
            if len(calls) == 2:
                raise BadCookie("gone")
            return await real(path, cookie, min(max_entries, 3), client=client)

        monkeypatch.setattr(ns, "readdir_rows", readdir_rows)
        dfh = gw.gateway.handle_for(gw.export("/data"), "d")
        got = await _reply(
            gw, Nfs3Proc.READDIRPLUS, nfs3.Readdirplus3Args(dfh, 0, bytes(8), 8192, 8192)
        )
        res = nfs3.unpack_readdirplus3res(Reader(got))
        assert res.status == NfsStat3.NFS3_OK and not res.eof
        assert [e.name for e in res.entries] == _names("ds/d/")[:5]
        assert calls[0] == 0 and calls[1] == res.entries[-1].cookie
        again = nfs3.Readdirplus3Args(dfh, res.entries[-1].cookie, res.cookieverf, 8192, 8192)
        calls.append(-1)  # past the failing call: the rest of the listing as usual
        res = nfs3.unpack_readdirplus3res(Reader(await _reply(gw, Nfs3Proc.READDIRPLUS, again)))
        assert res.status == NfsStat3.NFS3_OK and res.entries[0].name == _names("ds/d/")[5]
