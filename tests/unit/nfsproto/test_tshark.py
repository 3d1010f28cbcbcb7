"""An independent check of our encoders: every NFSv3, MOUNTv3 and PORTMAPv2 call and reply we
encode is written into a pcap as a TCP conversation, and Wireshark's dissector (tshark) must
decode each one as the intended procedure with no Malformed packet and no expert warning."""

from __future__ import annotations

import shutil
import struct
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from nfsproto import mount3, nfs3, portmap, rpc
from nfsproto.nfs3 import (
    CreateHow3,
    CreateMode3,
    Diropargs3,
    Fattr3,
    Ftype3,
    Nfs3Proc,
    NfsStat3,
    NfsTime3,
    Sattr3,
    SetTime,
    Specdata3,
    StableHow,
    TimeHow,
    WccAttr,
    WccData,
)
from nfsproto.xdr import Writer

pytestmark = pytest.mark.tshark

TSHARK = shutil.which("tshark")

# ------------------------------------------------------------------ a tiny pcap writer


def _csum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    s: int = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


class PcapWriter:
    """Ethernet/IPv4/TCP frames of one client<->server conversation with consistent
    sequence numbers (so tshark reassembles and matches replies to calls)."""

    CLIENT = bytes([10, 0, 0, 1])
    SERVER = bytes([10, 0, 0, 2])

    def __init__(self, server_port: int) -> None:
        self.frames: list[bytes] = []
        self.sport, self.dport = 871, server_port
        self.seq = {True: 1000, False: 5000}  # True: client->server
        self._handshake()

    def _tcp(self, from_client: bool, payload: bytes, flags: int) -> None:
        src, dst = (self.CLIENT, self.SERVER) if from_client else (self.SERVER, self.CLIENT)
        sp, dp = (self.sport, self.dport) if from_client else (self.dport, self.sport)
        seq, ack = self.seq[from_client], self.seq[not from_client]
        hdr = struct.pack("!HHIIBBHHH", sp, dp, seq, ack, 5 << 4, flags, 65535, 0, 0)
        pseudo = src + dst + struct.pack("!BBH", 0, 6, len(hdr) + len(payload))
        c = _csum(pseudo + hdr + payload)
        hdr = hdr[:16] + struct.pack("!H", c) + hdr[18:]
        total = 20 + len(hdr) + len(payload)
        ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, total, 1, 0x4000, 64, 6, 0, src, dst)
        ip = ip[:10] + struct.pack("!H", _csum(ip)) + ip[12:]
        eth = b"\x02\0\0\0\0\2" + b"\x02\0\0\0\0\1" + b"\x08\x00"
        self.frames.append(eth + ip + hdr + payload)
        self.seq[from_client] = (seq + len(payload) + (1 if flags & 0x03 else 0)) & 0xFFFFFFFF

    def _handshake(self) -> None:
        self._tcp(True, b"", 0x02)  # SYN
        self._tcp(False, b"", 0x12)  # SYN/ACK
        self._tcp(True, b"", 0x10)  # ACK

    def message(self, from_client: bool, record: bytes) -> int:
        """Append one RPC record (with its record mark); returns its frame number."""
        self._tcp(from_client, record, 0x18)  # PSH/ACK
        return len(self.frames)

    def write(self, path: Path) -> None:
        with path.open("wb") as f:
            f.write(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 262144, 1))
            for i, fr in enumerate(self.frames):
                f.write(struct.pack("<IIII", 1_700_000_000 + i, 0, len(fr), len(fr)))
                f.write(fr)


# ------------------------------------------------------------------ sample messages

FH = bytes.fromhex("01") + b"\x00\x07" + bytes(range(3, 40))
FH2 = bytes.fromhex("01") + b"\x00\x07" + bytes(range(50, 70))
T = NfsTime3(1_700_000_000, 123_456_789)
ATTR = Fattr3(
    Ftype3.NF3REG,
    0o644,
    1,
    1000,
    1000,
    114_660,
    118_784,
    Specdata3(0, 0),
    7,
    0x1234_5678_9ABC,
    T,
    T,
    T,
)
DATTR = Fattr3(Ftype3.NF3DIR, 0o755, 2, 0, 0, 4096, 4096, Specdata3(0, 0), 7, 42, T, T, T)
WCC = WccData(WccAttr(4096, T, T), DATTR)
SATTR = Sattr3(
    mode=0o600,
    uid=1000,
    gid=None,
    size=0,
    atime=SetTime(TimeHow.SET_TO_SERVER_TIME),
    mtime=SetTime(TimeHow.SET_TO_CLIENT_TIME, T),
)
WHERE = Diropargs3(FH, b"n01440764_10026.JPEG")
OK = NfsStat3.NFS3_OK
VERF = b"\x01\x02\x03\x04\x05\x06\x07\x08"

NFS_SAMPLES: dict[Nfs3Proc, tuple[Any, Any]] = {
    Nfs3Proc.NULL: (None, None),
    Nfs3Proc.GETATTR: (nfs3.Getattr3Args(FH), nfs3.Getattr3Res(OK, ATTR)),
    Nfs3Proc.SETATTR: (
        nfs3.Setattr3Args(FH, SATTR, T),
        nfs3.Setattr3Res(OK, WccData(WccAttr(1, T, T), ATTR)),
    ),
    Nfs3Proc.LOOKUP: (nfs3.Lookup3Args(WHERE), nfs3.Lookup3Res(OK, FH2, ATTR, DATTR)),
    Nfs3Proc.ACCESS: (nfs3.Access3Args(FH, 0x3F), nfs3.Access3Res(OK, ATTR, 0x01)),
    Nfs3Proc.READLINK: (nfs3.Readlink3Args(FH), nfs3.Readlink3Res(OK, ATTR, b"../target")),
    Nfs3Proc.READ: (
        nfs3.Read3Args(FH, 4096, 8192),
        nfs3.Read3Res(OK, ATTR, 13, True, b"hello, world!"),
    ),
    Nfs3Proc.WRITE: (
        nfs3.Write3Args(FH, 0, 5, StableHow.FILE_SYNC, b"abcde"),
        nfs3.Write3Res(OK, WccData(None, ATTR), 5, StableHow.FILE_SYNC, VERF),
    ),
    Nfs3Proc.CREATE: (
        nfs3.Create3Args(WHERE, CreateHow3(CreateMode3.GUARDED, SATTR)),
        nfs3.Create3Res(OK, FH2, ATTR, WCC),
    ),
    Nfs3Proc.MKDIR: (
        nfs3.Mkdir3Args(WHERE, Sattr3(mode=0o755)),
        nfs3.Mkdir3Res(OK, FH2, DATTR, WCC),
    ),
    Nfs3Proc.SYMLINK: (
        nfs3.Symlink3Args(WHERE, nfs3.Symlinkdata3(Sattr3(), b"/a/b")),
        nfs3.Symlink3Res(OK, FH2, ATTR, WCC),
    ),
    Nfs3Proc.MKNOD: (
        nfs3.Mknod3Args(WHERE, nfs3.Mknoddata3(Ftype3.NF3FIFO, Sattr3())),
        nfs3.Mknod3Res(NfsStat3.NFS3ERR_NOTSUPP, dir_wcc=WCC),
    ),
    Nfs3Proc.REMOVE: (nfs3.Remove3Args(WHERE), nfs3.Remove3Res(OK, WCC)),
    Nfs3Proc.RMDIR: (nfs3.Rmdir3Args(WHERE), nfs3.Rmdir3Res(NfsStat3.NFS3ERR_NOTEMPTY, WCC)),
    Nfs3Proc.RENAME: (
        nfs3.Rename3Args(WHERE, Diropargs3(FH2, b"new name")),
        nfs3.Rename3Res(OK, WCC, WCC),
    ),
    Nfs3Proc.LINK: (nfs3.Link3Args(FH, WHERE), nfs3.Link3Res(NfsStat3.NFS3ERR_NOTSUPP, ATTR, WCC)),
    Nfs3Proc.READDIR: (
        nfs3.Readdir3Args(FH, 0, bytes(8), 8192),
        nfs3.Readdir3Res(
            OK, DATTR, VERF, [nfs3.Entry3(i + 10, b"f%d.jpg" % i, i + 1) for i in range(3)], True
        ),
    ),
    Nfs3Proc.READDIRPLUS: (
        nfs3.Readdirplus3Args(FH, 0, bytes(8), 4096, 32768),
        nfs3.Readdirplus3Res(
            OK,
            DATTR,
            VERF,
            [nfs3.Entryplus3(i + 10, b"f%d.jpg" % i, i + 1, ATTR, FH2) for i in range(3)]
            + [nfs3.Entryplus3(99, b"noattrs", 9, None, None)],
            False,
        ),
    ),
    Nfs3Proc.FSSTAT: (
        nfs3.Fsstat3Args(FH),
        nfs3.Fsstat3Res(OK, DATTR, 1 << 50, 1 << 49, 1 << 49, 10, 5, 5, 0),
    ),
    Nfs3Proc.FSINFO: (
        nfs3.Fsinfo3Args(FH),
        nfs3.Fsinfo3Res(
            OK,
            DATTR,
            1 << 20,
            1 << 20,
            4096,
            1 << 20,
            1 << 20,
            4096,
            65536,
            5 << 40,
            NfsTime3(0, 1),
            0x1A,
        ),
    ),
    Nfs3Proc.PATHCONF: (
        nfs3.Pathconf3Args(FH),
        nfs3.Pathconf3Res(OK, ATTR, 1, 255, True, True, False, True),
    ),
    Nfs3Proc.COMMIT: (nfs3.Commit3Args(FH, 0, 0), nfs3.Commit3Res(OK, WCC, VERF)),
}


def _void(w: Writer, v: None) -> None:
    pass


Packer = Callable[[Writer, Any], None]

MOUNT_SAMPLES: dict[int, tuple[Packer, Any, Packer, Any]] = {
    mount3.MountProc.NULL: (_void, None, _void, None),
    mount3.MountProc.MNT: (
        mount3.pack_mnt3args,
        mount3.Mnt3Args(b"/data"),
        mount3.pack_mnt3res,
        mount3.Mnt3Res(mount3.MountStat3.MNT3_OK, FH, [1, 0]),
    ),
    mount3.MountProc.DUMP: (
        _void,
        None,
        mount3.pack_mountlist,
        [mount3.MountBody(b"client1", b"/data")],
    ),
    mount3.MountProc.UMNT: (mount3.pack_mnt3args, mount3.Mnt3Args(b"/data"), _void, None),
    mount3.MountProc.UMNTALL: (_void, None, _void, None),
    mount3.MountProc.EXPORT: (
        _void,
        None,
        mount3.pack_exports,
        [mount3.ExportNode(b"/data", [b"10.0.0.0/8"]), mount3.ExportNode(b"/other", [])],
    ),
}

MAP = portmap.Mapping(nfs3.PROGRAM, 3, portmap.IPPROTO_TCP, 0)
PMAP_SAMPLES: dict[int, tuple[Packer, Any, Packer, Any]] = {
    portmap.PmapProc.NULL: (_void, None, _void, None),
    portmap.PmapProc.SET: (portmap.pack_mapping, MAP, portmap.pack_bool, False),
    portmap.PmapProc.UNSET: (portmap.pack_mapping, MAP, portmap.pack_bool, True),
    portmap.PmapProc.GETPORT: (portmap.pack_mapping, MAP, portmap.pack_port, 2049),
    portmap.PmapProc.DUMP: (
        _void,
        None,
        portmap.pack_pmaplist,
        [portmap.Mapping(100000, 2, 6, 111), MAP],
    ),
    portmap.PmapProc.CALLIT: (
        portmap.pack_call_args,
        portmap.CallArgs(100003, 3, 0, b""),
        portmap.pack_call_result,
        portmap.CallResult(2049, b""),
    ),
}


def _record(fill: Callable[[Writer], None]) -> bytes:
    w = Writer()
    fill(w)
    return b"".join(bytes(b) for b in rpc.frame(w.buffers()))


def _conversation(
    port: int, prog: int, vers: int, samples: dict[int, tuple[Packer, Any, Packer, Any]]
) -> tuple[PcapWriter, dict[int, tuple[str, int]]]:
    """-> pcap and {frame number: ("call"|"reply", proc)}"""
    pc = PcapWriter(port)
    expect: dict[int, tuple[str, int]] = {}
    for i, (proc, (pa, a, pr, res)) in enumerate(samples.items()):
        xid = 0x1000 + i

        def call(w: Writer, xid: int = xid, proc: int = proc, pa: Packer = pa, a: Any = a) -> None:
            rpc.pack_call(w, xid, prog, vers, proc, rpc.auth_sys(1000, 1000, [1000], b"node1"))
            pa(w, a)

        def reply(w: Writer, xid: int = xid, pr: Packer = pr, res: Any = res) -> None:
            rpc.pack_success_header(w, xid)
            pr(w, res)

        expect[pc.message(True, _record(call))] = ("call", proc)
        expect[pc.message(False, _record(reply))] = ("reply", proc)
    return pc, expect


def _tshark(pcap: Path, proc_field: str, port: int) -> dict[int, dict[str, str]]:
    assert TSHARK is not None
    fields = [
        "frame.number",
        "rpc.msgtyp",
        proc_field,
        "_ws.malformed",
        "_ws.expert.severity",
        "_ws.expert.message",
    ]
    out = subprocess.run(
        [
            TSHARK,
            "-n",
            "-r",
            str(pcap),
            "-d",
            f"tcp.port=={port},rpc",
            "-o",
            "tcp.check_checksum:TRUE",
            "-T",
            "fields",
            "-E",
            "separator=|",
            "-E",
            "occurrence=a",
            *[a for f in fields for a in ("-e", f)],
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    rows: dict[int, dict[str, str]] = {}
    for line in out.splitlines():
        vals = line.split("|")
        rows[int(vals[0])] = dict(zip(fields, vals, strict=True))
    return rows


def _check(
    pc: PcapWriter,
    expect: dict[int, tuple[str, int]],
    proc_field: str,
    port: int,
    tmp_path: Path,
    name: str,
) -> None:
    pcap = tmp_path / f"{name}.pcap"
    pc.write(pcap)
    rows = _tshark(pcap, proc_field, port)
    problems = []
    for frame, (kind, proc) in expect.items():
        row = rows.get(frame)
        if row is None:
            problems.append(f"frame {frame}: not decoded")
            continue
        if row["rpc.msgtyp"] != ("0" if kind == "call" else "1"):
            problems.append(f"frame {frame} ({kind} {proc}): msgtyp {row['rpc.msgtyp']!r}")
        if row[proc_field] != str(int(proc)):
            problems.append(f"frame {frame} ({kind} {proc}): decoded as {row[proc_field]!r}")
        if row["_ws.malformed"]:
            problems.append(f"frame {frame} ({kind} {proc}): Malformed")
        if row["_ws.expert.severity"]:
            problems.append(
                f"frame {frame} ({kind} {proc}): expert "
                f"{row['_ws.expert.severity']} {row['_ws.expert.message']}"
            )
    assert not problems, "\n".join(problems)


needs_tshark = pytest.mark.skipif(
    TSHARK is None, reason="tshark not installed (make test installs it when run as root)"
)


@needs_tshark
def test_tshark_decodes_every_nfs3_call_and_reply(tmp_path: Path) -> None:
    samples: dict[int, tuple[Packer, Any, Packer, Any]] = {}
    for proc, (a, res) in NFS_SAMPLES.items():
        codec = nfs3.PROCS[proc]
        samples[proc] = (codec.pack_args, a, codec.pack_res, res)
    assert len(samples) == 22
    pc, expect = _conversation(2049, nfs3.PROGRAM, 3, samples)
    _check(pc, expect, "nfs.procedure_v3", 2049, tmp_path, "nfs3")


@needs_tshark
def test_tshark_decodes_mount3(tmp_path: Path) -> None:
    pc, expect = _conversation(20048, mount3.PROGRAM, 3, MOUNT_SAMPLES)
    _check(pc, expect, "mount.procedure_v3", 20048, tmp_path, "mount3")


@needs_tshark
def test_tshark_decodes_portmap2(tmp_path: Path) -> None:
    pc, expect = _conversation(111, portmap.PROGRAM, 2, PMAP_SAMPLES)
    _check(pc, expect, "portmap.procedure_v2", 111, tmp_path, "portmap2")


@needs_tshark
def test_tshark_flags_a_broken_encoding(tmp_path: Path) -> None:
    """The check can fail: a GETATTR reply cut short is reported as malformed."""
    pc = PcapWriter(2049)
    codec = nfs3.PROCS[Nfs3Proc.GETATTR]

    def call(w: Writer) -> None:
        rpc.pack_call(w, 1, nfs3.PROGRAM, 3, 1)
        codec.pack_args(w, nfs3.Getattr3Args(FH))

    w = Writer()
    rpc.pack_success_header(w, 1)
    codec.pack_res(w, nfs3.Getattr3Res(OK, ATTR))
    body = w.getvalue()[:-12]
    pc.message(True, _record(call))
    bad = pc.message(False, rpc.record_header(len(body)) + body)
    pcap = tmp_path / "bad.pcap"
    pc.write(pcap)
    rows = _tshark(pcap, "nfs.procedure_v3", 2049)
    assert rows[bad]["_ws.malformed"] or rows[bad]["_ws.expert.severity"]
