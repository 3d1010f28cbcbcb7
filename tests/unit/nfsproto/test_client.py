"""The sans-I/O RPC client core (``nfsproto.client``): calls with fresh xids, record-marked;
replies reassembled from any split of the stream, matched to their waiters by xid in any
order; late and unknown replies dropped; results decoded, RPC-level refusals raised; the call
table (``CallSpec``) names every procedure with the codecs of its program."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nfsproto import mount3, nfs3, portmap, rpc
from nfsproto.client import (
    MOUNT_MNT,
    NFS3,
    NFS3_ACCESS,
    NFS3_FSINFO,
    NFS3_GETATTR,
    NFS3_LOOKUP,
    NFS3_READ,
    NFS3_READDIRPLUS,
    PMAP_GETPORT,
    PMAP_SET,
    PMAP_UNSET,
    RpcClientCore,
    RpcError,
    decode_reply,
    decode_result,
    raw_spec,
)
from nfsproto.xdr import Buffer, Reader, Writer, XdrError

CRED = rpc.auth_sys(1000, 100, [100], b"host")


def _reply(xid: int, port: int | None = None) -> bytes:
    """A record-marked SUCCESS reply to a GETPORT (``port``), or with no results."""
    w = Writer()
    rpc.pack_success_header(w, xid)
    if port is not None:
        portmap.pack_port(w, port)
    return b"".join(bytes(b) for b in rpc.frame(w.buffers()))


def _join(out: list[Buffer]) -> bytes:
    return b"".join(bytes(b) for b in out)


def _getport(core: RpcClientCore[str], waiter: str) -> tuple[int, bytes]:
    xid, out = core.call(
        waiter,
        portmap.PROGRAM,
        portmap.VERSION,
        portmap.PmapProc.GETPORT,
        portmap.pack_mapping,
        portmap.Mapping(nfs3.PROGRAM, 3, portmap.IPPROTO_TCP, 0),
    )
    return xid, _join(out)


def test_a_call_is_one_marked_record_with_a_fresh_xid_and_the_credential() -> None:
    core: RpcClientCore[str] = RpcClientCore(CRED, first_xid=0xFFFFFFFF)
    xid1, data = _getport(core, "a")
    (mark,) = struct.unpack_from(">I", data)
    assert mark == rpc.LAST_FRAGMENT | (len(data) - 4)
    r = Reader(data, 4)
    h = rpc.unpack_call(r)
    assert (h.xid, h.prog, h.vers, h.proc) == (xid1, 100000, 2, portmap.PmapProc.GETPORT)
    assert h.cred == CRED and h.verf == rpc.NULL_AUTH
    assert portmap.unpack_mapping(r) == portmap.Mapping(nfs3.PROGRAM, 3, portmap.IPPROTO_TCP, 0)
    r.done()
    xid2, out = core.call("b", nfs3.PROGRAM, 3, 0, Writer.raw, b"", cred=rpc.NULL_AUTH)
    assert (xid1, xid2) == (0xFFFFFFFF, 0)  # wraps
    assert rpc.unpack_call(Reader(_join(out), 4)).cred == rpc.NULL_AUTH
    assert len(core) == 2


def test_xids_still_waiting_are_skipped() -> None:
    core: RpcClientCore[str] = RpcClientCore(first_xid=5)
    core.call("a", 1, 1, 0, Writer.raw, b"")  # 5 waits
    core._xid = 5  # the sequence comes round again
    xid, _ = core.call("b", 1, 1, 0, Writer.raw, b"")
    assert xid == 6


@given(st.data())
def test_replies_in_any_order_and_any_split_reach_their_waiters(data: st.DataObject) -> None:
    core: RpcClientCore[str] = RpcClientCore(CRED)
    xids = {f"w{i}": _getport(core, f"w{i}")[0] for i in range(5)}
    order = data.draw(st.permutations(sorted(xids)))
    stream = b"".join(_reply(xids[w], 2049 + i) for i, w in enumerate(order))
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=8)))
    got: list[tuple[str, int]] = []
    for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        for waiter, rec in core.receive(stream[a:b]):
            got.append((waiter, decode_result(rec, portmap.unpack_port)))
    assert got == [(w, 2049 + i) for i, w in enumerate(order)]
    assert len(core) == 0 and core.unmatched == 0


def test_late_and_unknown_replies_are_dropped_and_counted() -> None:
    core: RpcClientCore[str] = RpcClientCore()
    xid, _ = _getport(core, "gone")
    core.forget(xid)  # the caller timed out
    xid2, _ = _getport(core, "here")
    out = core.receive(_reply(xid, 1) + _reply(0xDEAD, 2) + _reply(xid2, 3))
    assert [(w, decode_result(r, portmap.unpack_port)) for w, r in out] == [("here", 3)]
    assert core.unmatched == 2


def test_close_hands_back_every_waiter() -> None:
    core: RpcClientCore[str] = RpcClientCore()
    for w in "abc":
        _getport(core, w)
    assert sorted(core.close()) == ["a", "b", "c"]
    assert len(core) == 0 and core.close() == []


def test_a_record_over_the_limit_is_an_error() -> None:
    core: RpcClientCore[str] = RpcClientCore(max_record=64)
    with pytest.raises(rpc.RecordError):
        core.receive(rpc.record_header(65))


def _accepted(xid: int, stat: rpc.AcceptStat) -> bytes:
    w = Writer()
    if stat == rpc.AcceptStat.PROG_MISMATCH:
        rpc.pack_prog_mismatch(w, xid, 2, 3)
    else:
        rpc.pack_accepted_reply(w, xid, stat)
    return w.getvalue()


@pytest.mark.parametrize("stat", [s for s in rpc.AcceptStat if s != rpc.AcceptStat.SUCCESS])
def test_accepted_but_not_run_is_an_rpc_error(stat: rpc.AcceptStat) -> None:
    with pytest.raises(RpcError, match=stat.name) as e:
        decode_result(_accepted(7, stat), portmap.unpack_port)
    assert e.value.header.accept_stat == stat and e.value.header.xid == 7


def test_denied_is_an_rpc_error() -> None:
    w = Writer()
    rpc.pack_auth_error(w, 9, rpc.AuthStat.AUTH_TOOWEAK)
    with pytest.raises(RpcError, match="AUTH_ERROR AUTH_TOOWEAK") as e:
        decode_result(w.getvalue(), portmap.unpack_port)
    assert e.value.header.stat == rpc.ReplyStat.MSG_DENIED
    w = Writer()
    rpc.pack_rpc_mismatch(w, 9)
    with pytest.raises(RpcError, match="RPC_MISMATCH"):
        decode_result(w.getvalue(), portmap.unpack_port)


def test_decode_reply_returns_any_status_and_decode_result_wants_every_byte() -> None:
    h, r = decode_reply(_accepted(3, rpc.AcceptStat.PROC_UNAVAIL))
    assert h.accept_stat == rpc.AcceptStat.PROC_UNAVAIL and r.remaining() == 0
    rec = _reply(4, 111)[4:]
    assert decode_result(rec, portmap.unpack_port) == 111
    with pytest.raises(XdrError):
        decode_result(rec + b"\0\0\0\0", portmap.unpack_port)  # longer than its result
    with pytest.raises(XdrError):
        decode_result(rec[:-1], portmap.unpack_port)
    with pytest.raises(XdrError):
        decode_reply(struct.pack(">II", 4, rpc.MsgType.CALL))


def _packed(pack: object, args: object) -> bytes:
    w = Writer()
    pack(w, args)  # type: ignore[operator]
    return w.getvalue()


def test_the_call_table_covers_every_nfs3_procedure_with_its_codecs() -> None:
    for proc in nfs3.Nfs3Proc:
        spec = NFS3[proc]
        assert (spec.prog, spec.vers, spec.proc, spec.name) == (
            nfs3.PROGRAM,
            nfs3.VERSION,
            proc,
            proc.name,
        )
        assert spec.pack_args is nfs3.PROCS[proc].pack_args
        assert spec.unpack_res is nfs3.PROCS[proc].unpack_res


def test_the_typed_specs_pack_the_bytes_of_the_generic_ones() -> None:
    fh = b"\x01" * 16
    cases = [
        (NFS3_GETATTR, nfs3.Getattr3Args(fh)),
        (NFS3_LOOKUP, nfs3.Lookup3Args(nfs3.Diropargs3(fh, b"a.jpg"))),
        (NFS3_ACCESS, nfs3.Access3Args(fh, 0x3F)),
        (NFS3_READ, nfs3.Read3Args(fh, 4096, 1 << 20)),
        (NFS3_READDIRPLUS, nfs3.Readdirplus3Args(fh, 7, b"\0" * 8, 4096, 65536)),
        (NFS3_FSINFO, nfs3.Fsinfo3Args(fh)),
    ]
    for spec, args in cases:
        generic = NFS3[nfs3.Nfs3Proc(spec.proc)]
        assert spec[:3] == generic[:3] and spec.name == generic.name
        assert _packed(spec.pack_args, args) == _packed(generic.pack_args, args)


def test_mount_portmap_and_raw_specs() -> None:
    assert MOUNT_MNT[:3] == (mount3.PROGRAM, mount3.VERSION, mount3.MountProc.MNT)
    assert _packed(MOUNT_MNT.pack_args, mount3.Mnt3Args(b"/data")) == b"\0\0\0\x05/data\0\0\0"
    m = portmap.Mapping(nfs3.PROGRAM, nfs3.VERSION, portmap.IPPROTO_TCP, 2049)
    for spec, proc in (
        (PMAP_SET, portmap.PmapProc.SET),
        (PMAP_UNSET, portmap.PmapProc.UNSET),
        (PMAP_GETPORT, portmap.PmapProc.GETPORT),
    ):
        assert spec[:3] == (portmap.PROGRAM, portmap.VERSION, proc) and spec.name == proc.name
        assert _packed(spec.pack_args, m) == struct.pack(">4I", 100003, 3, 6, 2049)
    raw = raw_spec(1, 2, 3)
    assert raw[:3] == (1, 2, 3) and _packed(raw.pack_args, b"\0\0\0\x07") == b"\0\0\0\x07"
    assert raw.unpack_res(Reader(b"")) is None
