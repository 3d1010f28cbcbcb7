"""Inputs and judgements for fuzzing the gateway's RPC surface (record framing, the call
header and credentials, every procedure's arguments).

Owns:

- ``seed_calls``: one valid call (a record without its mark) for every procedure of NFSv3,
  MOUNTv3 and PORTMAPv2, with real handles where a procedure takes one;
- ``Mutator``: deterministic mutations of a record (bit flips, byte and word overwrites, huge
  and off-by-one length words, truncation, insertion, splicing two calls, credentials over
  their limits) and of a byte stream (fragment storms, huge marks);
- ``expected``: the outcome RFC 5531 and the gateway's rules give a record (an independent
  decode of the header, credential and arguments with nfsproto), and ``check_reply``: the
  gateway's reply must be exactly that outcome, well formed, with the call's xid, and for a
  successful call a result that decodes completely.

Must not: talk to sockets (the tests do), or read a clock.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from nfsproto import mount3, nfs3, portmap, rpc
from nfsproto.nfs3 import (
    CreateHow3,
    CreateMode3,
    Diropargs3,
    Ftype3,
    Mknoddata3,
    Nfs3Proc,
    Sattr3,
    StableHow,
    Symlinkdata3,
)
from nfsproto.rpc import AuthFlavor, AuthStat, RejectStat, ReplyStat
from nfsproto.xdr import Reader, Writer, XdrError

__all__ = [
    "Handles",
    "Mutator",
    "Outcome",
    "check_reply",
    "expected",
    "grows_file_far",
    "make_call",
    "seed_calls",
]

U32 = struct.Struct(">I")
NFS, MOUNT, PMAP = nfs3.PROGRAM, mount3.PROGRAM, portmap.PROGRAM


@dataclass(frozen=True, slots=True)
class Handles:
    """Real handles of the export under test: its root, a directory, a file, and a file and
    directory of a read-write export."""

    root: bytes
    dir: bytes
    file: bytes
    rw_root: bytes
    rw_file: bytes


def make_call(
    xid: int, prog: int, vers: int, proc: int, args: bytes, cred: rpc.OpaqueAuth | None = None
) -> bytes:
    w = Writer()
    rpc.pack_call(w, xid, prog, vers, proc, cred or rpc.auth_sys(0, 0, [0], b"fuzz"))
    w.raw(args)
    return w.getvalue()


def _pack(pack: Callable[[Writer, Any], None], v: Any) -> bytes:
    w = Writer()
    pack(w, v)
    return w.getvalue()


def seed_calls(h: Handles) -> list[tuple[int, int, int, bytes]]:
    """(prog, vers, proc, encoded args) for every procedure."""
    P = nfs3.PROCS
    s3 = Sattr3(mode=0o644)
    nfs_args: dict[int, object] = {
        Nfs3Proc.NULL: None,
        Nfs3Proc.GETATTR: nfs3.Getattr3Args(h.file),
        Nfs3Proc.SETATTR: nfs3.Setattr3Args(h.rw_file, Sattr3(mode=0o600)),
        Nfs3Proc.LOOKUP: nfs3.Lookup3Args(Diropargs3(h.dir, b"f0.bin")),
        Nfs3Proc.ACCESS: nfs3.Access3Args(h.file, 0x3F),
        Nfs3Proc.READLINK: nfs3.Readlink3Args(h.file),
        Nfs3Proc.READ: nfs3.Read3Args(h.file, 0, 4096),
        Nfs3Proc.WRITE: nfs3.Write3Args(h.rw_file, 0, 5, StableHow.FILE_SYNC, b"hello"),
        Nfs3Proc.CREATE: nfs3.Create3Args(
            Diropargs3(h.rw_root, b"new"), CreateHow3(CreateMode3.UNCHECKED, s3)
        ),
        Nfs3Proc.MKDIR: nfs3.Mkdir3Args(Diropargs3(h.rw_root, b"newdir"), s3),
        Nfs3Proc.SYMLINK: nfs3.Symlink3Args(
            Diropargs3(h.rw_root, b"sym"), Symlinkdata3(s3, b"target")
        ),
        Nfs3Proc.MKNOD: nfs3.Mknod3Args(
            Diropargs3(h.rw_root, b"fifo"), Mknoddata3(Ftype3.NF3FIFO, s3)
        ),
        Nfs3Proc.REMOVE: nfs3.Remove3Args(Diropargs3(h.rw_root, b"new")),
        Nfs3Proc.RMDIR: nfs3.Rmdir3Args(Diropargs3(h.rw_root, b"newdir")),
        Nfs3Proc.RENAME: nfs3.Rename3Args(Diropargs3(h.rw_root, b"a"), Diropargs3(h.rw_root, b"b")),
        Nfs3Proc.LINK: nfs3.Link3Args(h.rw_file, Diropargs3(h.rw_root, b"hard")),
        Nfs3Proc.READDIR: nfs3.Readdir3Args(h.dir, 0, bytes(8), 4096),
        Nfs3Proc.READDIRPLUS: nfs3.Readdirplus3Args(h.dir, 0, bytes(8), 1024, 8192),
        Nfs3Proc.FSSTAT: nfs3.Fsstat3Args(h.root),
        Nfs3Proc.FSINFO: nfs3.Fsinfo3Args(h.root),
        Nfs3Proc.PATHCONF: nfs3.Pathconf3Args(h.root),
        Nfs3Proc.COMMIT: nfs3.Commit3Args(h.rw_file, 0, 0),
    }
    out = [(NFS, nfs3.VERSION, int(p), _pack(P[p].pack_args, a)) for p, a in nfs_args.items()]
    mnt = _pack(mount3.pack_mnt3args, mount3.Mnt3Args(b"/data"))
    mp = mount3.MountProc
    out += [
        (MOUNT, mount3.VERSION, mp.NULL, b""),
        (MOUNT, mount3.VERSION, mp.MNT, mnt),
        (MOUNT, mount3.VERSION, mp.DUMP, b""),
        (MOUNT, mount3.VERSION, mp.UMNT, mnt),
        (MOUNT, mount3.VERSION, mp.UMNTALL, b""),
        (MOUNT, mount3.VERSION, mp.EXPORT, b""),
    ]
    mapping = _pack(portmap.pack_mapping, portmap.Mapping(NFS, 3, portmap.IPPROTO_TCP, 0))
    pp = portmap.PmapProc
    out += [
        (PMAP, portmap.VERSION, pp.NULL, b""),
        (PMAP, portmap.VERSION, pp.GETPORT, mapping),
        (PMAP, portmap.VERSION, pp.DUMP, b""),
        (PMAP, portmap.VERSION, pp.SET, mapping),
    ]
    return out


# --------------------------------------------------------------------------- outcomes


@dataclass(frozen=True, slots=True)
class Outcome:
    """What the gateway must do with a record: ``kind`` is "drop" (no reply), "rpc_mismatch",
    "auth" (MSG_DENIED/AUTH_ERROR with ``auth_stat``), or an accept_stat name ("SUCCESS",
    "GARBAGE_ARGS", ...). ``alt`` is another acceptable accept_stat (SYSTEM_ERR for a
    procedure without a failure body whose handler failed)."""

    kind: str
    xid: int | None = None
    auth_stat: AuthStat | None = None
    prog: int = 0
    vers: int = 0
    proc: int = 0
    alt: str | None = None


# Results of the procedures that have one beyond void (how to decode a SUCCESS reply).
def _res_decoder(prog: int, proc: int) -> Callable[[Reader], object] | None:
    if prog == NFS:
        return nfs3.PROCS[proc].unpack_res
    mp, pp = mount3.MountProc, portmap.PmapProc
    table: dict[tuple[int, int], Callable[[Reader], object]] = {
        (MOUNT, mp.MNT): mount3.unpack_mnt3res,
        (MOUNT, mp.DUMP): mount3.unpack_mountlist,
        (MOUNT, mp.EXPORT): mount3.unpack_exports,
        (PMAP, pp.GETPORT): portmap.unpack_port,
        (PMAP, pp.SET): portmap.unpack_bool,
        (PMAP, pp.UNSET): portmap.unpack_bool,
        (PMAP, pp.DUMP): portmap.unpack_pmaplist,
    }
    return table.get((prog, proc))


def _args_decoder(prog: int, proc: int) -> Callable[[Reader], object] | None:
    if prog == NFS:
        return nfs3.PROCS[proc].unpack_args if proc in nfs3.PROCS else None
    mp, pp = mount3.MountProc, portmap.PmapProc
    table: dict[tuple[int, int], Callable[[Reader], object]] = {
        (MOUNT, mp.MNT): mount3.unpack_mnt3args,
        (MOUNT, mp.UMNT): mount3.unpack_mnt3args,
        (PMAP, pp.SET): portmap.unpack_mapping,
        (PMAP, pp.UNSET): portmap.unpack_mapping,
        (PMAP, pp.GETPORT): portmap.unpack_mapping,
    }
    return table.get((prog, proc))


# prog -> (low, high, {vers: procedures}) of what the gateway serves
SERVED: Mapping[int, Mapping[int, range]] = {
    NFS: {3: range(22)},
    MOUNT: {3: range(6)},
    PMAP: {2: range(5)},
}
# A call to these programs may also answer SYSTEM_ERR: their procedures have no failure body,
# except MNT, which answers a mountstat3.
_NO_FAIL_BODY = {MOUNT, PMAP}


def expected(record: bytes) -> Outcome:
    """The outcome of ``record`` per RFC 5531 and the gateway's rules, decided with nfsproto
    independently of ``gateway.dispatch``."""
    if len(record) < 4:
        return Outcome("drop")
    xid = U32.unpack_from(record, 0)[0]
    r = Reader(record)
    try:
        hdr = rpc.unpack_call(r)
    except rpc.RpcDecodeError as e:
        if e.xid is None:
            return Outcome("drop")
        if e.rpc_mismatch:
            return Outcome("rpc_mismatch", xid)
        if e.auth_stat is not None:
            return Outcome("auth", xid, e.auth_stat)
        return Outcome("GARBAGE_ARGS", xid)

    def out(kind: str, alt: str | None = None) -> Outcome:
        return Outcome(kind, xid, None, hdr.prog, hdr.vers, hdr.proc, alt)

    versions = SERVED.get(hdr.prog)
    if versions is None:
        return out("PROG_UNAVAIL")
    procs = versions.get(hdr.vers)
    if procs is None:
        return out("PROG_MISMATCH")
    if hdr.proc not in procs:
        return out("PROC_UNAVAIL")
    any_auth = hdr.proc == 0
    if hdr.cred.flavor == AuthFlavor.AUTH_SYS:
        try:
            rpc.unpack_auth_sys(hdr.cred.body)
        except rpc.AuthError:
            return Outcome("auth", xid, AuthStat.AUTH_BADCRED, hdr.prog, hdr.vers, hdr.proc)
    elif hdr.cred.flavor != AuthFlavor.AUTH_NONE and not any_auth:
        return Outcome("auth", xid, AuthStat.AUTH_TOOWEAK, hdr.prog, hdr.vers, hdr.proc)
    if hdr.verf.flavor not in (AuthFlavor.AUTH_NONE, AuthFlavor.AUTH_SYS) and not any_auth:
        return Outcome("auth", xid, AuthStat.AUTH_BADVERF, hdr.prog, hdr.vers, hdr.proc)
    dec = _args_decoder(hdr.prog, hdr.proc)
    if dec is not None:
        try:
            dec(r)
        except XdrError:
            return out("GARBAGE_ARGS")
    return out("SUCCESS", "SYSTEM_ERR" if hdr.prog in _NO_FAIL_BODY else None)


FAR = 64 << 20


def grows_file_far(record: bytes, limit: int = FAR) -> bool:
    """Whether ``record`` is a well-formed NFS call that would make a file longer than
    ``limit`` (a WRITE ending past it, a size in a sattr3 past it)."""
    want = expected(record)
    if want.kind != "SUCCESS" or want.prog != NFS:
        return False
    r = Reader(record)
    rpc.unpack_call(r)
    args = nfs3.PROCS[want.proc].unpack_args(r)
    if isinstance(args, nfs3.Write3Args):
        return args.offset + args.count > limit
    for v in (getattr(args, "new_attributes", None), getattr(args, "attributes", None)):
        if isinstance(v, Sattr3) and v.size is not None and v.size > limit:
            return True
    how = getattr(args, "how", None)
    attrs = getattr(how, "obj_attributes", None)
    return isinstance(attrs, Sattr3) and attrs.size is not None and attrs.size > limit


def check_reply(want: Outcome, reply: bytes | None) -> str | None:
    """None when ``reply`` is the outcome ``want``; otherwise what is wrong."""
    if want.kind == "drop":
        return None if reply is None else "a reply to a record that must be dropped"
    if reply is None:
        return f"no reply, expected {want.kind}"
    r = Reader(reply)
    try:
        h = rpc.unpack_reply(r)
    except XdrError as e:
        return f"malformed reply header: {e}"
    if h.xid != want.xid:
        return f"reply xid {h.xid:#x}, call xid {want.xid:#x}"
    if want.kind == "rpc_mismatch":
        ok = h.stat == ReplyStat.MSG_DENIED and h.reject_stat == RejectStat.RPC_MISMATCH
        return None if ok and r.remaining() == 0 else f"expected RPC_MISMATCH, got {h}"
    if want.kind == "auth":
        ok = h.reject_stat == RejectStat.AUTH_ERROR and h.auth_stat == want.auth_stat
        return None if ok and r.remaining() == 0 else f"expected {want.auth_stat}, got {h}"
    if h.stat != ReplyStat.MSG_ACCEPTED or h.accept_stat is None:
        return f"expected {want.kind}, got {h}"
    got = h.accept_stat.name
    if got != want.kind and got != want.alt:
        return f"expected {want.kind}, got {got}"
    if got != "SUCCESS":
        return None if r.remaining() == 0 else f"{r.remaining()} bytes after {got}"
    dec = _res_decoder(want.prog, want.proc)
    try:
        if dec is not None:
            dec(r)
        r.done()
    except XdrError as e:
        return f"SUCCESS reply whose result does not decode: {e}"
    return None


# --------------------------------------------------------------------------- mutations

HUGE_WORDS = (
    0xFFFFFFFF,
    0x7FFFFFFF,
    0x80000000,
    0x10000000,
    0x00100001,
    rpc.MAX_AUTH_BODY + 1,
    rpc.MAX_AUTH_BODY,
    rpc.MAX_GIDS + 1,
    rpc.MAX_MACHINE_NAME + 1,
    nfs3.NFS3_FHSIZE + 1,
    0,
    1,
    3,
)


def _auth_sys_raw(name_len: int, ngids: int, declared_gids: int | None = None) -> bytes:
    """An AUTH_SYS body with a machine name of ``name_len`` bytes and ``ngids`` groups (the
    count word may lie: ``declared_gids``)."""
    w = Writer()
    w.u32(1)
    w.opaque(b"m" * name_len)
    w.u32(0)
    w.u32(0)
    w.u32(ngids if declared_gids is None else declared_gids)
    for g in range(ngids):
        w.u32(g)
    return w.getvalue()


def credential_cases() -> list[tuple[str, rpc.OpaqueAuth, str]]:
    """(name, credential, the auth outcome for a non-NULL procedure): AUTH_SYS at and past
    its limits, other flavours, bodies at and past 400 bytes."""
    sys_ = AuthFlavor.AUTH_SYS
    return [
        ("16 gids", rpc.OpaqueAuth(sys_, _auth_sys_raw(8, 16)), "ok"),
        ("17 gids", rpc.OpaqueAuth(sys_, _auth_sys_raw(8, 17)), "AUTH_BADCRED"),
        ("255-byte name", rpc.OpaqueAuth(sys_, _auth_sys_raw(255, 2)), "ok"),
        ("256-byte name", rpc.OpaqueAuth(sys_, _auth_sys_raw(256, 2)), "AUTH_BADCRED"),
        ("gid count lies", rpc.OpaqueAuth(sys_, _auth_sys_raw(8, 2, 9)), "AUTH_BADCRED"),
        ("gid count huge", rpc.OpaqueAuth(sys_, _auth_sys_raw(8, 2, 0xFFFFFFFF)), "AUTH_BADCRED"),
        ("trailing bytes", rpc.OpaqueAuth(sys_, _auth_sys_raw(8, 1) + b"\0\0\0\0"), "AUTH_BADCRED"),
        ("truncated", rpc.OpaqueAuth(sys_, _auth_sys_raw(8, 4)[:-2]), "AUTH_BADCRED"),
        ("empty AUTH_SYS", rpc.OpaqueAuth(sys_, b""), "AUTH_BADCRED"),
        ("AUTH_NONE", rpc.NULL_AUTH, "ok"),
        ("AUTH_DH", rpc.OpaqueAuth(AuthFlavor.AUTH_DH, b"\0" * 16), "AUTH_TOOWEAK"),
        ("RPCSEC_GSS", rpc.OpaqueAuth(AuthFlavor.RPCSEC_GSS, b"\0" * 40), "AUTH_TOOWEAK"),
        ("flavor 0xffffffff", rpc.OpaqueAuth(0xFFFFFFFF, b""), "AUTH_TOOWEAK"),
    ]


def raw_cred_call(xid: int, prog: int, vers: int, proc: int, flavor: int, body_len: int) -> bytes:
    """A call whose credential body claims ``body_len`` bytes (pack_call refuses > 400);
    at most 404 of them are actually sent."""
    w = Writer()
    w.pack(struct.Struct(">6I"), xid, 0, 2, prog, vers, proc)
    w.u32(flavor)
    w.u32(body_len)
    w.raw(b"\0" * min((body_len + 3) & ~3, 404))
    w.u32(0)
    w.u32(0)
    return w.getvalue()


class Mutator:
    """Deterministic record mutations from one ``random.Random``."""

    def __init__(self, seed: int, calls: list[bytes]) -> None:
        self.rng = random.Random(seed)
        self.calls = calls
        self.ops: list[Callable[[bytearray], bytearray]] = [
            self.flip_bits,
            self.overwrite_bytes,
            self.huge_word,
            self.bump_word,
            self.truncate,
            self.insert,
            self.delete,
            self.splice,
            self.new_xid_only,
        ]

    def record(self) -> bytes:
        """A mutation (1-3 operations) of a random seed call."""
        b = bytearray(self.rng.choice(self.calls))
        for _ in range(self.rng.randint(1, 3)):
            b = self.rng.choice(self.ops)(b)
        return bytes(b)

    def random_bytes(self) -> bytes:
        n = self.rng.choice((0, 1, 3, 4, 7, 24, 40, 100, 1000))
        return self.rng.randbytes(n)

    def _word_at(self, b: bytearray) -> int:
        return self.rng.randrange(0, max(1, len(b) - 3)) & ~3

    def flip_bits(self, b: bytearray) -> bytearray:
        for _ in range(self.rng.randint(1, 4)):
            if b:
                i = self.rng.randrange(len(b))
                b[i] ^= 1 << self.rng.randrange(8)
        return b

    def overwrite_bytes(self, b: bytearray) -> bytearray:
        if b:
            i = self.rng.randrange(len(b))
            n = self.rng.randint(1, 8)
            b[i : i + n] = self.rng.randbytes(min(n, len(b) - i))
        return b

    def huge_word(self, b: bytearray) -> bytearray:
        if len(b) >= 4:
            i = self._word_at(b)
            b[i : i + 4] = U32.pack(self.rng.choice(HUGE_WORDS))
        return b

    def bump_word(self, b: bytearray) -> bytearray:
        if len(b) >= 4:
            i = self._word_at(b)
            v = (U32.unpack_from(b, i)[0] + self.rng.choice((-1, 1, 4, -4))) & 0xFFFFFFFF
            b[i : i + 4] = U32.pack(v)
        return b

    def truncate(self, b: bytearray) -> bytearray:
        return b[: self.rng.randrange(len(b) + 1)]

    def insert(self, b: bytearray) -> bytearray:
        i = self.rng.randrange(len(b) + 1)
        return b[:i] + bytearray(self.rng.randbytes(self.rng.choice((1, 4, 8, 64)))) + b[i:]

    def delete(self, b: bytearray) -> bytearray:
        if not b:
            return b
        i = self.rng.randrange(len(b))
        return b[:i] + b[i + self.rng.choice((1, 4, 8)) :]

    def splice(self, b: bytearray) -> bytearray:
        other = self.rng.choice(self.calls)
        i = self.rng.randrange(len(b) + 1)
        j = self.rng.randrange(len(other) + 1)
        return b[:i] + bytearray(other[j:])

    def new_xid_only(self, b: bytearray) -> bytearray:
        if len(b) >= 4:
            b[0:4] = self.rng.randbytes(4)
        return b
