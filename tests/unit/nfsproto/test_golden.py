"""Golden bytes: the hot calls as the Linux NFSv3 client sends them (GETATTR, LOOKUP, ACCESS,
READ, READDIRPLUS, each with its RPC header and AUTH_SYS credential) and our replies, captured
from a kernel in QEMU (``tests/data/README.md`` says how; ``tests/e2e/capture_golden.py``
regenerates them). Each decodes completely with nfsproto into the fields the capture's
workload implies, and re-encoding what we decoded gives the same bytes (our encoders are
canonical: there is one XDR encoding of a value).

The ``check_*`` functions take the records by file stem, so the e2e suite runs them on a
fresh capture too (``tests/e2e/test_golden_capture.py``).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from nfsproto import nfs3, rpc
from nfsproto.client import decode_reply
from nfsproto.nfs3 import Ftype3, Nfs3Proc, NfsStat3
from nfsproto.xdr import Reader, Writer, XdrError

DATA = Path(__file__).resolve().parents[2] / "data"
STEMS = ("getattr", "lookup", "access", "read", "readdirplus")
Golden = Mapping[str, tuple[bytes, bytes]]

# What the capture served (tests/e2e/capture_golden.py: FILES, MTIME) and how our handles
# are built: 12 bytes (format, export, MAC) then the key relative to the export.
HELLO = b"hello from the golden bytes of nfsgw\n"
MTIME = 1_700_000_000
HANDLE_HEAD = 12
# What opening a file for reading asks (RFC 1813 ACCESS3_*), and what a read-only export
# grants on a 0644 file: READ only.
ACCESS_OPEN_RDONLY = (
    nfs3.ACCESS3_READ | nfs3.ACCESS3_MODIFY | nfs3.ACCESS3_EXTEND | nfs3.ACCESS3_EXECUTE
)


def load(d: Path = DATA) -> dict[str, tuple[bytes, bytes]]:
    return {
        s: ((d / f"{s}_call.bin").read_bytes(), (d / f"{s}_reply.bin").read_bytes()) for s in STEMS
    }


def _call(data: bytes, proc: Nfs3Proc) -> tuple[rpc.CallHeader, Any]:
    """Decode a call of ``proc``: the RPC header and AUTH_SYS credential of the Linux client
    (root in the guest, machine name "(none)": it has no hostname), then its arguments,
    consuming every byte; re-encoding gives the same bytes."""
    codec = nfs3.PROCS[proc]
    # the header's fixed words, read without our decoder: xid, CALL, rpcvers 2, prog, vers,
    # proc, then the AUTH_SYS flavor
    xid, mtype, rpcvers, prog, vers, p, flavor = struct.unpack_from(">7I", data)
    assert (mtype, rpcvers, prog, vers, p, flavor) == (0, 2, nfs3.PROGRAM, 3, proc, 1)

    r = Reader(data)
    h = rpc.unpack_call(r)
    args = codec.unpack_args(r)
    r.done()
    assert (h.xid, h.prog, h.vers, h.proc) == (xid, nfs3.PROGRAM, nfs3.VERSION, proc)
    assert h.cred.flavor == rpc.AuthFlavor.AUTH_SYS
    assert h.verf == rpc.NULL_AUTH
    cred = rpc.unpack_auth_sys(h.cred.body)
    assert (cred.uid, cred.gid, cred.gids, cred.machinename) == (0, 0, [], b"(none)")
    assert rpc.pack_auth_sys(cred) == h.cred.body

    w = Writer()
    rpc.pack_call(w, h.xid, h.prog, h.vers, h.proc, h.cred, h.verf)
    codec.pack_args(w, args)
    assert w.getvalue() == data
    return h, args


def _reply(data: bytes, xid: int, proc: Nfs3Proc) -> Any:
    """Decode our accepted SUCCESS reply to ``xid``: the result, status NFS3_OK, consuming
    every byte; re-encoding gives the same bytes."""
    codec = nfs3.PROCS[proc]
    h, r = decode_reply(data)
    res: Any = codec.unpack_res(r)
    r.done()
    assert h.xid == xid
    assert h.stat == rpc.ReplyStat.MSG_ACCEPTED and h.accept_stat == rpc.AcceptStat.SUCCESS
    assert h.verf == rpc.NULL_AUTH
    assert res.status == NfsStat3.NFS3_OK

    w = Writer()
    rpc.pack_success_header(w, xid)
    codec.pack_res(w, res)
    assert w.getvalue() == data
    return res


def _hello_attrs(a: nfs3.Fattr3 | None) -> None:
    assert a is not None
    assert (a.type, a.mode, a.nlink, a.uid, a.gid) == (Ftype3.NF3REG, 0o644, 1, 0, 0)
    assert a.size == len(HELLO)
    assert a.mtime == nfs3.NfsTime3(MTIME, 0)


def _file_handle(g: Golden) -> bytes:
    """The handle of hello.txt, from the LOOKUP reply."""
    call, reply = g["lookup"]
    h, _ = _call(call, Nfs3Proc.LOOKUP)
    fh: bytes = _reply(reply, h.xid, Nfs3Proc.LOOKUP).object
    return fh


def check_lookup(g: Golden) -> None:
    call, reply = g["lookup"]
    h, args = _call(call, Nfs3Proc.LOOKUP)
    assert len(args.what.dir) == HANDLE_HEAD  # the export's root: the empty key
    assert args.what.name == b"hello.txt"
    res = _reply(reply, h.xid, Nfs3Proc.LOOKUP)
    assert len(res.object) == HANDLE_HEAD + len(b"hello.txt") <= nfs3.NFS3_FHSIZE
    assert res.object[:2] == args.what.dir[:2]  # handle format and export
    _hello_attrs(res.obj_attributes)
    assert res.dir_attributes is not None and res.dir_attributes.type == Ftype3.NF3DIR


def check_getattr(g: Golden) -> None:
    call, reply = g["getattr"]
    h, args = _call(call, Nfs3Proc.GETATTR)
    assert args.object == _file_handle(g)
    _hello_attrs(_reply(reply, h.xid, Nfs3Proc.GETATTR).obj_attributes)


def check_access(g: Golden) -> None:
    call, reply = g["access"]
    h, args = _call(call, Nfs3Proc.ACCESS)
    assert args.object == _file_handle(g)
    assert args.access == ACCESS_OPEN_RDONLY
    res = _reply(reply, h.xid, Nfs3Proc.ACCESS)
    assert res.access == nfs3.ACCESS3_READ
    _hello_attrs(res.obj_attributes)


def check_read(g: Golden) -> None:
    call, reply = g["read"]
    h, args = _call(call, Nfs3Proc.READ)
    assert args.file == _file_handle(g)
    assert (args.offset, args.count) == (0, 4096)  # one page
    res = _reply(reply, h.xid, Nfs3Proc.READ)
    assert (res.count, res.eof, bytes(res.data)) == (len(HELLO), True, HELLO)
    _hello_attrs(res.file_attributes)


def check_readdirplus(g: Golden) -> None:
    call, reply = g["readdirplus"]
    h, args = _call(call, Nfs3Proc.READDIRPLUS)
    assert len(args.dir) == HANDLE_HEAD + len(b"dir")
    assert (args.cookie, args.cookieverf) == (0, bytes(nfs3.NFS3_COOKIEVERFSIZE))
    assert (args.dircount, args.maxcount) == (65536, 65536)
    res = _reply(reply, h.xid, Nfs3Proc.READDIRPLUS)
    assert res.eof
    assert [e.name for e in res.entries] == [b".", b"..", b"a.txt", b"b.txt"]
    assert res.entries[0].name_handle == args.dir
    sizes = {e.name: e.name_attributes.size for e in res.entries if e.name_attributes}
    assert (sizes[b"a.txt"], sizes[b"b.txt"]) == (2, 3)
    for e in res.entries[2:]:
        assert e.name_handle is not None
        assert len(e.name_handle) == HANDLE_HEAD + len(b"dir/") + len(e.name)
    assert len({e.cookie for e in res.entries}) == len(res.entries)


CHECKS: dict[str, Callable[[Golden], None]] = {
    "getattr": check_getattr,
    "lookup": check_lookup,
    "access": check_access,
    "read": check_read,
    "readdirplus": check_readdirplus,
}


@pytest.fixture(scope="module")
def golden() -> dict[str, tuple[bytes, bytes]]:
    return load()


@pytest.mark.parametrize("stem", STEMS)
def test_golden(golden: Golden, stem: str) -> None:
    CHECKS[stem](golden)


def test_every_truncation_of_a_golden_call_is_an_error(golden: Golden) -> None:
    """Every strict prefix of a captured call fails to decode (XdrError), never decodes to
    something else."""
    for stem in STEMS:
        call, _ = golden[stem]
        codec = nfs3.PROCS[Nfs3Proc(struct.unpack_from(">I", call, 20)[0])]
        for n in range(len(call)):
            r = Reader(call[:n])
            with pytest.raises(XdrError):
                rpc.unpack_call(r)
                codec.unpack_args(r)
                r.done()
