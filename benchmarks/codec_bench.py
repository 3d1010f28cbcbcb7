"""Codec micro-benchmark: µs per encode/decode of the messages on the hot path.

    .venv/bin/python benchmarks/codec_bench.py [--repeat 5]

Prints the best of ``--repeat`` runs (each auto-ranged by timeit) for: GETATTR reply, LOOKUP
call + reply, READ reply of 1 MiB (and 64 KiB, to show the cost does not depend on the payload:
the payload is appended by reference), READDIRPLUS reply with 100 entries, and record-marking
reassembly of a 1 MiB WRITE call fed in 64 KiB segments. Targets on a 2-core machine:
GETATTR reply encode <= 5 µs, READDIRPLUS(100) encode <= 250 µs.
"""

from __future__ import annotations

import argparse
import timeit
from collections.abc import Callable
from typing import Any

from nfsproto import nfs3, rpc
from nfsproto.nfs3 import Diropargs3, Fattr3, Ftype3, Nfs3Proc, NfsStat3, NfsTime3, Specdata3
from nfsproto.xdr import Reader, Writer

FH = bytes(range(40))
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
OK = NfsStat3.NFS3_OK


def best_us(fn: Callable[[], object], repeat: int) -> float:
    t = timeit.Timer(fn)
    n, _ = t.autorange()
    return min(t.repeat(repeat=repeat, number=n)) / n * 1e6


def reply(pack: Callable[[Writer, Any], None], res: object) -> Callable[[], list[Any]]:
    def f() -> list[Any]:
        w = Writer()
        rpc.pack_success_header(w, 0x1234)
        pack(w, res)
        return rpc.frame(w.buffers())

    return f


def encoded(fn: Callable[[], list[Any]]) -> bytes:
    return b"".join(bytes(b) for b in fn())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    P = nfs3.PROCS
    rows: list[tuple[str, float]] = []

    getattr_enc = reply(P[Nfs3Proc.GETATTR].pack_res, nfs3.Getattr3Res(OK, ATTR))
    rows.append(
        ("GETATTR reply encode (rpc header + fattr3 + record mark)", best_us(getattr_enc, a.repeat))
    )
    ga = encoded(getattr_enc)[4:]

    def getattr_dec() -> object:
        r = Reader(ga)
        rpc.unpack_reply(r)
        return P[Nfs3Proc.GETATTR].unpack_res(r)

    rows.append(("GETATTR reply decode", best_us(getattr_dec, a.repeat)))

    cred = rpc.auth_sys(1000, 1000, [1000, 27], b"trainer-node-01")
    largs = nfs3.Lookup3Args(Diropargs3(FH, b"n01440764_10026.JPEG"))

    def lookup_call_enc() -> list[Any]:
        w = Writer()
        rpc.pack_call(w, 7, nfs3.PROGRAM, 3, Nfs3Proc.LOOKUP, cred)
        P[Nfs3Proc.LOOKUP].pack_args(w, largs)
        return rpc.frame(w.buffers())

    lc = encoded(lookup_call_enc)[4:]

    def lookup_call_dec() -> object:
        r = Reader(lc)
        h = rpc.unpack_call(r)
        rpc.unpack_auth_sys(h.cred.body)
        return P[Nfs3Proc.LOOKUP].unpack_args(r)

    lookup_res_enc = reply(P[Nfs3Proc.LOOKUP].pack_res, nfs3.Lookup3Res(OK, FH, ATTR, ATTR))
    lr = encoded(lookup_res_enc)[4:]

    def lookup_res_dec() -> object:
        r = Reader(lr)
        rpc.unpack_reply(r)
        return P[Nfs3Proc.LOOKUP].unpack_res(r)

    rows.append(("LOOKUP call encode", best_us(lookup_call_enc, a.repeat)))
    rows.append(
        ("LOOKUP call decode (header + AUTH_SYS + args)", best_us(lookup_call_dec, a.repeat))
    )
    rows.append(("LOOKUP reply encode", best_us(lookup_res_enc, a.repeat)))
    rows.append(("LOOKUP reply decode", best_us(lookup_res_dec, a.repeat)))

    for size in (64 << 10, 1 << 20):
        data = memoryview(bytes(size))
        enc = reply(P[Nfs3Proc.READ].pack_res, nfs3.Read3Res(OK, ATTR, size, False, data))
        bufs = enc()
        assert any(b is data for b in bufs), "READ payload must not be copied"
        rows.append(
            (f"READ reply encode, {size >> 10} KiB payload (no copy)", best_us(enc, a.repeat))
        )

    entries = [
        nfs3.Entryplus3(1000 + i, b"n01440764_%05d.JPEG" % i, i + 1, ATTR, FH) for i in range(100)
    ]
    rdp = nfs3.Readdirplus3Res(OK, ATTR, bytes(8), entries, False)
    rdp_enc = reply(P[Nfs3Proc.READDIRPLUS].pack_res, rdp)
    rows.append(("READDIRPLUS reply encode, 100 entries", best_us(rdp_enc, a.repeat)))
    rd = encoded(rdp_enc)[4:]

    def rdp_dec() -> object:
        r = Reader(rd)
        rpc.unpack_reply(r)
        return P[Nfs3Proc.READDIRPLUS].unpack_res(r)

    rows.append(("READDIRPLUS reply decode, 100 entries", best_us(rdp_dec, a.repeat)))

    w = Writer()
    rpc.pack_call(w, 9, nfs3.PROGRAM, 3, Nfs3Proc.WRITE, cred)
    P[Nfs3Proc.WRITE].pack_args(
        w, nfs3.Write3Args(FH, 0, 1 << 20, nfs3.StableHow.UNSTABLE, bytes(1 << 20))
    )
    stream = b"".join(bytes(b) for b in rpc.frame(w.buffers()))
    segs = [stream[i : i + 65536] for i in range(0, len(stream), 65536)]

    def rm_parse() -> object:
        rr = rpc.RecordReader()
        out: list[object] = []
        for s in segs:
            out += rr.feed(s)
        assert len(out) == 1
        return out

    def write_decode() -> object:
        rr = rpc.RecordReader()
        recs: list[object] = []
        for s in segs:
            recs += rr.feed(s)
        r = Reader(recs[0])  # type: ignore[arg-type]
        rpc.unpack_call(r)
        return P[Nfs3Proc.WRITE].unpack_args(r)

    rows.append(
        (
            "record marking: reassemble a 1 MiB WRITE call from 64 KiB segments",
            best_us(rm_parse, a.repeat),
        )
    )
    rows.append(("  ... plus call header + WRITE args decode", best_us(write_decode, a.repeat)))

    width = max(len(n) for n, _ in rows)
    print(f"{'operation':<{width}}  µs/op")
    for name, us in rows:
        print(f"{name:<{width}}  {us:8.2f}")


if __name__ == "__main__":
    main()
