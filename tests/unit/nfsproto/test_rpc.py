"""ONC RPC envelope, record marking, MOUNT v3 and PORTMAP v2 codecs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nfsproto import mount3, portmap, rpc
from nfsproto.xdr import Reader, Writer, XdrError, as_bool, member

u32 = st.integers(0, 2**32 - 1)


def enc(pack: Callable[[Writer, Any], None], v: Any) -> bytes:
    w = Writer()
    pack(w, v)
    return w.getvalue()


def dec(unpack: Callable[[Reader], Any], data: bytes) -> Any:
    r = Reader(data)
    v = unpack(r)
    r.done()
    return v


def assert_prefixes_raise(unpack: Callable[[Reader], Any], data: bytes) -> None:
    for i in range(len(data)):
        with pytest.raises(XdrError):
            dec(unpack, data[:i])


# ------------------------------------------------------------------ record marking


def test_record_single_fragment_zero_copy() -> None:
    payload = b"abcd" * 10
    stream = rpc.record_header(len(payload)) + payload
    rr = rpc.RecordReader()
    out = rr.feed(stream)
    assert [bytes(x) for x in out] == [payload]
    assert isinstance(out[0], memoryview)


def test_record_multi_fragment_byte_by_byte() -> None:
    parts = [b"x" * 8, b"y" * 12, b"z" * 4]
    stream = (
        rpc.record_header(8, last=False)
        + parts[0]
        + rpc.record_header(12, last=False)
        + parts[1]
        + rpc.record_header(4)
        + parts[2]
        + rpc.record_header(0)  # an empty record follows
    )
    rr = rpc.RecordReader()
    got: list[bytes] = []
    for i in range(len(stream)):
        got += [bytes(x) for x in rr.feed(stream[i : i + 1])]
    assert got == [b"".join(parts), b""]
    assert rr.pending_bytes() == 0


@given(st.lists(st.binary(max_size=64), max_size=8), st.integers(1, 50))
def test_record_stream_any_chunking(records: list[bytes], chunk: int) -> None:
    stream = b"".join(rpc.record_header(len(r)) + r for r in records)
    rr = rpc.RecordReader()
    got: list[bytes] = []
    for i in range(0, len(stream), chunk):
        got += [bytes(x) for x in rr.feed(stream[i : i + chunk])]
    assert got == records


def test_record_too_large_rejected_before_data() -> None:
    rr = rpc.RecordReader(max_record=1024)
    with pytest.raises(rpc.RecordError):
        rr.feed(rpc.record_header(1025))
    rr = rpc.RecordReader(max_record=1024)
    # fragments adding up past the limit
    rr.feed(rpc.record_header(1000, last=False) + b"\0" * 1000)
    with pytest.raises(rpc.RecordError):
        rr.feed(rpc.record_header(100))


def test_frame() -> None:
    bufs = rpc.frame([b"abcd", memoryview(b"efgh")])
    assert b"".join(bytes(b) for b in bufs) == b"\x80\x00\x00\x08abcdefgh"


# ------------------------------------------------------------------ calls and replies

auth_sys_st = st.builds(
    rpc.AuthSys,
    u32,
    st.binary(max_size=rpc.MAX_MACHINE_NAME),
    u32,
    u32,
    st.lists(u32, max_size=rpc.MAX_GIDS),
)


@given(u32, u32, u32, u32, auth_sys_st)
def test_call_roundtrip(xid: int, prog: int, vers: int, proc: int, a: rpc.AuthSys) -> None:
    w = Writer()
    cred = rpc.OpaqueAuth(rpc.AuthFlavor.AUTH_SYS, rpc.pack_auth_sys(a))
    rpc.pack_call(w, xid, prog, vers, proc, cred)
    w.raw(b"ARGS")
    data = w.getvalue()
    r = Reader(data)
    h = rpc.unpack_call(r)
    assert (h.xid, h.prog, h.vers, h.proc) == (xid, prog, vers, proc)
    assert h.cred == cred and h.verf == rpc.NULL_AUTH
    assert rpc.unpack_auth_sys(h.cred.body) == a
    assert bytes(r.fixed(4)) == b"ARGS"
    for i in range(len(data) - 4):
        with pytest.raises(rpc.RpcDecodeError):
            rpc.unpack_call(Reader(data[:i]))


def test_call_golden_bytes() -> None:
    # RFC 5531 §9: xid, CALL(0), rpcvers 2, prog, vers, proc, cred, verf
    w = Writer()
    rpc.pack_call(w, 0x01020304, 100003, 3, 1, rpc.auth_sys(0, 0, [], b"h"))
    assert w.getvalue().hex() == (
        "01020304"
        "00000000"
        "00000002"
        "000186a3"
        "00000003"
        "00000001"
        "00000001"
        "00000018"  # AUTH_SYS, body length 24
        "00000000"
        "00000001"
        "68000000"
        "00000000"
        "00000000"
        "00000000"  # stamp name uid gid gids
        "00000000"
        "00000000"  # verf AUTH_NONE, 0
    )


def test_auth_sys_limits() -> None:
    ok = rpc.AuthSys(1, b"m" * 255, 0, 0, list(range(16)))
    assert rpc.unpack_auth_sys(rpc.pack_auth_sys(ok)) == ok
    w = Writer()
    w.u32(1)
    w.string(b"m" * 256)
    w.u32(0)
    w.u32(0)
    w.u32(0)
    with pytest.raises(rpc.AuthError) as e:
        rpc.unpack_auth_sys(w.getvalue())
    assert e.value.stat == rpc.AuthStat.AUTH_BADCRED
    w = Writer()
    w.u32(1)
    w.string(b"m")
    w.u32(0)
    w.u32(0)
    w.u32(17)
    for g in range(17):
        w.u32(g)
    with pytest.raises(rpc.AuthError):
        rpc.unpack_auth_sys(w.getvalue())
    with pytest.raises(XdrError):
        rpc.pack_auth_sys(rpc.AuthSys(1, b"m", 0, 0, list(range(17))))


def test_call_errors_carry_xid() -> None:
    w = Writer()
    w.u32(7)
    w.u32(0)
    w.u32(3)  # rpcvers 3
    w.u32(1)
    w.u32(1)
    w.u32(1)
    with pytest.raises(rpc.RpcDecodeError) as e:
        rpc.unpack_call(Reader(w.getvalue()))
    assert e.value.xid == 7 and e.value.rpc_mismatch
    # credential body over 400 bytes: an AUTH_BADCRED, before allocating
    w = Writer()
    rpc.pack_call(w, 9, 100003, 3, 0)
    data = bytearray(w.getvalue())
    data[24:32] = b"\x00\x00\x00\x01\x7f\xff\xff\xff"
    with pytest.raises(rpc.RpcDecodeError) as e:
        rpc.unpack_call(Reader(bytes(data)))
    assert e.value.xid == 9 and e.value.auth_stat == rpc.AuthStat.AUTH_BADCRED
    # a reply is not a call: dropped (no xid to answer)
    with pytest.raises(rpc.RpcDecodeError) as e:
        rpc.unpack_call(Reader(b"\0\0\0\1\0\0\0\1"))
    assert e.value.xid is None


REPLIES: list[tuple[str, Callable[[Writer], None], str]] = [
    (
        "success",
        lambda w: rpc.pack_success_header(w, 5),
        "00000005 00000001 00000000 00000000 00000000 00000000",
    ),
    (
        "prog_unavail",
        lambda w: rpc.pack_accepted_reply(w, 5, rpc.AcceptStat.PROG_UNAVAIL),
        "00000005 00000001 00000000 00000000 00000000 00000001",
    ),
    (
        "prog_mismatch",
        lambda w: rpc.pack_prog_mismatch(w, 5, 2, 3),
        "00000005 00000001 00000000 00000000 00000000 00000002 00000002 00000003",
    ),
    (
        "proc_unavail",
        lambda w: rpc.pack_accepted_reply(w, 5, rpc.AcceptStat.PROC_UNAVAIL),
        "00000005 00000001 00000000 00000000 00000000 00000003",
    ),
    (
        "garbage_args",
        lambda w: rpc.pack_accepted_reply(w, 5, rpc.AcceptStat.GARBAGE_ARGS),
        "00000005 00000001 00000000 00000000 00000000 00000004",
    ),
    (
        "system_err",
        lambda w: rpc.pack_accepted_reply(w, 5, rpc.AcceptStat.SYSTEM_ERR),
        "00000005 00000001 00000000 00000000 00000000 00000005",
    ),
    (
        "rpc_mismatch",
        lambda w: rpc.pack_rpc_mismatch(w, 5),
        "00000005 00000001 00000001 00000000 00000002 00000002",
    ),
    (
        "auth_error",
        lambda w: rpc.pack_auth_error(w, 5, rpc.AuthStat.AUTH_TOOWEAK),
        "00000005 00000001 00000001 00000001 00000005",
    ),
]


@pytest.mark.parametrize(("name", "pack", "golden"), REPLIES, ids=[r[0] for r in REPLIES])
def test_reply_forms(name: str, pack: Callable[[Writer], None], golden: str) -> None:
    w = Writer()
    pack(w)
    data = w.getvalue()
    assert data.hex() == golden.replace(" ", "")
    r = Reader(data)
    h = rpc.unpack_reply(r)
    r.done()
    assert h.xid == 5
    if name == "prog_mismatch":
        assert (h.mismatch_low, h.mismatch_high) == (2, 3)
    if name == "auth_error":
        assert h.auth_stat == rpc.AuthStat.AUTH_TOOWEAK
    if name == "rpc_mismatch":
        assert h.reject_stat == rpc.RejectStat.RPC_MISMATCH
    assert_prefixes_raise(rpc.unpack_reply, data)


# ------------------------------------------------------------------ MOUNT v3

names = st.binary(max_size=32)


@given(
    st.builds(
        mount3.Mnt3Res,
        st.just(mount3.MountStat3.MNT3_OK),
        st.binary(max_size=64),
        st.lists(st.sampled_from([0, 1]), max_size=3),
    )
    | st.builds(mount3.Mnt3Res, st.sampled_from(list(mount3.MountStat3)[1:]))
)
def test_mnt3res_roundtrip(v: mount3.Mnt3Res) -> None:
    data = enc(mount3.pack_mnt3res, v)
    assert dec(mount3.unpack_mnt3res, data) == v
    assert_prefixes_raise(mount3.unpack_mnt3res, data)


@given(st.builds(mount3.Mnt3Args, st.binary(max_size=mount3.MNTPATHLEN)))
def test_mnt3args_roundtrip(v: mount3.Mnt3Args) -> None:
    data = enc(mount3.pack_mnt3args, v)
    assert dec(mount3.unpack_mnt3args, data) == v
    assert_prefixes_raise(mount3.unpack_mnt3args, data)


@given(st.lists(st.builds(mount3.MountBody, names, names), max_size=5))
def test_mountlist_roundtrip(v: list[mount3.MountBody]) -> None:
    data = enc(mount3.pack_mountlist, v)
    assert dec(mount3.unpack_mountlist, data) == v
    assert_prefixes_raise(mount3.unpack_mountlist, data)


@given(st.lists(st.builds(mount3.ExportNode, names, st.lists(names, max_size=3)), max_size=5))
def test_exports_roundtrip(v: list[mount3.ExportNode]) -> None:
    data = enc(mount3.pack_exports, v)
    assert dec(mount3.unpack_exports, data) == v
    assert_prefixes_raise(mount3.unpack_exports, data)


def test_mount_golden_and_limits() -> None:
    res = mount3.Mnt3Res(mount3.MountStat3.MNT3_OK, b"\x01\x02\x03\x04", [1, 0])
    assert enc(mount3.pack_mnt3res, res).hex() == (
        "000000000000000401020304000000020000000100000000"
    )
    with pytest.raises(XdrError):
        dec(mount3.unpack_mnt3args, b"\x00\x00\x04\x01" + b"a" * 1028)  # dirpath > 1024
    with pytest.raises(XdrError):
        dec(mount3.unpack_mnt3res, b"\x00\x00\x00\x63")  # unknown status


# ------------------------------------------------------------------ PORTMAP v2

mapping_st = st.builds(portmap.Mapping, u32, u32, st.sampled_from([6, 17]), u32)


@given(mapping_st)
def test_mapping_roundtrip(v: portmap.Mapping) -> None:
    data = enc(portmap.pack_mapping, v)
    assert len(data) == 16
    assert dec(portmap.unpack_mapping, data) == v
    assert_prefixes_raise(portmap.unpack_mapping, data)


@given(st.lists(mapping_st, max_size=6))
def test_pmaplist_roundtrip(v: list[portmap.Mapping]) -> None:
    data = enc(portmap.pack_pmaplist, v)
    assert dec(portmap.unpack_pmaplist, data) == v
    assert_prefixes_raise(portmap.unpack_pmaplist, data)


@given(st.builds(portmap.CallArgs, u32, u32, u32, st.binary(max_size=40)))
def test_callit_roundtrip(v: portmap.CallArgs) -> None:
    data = enc(portmap.pack_call_args, v)
    assert dec(portmap.unpack_call_args, data) == v
    assert_prefixes_raise(portmap.unpack_call_args, data)
    res = portmap.CallResult(2049, bytes(v.args))
    assert dec(portmap.unpack_call_result, enc(portmap.pack_call_result, res)) == res


def test_portmap_golden() -> None:
    m = portmap.Mapping(100003, 3, portmap.IPPROTO_TCP, 0)
    assert enc(portmap.pack_mapping, m).hex() == "000186a3000000030000000600000000"
    assert enc(portmap.pack_port, 2049).hex() == "00000801"
    assert dec(portmap.unpack_bool, b"\0\0\0\1") is True
    with pytest.raises(XdrError):
        dec(portmap.unpack_bool, b"\0\0\0\2")


# ------------------------------------------------------------------ XDR primitives


def test_xdr_oversized_opaque_without_allocating() -> None:
    r = Reader(b"\x7f\xff\xff\xff" + b"\0" * 8)
    with pytest.raises(XdrError):
        r.opaque(2**31)
    r = Reader(b"\x00\x00\x01\x00" + b"\0" * 8)
    with pytest.raises(XdrError):
        r.opaque(255)
    r = Reader(b"\xff\xff\xff\xff")
    with pytest.raises(XdrError):
        r.count(10**9)


def test_xdr_padding_and_zero_copy() -> None:
    w = Writer()
    big = memoryview(bytes(range(256)) * 16)
    w.opaque(b"abcde")
    w.opaque(big)
    w.u32(1)
    bufs = w.buffers()
    assert any(b is big for b in bufs)  # large opaques are appended by reference
    data = b"".join(bytes(b) for b in bufs)
    r = Reader(data)
    assert bytes(r.opaque(10)) == b"abcde"
    assert bytes(r.opaque(1 << 20)) == bytes(big)
    assert r.u32() == 1
    r.done()
    with pytest.raises(XdrError):
        Reader(b"\0\0\0\1a\0\1\0").opaque(4)  # non-zero padding


def test_xdr_fixed_enum_bool() -> None:
    r = Reader(b"abc\0" + b"\0\0\0\2" + b"\0\0\0\1")
    assert bytes(r.fixed(3)) == b"abc"
    assert r.enum({2: "two"}, "thing") == "two"
    assert r.optional() is True
    r.done()
    with pytest.raises(XdrError, match="padding"):
        Reader(b"abc\1").fixed(3)
    with pytest.raises(XdrError, match="unknown thing value -1"):
        Reader(b"\xff\xff\xff\xff").enum({2: "two"}, "thing")  # XDR enums are signed
    with pytest.raises(XdrError, match="unknown thing value 3"):
        member({2: "two"}, 3, "thing")
    assert as_bool(0) is False
    with pytest.raises(XdrError, match="bool"):
        as_bool(2)
    with pytest.raises(XdrError, match="bool"):
        Reader(b"\0\0\0\2").boolean()


@given(st.binary(max_size=40), st.integers(0, 2**64 - 1), st.booleans())
def test_xdr_every_truncated_prefix_raises(blob: bytes, n: int, flag: bool) -> None:
    w = Writer()
    w.u64(n)
    w.opaque(blob)
    w.boolean(flag)
    w.fixed(blob)
    enc = w.getvalue()

    def read(r: Reader) -> tuple[int, bytes, bool, bytes]:
        return r.u64(), bytes(r.opaque(40)), r.boolean(), bytes(r.fixed(len(blob)))

    r = Reader(enc)
    assert read(r) == (n, blob, flag, blob)
    r.done()
    for end in range(len(enc)):
        with pytest.raises(XdrError):
            read(Reader(enc, end=end))
