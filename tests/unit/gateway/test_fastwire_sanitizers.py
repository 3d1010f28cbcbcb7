"""``gateway/_fastwire.c`` under AddressSanitizer and UndefinedBehaviorSanitizer.

The test compiles the C with ``-fsanitize=address,undefined -fno-sanitize-recover=all`` into
a temporary directory and runs this file as a script in a child Python (the same
interpreter, ``libasan`` preloaded since the interpreter is not instrumented,
``PYTHONMALLOC=malloc`` so that every object is its own allocation with red zones around it):
a bounded fuzz loop (``fuzz``) of mutated, truncated and random records through
``parse_call``, random streams through ``RecordReader``, the reply builders at their
limits, the guarded reads of mappings (``copy_mapped``, ``mapped_readable``) on files
truncated under them, each result compared with the Python twin's (or the file). Records
are handed over in buffers of exactly their size (ctypes arrays, allocated by malloc), so
reading one byte past the end is an ASan report. Any report, or any difference from the
twin, ends the child with a non-zero status; the test wants status 0 and the child's count
of cases.

Skips when gcc or its libasan is missing, unless ``NFSGW_REQUIRE_NATIVE=1``.
"""

from __future__ import annotations

import ctypes
import os
import random
import struct
import sys
import time
from pathlib import Path
from typing import Any

from tests.sanitizers import cases_run, run_under_sanitizers

ROOT = Path(__file__).resolve().parents[3]
SOURCE = ROOT / "gateway" / "_fastwire.c"
CASES = 200_000
SECONDS = 25.0  # the loop stops here if the machine is slower than planned
MIN_CASES = 20_000


def test_fastwire_under_sanitizers(tmp_path: Path) -> None:
    lines = run_under_sanitizers(
        SOURCE, "_fastwire", __file__, tmp_path, cases=CASES, seconds=SECONDS
    )
    assert cases_run(lines) >= MIN_CASES, lines[-1]


# --------------------------------------------------------------------------- the child


def _exact(data: bytes) -> Any:
    """``data`` in a buffer of exactly its size (over 16 bytes: its own malloc'd block)."""
    return (ctypes.c_ubyte * len(data)).from_buffer_copy(data)


def _outcome(fn: Any, *args: Any) -> object:
    try:
        return ("ok", fn(*args))
    except Exception as e:
        return ("error", type(e), str(e))


class Fuzz:
    def __init__(self, native: Any, seed: int) -> None:
        from gateway import fastwire
        from nfsproto import nfs3, rpc
        from nfsproto.xdr import Writer

        self.c, self.py, self.rpc = native, fastwire, rpc
        self.rng = random.Random(seed)
        self.cases = 0
        rng = self.rng
        self.calls: list[bytes] = []
        for i in range(400):
            proc = (1, 3, 4, 6)[i % 4]
            fh = rng.randbytes(rng.choice([0, 1, 8, 28, 63, 64]))
            cred = rpc.NULL_AUTH
            if i % 3:
                gids = [rng.getrandbits(32) for _ in range(rng.randint(0, 16))]
                name = rng.randbytes(rng.choice([0, 1, 5, 255]))
                cred = rpc.auth_sys(rng.getrandbits(32), rng.getrandbits(32), gids, name)
            args: Any = nfs3.Getattr3Args(fh)
            if proc == 3:
                name = rng.randbytes(rng.choice([1, 2, 3, 4, 100, 254, 255]))
                args = nfs3.Lookup3Args(nfs3.Diropargs3(fh, name))
            elif proc == 4:
                args = nfs3.Access3Args(fh, rng.getrandbits(32))
            elif proc == 6:
                args = nfs3.Read3Args(fh, rng.getrandbits(64), rng.getrandbits(32))
            w = Writer()
            rpc.pack_call(w, rng.getrandbits(32), nfs3.PROGRAM, 3, proc, cred)
            nfs3.PROCS[proc].pack_args(w, args)
            self.calls.append(w.getvalue())

    def parse(self, record: bytes) -> None:
        want = self.py.parse_call(record)
        got = self.c.parse_call(_exact(record))
        if got != want or (want is not None and list(map(type, got)) != list(map(type, want))):
            raise AssertionError(f"parse_call differs on {record.hex()}: {got} != {want}")
        self.cases += 1

    def mutate(self, record: bytes) -> bytes:
        rng = self.rng
        kind = rng.randrange(6)
        if kind == 0:
            return record[: rng.randrange(len(record))]
        b = bytearray(record)
        if kind == 1:
            for _ in range(rng.randint(1, 3)):
                b[rng.randrange(len(b))] ^= rng.randint(1, 255)
        elif kind == 2:
            at = rng.randrange(0, len(b) - 3, 4 if rng.random() < 0.8 else 1)
            edges = (0, 1, 3, 4, 64, 65, 255, 256, 400, 401, 0x7FFFFFFF, 2**32 - 1)
            value = rng.choice(edges) if rng.random() < 0.7 else rng.getrandbits(32)
            b[at : at + 4] = struct.pack(">I", value)
        elif kind == 3:
            b += rng.randbytes(rng.randint(1, 12))
        elif kind == 4:
            return bytes(b[:24]) + rng.randbytes(rng.randrange(600))
        else:
            return rng.randbytes(rng.randrange(120))
        return bytes(b)

    def records(self, n: int) -> None:
        for _ in range(n):
            base = self.rng.choice(self.calls)
            self.parse(base if self.rng.random() < 0.05 else self.mutate(base))

    def stream(self) -> None:
        rng, rpc = self.rng, self.rpc
        out = bytearray()
        for _ in range(rng.randrange(8)):
            rec = rng.randbytes(rng.choice([0, 1, 3, 40, 300, 2000]))
            cuts = sorted(rng.randint(0, len(rec)) for _ in range(rng.randrange(4)))
            bounds = [0, *cuts, len(rec)]
            for i in range(len(bounds) - 1):
                last = rpc.LAST_FRAGMENT if i == len(bounds) - 2 else 0
                out += struct.pack(">I", last | (bounds[i + 1] - bounds[i]))
                out += rec[bounds[i] : bounds[i + 1]]
        if rng.random() < 0.3:
            out += rng.randbytes(rng.randrange(12))
        limit = rng.choice([rpc.DEFAULT_MAX_RECORD, -1, 0, 1, 300, 2000, rng.randrange(3000)])
        py, c = rpc.RecordReader(limit), self.c.RecordReader(limit, rpc.RecordError)
        cuts = sorted(rng.randint(0, len(out)) for _ in range(rng.randrange(10)))
        for a, b in zip([0, *cuts], [*cuts, len(out)], strict=True):
            piece = bytes(out[a:b])
            got, want = self._feed(c, _exact(piece)), self._feed(py, piece)
            if got != want:
                raise AssertionError(f"RecordReader differs on {out.hex()} at {a}:{b}")
            self.cases += 1

    @staticmethod
    def _feed(reader: Any, data: Any) -> object:
        try:
            got = reader.feed(data)
        except Exception as e:
            return ("error", type(e), str(e), reader.pending_bytes())
        return ("ok", [(type(r), bytes(r)) for r in got], reader.pending_bytes())

    def replies(self) -> None:
        ints = (0, 1, 2**32 - 1, 2**32, -1, 2**64, 0x7FFFFF00, 0x7FFFFF01, 1.5, None)
        ok = bytes(range(84))
        for n in range(0, 100):
            b = _exact(bytes(range(n)))
            for v in ints:
                for name, args in (
                    ("reply_getattr", (v, b)),
                    ("reply_access", (v, b, v)),
                    ("reply_lookup", (v, b, ok, ok)),
                    ("reply_lookup", (v, ok[:64], b, ok)),
                    ("reply_lookup", (v, ok[:64], ok, b)),
                    ("reply_lookup_noent", (v, b)),
                    ("reply_read_head", (5, b, v, n & 1)),
                    ("reply_read_head", (v, ok, n, v)),
                    ("pad", (v,)),
                ):
                    py_args = tuple(bytes(a) if isinstance(a, ctypes.Array) else a for a in args)
                    got = _outcome(getattr(self.c, name), *args)
                    want = _outcome(getattr(self.py, name), *py_args)
                    if got != want:
                        raise AssertionError(f"{name}{py_args}: {got} != {want}")
                    self.cases += 1

    def mappings(self, directory: str) -> None:
        """``Mapping`` of files of many sizes against ``mmap.mmap``: the same bytes through
        memoryview slices that outlive the object, bad arguments refused the same way."""
        import mmap

        path = os.path.join(directory, "mapped")
        for size in (1, 2, 4095, 4096, 4097, 65_536, 110_000, 1 << 20):
            data = self.rng.randbytes(size)
            with open(path, "wb") as f:
                f.write(data)
            fd = os.open(path, os.O_RDONLY)
            try:
                for n in (1, size // 2 or 1, size):
                    m = self.c.Mapping(fd, n)
                    view = memoryview(m)[self.rng.randrange(n) :]
                    del m  # the view keeps the mapping
                    ref = mmap.mmap(fd, n, mmap.MAP_SHARED, mmap.PROT_READ)
                    if bytes(view) != ref[n - len(view) :] or not view.readonly:
                        raise AssertionError(f"Mapping({size}, {n}) differs")
                    ref.close()
                    self.cases += 1
                for off in range(0, size, mmap.PAGESIZE * 3):  # a range from a page offset
                    n = self.rng.randrange(1, size - off + 1)
                    view = memoryview(self.c.Mapping(fd, n, off))
                    if bytes(view) != data[off : off + n]:
                        raise AssertionError(f"Mapping({size}, {n}, {off}) differs")
                    self.cases += 1
                self.guarded(fd, path, size, data)
                fd = os.open(path, os.O_RDONLY)
                bad_args = ((fd, 0), (fd, -1), (fd, size + 1), (-1, 1), (fd, 1, -4096))
                for bad in (*bad_args, (fd, size, mmap.PAGESIZE), (fd, 1, 1)):
                    try:
                        self.c.Mapping(*bad)
                    except (ValueError, OSError):
                        self.cases += 1
                    else:
                        raise AssertionError(f"Mapping{bad} accepted")
            finally:
                os.close(fd)
            os.unlink(path)

    def guarded(self, fd: int, path: str, size: int, data: bytes) -> None:
        """``copy_mapped`` and ``mapped_readable`` on random ranges of a mapping (the same
        bytes as the file; readable), then with the file truncated under it at a random
        point (ranges before it still read, ranges reaching past it None / False), then
        rewritten to its size (readable again). Closes ``fd``."""
        import mmap

        m = memoryview(self.c.Mapping(fd, size))
        os.close(fd)
        for _ in range(20):
            lo = self.rng.randrange(size)
            hi = self.rng.randint(lo + 1, size)
            if self.c.copy_mapped(m[lo:hi]) != data[lo:hi] or not self.c.mapped_readable(m[lo:hi]):
                raise AssertionError(f"copy_mapped/mapped_readable of [{lo}:{hi}] differs")
            self.cases += 1
        cut = self.rng.randrange(size)
        os.truncate(path, cut)
        ok_end = cut - cut % mmap.PAGESIZE  # whole pages before the cut stay readable
        for _ in range(20):
            lo = self.rng.randrange(size)
            hi = self.rng.randint(lo + 1, size)
            got, readable = self.c.copy_mapped(m[lo:hi]), self.c.mapped_readable(m[lo:hi])
            past = (
                -(-hi // mmap.PAGESIZE) * mmap.PAGESIZE > -(-cut // mmap.PAGESIZE) * mmap.PAGESIZE
            )
            if past and (got is not None or readable):
                raise AssertionError(f"[{lo}:{hi}] past a cut at {cut} read as {readable}")
            if hi <= ok_end and (got != data[lo:hi] or not readable):
                raise AssertionError(f"[{lo}:{hi}] before a cut at {cut} not read")
            self.cases += 1
        with open(path, "wb") as f:
            f.write(data)
        if self.c.copy_mapped(m) is None or not self.c.mapped_readable(m):
            raise AssertionError("a mapping of a file restored to its size is not readable")
        self.cases += 1

    def body_buffers(self) -> None:
        """``BodyBuffer`` of many sizes filled through memoryview slices in random pieces (as
        ``recv_into`` does), views outliving the object: the bytes written, nothing past the
        end; sealed: no buffer exported again; bad sizes refused."""
        for size in (1, 2, 4095, 4096, 4097, 65_536, 110_000, (8 << 20) + 3):
            data = self.rng.randbytes(size)
            b = self.c.BodyBuffer(size)
            whole = memoryview(b)
            if whole.readonly or len(whole) != size or len(b) != size:
                raise AssertionError(f"BodyBuffer({size}): not a writable buffer of its size")
            pos = 0
            while pos < size:
                view = whole[pos:]
                n = min(len(view), self.rng.randint(1, 70_000))
                view[:n] = data[pos : pos + n]
                pos += n
                del view
            del whole
            out = b.seal()
            try:
                memoryview(b)
            except BufferError:
                pass
            else:
                raise AssertionError("a sealed BodyBuffer exported a buffer")
            del b  # the bytes outlive it
            if type(out) is not bytes or out != data:
                raise AssertionError(f"BodyBuffer({size}) differs")
            self.cases += 1
        for bad in (0, -1):
            try:
                self.c.BodyBuffer(bad)
            except ValueError:
                self.cases += 1
            else:
                raise AssertionError(f"BodyBuffer({bad}) accepted")


def fuzz(so: str, cases: int, seconds: float, seed: int) -> int:
    import importlib.util

    maps = Path("/proc/self/maps").read_text()
    assert "libasan" in maps, "libasan is not loaded"
    spec = importlib.util.spec_from_file_location("gateway._fastwire", so)
    assert spec is not None and spec.loader is not None
    native = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(native)
    assert native.__file__ == so
    print(f"seed {seed} (rerun: python {__file__} SO CASES SECONDS SEED)", flush=True)
    f = Fuzz(native, seed)
    f.replies()
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        f.mappings(d)
    f.body_buffers()
    deadline = time.monotonic() + seconds
    while f.cases < cases and time.monotonic() < deadline:
        f.records(2000)
        for _ in range(20):
            f.stream()
    return f.cases


if __name__ == "__main__":
    seed = int(sys.argv[4]) if len(sys.argv) > 4 else random.getrandbits(32)
    n = fuzz(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), seed)
    print(f"fuzz ran {n} cases")
