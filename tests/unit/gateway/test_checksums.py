"""The CRCs S3 stores, the compiled twin (``gateway._checksums``) against the Python reference
(``gateway.backend.checksums``): published check values, every length 0..300, random buffers,
memoryview slices at odd offsets, buffers past the GIL-release and lane thresholds, incremental
use, and the portable table engine (``NFSGW_CHECKSUMS_NO_CLMUL=1``, in a child) as well as the
PCLMULQDQ one. The C under ASan/UBSan is test_checksums_sanitizers.py.

Skips the compiled side when the extension is not built, unless ``NFSGW_REQUIRE_NATIVE=1``.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import zlib
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from gateway.backend import checksums
from gateway.backend.checksums import py_crc32, py_crc32c, py_crc64nvme

ROOT = Path(__file__).resolve().parents[3]
Crc = Callable[..., int]
NAMES = ("crc32", "crc32c", "crc64nvme")
PY: dict[str, Crc] = {"crc32": py_crc32, "crc32c": py_crc32c, "crc64nvme": py_crc64nvme}

# The CRC catalogue's check values (CRC of b"123456789"; CRC64NVME's is also AWS's documented
# one), RFC 3720 B.4's patterns for CRC32C, and the same patterns through CRC64NVME as an
# independent implementation computes them (awscrt 0.38's awscrt.checksums.crc64nvme).
CHECK = {"crc32": 0xCBF43926, "crc32c": 0xE3069283, "crc64nvme": 0xAE8B14860A799888}
VECTORS = {
    "crc32c": [
        (bytes(32), 0x8A9136AA),  # RFC 3720 B.4
        (b"\xff" * 32, 0x62A8AB43),
        (bytes(range(32)), 0x46DD794E),
        (bytes(range(31, -1, -1)), 0x113FDB5C),
    ],
    "crc64nvme": [
        (bytes(32), 0xCF3473434D4ECF3B),
        (b"\xff" * 32, 0xA0A06974C34D63C4),
        (bytes(range(32)), 0xB9D9D4A8492CBD7F),
        (bytes(range(31, -1, -1)), 0x17115A712025F5AF),
    ],
}


def native() -> ModuleType:
    c = checksums.compiled()
    if c is None:
        if os.environ.get("NFSGW_REQUIRE_NATIVE") == "1":
            pytest.fail("NFSGW_REQUIRE_NATIVE=1 but gateway._checksums is not built")
        pytest.skip("gateway._checksums is not built (or NFSGW_PURE_PYTHON is set)")
    return c


@pytest.fixture(params=["python", "c"])
def crcs(request: pytest.FixtureRequest) -> dict[str, Crc]:
    if request.param == "python":
        return PY
    c = native()
    return {name: getattr(c, name) for name in NAMES}


@pytest.mark.parametrize("name", NAMES)
def test_check_values_and_empty_input(crcs: dict[str, Crc], name: str) -> None:
    fn = crcs[name]
    assert fn(b"123456789") == CHECK[name]
    assert fn(b"") == 0
    assert fn(b"", 12345) == 12345
    for data, want in VECTORS.get(name, []):
        assert fn(data) == want, data.hex()
    assert fn(b"6789", fn(b"12345")) == CHECK[name]
    assert fn(data=b"123456789", crc=0) == CHECK[name]


def test_crc32_is_zlibs(crcs: dict[str, Crc]) -> None:
    rng = random.Random(32)
    for n in (0, 1, 7, 64, 127, 128, 129, 1000, 70_000):
        data = rng.randbytes(n)
        assert crcs["crc32"](data) == zlib.crc32(data)
        assert crcs["crc32"](data, 0xDEADBEEF) == zlib.crc32(data, 0xDEADBEEF)


@pytest.mark.parametrize("name", NAMES)
def test_the_twins_agree_on_every_length_to_300_and_random_buffers(name: str) -> None:
    c, py = getattr(native(), name), PY[name]
    rng = random.Random(300)
    for n in range(301):
        data = rng.randbytes(n)
        assert c(data) == py(data), n
        assert c(bytes(n)) == py(bytes(n)), n
        assert c(b"\xff" * n) == py(b"\xff" * n), n
    for _ in range(200):
        data = rng.randbytes(rng.randrange(5000))
        start = rng.getrandbits(32 if name != "crc64nvme" else 64)
        assert c(data, start) == py(data, start)


@pytest.mark.parametrize("name", NAMES)
def test_memoryview_slices_at_odd_offsets_and_bytearrays(name: str) -> None:
    c, py = getattr(native(), name), PY[name]
    rng = random.Random(7)
    big = rng.randbytes(4096)
    mv = memoryview(big)
    for start in (1, 3, 5, 7, 9, 15, 17):
        for length in (0, 1, 15, 16, 63, 64, 127, 128, 129, 255, 1000, 1024, 1600, 4096 - 17):
            piece = mv[start : start + length]
            assert c(piece) == py(bytes(piece)), (start, length)
    assert c(bytearray(big)) == py(big)
    with pytest.raises((TypeError, BufferError)):
        c(mv[::2])  # not one contiguous run of bytes


@pytest.mark.parametrize("name", NAMES)
def test_large_buffers_and_incremental_use(name: str) -> None:
    """Past the GIL release (32 kB) and many lane rounds; split anywhere, the same value."""
    c, py = getattr(native(), name), PY[name]
    rng = random.Random(11)
    data = rng.randbytes(300_001)
    whole = py(data)
    assert c(data) == whole
    for cut in (0, 1, 63, 64, 65, 1023, 1024, 32_767, 32_768, 150_000, 300_000, 300_001):
        assert c(data[cut:], c(data[:cut])) == whole, cut
    big = rng.randbytes(8 << 20)
    if name == "crc32":
        assert c(big) == zlib.crc32(big)
    else:  # the Python twin takes seconds on 8 MB: compare pieces joined through the C
        assert c(big) == c(big[4_000_001:], c(big[:4_000_001]))


@pytest.mark.parametrize("name", NAMES)
def test_bad_arguments_fail_alike(name: str) -> None:
    c, py = getattr(native(), name), PY[name]
    width = 64 if name == "crc64nvme" else 32
    for bad in (-1, 1 << width):
        for fn in (c, py):
            with pytest.raises(ValueError):
                fn(b"x", bad)
    for fn in (c, py):
        with pytest.raises(TypeError):
            fn(b"x", 1.5)
        with pytest.raises(TypeError):
            fn("text")
    assert c(b"x", (1 << width) - 1) == py(b"x", (1 << width) - 1)


@pytest.mark.parametrize(
    ("variable", "engine"),
    [("NFSGW_CHECKSUMS_NO_CLMUL", "tables"), ("NFSGW_CHECKSUMS_NO_AVX512", "pclmul")],
)
def test_the_other_engines_agree_too(variable: str, engine: str) -> None:
    """The portable slicing-by-8 engine (without PCLMULQDQ) and the 128-bit PCLMULQDQ one
    (without AVX-512), chosen at import: run in a child with each forced."""
    if native().engine == "tables" and engine != "tables":
        pytest.skip("this CPU has no PCLMULQDQ")
    code = (
        "import random, sys\n"
        "from gateway import _checksums as c\n"
        "from gateway.backend import checksums as p\n"
        f"assert c.engine == {engine!r}, c.engine\n"
        "rng = random.Random(5)\n"
        "for n in [*range(300), 1000, 1023, 1024, 1025, 4097, 40000]:\n"
        "    d = rng.randbytes(n)\n"
        "    for name in ('crc32', 'crc32c', 'crc64nvme'):\n"
        "        assert getattr(c, name)(d) == getattr(p, 'py_' + name)(d), (name, n)\n"
        "print('ok')\n"
    )
    env = {**os.environ, variable: "1", "PYTHONPATH": str(ROOT)}
    run = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True
    )
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-3000:]


def test_the_selected_twin() -> None:
    """``checksums.crc*`` use the compiled twin when built; both give the same values."""
    for name in NAMES:
        assert getattr(checksums, name)(b"123456789") == CHECK[name]
    if checksums.compiled() is not None:
        assert checksums.fast_crcs()
