"""The single-entry encoders behind ``entries_xdr`` (``pack_entry3``, ``pack_entryplus3``,
``fattr3_fields``): the same bytes as the list packers give the same entry, lengths equal to
``size_entry3``/``size_entryplus3``, and what has no wire form refused."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nfsproto import nfs3
from nfsproto.nfs3 import (
    FATTR3_FILEID,
    MAX_NAME,
    NFS3_FHSIZE,
    Entry3,
    Entryplus3,
    Fattr3,
    NfsStat3,
    Readdir3Res,
    Readdirplus3Res,
    fattr3_fields,
    pack_entry3,
    pack_entryplus3,
    size_entry3,
    size_entryplus3,
)
from nfsproto.xdr import Reader, Writer, XdrError
from tests.unit.nfsproto.strategies_nfs3 import entry3, fattr3, fh, name, u64

OK = NfsStat3.NFS3_OK


def _packed(pack: object, res: object) -> bytes:
    w = Writer()
    pack(w, res)  # type: ignore[operator]
    return w.getvalue()


@given(st.lists(entry3, max_size=5), st.booleans())
def test_entry3_bytes_are_the_list_packers(entries: list[Entry3], eof: bool) -> None:
    raw = b"".join(pack_entry3(e.fileid, e.name, e.cookie) for e in entries)
    assert len(raw) == sum(size_entry3(len(e.name)) for e in entries)
    want = _packed(nfs3.pack_readdir3res, Readdir3Res(OK, None, b"v" * 8, entries, eof))
    got = _packed(nfs3.pack_readdir3res, Readdir3Res(OK, None, b"v" * 8, [], eof, raw))
    assert got == want
    assert nfs3.unpack_readdir3res(Reader(got)).entries == entries


@given(st.lists(st.tuples(name, u64, fattr3, fh), max_size=4), st.booleans())
def test_entryplus3_bytes_are_the_list_packers(
    items: list[tuple[bytes, int, Fattr3, bytes]], eof: bool
) -> None:
    entries = [Entryplus3(a.fileid, n, c, a, h) for n, c, a, h in items]
    raw = b"".join(pack_entryplus3(n, c, fattr3_fields(a), h) for n, c, a, h in items)
    assert len(raw) == sum(size_entryplus3(len(n), True, len(h)) for n, _, _, h in items)
    want = _packed(nfs3.pack_readdirplus3res, Readdirplus3Res(OK, None, b"v" * 8, entries, eof))
    got = _packed(nfs3.pack_readdirplus3res, Readdirplus3Res(OK, None, b"v" * 8, [], eof, raw))
    assert got == want
    assert nfs3.unpack_readdirplus3res(Reader(got)).entries == entries


@given(fattr3)
def test_fattr3_fields_are_the_wire_order(a: Fattr3) -> None:
    w = Writer()
    nfs3.pack_fattr3(w, a)
    assert nfs3._FATTR3.pack(*fattr3_fields(a)) == w.getvalue()
    assert fattr3_fields(a)[FATTR3_FILEID] == a.fileid


def test_what_has_no_wire_form_is_refused() -> None:
    a = fattr3_fields(
        Fattr3(
            nfs3.Ftype3.NF3REG,
            0,
            1,
            0,
            0,
            0,
            0,
            nfs3.Specdata3(0, 0),
            1,
            2,
            nfs3.NfsTime3(0, 0),
            nfs3.NfsTime3(0, 0),
            nfs3.NfsTime3(0, 0),
        )
    )
    with pytest.raises(XdrError):
        pack_entry3(1, b"n" * (MAX_NAME + 1), 3)
    with pytest.raises(XdrError):
        pack_entryplus3(b"n" * (MAX_NAME + 1), 3, a, b"h")
    with pytest.raises(XdrError):
        pack_entryplus3(b"n", 3, a, b"h" * (NFS3_FHSIZE + 1))
    assert len(pack_entryplus3(b"n" * MAX_NAME, 3, a, b"h" * NFS3_FHSIZE)) == size_entryplus3(
        MAX_NAME, True, NFS3_FHSIZE
    )
