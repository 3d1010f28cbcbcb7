"""READDIR(PLUS) pages as rows (``Namespace.readdir_rows``, ``directory.Rows``): every row
the handler encodes from the columns alone (not in ``Rows.special``) is a file as a listing
shows it, with the size, mtime and path a lookup of it gives; every other row carries the
entry a lookup gives; and ``HandleCodec.listed_ids`` gives ``fileid``'s and ``encode``'s
values. The reply bytes themselves are compared with the general path in
test_readdir_fast.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.attrs import is_listed_file
from gateway.clock import FakeClock
from gateway.namespace import Namespace, join_path
from gateway.namespace.handles import INLINE_MAX, HandleCodec, fileid
from tests.unit.gateway.test_readdir_fast import _gateway, _names, _with_metadata


async def _check_rows(ns: Namespace, path: str, page: int) -> tuple[list[str], int]:
    """Walk ``path``'s rows ``page`` at a time, checking each against a lookup; (the names,
    how many rows were special)."""
    names: list[str] = []
    special = 0
    cookie = 0
    for _ in range(10_000):
        rows = await ns.readdir_rows(path, cookie, page)
        assert len(rows.names) == len(rows.cookies) <= page
        assert len(rows.sizes()) == len(rows.mtimes()) == len(rows.names)
        assert rows.page().entries == [
            (c, await ns.getattr(join_path(path, n)))
            for c, n in zip(rows.cookies, rows.names, strict=True)
        ]
        for i, name in enumerate(rows.names):
            want = await ns.getattr(join_path(path, name))
            assert want.name == name
            if i in rows.special:
                assert rows.special[i] == want
                special += 1
            else:
                assert is_listed_file(want), want
                assert (rows.sizes()[i], rows.mtimes()[i]) == (want.size, want.mtime_ns)
        names += rows.names
        if rows.eof:
            return names, special
        assert rows.names, "a page short of eof holds a row"
        cookie = rows.cookies[-1]
    raise AssertionError("the listing did not end")


@pytest.mark.parametrize("page", [1, 2, 3, 7, 64, 10_000])
async def test_rows_are_what_lookups_show(tmp_path: Path, page: int) -> None:
    clock = FakeClock()
    async with _gateway(tmp_path, clock) as gw:
        await gw.mount(b"/data")
        ns = gw.export("/data").ns
        want = [n.decode() for n in _names("ds/d/")[2:]]
        names, special = await _check_rows(ns, "d", page)
        assert names == want
        assert special == 4  # sub1, sub2, zz-last, marked: listings carry no metadata
        await _with_metadata(gw)  # mode, owner, times, symlinks, special files in ``extra``
        names, special = await _check_rows(ns, "d", page)
        assert names == want and special == 4 + 8
        gw.store.seed("ds/d/new-file", b"n" * 10)  # a mutation not folded yet, and a removal
        ns.upsert(await gw.store.head("ds/d/new-file"))
        await gw.store.delete("ds/d/f010xxxxxxxxxx")
        ns.remove("d/f010xxxxxxxxxx")
        names, _ = await _check_rows(ns, "d", page)
        assert "new-file" in names and "f010xxxxxxxxxx" not in names
        assert len(names) == len(want)
        clock.advance(3600.0)  # a re-list: metadata of unchanged objects kept
        names, special = await _check_rows(ns, "d", page)
        assert len(names) == len(want) and special >= 4 + 8
        assert (await _check_rows(ns, "", page))[0] == [n.decode() for n in _names("ds/")[2:]]


@pytest.mark.parametrize("export_id", [0, 1, 7, 0xFFFF])
def test_listed_ids_are_fileid_and_encode(export_id: int) -> None:
    codec = HandleCodec(b"k" * 32)
    ids = codec.listed_ids(export_id)
    paths = [
        "",
        "a",
        "n01440764/n01440764_10026.JPEG",
        "x" * INLINE_MAX,
        "x" * (INLINE_MAX + 1),
        "train/" + "c" * 60 + "/short.jpg",
        "d/" + "L" * 200,
        "\u00e9t\u00e9/\u65e5\u672c.jpg",
        "\u65e5" * 17 + "/a",  # 53 bytes of UTF-8 in 19 characters
    ]
    inline = 0
    for path in paths:
        raw = path.encode()
        fid, fh = ids(raw)
        assert fid == fileid(export_id, path), path
        if len(raw) <= INLINE_MAX:
            assert fh == codec.encode(export_id, path), path
            inline += 1
        else:
            assert fh is None, path
    assert inline == 5
    with pytest.raises(ValueError):
        codec.listed_ids(0x10000)
