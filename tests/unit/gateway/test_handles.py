"""The handle codec: forms, round trips through ``Handles`` (cached on the encoding gateway),
MAC failures, lengths, determinism across codecs, fileids, the secret."""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.errors import BadHandle, StaleHandle
from gateway.namespace.handles import (
    DIR_HASH_SIZE,
    FORM_HASHED,
    FORM_INLINE,
    FORM_MAPPED,
    FORM_NAMED,
    HEADER_SIZE,
    INLINE_MAX,
    NAME_HASH_SIZE,
    NAME_INLINE_MAX,
    ROOT_FILEID,
    SECRET_SIZE,
    HandleCodec,
    dir_hash,
    fileid,
    load_or_create_secret,
    name_hash,
)
from gateway.namespace.index import Namespace
from gateway.namespace.resolve import Handles
from nfsproto.limits import NFS3_FHSIZE

SECRET = b"s" * 32
SHORT = "train/n01440764/n01440764_10026.JPEG"
LONG_DIR = "a/very/long/directory/name/that/does/not/fit/inline"
NAMED = f"{LONG_DIR}/file-000001.jpg"  # 66 bytes, a short name
HASHED = f"train/{'n' * 60}.jpg"  # a 64-byte name


def no_ns(export_id: int) -> Namespace | None:
    raise AssertionError("a cached handle must not need the namespace")


def test_forms_and_sizes() -> None:
    c = HandleCodec(SECRET)
    fh = c.encode(7, SHORT)
    assert fh[1] == FORM_INLINE and fh[HEADER_SIZE:] == SHORT.encode()
    fh = c.encode(7, NAMED)
    assert fh[1] == FORM_NAMED
    assert fh[HEADER_SIZE:] == dir_hash(7, LONG_DIR) + b"file-000001.jpg"
    fh = c.encode(7, HASHED)
    assert fh[1] == FORM_HASHED and len(fh) == HEADER_SIZE + DIR_HASH_SIZE + NAME_HASH_SIZE
    assert fh[HEADER_SIZE:] == dir_hash(7, "train") + name_hash("n" * 60 + ".jpg")
    # The name limit of the named form, exactly, and one byte more.
    edge = f"{LONG_DIR}/{'x' * NAME_INLINE_MAX}"
    assert c.encode(1, edge)[1] == FORM_NAMED and len(c.encode(1, edge)) == NFS3_FHSIZE
    assert c.encode(1, edge + "x")[1] == FORM_HASHED
    # A long name directly under the root: its parent is "".
    top = "y" * 100
    assert c.encode(1, top)[HEADER_SIZE:] == dir_hash(1, "") + name_hash(top)
    with pytest.raises(ValueError):
        c.encode(1, LONG_DIR + "/more/")
    with pytest.raises(ValueError):
        c.encode(70000, "a")
    with pytest.raises(ValueError):
        HandleCodec(b"short")


def test_same_path_same_handle_on_every_codec() -> None:
    """Stable across restarts and gateways: no state goes into a handle."""
    a, b = HandleCodec(SECRET), HandleCodec(SECRET)
    for p in ("", SHORT, NAMED, HASHED, "é/日本語/" + "😀" * 20):
        assert a.encode(3, p) == b.encode(3, p)
    b.encode(3, "other/dir/" + "z" * 60)  # the memo of the last parent changes nothing
    assert a.encode(3, NAMED) == b.encode(3, NAMED)
    assert a.encode(1, NAMED) != a.encode(2, NAMED)  # the export id is in the hash and the MAC


async def test_round_trip_every_form_on_the_encoding_gateway() -> None:
    h = Handles(SECRET)
    paths = ["", "a", SHORT, "é/日本語/😀", "x" * INLINE_MAX, NAMED, HASHED, "q" * 255]
    paths += [f"{LONG_DIR}/{'é' * 21}", f"{LONG_DIR}/{'é' * 22}"]  # 42 and 44 bytes of name
    for p in paths:
        fh = h.encode(5, p)
        assert len(fh) <= NFS3_FHSIZE
        assert await h.decode(fh, no_ns) == (5, p)
    assert await h.decode(memoryview(h.encode(3, SHORT)), no_ns) == (3, SHORT)  # type: ignore[arg-type]


@given(
    st.integers(0, 0xFFFF),
    st.lists(
        st.text(min_size=1, max_size=90).filter(lambda s: "/" not in s and "\0" not in s),
        min_size=1,
        max_size=6,
    ),
)
def test_round_trip_property(export_id: int, names: list[str]) -> None:
    path = "/".join(names)
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return
    h = Handles(SECRET)
    fh = h.encode(export_id, path)
    assert HEADER_SIZE <= len(fh) <= NFS3_FHSIZE
    assert asyncio.run(h.decode(fh, no_ns)) == (export_id, path)


def _forgeries(fh: bytes) -> list[bytes]:
    out = [b"", fh[:11], fh[:-1], fh + b"x", b"\x01" * 65, bytes([2]) + fh[1:]]
    out.append(fh[:1] + b"\x07" + fh[2:])  # unknown form
    out.append(fh[:4] + bytes(8) + fh[12:])  # zero MAC
    out.append(fh[:2] + b"\x00\x02" + fh[4:])  # another export
    out += [fh[:i] + bytes([fh[i] ^ 1]) + fh[i + 1 :] for i in range(len(fh))]  # every bit 0
    return out


async def test_forged_truncated_foreign_handles_are_bad() -> None:
    h = Handles(SECRET)
    for p in (SHORT, NAMED, HASHED):
        fh = h.encode(1, p)
        for b in _forgeries(fh):
            with pytest.raises(BadHandle):
                await h.decode(b, no_ns)
        # The form byte switched between the hashed forms: the MAC covers it.
        other = FORM_NAMED if fh[1] == FORM_HASHED else FORM_HASHED
        with pytest.raises(BadHandle):
            await h.decode(fh[:1] + bytes([other]) + fh[2:], no_ns)
    foreign = Handles(b"t" * 32)
    for p in (SHORT, NAMED, HASHED):
        with pytest.raises(BadHandle):
            await h.decode(foreign.encode(1, p), no_ns)


async def test_mapped_form_without_legacy_map_is_stale() -> None:
    """A correctly signed handle of the old mapped form, on a gateway with no old map."""
    h = Handles(SECRET)
    payload = bytes(16)
    head = bytes([1, FORM_MAPPED, 0, 1])
    fh = head + h.codec._mac(head, payload) + payload
    with pytest.raises(StaleHandle):
        await h.decode(fh, no_ns)


def test_fileid_stable_nonzero() -> None:
    assert fileid(1, "") == ROOT_FILEID
    a = fileid(1, SHORT)
    assert a == fileid(1, SHORT) and a not in (0, ROOT_FILEID) and a < 2**64
    assert fileid(2, SHORT) != a and fileid(1, SHORT + "x") != a
    ids = {fileid(1, f"d/{i}") for i in range(10_000)}
    assert len(ids) == 10_000 and 0 not in ids and ROOT_FILEID not in ids


def test_secret_created_once_0600(tmp_path: Path) -> None:
    s1 = load_or_create_secret(tmp_path / "st")
    assert len(s1) == SECRET_SIZE
    f = tmp_path / "st" / "handle.secret"
    assert stat.S_IMODE(os.stat(f).st_mode) == 0o600
    assert load_or_create_secret(tmp_path / "st") == s1
    assert [p.name for p in (tmp_path / "st").iterdir()] == ["handle.secret"]
    f.write_bytes(b"short")
    with pytest.raises(ValueError):
        load_or_create_secret(tmp_path / "st")
