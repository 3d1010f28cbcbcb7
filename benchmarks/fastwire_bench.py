"""Fast-path wire mechanics micro-benchmark: ns per call, the C module against its Python twin.

    .venv/bin/python benchmarks/fastwire_bench.py [--repeat 3]

Rows: ``parse_call`` of each procedure's call as the Linux client sends it (the golden records
of tests/data: AUTH_SYS credential, a 28-byte handle), each ``reply_*`` with a 28-byte handle,
``pad``, and ``RecordReader.feed`` of 64 KiB segments cut from a stream of 3,277-byte records
(20 per segment, one split across each boundary) and of a segment holding one GETATTR call.
Each figure is the best of ``--repeat`` timeit runs (each auto-ranged). Without the built
module (``pip install -e .`` with a C compiler) only the Python column is filled.
"""

from __future__ import annotations

import argparse
import struct
import timeit
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from gateway import fastwire
from nfsproto import rpc

DATA = Path(__file__).resolve().parents[1] / "tests" / "data"
ATTR = bytes(range(84))
FH = bytes(range(28))
SEGMENT = 64 * 1024
RECORD = 3277  # mark included: 20 records per 64 KiB segment


def best_ns(fn: Callable[[], object], repeat: int) -> float:
    t = timeit.Timer(fn)
    n, _ = t.autorange()
    return min(t.repeat(repeat=repeat, number=n)) / n * 1e9


def segments() -> list[bytes]:
    payload = bytes(RECORD - 4)
    record = struct.pack(">I", rpc.LAST_FRAGMENT | len(payload)) + payload
    stream = record * 200
    return [stream[i : i + SEGMENT] for i in range(0, len(stream) - SEGMENT + 1, SEGMENT)]


def parse(w: ModuleType, record: bytes) -> Callable[[], object]:
    return lambda: w.parse_call(record)


def cases(w: ModuleType, reader: Callable[[], Any]) -> dict[str, Callable[[], object]]:
    """The calls to time, with ``w`` the module (fastwire or _fastwire) and ``reader`` a
    factory of its RecordReader."""
    out: dict[str, Callable[[], object]] = {}
    for stem in ("getattr", "lookup", "access", "read"):
        out[f"parse_call {stem.upper()}"] = parse(w, (DATA / f"{stem}_call.bin").read_bytes())
    out["reply_getattr"] = lambda: w.reply_getattr(0x1234, ATTR)
    out["reply_access"] = lambda: w.reply_access(0x1234, ATTR, 0x21)
    out["reply_lookup"] = lambda: w.reply_lookup(0x1234, FH, ATTR, ATTR)
    out["reply_lookup_noent"] = lambda: w.reply_lookup_noent(0x1234, ATTR)
    out["reply_read_head"] = lambda: w.reply_read_head(0x1234, ATTR, 114_660, True)
    out["pad"] = lambda: w.pad(114_661)
    segs = segments()

    def feed_segments() -> None:
        r = reader()
        for s in segs:
            r.feed(s)

    per = round(SEGMENT / RECORD)
    out[f"RecordReader.feed 64 KiB, {per} records (per segment)"] = feed_segments
    small = rpc.record_header(len(rec := (DATA / "getattr_call.bin").read_bytes())) + rec
    one = reader()
    out["RecordReader.feed one GETATTR call"] = lambda: one.feed(small)
    return out


def load_native() -> ModuleType | None:
    try:
        from gateway import _fastwire
    except ImportError:
        return None
    return _fastwire


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    native = load_native()
    py = cases(fastwire, lambda: rpc.RecordReader())
    c = None
    if native is not None:
        c = cases(native, lambda: native.RecordReader(rpc.DEFAULT_MAX_RECORD, rpc.RecordError))
    per_segment = len(segments())
    print(f"{'ns per call':<52} {'Python':>9} {'C':>9} {'speed-up':>9}")
    for name, fn in py.items():
        div = per_segment if name.startswith("RecordReader.feed 64") else 1
        if c is not None:
            assert c[name]() == fn() or name.startswith("RecordReader"), name
        t_py = best_ns(fn, args.repeat) / div
        if c is None:
            print(f"{name:<52} {t_py:9.0f} {'-':>9} {'-':>9}")
            continue
        t_c = best_ns(c[name], args.repeat) / div
        print(f"{name:<52} {t_py:9.0f} {t_c:9.0f} {t_py / t_c:8.1f}x")


if __name__ == "__main__":
    main()
