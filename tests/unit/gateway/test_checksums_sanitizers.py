"""``gateway/_checksums.c`` under AddressSanitizer and UndefinedBehaviorSanitizer.

As test_fastwire_sanitizers.py does for the fast path: the test compiles the C with
``-fsanitize=address,undefined -fno-sanitize-recover=all`` into a temporary directory and runs
this file as a script in a child Python (``libasan`` preloaded, ``PYTHONMALLOC=malloc``), once
per engine: VPCLMULQDQ (AVX-512) and PCLMULQDQ where the CPU has them
(``NFSGW_CHECKSUMS_NO_AVX512=1`` selects the latter), and the portable tables
(``NFSGW_CHECKSUMS_NO_CLMUL=1``). The child's bounded fuzz loop (``fuzz``) hands the three CRCs
random buffers of every length class (0..300, around the 16-byte lanes and the 128-byte CLMUL
threshold, a few kB, past the 32 kB GIL release) in buffers of exactly their size (ctypes
arrays, malloc'd: one byte read past the end is an ASan report), at odd offsets through
memoryviews, with random starting CRCs, and compares each value with the Python reference
(zlib for CRC32); large buffers are checked split at random points, each piece through the
C, against the whole. Any report or difference ends the child with a non-zero status.

Skips when gcc or its libasan is missing, unless ``NFSGW_REQUIRE_NATIVE=1``.
"""

from __future__ import annotations

import random
import sys
import time
import zlib
from pathlib import Path
from typing import Any

import pytest

from tests.sanitizers import cases_run, exact, run_under_sanitizers

ROOT = Path(__file__).resolve().parents[3]
SOURCE = ROOT / "gateway" / "_checksums.c"
CASES = 20_000
SECONDS = 8.0  # per engine: the loop stops here if the machine is slower than planned
MIN_CASES = 2_000


@pytest.mark.parametrize("engine", ["vpclmulqdq", "pclmul", "tables"])
def test_checksums_under_sanitizers(tmp_path: Path, engine: str) -> None:
    env: dict[str, str | None] = {
        "NFSGW_CHECKSUMS_NO_CLMUL": None,
        "NFSGW_CHECKSUMS_NO_AVX512": None,
    }
    if engine == "tables":
        env["NFSGW_CHECKSUMS_NO_CLMUL"] = "1"
    elif engine == "pclmul":
        env["NFSGW_CHECKSUMS_NO_AVX512"] = "1"
    lines = run_under_sanitizers(
        SOURCE, "_checksums", __file__, tmp_path, cases=CASES, seconds=SECONDS, env=env
    )
    if engine != "tables" and f"engine {engine}" not in lines:
        pytest.skip(f"this CPU has no {engine.upper()} ({lines[:1]})")
    assert f"engine {engine}" in lines, lines
    assert cases_run(lines) >= MIN_CASES, lines[-1]


# --------------------------------------------------------------------------- the child


_exact = exact


class Fuzz:
    def __init__(self, native: Any, seed: int) -> None:
        from gateway.backend import checksums

        self.c = native
        self.py = {
            "crc32": zlib.crc32,
            "crc32c": checksums.py_crc32c,
            "crc64nvme": checksums.py_crc64nvme,
        }
        self.width = {"crc32": 32, "crc32c": 32, "crc64nvme": 64}
        self.rng = random.Random(seed)
        self.cases = 0

    def length(self) -> int:
        rng = self.rng
        kind = rng.randrange(5)
        if kind == 0:
            return rng.randrange(301)
        if kind == 1:  # around lanes (16), registers (64), rounds and the CLMUL thresholds
            return rng.choice([16, 64, 128, 256, 512, 1024]) * rng.randint(1, 4) + rng.randint(
                -3, 3
            )
        if kind == 2:
            return rng.randrange(301, 5000)
        return rng.randrange(5000, 40_000) if kind == 3 else rng.randrange(32_760, 32_780)

    def one(self) -> None:
        rng = self.rng
        n = max(0, self.length())
        data = rng.randbytes(n)
        name = rng.choice(("crc32", "crc32c", "crc64nvme"))
        start = rng.getrandbits(self.width[name]) if rng.random() < 0.5 else 0
        fn = getattr(self.c, name)
        if n <= 5000 or name == "crc32":
            want = self.py[name](data, start)
        else:  # the Python twin is ~60 ns a byte: check big ones against pieces
            cut = rng.randrange(n + 1)
            want = fn(_exact(data[cut:]), fn(_exact(data[:cut]), start))
            want_py = self.py[name](data[:300], start)
            if fn(_exact(data[:300]), start) != want_py:
                raise AssertionError(f"{name} differs on {data[:300].hex()} from {start}")
        got = fn(_exact(data), start)
        if got != want:
            raise AssertionError(f"{name}({n} bytes, {start}) = {got:#x}, not {want:#x}")
        off = rng.randrange(1, 16)
        padded = _exact(rng.randbytes(off) + data + rng.randbytes(rng.randrange(4)))
        view = memoryview(padded).cast("B")[off : off + n]
        if fn(view, start) != want:
            raise AssertionError(f"{name} differs at offset {off} on {n} bytes")
        self.cases += 2


def fuzz(so: str, cases: int, seconds: float, seed: int) -> int:
    import importlib.util

    maps = Path("/proc/self/maps").read_text()
    assert "libasan" in maps, "libasan is not loaded"
    spec = importlib.util.spec_from_file_location("gateway._checksums", so)
    assert spec is not None and spec.loader is not None
    native = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(native)
    assert native.__file__ == so
    print(f"engine {native.engine}", flush=True)
    print(f"seed {seed} (rerun: python {__file__} SO CASES SECONDS SEED)", flush=True)
    f = Fuzz(native, seed)
    deadline = time.monotonic() + seconds
    while f.cases < cases and time.monotonic() < deadline:
        for _ in range(50):
            f.one()
    return f.cases


if __name__ == "__main__":
    seed = int(sys.argv[4]) if len(sys.argv) > 4 else random.getrandbits(32)
    n = fuzz(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), seed)
    print(f"fuzz ran {n} cases")
