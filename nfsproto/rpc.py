"""ONC RPC v2 (RFC 5531): TCP record marking, call and reply headers, AUTH_NONE and AUTH_SYS.

Owns: the RPC envelope of every message, both directions (a server decodes calls and encodes
replies; a client does the reverse). Must not: do I/O, read clocks, or import anything outside
nfsproto. Record marking (RFC 5531 §11) is a feed-bytes / get-records state machine.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Final

from nfsproto.xdr import U32, Buffer, Reader, Writer, XdrError

__all__ = [
    "RPC_VERSION",
    "MsgType",
    "ReplyStat",
    "AcceptStat",
    "RejectStat",
    "AuthStat",
    "AuthFlavor",
    "OpaqueAuth",
    "AuthSys",
    "CallHeader",
    "ReplyHeader",
    "RpcDecodeError",
    "AuthError",
    "RecordError",
    "RecordReader",
    "NULL_AUTH",
    "MAX_AUTH_BODY",
    "MAX_MACHINE_NAME",
    "MAX_GIDS",
    "DEFAULT_MAX_RECORD",
    "frame",
    "record_header",
    "peek_xid",
    "unpack_call",
    "pack_call",
    "unpack_reply",
    "pack_success_header",
    "pack_accepted_reply",
    "pack_prog_mismatch",
    "pack_rpc_mismatch",
    "pack_auth_error",
    "pack_auth_sys",
    "unpack_auth_sys",
    "auth_sys",
]

RPC_VERSION: Final = 2
MAX_AUTH_BODY: Final = 400  # RFC 5531 §8.2: opaque body<400>
MAX_MACHINE_NAME: Final = 255  # RFC 5531 §A.1 authsys_parms.machinename<255>
MAX_GIDS: Final = 16  # authsys_parms.gids<16>
LAST_FRAGMENT: Final = 0x80000000
DEFAULT_MAX_RECORD: Final = 4 * 1024 * 1024 + 64 * 1024


class MsgType(IntEnum):
    CALL = 0
    REPLY = 1


class ReplyStat(IntEnum):
    MSG_ACCEPTED = 0
    MSG_DENIED = 1


class AcceptStat(IntEnum):
    SUCCESS = 0
    PROG_UNAVAIL = 1
    PROG_MISMATCH = 2
    PROC_UNAVAIL = 3
    GARBAGE_ARGS = 4
    SYSTEM_ERR = 5


class RejectStat(IntEnum):
    RPC_MISMATCH = 0
    AUTH_ERROR = 1


class AuthStat(IntEnum):
    AUTH_OK = 0
    AUTH_BADCRED = 1
    AUTH_REJECTEDCRED = 2
    AUTH_BADVERF = 3
    AUTH_REJECTEDVERF = 4
    AUTH_TOOWEAK = 5
    AUTH_INVALIDRESP = 6
    AUTH_FAILED = 7
    AUTH_KERB_GENERIC = 8
    AUTH_TIMEEXPIRE = 9
    AUTH_TKT_FILE = 10
    AUTH_DECODE = 11
    AUTH_NET_ADDR = 12
    RPCSEC_GSS_CREDPROBLEM = 13
    RPCSEC_GSS_CTXPROBLEM = 14


class AuthFlavor(IntEnum):
    AUTH_NONE = 0
    AUTH_SYS = 1
    AUTH_SHORT = 2
    AUTH_DH = 3
    RPCSEC_GSS = 6


_ACCEPT_STATS: Final = frozenset(int(s) for s in AcceptStat)
_REJECT_STATS: Final = frozenset(int(s) for s in RejectStat)
_AUTH_STATS: Final = frozenset(int(s) for s in AuthStat)


class RpcDecodeError(XdrError):
    """A call that cannot be decoded. ``xid`` is set when the header got that far (so the
    server can still answer); ``auth_stat`` is set when the credential is what is wrong
    (answer MSG_DENIED/AUTH_ERROR); ``rpc_mismatch`` when rpcvers != 2."""

    def __init__(
        self,
        msg: str,
        *,
        xid: int | None = None,
        auth_stat: AuthStat | None = None,
        rpc_mismatch: bool = False,
    ) -> None:
        super().__init__(msg)
        self.xid = xid
        self.auth_stat = auth_stat
        self.rpc_mismatch = rpc_mismatch


class AuthError(XdrError):
    """A credential or verifier that is malformed or over its limits."""

    def __init__(self, msg: str, stat: AuthStat = AuthStat.AUTH_BADCRED) -> None:
        super().__init__(msg)
        self.stat = stat


class RecordError(XdrError):
    """Record marking violated: a record larger than the configured maximum."""


@dataclass(slots=True)
class OpaqueAuth:
    flavor: int
    body: bytes = b""


NULL_AUTH: Final = OpaqueAuth(AuthFlavor.AUTH_NONE, b"")


@dataclass(slots=True)
class AuthSys:
    """RFC 5531 §A.1 authsys_parms."""

    stamp: int
    machinename: bytes
    uid: int
    gid: int
    gids: list[int] = field(default_factory=list)


@dataclass(slots=True)
class CallHeader:
    xid: int
    prog: int
    vers: int
    proc: int
    cred: OpaqueAuth
    verf: OpaqueAuth


@dataclass(slots=True)
class ReplyHeader:
    """A decoded reply header. For MSG_ACCEPTED/SUCCESS the reader is left at the results."""

    xid: int
    stat: ReplyStat
    accept_stat: AcceptStat | None = None
    reject_stat: RejectStat | None = None
    auth_stat: AuthStat | None = None
    mismatch_low: int = 0
    mismatch_high: int = 0
    verf: OpaqueAuth = field(default_factory=lambda: OpaqueAuth(0))


# --------------------------------------------------------------------------- record marking


def record_header(length: int, last: bool = True) -> bytes:
    if length >= LAST_FRAGMENT:
        raise RecordError(f"fragment length {length} too large")
    return U32.pack((LAST_FRAGMENT if last else 0) | length)


def frame(buffers: list[Buffer]) -> list[Buffer]:
    """Prefix an encoded message with a single last-fragment record mark."""
    total = 0
    for b in buffers:
        total += len(b)
    return [record_header(total), *buffers]


class RecordReader:
    """Reassembles RPC records from a TCP byte stream (RFC 5531 §11).

    ``feed(data)`` returns the records completed by ``data``. A record (all of its fragments)
    larger than ``max_record`` raises ``RecordError`` as soon as its header says so, before
    the bytes arrive; the stream cannot be resynchronised after that, so the caller closes
    the connection. A single-fragment record that arrives whole inside one ``feed`` is
    returned as a memoryview of ``data`` (no copy); otherwise its bytes are copied once, into
    one buffer per record that grows as they arrive. Memory therefore follows the bytes
    received: never the length a mark claims (a 4-byte mark must not make the server allocate
    4 MiB), and never more per fragment (a storm of tiny or empty fragments costs no more
    than their payload)."""

    __slots__ = ("_hdr", "_last", "_left", "_rec", "max_record")

    def __init__(self, max_record: int = DEFAULT_MAX_RECORD) -> None:
        self.max_record = max_record
        self._hdr = bytearray()  # a record mark split across feeds
        self._rec: bytearray | None = None  # the record being reassembled (all its fragments)
        self._left = -1  # bytes still due in the current fragment; -1: a mark is due
        self._last = False  # the current fragment ends the record

    def pending_bytes(self) -> int:
        """Bytes held of a record not complete yet: a partial mark, or, once a record's first
        mark is read, that mark and the payload received so far (0 only between records)."""
        rec = self._rec
        return len(self._hdr) + (len(rec) + 4 if rec is not None else 0)

    def feed(self, data: Buffer) -> list[Buffer]:
        mv = data if isinstance(data, memoryview) else memoryview(data)
        out: list[Buffer] = []
        pos, n = 0, len(mv)
        while pos < n:
            if self._left < 0:
                if not self._hdr and n - pos >= 4:
                    (hdr,) = U32.unpack_from(mv, pos)
                    pos += 4
                else:
                    take = min(4 - len(self._hdr), n - pos)
                    self._hdr += mv[pos : pos + take]
                    pos += take
                    if len(self._hdr) < 4:
                        break
                    (hdr,) = U32.unpack_from(self._hdr, 0)
                    self._hdr.clear()
                ln = hdr & 0x7FFFFFFF
                have = len(self._rec) if self._rec is not None else 0
                if have + ln > self.max_record:
                    raise RecordError(
                        f"record of at least {have + ln} bytes exceeds the maximum "
                        f"of {self.max_record}"
                    )
                last = bool(hdr & LAST_FRAGMENT)
                if last and self._rec is None and n - pos >= ln:
                    out.append(mv[pos : pos + ln])  # whole record in this segment: no copy
                    pos += ln
                    continue
                if self._rec is None:
                    self._rec = bytearray()
                self._left = ln
                self._last = last
            if self._left:
                rec = self._rec
                assert rec is not None
                take = min(self._left, n - pos)
                rec += mv[pos : pos + take]  # in place: rec is self._rec
                pos += take
                self._left -= take
            if self._left == 0:
                self._left = -1
                if self._last:
                    assert self._rec is not None
                    out.append(self._rec)
                    self._rec = None
        return out


# --------------------------------------------------------------------------- auth


def _unpack_opaque_auth(r: Reader) -> OpaqueAuth:
    flavor = r.u32()
    body = r.opaque_bytes(MAX_AUTH_BODY)
    return OpaqueAuth(flavor, body)


def _pack_opaque_auth(w: Writer, a: OpaqueAuth) -> None:
    w.u32(a.flavor)
    w.opaque(a.body, MAX_AUTH_BODY)


def unpack_auth_sys(body: Buffer) -> AuthSys:
    """Parse an AUTH_SYS credential body; any violation is an ``AuthError`` (AUTH_BADCRED)."""
    r = Reader(body)
    try:
        stamp = r.u32()
        name = r.string(MAX_MACHINE_NAME)
        uid, gid = r.u32(), r.u32()
        n = r.count(MAX_GIDS)
        gids = [r.u32() for _ in range(n)]
        r.done()
    except XdrError as e:
        raise AuthError(f"bad AUTH_SYS credential: {e}") from None
    return AuthSys(stamp, name, uid, gid, gids)


def pack_auth_sys(p: AuthSys) -> bytes:
    if len(p.machinename) > MAX_MACHINE_NAME or len(p.gids) > MAX_GIDS:
        raise XdrError("AUTH_SYS credential over its limits")
    w = Writer()
    w.u32(p.stamp)
    w.string(p.machinename)
    w.u32(p.uid)
    w.u32(p.gid)
    w.u32(len(p.gids))
    for g in p.gids:
        w.u32(g)
    return w.getvalue()


def auth_sys(
    uid: int, gid: int, gids: list[int] | None = None, machine: bytes = b"nfsgw", stamp: int = 0
) -> OpaqueAuth:
    """An AUTH_SYS credential for a client."""
    return OpaqueAuth(
        AuthFlavor.AUTH_SYS, pack_auth_sys(AuthSys(stamp, machine, uid, gid, list(gids or [])))
    )


# --------------------------------------------------------------------------- calls

_CALL_HDR: Final = struct.Struct(">6I")  # xid, CALL, rpcvers, prog, vers, proc


def peek_xid(record: Buffer) -> int | None:
    if len(record) < 4:
        return None
    v: int = U32.unpack_from(record, 0)[0]
    return v


def unpack_call(r: Reader) -> CallHeader:
    """Decode a call header; the reader is left at the procedure's arguments.

    Raises RpcDecodeError: with ``xid`` None when not even the xid is there (drop the record),
    with ``rpc_mismatch`` for rpcvers != 2, with ``auth_stat`` for a bad credential/verifier,
    otherwise a plain garbage header (the server answers GARBAGE_ARGS)."""
    try:
        xid = r.u32()
    except XdrError:
        raise RpcDecodeError("record too short for an xid") from None
    try:
        mtype = r.u32()
        if mtype != MsgType.CALL:
            raise RpcDecodeError(f"not a call (msg_type {mtype})", xid=None)
        rpcvers, prog, vers, proc = r.u32(), r.u32(), r.u32(), r.u32()
    except RpcDecodeError:
        raise
    except XdrError as e:
        raise RpcDecodeError(f"truncated call header: {e}", xid=xid) from None
    if rpcvers != RPC_VERSION:
        raise RpcDecodeError(f"rpcvers {rpcvers}", xid=xid, rpc_mismatch=True)
    try:
        cred = _unpack_opaque_auth(r)
        verf = _unpack_opaque_auth(r)
    except XdrError as e:
        raise RpcDecodeError(
            f"bad credential: {e}", xid=xid, auth_stat=AuthStat.AUTH_BADCRED
        ) from None
    return CallHeader(xid, prog, vers, proc, cred, verf)


def pack_call(
    w: Writer,
    xid: int,
    prog: int,
    vers: int,
    proc: int,
    cred: OpaqueAuth = NULL_AUTH,
    verf: OpaqueAuth = NULL_AUTH,
) -> None:
    w.pack(_CALL_HDR, xid, MsgType.CALL, RPC_VERSION, prog, vers, proc)
    _pack_opaque_auth(w, cred)
    _pack_opaque_auth(w, verf)


# --------------------------------------------------------------------------- replies

# xid, REPLY, MSG_ACCEPTED, verf flavor AUTH_NONE, verf length 0, accept_stat
_ACCEPTED_NULL_VERF: Final = struct.Struct(">6I")


def pack_success_header(w: Writer, xid: int) -> None:
    """The 24-byte header of an accepted SUCCESS reply with an AUTH_NONE verifier (the
    hot path: results follow)."""
    w.pack(_ACCEPTED_NULL_VERF, xid, 1, 0, 0, 0, 0)


def pack_accepted_reply(
    w: Writer, xid: int, stat: AcceptStat = AcceptStat.SUCCESS, verf: OpaqueAuth = NULL_AUTH
) -> None:
    """An accepted reply. For SUCCESS the results follow; PROG_MISMATCH needs
    ``pack_prog_mismatch``; the other stats have no body."""
    w.u32(xid)
    w.u32(MsgType.REPLY)
    w.u32(ReplyStat.MSG_ACCEPTED)
    _pack_opaque_auth(w, verf)
    w.u32(stat)


def pack_prog_mismatch(w: Writer, xid: int, low: int, high: int) -> None:
    pack_accepted_reply(w, xid, AcceptStat.PROG_MISMATCH)
    w.u32(low)
    w.u32(high)


def pack_rpc_mismatch(w: Writer, xid: int, low: int = RPC_VERSION, high: int = RPC_VERSION) -> None:
    w.u32(xid)
    w.u32(MsgType.REPLY)
    w.u32(ReplyStat.MSG_DENIED)
    w.u32(RejectStat.RPC_MISMATCH)
    w.u32(low)
    w.u32(high)


def pack_auth_error(w: Writer, xid: int, stat: AuthStat) -> None:
    w.u32(xid)
    w.u32(MsgType.REPLY)
    w.u32(ReplyStat.MSG_DENIED)
    w.u32(RejectStat.AUTH_ERROR)
    w.u32(stat)


def unpack_reply(r: Reader) -> ReplyHeader:
    """Decode a reply header (client side). For MSG_ACCEPTED/SUCCESS the reader is left at the
    results; other forms are fully consumed."""
    xid = r.u32()
    mtype = r.u32()
    if mtype != MsgType.REPLY:
        raise XdrError(f"not a reply (msg_type {mtype})")
    stat = r.u32()
    if stat == ReplyStat.MSG_ACCEPTED:
        verf = _unpack_opaque_auth(r)
        a = r.u32()
        if a not in _ACCEPT_STATS:
            raise XdrError(f"unknown accept_stat {a}")
        h = ReplyHeader(xid, ReplyStat.MSG_ACCEPTED, accept_stat=AcceptStat(a), verf=verf)
        if a == AcceptStat.PROG_MISMATCH:
            h.mismatch_low, h.mismatch_high = r.u32(), r.u32()
        return h
    if stat == ReplyStat.MSG_DENIED:
        rs = r.u32()
        if rs not in _REJECT_STATS:
            raise XdrError(f"unknown reject_stat {rs}")
        h = ReplyHeader(xid, ReplyStat.MSG_DENIED, reject_stat=RejectStat(rs))
        if rs == RejectStat.RPC_MISMATCH:
            h.mismatch_low, h.mismatch_high = r.u32(), r.u32()
        else:
            s = r.u32()
            if s not in _AUTH_STATS:
                raise XdrError(f"unknown auth_stat {s}")
            h.auth_stat = AuthStat(s)
        return h
    raise XdrError(f"unknown reply_stat {stat}")
