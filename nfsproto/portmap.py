"""PORTMAP version 2 (RFC 1833 §3): NULL, SET, UNSET, GETPORT, DUMP, CALLIT.

Owns: the wire form of program 100000 version 2, both directions. A server may refuse CALLIT
(nfsgw answers PROC_UNAVAIL: an indirect call is an amplification vector). Must not: do I/O.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum
from typing import Final

from nfsproto.xdr import Reader, Writer

PROGRAM: Final = 100000
VERSION: Final = 2
IPPROTO_TCP: Final = 6
IPPROTO_UDP: Final = 17
MAX_CALLIT_ARGS: Final = 8192


class PmapProc(IntEnum):
    NULL = 0
    SET = 1
    UNSET = 2
    GETPORT = 3
    DUMP = 4
    CALLIT = 5


_MAPPING: Final = struct.Struct(">4I")


@dataclass(slots=True)
class Mapping:
    prog: int
    vers: int
    prot: int
    port: int


@dataclass(slots=True)
class CallArgs:
    prog: int
    vers: int
    proc: int
    args: bytes


@dataclass(slots=True)
class CallResult:
    port: int
    res: bytes


def pack_mapping(w: Writer, v: Mapping) -> None:
    w.pack(_MAPPING, v.prog, v.vers, v.prot, v.port)


def unpack_mapping(r: Reader) -> Mapping:
    prog, vers, prot, port = r.take(_MAPPING)
    return Mapping(prog, vers, prot, port)


def pack_bool(w: Writer, v: bool) -> None:
    w.boolean(v)


def unpack_bool(r: Reader) -> bool:
    return r.boolean()


def pack_port(w: Writer, v: int) -> None:
    w.u32(v)


def unpack_port(r: Reader) -> int:
    return r.u32()


def pack_pmaplist(w: Writer, v: list[Mapping]) -> None:
    for m in v:
        w.boolean(True)
        pack_mapping(w, m)
    w.boolean(False)


def unpack_pmaplist(r: Reader) -> list[Mapping]:
    out: list[Mapping] = []
    while r.optional():
        out.append(unpack_mapping(r))
    return out


def pack_call_args(w: Writer, v: CallArgs) -> None:
    w.u32(v.prog)
    w.u32(v.vers)
    w.u32(v.proc)
    w.opaque(v.args, MAX_CALLIT_ARGS)


def unpack_call_args(r: Reader) -> CallArgs:
    prog, vers, proc = r.u32(), r.u32(), r.u32()
    return CallArgs(prog, vers, proc, r.opaque_bytes(MAX_CALLIT_ARGS))


def pack_call_result(w: Writer, v: CallResult) -> None:
    w.u32(v.port)
    w.opaque(v.res, MAX_CALLIT_ARGS)


def unpack_call_result(r: Reader) -> CallResult:
    port = r.u32()
    return CallResult(port, r.opaque_bytes(MAX_CALLIT_ARGS))
