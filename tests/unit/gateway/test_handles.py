"""File handles: format, MAC, the long-path map and its persistence, fileids, the secret."""

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
    FHSIZE,
    INLINE_MAX,
    ROOT_FILEID,
    SECRET_SIZE,
    HandleCodec,
    fileid,
    load_or_create_secret,
)

SECRET = b"s" * 32
SHORT = "train/n01440764/n01440764_10026.JPEG"
LONG = "a/very/long/directory/name/that/does/not/fit/inline/file-000001.jpg"


def pending(c: HandleCodec) -> bool:
    return c.needs_flush


async def test_short_round_trip_is_inline():
    c = HandleCodec(SECRET, None)
    for path in ("", "a", SHORT, "é/日本語/😀", "x" * INLINE_MAX):
        fh = c.encode(7, path)
        assert len(fh) <= FHSIZE and fh[1] == 0
        assert await c.decode(fh) == (7, path)
        assert c.decode_nowait(fh) == (7, path)
    assert c.encode(1, "") != c.encode(2, "")
    assert await c.decode(memoryview(c.encode(3, SHORT))) == (3, SHORT)  # type: ignore[arg-type]


@given(st.integers(0, 0xFFFF), st.text(max_size=80).filter(lambda s: "\0" not in s))
def test_round_trip_property(export_id: int, path: str) -> None:
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return
    c = HandleCodec(SECRET, None)
    fh = c.encode(export_id, path)
    assert len(fh) <= FHSIZE
    assert asyncio.run(c.decode(fh)) == (export_id, path)


async def test_forged_truncated_foreign_handles_are_bad():
    c = HandleCodec(SECRET, None)
    fh = c.encode(1, SHORT)
    bad = [
        b"",
        fh[:11],
        fh[:-1],  # truncated payload breaks the MAC
        fh + b"x",
        bytes([2]) + fh[1:],  # unknown version
        fh[:1] + b"\x07" + fh[2:],  # unknown form
        fh[:4] + bytes(8) + fh[12:],  # zero MAC
        fh[:12] + b"TRAIN" + fh[17:],  # edited path
        fh[:2] + b"\x00\x02" + fh[4:],  # other export
        b"\x01" * 65,
    ]
    for b in bad:
        with pytest.raises(BadHandle):
            await c.decode(b)
    foreign = HandleCodec(b"t" * 32, None)
    with pytest.raises(BadHandle):
        await foreign.decode(fh)
    with pytest.raises(BadHandle):
        await c.decode(foreign.encode(1, LONG))
    with pytest.raises(ValueError):
        c.encode(70000, "a")
    with pytest.raises(ValueError):
        HandleCodec(b"short", None)


async def test_long_path_uses_map_and_survives_restart(tmp_path: Path) -> None:
    db = tmp_path / "state" / "handles.sqlite"
    c = HandleCodec(SECRET, db)
    assert len(LONG.encode()) > INLINE_MAX
    fh = await c.encode_async(3, LONG)
    assert len(fh) == 28 and fh[1] == 1
    assert not pending(c)
    assert await c.decode(fh) == (3, LONG)
    # Many at once: one batch, one flush.
    many = {f"{LONG}/{i}": c.encode(3, f"{LONG}/{i}") for i in range(100)}
    assert pending(c)
    await c.flush()
    await c.close()
    # A new process: same secret, same database.
    c2 = HandleCodec(SECRET, db)
    assert c2.decode_nowait(fh) is None  # needs the database
    assert await c2.decode(fh) == (3, LONG)
    assert c2.db_lookups == 1
    assert await c2.decode(fh) == (3, LONG)
    assert c2.db_lookups == 1  # cached now
    for path, h in many.items():
        assert await c2.decode(h) == (3, path)
    # A hash nobody mapped: a validly signed handle of an unknown path -> STALE.
    other = HandleCodec(SECRET, tmp_path / "other.sqlite")
    unknown = other.encode(3, LONG + "/nope")
    await other.close()
    with pytest.raises(StaleHandle):
        await c2.decode(unknown)
    await c2.close()


async def test_background_flush_without_explicit_flush(tmp_path: Path) -> None:
    db = tmp_path / "h.sqlite"
    c = HandleCodec(SECRET, db)
    fh = c.encode(1, LONG)
    assert c.decode_nowait(fh) == (1, LONG)  # served from the queue meanwhile
    for _ in range(100):
        if not c.needs_flush:
            break
        await asyncio.sleep(0.01)
    assert not c.needs_flush
    c2 = HandleCodec(SECRET, db)
    assert await c2.decode(fh) == (1, LONG)
    await c.close()
    await c2.close()


async def test_memory_only_long_paths_and_bounded_cache():
    c = HandleCodec(SECRET, None, cache_entries=2)
    fhs = [await c.encode_async(1, f"{LONG}/{i}") for i in range(3)]
    assert await c.decode(fhs[2]) == (1, f"{LONG}/2")
    with pytest.raises(StaleHandle):
        await c.decode(fhs[0])  # evicted and not persisted anywhere


def test_fileid_stable_nonzero():
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
