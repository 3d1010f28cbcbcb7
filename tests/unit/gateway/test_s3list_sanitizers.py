"""``gateway/_s3list.c`` under AddressSanitizer and UndefinedBehaviorSanitizer.

As test_fastwire_sanitizers.py does for the fast path (and with its helpers): the test
compiles the C with ``-fsanitize=address,undefined -fno-sanitize-recover=all`` into a
temporary directory and runs this file as a script in a child Python (``libasan`` preloaded,
``PYTHONMALLOC=malloc``). The child registers that build as ``gateway._s3list`` (so
``s3wire.parse_list`` runs it too) and runs a bounded fuzz loop (``fuzz``): generated pages
(test_s3list.Pages, 0 to 1,000 entries), their prefixes cut at random points, byte flips and
splices, and random bytes, each handed to the C in a buffer of exactly its size (a ctypes
array, malloc'd: one byte read past the end is an ASan report) and compared with the
ElementTree reference (test_s3list.check). Any report or difference ends the child with a
non-zero status; the test wants status 0 and the child's count of cases.

Skips when gcc or its libasan is missing, unless ``NFSGW_REQUIRE_NATIVE=1``.
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

from tests.sanitizers import cases_run, run_under_sanitizers
from tests.sanitizers import exact as _exact

ROOT = Path(__file__).resolve().parents[3]
SOURCE = ROOT / "gateway" / "_s3list.c"
CASES = 30_000
SECONDS = 15.0  # the loop stops here if the machine is slower than planned
MIN_CASES = 3_000


def test_s3list_under_sanitizers(tmp_path: Path) -> None:
    lines = run_under_sanitizers(
        SOURCE,
        "_s3list",
        __file__,
        tmp_path,
        cases=CASES,
        seconds=SECONDS,
        env={"NFSGW_PURE_PYTHON": None},
    )
    assert cases_run(lines) >= MIN_CASES, lines[-1]


# --------------------------------------------------------------------------- the child


def mutate(rng: random.Random, body: bytes, others: list[bytes]) -> bytes:
    kind = rng.randrange(5)
    if kind == 0 or not body:
        return body[: rng.randrange(len(body) + 1)]
    b = bytearray(body)
    if kind == 1:
        for _ in range(rng.randint(1, 4)):
            b[rng.randrange(len(b))] = rng.choice(b"<>/&;#x\"'=?! \t\r\n\x00\x80\xff]%+")
    elif kind == 2:
        for _ in range(rng.randint(1, 3)):
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
    elif kind == 3:
        other = rng.choice(others)
        at, to = rng.randrange(len(b) + 1), rng.randrange(len(other) + 1)
        b = b[:at] + other[to : to + rng.randrange(200)] + b[at:]
    else:
        return rng.randbytes(rng.randrange(64))
    return bytes(b)


def fuzz(so: str, cases: int, seconds: float, seed: int) -> int:
    import importlib.util

    maps = Path("/proc/self/maps").read_text()
    assert "libasan" in maps, "libasan is not loaded"
    spec = importlib.util.spec_from_file_location("gateway._s3list", so)
    assert spec is not None and spec.loader is not None
    native = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(native)
    assert native.__file__ == so
    sys.modules["gateway._s3list"] = native  # what s3wire.compiled() imports
    from gateway.backend import s3wire
    from tests.unit.gateway.test_s3list import AWS_PAGE, NOT_UNDERSTOOD, SEAWEED_PAGES, Pages, check

    assert s3wire.compiled() is native
    print(f"seed {seed} (rerun: python {__file__} SO CASES SECONDS SEED)", flush=True)
    rng = random.Random(seed)
    pages = Pages(rng)
    n = 0
    for body in [*SEAWEED_PAGES, AWS_PAGE, *NOT_UNDERSTOOD, pages.page(0), pages.page(1000)]:
        check(native, body, buffer=_exact(body) if body else body)
        n += 1
    bodies = [pages.page() for _ in range(50)] + SEAWEED_PAGES + [AWS_PAGE]
    deadline = time.monotonic() + seconds
    while n < cases and time.monotonic() < deadline:
        for _ in range(200):
            body = rng.choice(bodies)
            if rng.random() < 0.9:
                body = mutate(rng, body, bodies)
            check(native, body, buffer=_exact(body) if body else body)
            n += 1
        bodies[rng.randrange(len(bodies))] = pages.page()
    return n


if __name__ == "__main__":
    seed = int(sys.argv[4]) if len(sys.argv) > 4 else random.getrandbits(32)
    n = fuzz(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), seed)
    print(f"fuzz ran {n} cases")
