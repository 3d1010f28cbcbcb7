"""NFSv3 codecs (nfsproto.nfs3): round trips, bounds, discriminants, golden bytes, sizes."""

from __future__ import annotations

import contextlib
import tracemalloc
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nfsproto import nfs3
from nfsproto.nfs3 import (
    FSF3_CANSETTIME,
    FSF3_HOMOGENEOUS,
    FSF3_LINK,
    FSF3_SYMLINK,
    MAX_NAME,
    PROCS,
    READDIR3RES_OVERHEAD,
    READDIRPLUS3RES_OVERHEAD,
    Create3Args,
    CreateHow3,
    CreateMode3,
    Diropargs3,
    Entry3,
    Entryplus3,
    Fattr3,
    Fsinfo3Res,
    Ftype3,
    Getattr3Args,
    Getattr3Res,
    Lookup3Args,
    Lookup3Res,
    Mknoddata3,
    Nfs3Proc,
    NfsStat3,
    NfsTime3,
    Read3Args,
    Read3Res,
    Readdir3Res,
    Readdirplus3Res,
    Sattr3,
    SetTime,
    Specdata3,
    StableHow,
    TimeHow,
    Write3Args,
    size_entry3,
    size_entryplus3,
    size_entryplus3_dircount,
)
from nfsproto.xdr import Reader, Writer, XdrError

from .strategies_nfs3 import ARGS, RESULTS, entry3, entryplus3, fattr3, post_op_attr, verf8

OK = NfsStat3.NFS3_OK
NAMES = list(ARGS)

Packer = Callable[..., None]  # (Writer, value) -> None; value type varies per codec
Unpacker = Callable[[Reader], object]


def codecs(name: str, kind: str) -> tuple[Packer, Unpacker]:
    return getattr(nfs3, f"pack_{name}3{kind}"), getattr(nfs3, f"unpack_{name}3{kind}")


def encode(pack: Packer, v: object) -> bytes:
    w = Writer()
    pack(w, v)
    return w.getvalue()


def decode(unpack: Unpacker, data: bytes) -> object:
    r = Reader(data)
    v = unpack(r)
    r.done()
    return v


MESSAGES = [(n, "args") for n in NAMES] + [(n, "res") for n in NAMES]
STRATEGIES = {"args": ARGS, "res": RESULTS}


def msg_id(m: tuple[str, str]) -> str:
    return f"{m[0]}3{m[1]}"


# ------------------------------------------------------------------------------------------
# Round trips


@pytest.mark.parametrize("msg", MESSAGES, ids=msg_id)
@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_round_trip(msg: tuple[str, str], data: st.DataObject) -> None:
    name, kind = msg
    v = data.draw(STRATEGIES[kind][name])
    pack, unpack = codecs(name, kind)
    enc = encode(pack, v)
    assert len(enc) % 4 == 0
    assert decode(unpack, enc) == v  # memoryview fields compare by content
    # The PROCS entry encodes identically and decodes the same value.
    codec = PROCS[Nfs3Proc[name.upper()]]
    via = codec.pack_args if kind == "args" else codec.pack_res
    assert encode(via, v) == enc
    assert decode(codec.unpack_args if kind == "args" else codec.unpack_res, enc) == v


@pytest.mark.parametrize("msg", MESSAGES, ids=msg_id)
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_every_truncated_prefix_raises_xdrerror(msg: tuple[str, str], data: st.DataObject) -> None:
    name, kind = msg
    pack, unpack = codecs(name, kind)
    enc = encode(pack, data.draw(STRATEGIES[kind][name]))
    for n in range(len(enc)):
        with pytest.raises(XdrError):
            unpack(Reader(enc[:n]))
        # Same prefix as a window on the whole buffer: the codec must honour the Reader's end,
        # not the length of the underlying buffer.
        with pytest.raises(XdrError):
            unpack(Reader(enc, end=n))


@pytest.mark.parametrize("msg", MESSAGES, ids=msg_id)
@settings(max_examples=50, deadline=None)
@given(data=st.data())
def test_corrupted_input_raises_only_xdrerror(msg: tuple[str, str], data: st.DataObject) -> None:
    name, kind = msg
    pack, unpack = codecs(name, kind)
    enc = bytearray(encode(pack, data.draw(STRATEGIES[kind][name])))
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(enc) - 1))
        enc[i] = data.draw(st.sampled_from([0x00, 0x01, 0x02, 0x03, 0x7F, 0x80, 0xFF]))
    with contextlib.suppress(XdrError):
        decode(unpack, bytes(enc))


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(MESSAGES), st.binary(max_size=200))
def test_random_bytes_raise_only_xdrerror(msg: tuple[str, str], blob: bytes) -> None:
    _, unpack = codecs(*msg)
    with contextlib.suppress(XdrError):
        decode(unpack, blob)


@pytest.mark.parametrize("msg", MESSAGES, ids=msg_id)
@settings(max_examples=10, deadline=None)
@given(data=st.data())
def test_trailing_bytes_detected_by_done(msg: tuple[str, str], data: st.DataObject) -> None:
    name, kind = msg
    pack, unpack = codecs(name, kind)
    v = data.draw(STRATEGIES[kind][name])
    r = Reader(encode(pack, v) + b"\0\0\0\0")
    assert unpack(r) == v
    with pytest.raises(XdrError, match="trailing"):
        r.done()


def test_null_procedure_is_void() -> None:
    codec = PROCS[Nfs3Proc.NULL]
    assert codec.name == "NULL"
    assert encode(codec.pack_args, None) == b""
    assert encode(codec.pack_res, None) == b""
    assert decode(codec.unpack_args, b"") is None
    assert decode(codec.unpack_res, b"") is None


def test_procs_table_covers_all_procedures() -> None:
    assert sorted(PROCS) == list(range(22))
    for proc in Nfs3Proc:
        assert PROCS[proc].name == proc.name


def test_procs_pack_rejects_the_wrong_type() -> None:
    with pytest.raises(TypeError, match="Getattr3Res"):
        PROCS[Nfs3Proc.GETATTR].pack_res(Writer(), Lookup3Res(NfsStat3.NFS3ERR_NOENT))
    with pytest.raises(TypeError):
        PROCS[Nfs3Proc.LOOKUP].pack_args(Writer(), None)


# ------------------------------------------------------------------------------------------
# Zero copy of READ/WRITE payloads


def test_read_payload_is_not_copied() -> None:
    payload = memoryview(bytes(range(256)) * 256 + b"xyz")  # 65,539 bytes: 1 byte of padding
    w = Writer()
    nfs3.pack_read3res(w, Read3Res(OK, None, len(payload), True, payload))
    bufs = w.buffers()
    assert any(b is payload for b in bufs)
    enc = b"".join(bufs)
    assert len(enc) == 4 + 4 + 4 + 4 + 4 + 65540
    res = decode(nfs3.unpack_read3res, enc)
    assert isinstance(res, Read3Res)
    assert isinstance(res.data, memoryview)
    assert res.data.obj is enc  # a slice of the input, not a copy
    assert res.data == payload


def test_write_payload_is_not_copied() -> None:
    payload = b"\xab" * 5000
    w = Writer()
    nfs3.pack_write3args(w, Write3Args(b"fh", 0, 5000, StableHow.UNSTABLE, payload))
    assert any(b is payload for b in w.buffers())
    enc = b"".join(w.buffers())
    args = decode(nfs3.unpack_write3args, enc)
    assert isinstance(args, Write3Args)
    assert isinstance(args.data, memoryview) and args.data.obj is enc
    assert bytes(args.data) == payload


# ------------------------------------------------------------------------------------------
# Bounds: oversized lengths fail before allocating


def _peak_alloc(fn: Callable[[], object]) -> int:
    tracemalloc.start()
    try:
        with pytest.raises(XdrError):
            fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize(
    ("unpack", "blob"),
    [
        # LOOKUP3args: 4-byte handle, then a name claiming 2**31 bytes with 8 bytes left.
        (nfs3.unpack_lookup3args, "00000004 01020304 80000000 0000000000000000"),
        # GETATTR3args: handle length 0xffffffff.
        (nfs3.unpack_getattr3args, "ffffffff 00000000"),
        # GETATTR3args: handle of 65 bytes (over NFS3_FHSIZE) although the bytes are there.
        (nfs3.unpack_getattr3args, "00000041" + "00" * 68),
        # WRITE3args: data length 2**31 (over MAX_DATA and over the input).
        (nfs3.unpack_write3args, "00000000 0000000000000000 00000001 00000000 80000000 00"),
        # READ3res ok: data length 0xfffffffc.
        (nfs3.unpack_read3res, "00000000 00000000 00000001 00000000 fffffffc 00000000"),
        # READLINK3res ok: path length 4097 (over MAX_PATH).
        (nfs3.unpack_readlink3res, "00000000 00000000 00001001" + "61" * 4100),
        # READDIR3res ok: one entry whose name claims 2**31 bytes.
        (
            nfs3.unpack_readdir3res,
            "00000000 00000000 0000000000000000 00000001 0000000000000001 80000000 00000000",
        ),
        # READDIRPLUS3res ok: one entry whose name is 256 bytes (over MAX_NAME).
        (
            nfs3.unpack_readdirplus3res,
            "00000000 00000000 0000000000000000 00000001 0000000000000001 00000100"
            + "61" * 256
            + "0000000000000001 00000000 00000000 00000000 00000001",
        ),
    ],
)
def test_oversized_lengths_raise_without_allocating(unpack: Unpacker, blob: str) -> None:
    data = bytes.fromhex(blob)
    assert _peak_alloc(lambda: unpack(Reader(data))) < 64 * 1024


def test_name_limit_is_inclusive() -> None:
    v = Lookup3Args(Diropargs3(b"d", b"n" * MAX_NAME))
    assert decode(nfs3.unpack_lookup3args, encode(nfs3.pack_lookup3args, v)) == v


# ------------------------------------------------------------------------------------------
# Bad discriminants


def _replace_word(enc: bytes, index: int, value: int) -> bytes:
    return enc[: 4 * index] + value.to_bytes(4, "big") + enc[4 * index + 4 :]


FATTR = Fattr3(
    Ftype3.NF3REG,
    0o644,
    2,
    1000,
    1001,
    114660,
    114688,
    Specdata3(5, 6),
    7,
    1234567890,
    NfsTime3(1700000000, 1),
    NfsTime3(1700000000, 2),
    NfsTime3(1700000000, 3),
)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("bad", [3, 99, 10000, 10009, 0xFFFFFFFF])
def test_unknown_status_raises(name: str, bad: int) -> None:
    _, unpack = codecs(name, "res")
    with pytest.raises(XdrError, match="nfsstat3"):
        unpack(Reader(bad.to_bytes(4, "big") + b"\0" * 200))


@pytest.mark.parametrize("ftype", [0, 8, 0x80000001])
def test_unknown_ftype_raises(ftype: int) -> None:
    enc = encode(nfs3.pack_getattr3res, Getattr3Res(OK, FATTR))
    with pytest.raises(XdrError, match="ftype3"):
        decode(nfs3.unpack_getattr3res, _replace_word(enc, 1, ftype))


def test_unknown_stable_how_raises() -> None:
    enc = encode(nfs3.pack_write3args, Write3Args(b"\1\2\3\4", 0, 1, StableHow.FILE_SYNC, b"a"))
    assert enc[20:24] == b"\0\0\0\2"  # words: fh length, fh, offset (2), count, stable
    with pytest.raises(XdrError, match="stable_how"):
        decode(nfs3.unpack_write3args, _replace_word(enc, 5, 3))
    res = encode(nfs3.pack_write3res, nfs3.Write3Res(OK, committed=StableHow.DATA_SYNC))
    # status, pre_op_attr absent, post_op_attr absent, count, committed, verf
    with pytest.raises(XdrError, match="stable_how"):
        decode(nfs3.unpack_write3res, _replace_word(res, 4, 7))


def test_unknown_createmode_raises() -> None:
    args = Create3Args(Diropargs3(b"", b""), CreateHow3(CreateMode3.UNCHECKED, Sattr3()))
    enc = encode(nfs3.pack_create3args, args)
    with pytest.raises(XdrError, match="createmode3"):
        decode(nfs3.unpack_create3args, _replace_word(enc, 2, 3))


# words: dir length, name length, createmode, mode/uid/gid/size set_it, atime, mtime
@pytest.mark.parametrize("word", [7, 8])
def test_unknown_time_how_raises(word: int) -> None:
    args = Create3Args(Diropargs3(b"", b""), CreateHow3(CreateMode3.GUARDED, Sattr3()))
    enc = encode(nfs3.pack_create3args, args)
    with pytest.raises(XdrError, match="time_how"):
        decode(nfs3.unpack_create3args, _replace_word(enc, word, 3))


def test_unknown_mknod_type_raises() -> None:
    enc = encode(
        nfs3.pack_mknod3args, nfs3.Mknod3Args(Diropargs3(b"", b""), Mknoddata3(Ftype3.NF3REG))
    )
    with pytest.raises(XdrError, match="ftype3"):
        decode(nfs3.unpack_mknod3args, _replace_word(enc, 2, 8))


def test_bad_booleans_raise() -> None:
    # post_op_attr follows = 2
    with pytest.raises(XdrError, match="bool"):
        decode(nfs3.unpack_lookup3res, bytes.fromhex("00000002 00000002"))
    # READ3res eof = 2
    with pytest.raises(XdrError, match="bool"):
        decode(nfs3.unpack_read3res, bytes.fromhex("00000000 00000000 00000000 00000002 00000000"))
    # READDIR3res entry "value follows" = 2
    with pytest.raises(XdrError, match="bool"):
        decode(
            nfs3.unpack_readdir3res, bytes.fromhex("00000000 00000000 0000000000000000 00000002")
        )
    # PATHCONF3res case_preserving = 5
    enc = encode(nfs3.pack_pathconf3res, nfs3.Pathconf3Res(OK))
    with pytest.raises(XdrError, match="bool"):
        decode(nfs3.unpack_pathconf3res, _replace_word(enc, 7, 5))


def test_nonzero_padding_raises() -> None:
    enc = encode(nfs3.pack_lookup3args, Lookup3Args(Diropargs3(b"\1", b"ab")))
    with pytest.raises(XdrError, match="padding"):
        decode(nfs3.unpack_lookup3args, enc[:-1] + b"\1")


# ------------------------------------------------------------------------------------------
# Packers refuse values without a wire form


@pytest.mark.parametrize(
    ("pack", "value"),
    [
        (nfs3.pack_getattr3args, Getattr3Args(b"x" * 65)),
        (nfs3.pack_getattr3res, Getattr3Res(OK)),
        (nfs3.pack_lookup3args, Lookup3Args(Diropargs3(b"", b"n" * 256))),
        (nfs3.pack_readdir3args, nfs3.Readdir3Args(b"", 0, b"short", 100)),
        (nfs3.pack_write3res, nfs3.Write3Res(OK, verf=b"1234567")),
        (nfs3.pack_commit3res, nfs3.Commit3Res(OK, verf=b"123456789")),
        (
            nfs3.pack_create3args,
            Create3Args(Diropargs3(b"", b"a"), CreateHow3(CreateMode3.GUARDED)),
        ),
        (
            nfs3.pack_create3args,
            Create3Args(Diropargs3(b"", b"a"), CreateHow3(CreateMode3.EXCLUSIVE, verf=b"")),
        ),
        (
            nfs3.pack_mkdir3args,
            nfs3.Mkdir3Args(
                Diropargs3(b"", b"a"), Sattr3(atime=SetTime(TimeHow.SET_TO_CLIENT_TIME))
            ),
        ),
        (
            nfs3.pack_mknod3args,
            nfs3.Mknod3Args(Diropargs3(b"", b"a"), Mknoddata3(Ftype3.NF3CHR, Sattr3())),
        ),
        (
            nfs3.pack_mknod3args,
            nfs3.Mknod3Args(Diropargs3(b"", b"a"), Mknoddata3(Ftype3.NF3FIFO)),
        ),
        (
            nfs3.pack_readdir3res,
            Readdir3Res(OK, entries=[Entry3(1, b"n" * 256, 1)]),
        ),
        (
            nfs3.pack_readdirplus3res,
            Readdirplus3Res(OK, entries=[Entryplus3(1, b"n", 1, None, b"h" * 65)]),
        ),
    ],
)
def test_packers_reject_values_without_wire_form(pack: Packer, value: object) -> None:
    with pytest.raises(XdrError):
        encode(pack, value)


# ------------------------------------------------------------------------------------------
# Golden vectors, written by hand from the RFC 1813 layouts.

# fattr3 (84 bytes) of FATTR above.
FATTR3_HEX = (
    "00000001"  # type NF3REG
    "000001a4"  # mode 0644
    "00000002"  # nlink 2
    "000003e8"  # uid 1000
    "000003e9"  # gid 1001
    "000000000001bfe4"  # size 114660
    "000000000001c000"  # used 114688
    "00000005 00000006"  # rdev specdata1 5, specdata2 6
    "0000000000000007"  # fsid 7
    "00000000499602d2"  # fileid 1234567890
    "6553f100 00000001"  # atime 1700000000 s, 1 ns
    "6553f100 00000002"  # mtime 1700000000 s, 2 ns
    "6553f100 00000003"  # ctime 1700000000 s, 3 ns
)

GOLDEN: list[tuple[str, Packer, Unpacker, object, str]] = [
    (
        "GETATTR3res ok",
        nfs3.pack_getattr3res,
        nfs3.unpack_getattr3res,
        Getattr3Res(OK, FATTR),
        "00000000"  # status NFS3_OK
        + FATTR3_HEX,  # obj_attributes
    ),
    (
        "LOOKUP3args",
        nfs3.pack_lookup3args,
        nfs3.unpack_lookup3args,
        Lookup3Args(Diropargs3(b"\x01\x02\x03\x04\x05", b"cat.jpg")),
        "00000005"  # what.dir length 5
        "0102030405 000000"  # handle bytes + 3 bytes of padding
        "00000007"  # what.name length 7
        "6361742e6a7067 00",  # "cat.jpg" + 1 byte of padding
    ),
    (
        "READ3args",
        nfs3.pack_read3args,
        nfs3.unpack_read3args,
        Read3Args(b"\xaa" * 8, 65536, 131072),
        "00000008"  # file handle length 8
        "aaaaaaaaaaaaaaaa"  # handle bytes (no padding)
        "0000000000010000"  # offset 65536
        "00020000",  # count 131072
    ),
    (
        "READ3res ok, 5 bytes",
        nfs3.pack_read3res,
        nfs3.unpack_read3res,
        Read3Res(OK, None, 5, True, b"hello"),
        "00000000"  # status NFS3_OK
        "00000000"  # file_attributes: attributes_follow FALSE
        "00000005"  # count 5
        "00000001"  # eof TRUE
        "00000005"  # data length 5
        "68656c6c6f 000000",  # "hello" + 3 bytes of padding
    ),
    (
        "WRITE3args",
        nfs3.pack_write3args,
        nfs3.unpack_write3args,
        Write3Args(b"\x01\x02\x03\x04", 4096, 3, StableHow.FILE_SYNC, b"abc"),
        "00000004 01020304"  # file handle length 4, bytes
        "0000000000001000"  # offset 4096
        "00000003"  # count 3
        "00000002"  # stable FILE_SYNC
        "00000003"  # data length 3
        "616263 00",  # "abc" + 1 byte of padding
    ),
    (
        "CREATE3args GUARDED, mode only",
        nfs3.pack_create3args,
        nfs3.unpack_create3args,
        Create3Args(
            Diropargs3(b"\xde\xad\xbe\xef", b"new"),
            CreateHow3(CreateMode3.GUARDED, Sattr3(mode=0o644)),
        ),
        "00000004 deadbeef"  # where.dir: length 4, handle
        "00000003 6e657700"  # where.name: length 3, "new" + 1 byte of padding
        "00000001"  # how.mode GUARDED
        "00000001 000001a4"  # mode: set_it TRUE, 0644
        "00000000"  # uid: set_it FALSE
        "00000000"  # gid: set_it FALSE
        "00000000"  # size: set_it FALSE
        "00000000"  # atime: DONT_CHANGE
        "00000000",  # mtime: DONT_CHANGE
    ),
    (
        "READDIRPLUS3res ok, 1 entry",
        nfs3.pack_readdirplus3res,
        nfs3.unpack_readdirplus3res,
        Readdirplus3Res(
            OK,
            None,
            bytes.fromhex("0102030405060708"),
            [Entryplus3(42, b"a.jpg", 1, FATTR, b"\x0a\x0b\x0c\x0d")],
            True,
        ),
        "00000000"  # status NFS3_OK
        "00000000"  # dir_attributes: attributes_follow FALSE
        "0102030405060708"  # cookieverf
        "00000001"  # entries: value follows
        "000000000000002a"  # fileid 42
        "00000005 612e6a7067 000000"  # name: length 5, "a.jpg" + 3 bytes of padding
        "0000000000000001"  # cookie 1
        "00000001"  # name_attributes: attributes_follow TRUE
        + FATTR3_HEX
        + "00000001"  # name_handle: handle_follows TRUE
        "00000004 0a0b0c0d"  # handle: length 4, bytes
        "00000000"  # nextentry: no value follows
        "00000001",  # eof TRUE
    ),
    (
        "FSINFO3res ok",
        nfs3.pack_fsinfo3res,
        nfs3.unpack_fsinfo3res,
        Fsinfo3Res(
            OK,
            None,
            1048576,
            1048576,
            4096,
            1048576,
            1048576,
            4096,
            65536,
            2**63 - 1,
            NfsTime3(0, 1),
            FSF3_LINK | FSF3_SYMLINK | FSF3_HOMOGENEOUS | FSF3_CANSETTIME,
        ),
        "00000000"  # status NFS3_OK
        "00000000"  # obj_attributes: attributes_follow FALSE
        "00100000"  # rtmax 1 MiB
        "00100000"  # rtpref 1 MiB
        "00001000"  # rtmult 4096
        "00100000"  # wtmax 1 MiB
        "00100000"  # wtpref 1 MiB
        "00001000"  # wtmult 4096
        "00010000"  # dtpref 64 KiB
        "7fffffffffffffff"  # maxfilesize 2**63-1
        "00000000 00000001"  # time_delta 0 s, 1 ns
        "0000001b",  # properties LINK|SYMLINK|HOMOGENEOUS|CANSETTIME
    ),
    (
        "LOOKUP3res NOENT, no dir attributes",
        nfs3.pack_lookup3res,
        nfs3.unpack_lookup3res,
        Lookup3Res(NfsStat3.NFS3ERR_NOENT),
        "00000002"  # status NFS3ERR_NOENT
        "00000000",  # resfail.dir_attributes: attributes_follow FALSE
    ),
    (
        "LOOKUP3res STALE, dir attributes",
        nfs3.pack_lookup3res,
        nfs3.unpack_lookup3res,
        Lookup3Res(NfsStat3.NFS3ERR_STALE, dir_attributes=FATTR),
        "00000046"  # status NFS3ERR_STALE (70)
        "00000001" + FATTR3_HEX,  # resfail.dir_attributes: attributes_follow TRUE
    ),
    (
        "WRITE3res ok",
        nfs3.pack_write3res,
        nfs3.unpack_write3res,
        nfs3.Write3Res(
            OK,
            nfs3.WccData(nfs3.WccAttr(10, NfsTime3(1, 2), NfsTime3(3, 4)), None),
            3,
            StableHow.UNSTABLE,
            b"VERIFIER",
        ),
        "00000000"  # status NFS3_OK
        "00000001"  # file_wcc.before: attributes_follow TRUE
        "000000000000000a"  # wcc_attr.size 10
        "00000001 00000002"  # wcc_attr.mtime
        "00000003 00000004"  # wcc_attr.ctime
        "00000000"  # file_wcc.after: attributes_follow FALSE
        "00000003"  # count 3
        "00000000"  # committed UNSTABLE
        "5645524946494552",  # verf "VERIFIER"
    ),
]


@pytest.mark.parametrize(
    ("what", "pack", "unpack", "value", "hexs"), GOLDEN, ids=[g[0] for g in GOLDEN]
)
def test_golden(what: str, pack: Packer, unpack: Unpacker, value: object, hexs: str) -> None:
    wire = bytes.fromhex(hexs)
    assert encode(pack, value).hex() == wire.hex()
    assert decode(unpack, wire) == value


def test_fattr3_is_84_bytes() -> None:
    assert nfs3.FATTR3_SIZE == 84
    assert len(bytes.fromhex(FATTR3_HEX)) == 84
    assert encode(nfs3.pack_fattr3, FATTR) == bytes.fromhex(FATTR3_HEX)


# ------------------------------------------------------------------------------------------
# Exact sizes for READDIR / READDIRPLUS


@settings(max_examples=100, deadline=None)
@given(st.lists(entry3, max_size=20), post_op_attr, verf8, st.booleans())
def test_readdir_sizes_match_encoding(
    entries: list[Entry3], dir_attrs: Fattr3 | None, verf: bytes, eof: bool
) -> None:
    enc = encode(nfs3.pack_readdir3res, Readdir3Res(OK, dir_attrs, verf, entries, eof))
    overhead = READDIR3RES_OVERHEAD - (0 if dir_attrs else nfs3.POST_OP_ATTR_ATTRS_SIZE)
    assert len(enc) == overhead + sum(size_entry3(len(e.name)) for e in entries)


@settings(max_examples=100, deadline=None)
@given(st.lists(entryplus3, max_size=12), post_op_attr, verf8, st.booleans())
def test_readdirplus_sizes_match_encoding(
    entries: list[Entryplus3], dir_attrs: Fattr3 | None, verf: bytes, eof: bool
) -> None:
    enc = encode(nfs3.pack_readdirplus3res, Readdirplus3Res(OK, dir_attrs, verf, entries, eof))
    overhead = READDIRPLUS3RES_OVERHEAD - (0 if dir_attrs else nfs3.POST_OP_ATTR_ATTRS_SIZE)
    sizes = [
        size_entryplus3(
            len(e.name),
            e.name_attributes is not None,
            None if e.name_handle is None else len(e.name_handle),
        )
        for e in entries
    ]
    assert len(enc) == overhead + sum(sizes)


def test_overheads() -> None:
    full = Readdirplus3Res(OK, FATTR, b"\0" * 8, [], False)
    assert len(encode(nfs3.pack_readdirplus3res, full)) == READDIRPLUS3RES_OVERHEAD == 108
    full3 = Readdir3Res(OK, FATTR, b"\0" * 8, [], True)
    assert len(encode(nfs3.pack_readdir3res, full3)) == READDIR3RES_OVERHEAD == 108


@settings(max_examples=50, deadline=None)
@given(fattr3, st.binary(max_size=MAX_NAME), st.integers(0, 2**64 - 1))
def test_dircount_counts_fileid_name_and_cookie(attrs: Fattr3, name: bytes, cookie: int) -> None:
    # The dircount share of an entryplus3 is exactly the bytes of its fileid3, filename3 and
    # cookie3, i.e. the entry3 of the same name without the value-follows word.
    e = Entryplus3(7, name, cookie, attrs, b"h" * 33)
    enc = encode(nfs3.pack_readdirplus3res, Readdirplus3Res(OK, None, b"\0" * 8, [e], True))
    body = enc[4 + 4 + 8 + 4 :]  # skip status, dir_attributes, cookieverf, value-follows
    head = 8 + 4 + len(name) + (-len(name) % 4) + 8
    assert body[head - 8 : head] == cookie.to_bytes(8, "big")
    assert size_entryplus3_dircount(len(name)) == head == size_entry3(len(name)) - 4
    assert size_entryplus3(len(name), True, 33) == 4 + head + 4 + 84 + 4 + 4 + 36
