"""Body checksums, sans-I/O: which checksum a GET reply lets the S3 store verify a
whole-object body against (``body_checksum``), and computing it (``Checksum.compute``,
``digest``, the CRCs ``crc32``, ``crc32c``, ``crc64nvme``), and ``page_digest``, which
tells a listing page from the previous one.

Owns: the CRCs S3 stores, twice: compiled (``gateway._checksums``, C, built by the package's
own build) and the pure-Python reference here (``py_crc32c``, ``py_crc64nvme``; CRC32 is
zlib's), which must give the same values for the same bytes (tests/unit/gateway/
test_checksums.py, and the C under ASan/UBSan in test_checksums_sanitizers.py). The compiled
ones are used unless ``NFSGW_PURE_PYTHON=1`` or the extension was not built (``compiled``).
At start the server checks the compiled engine in use (VPCLMULQDQ, PCLMULQDQ or the tables:
``_checksums.engines``) against the reference on fixed vectors (``self_check``: lengths
around every loop's boundaries and up to 9 KiB, at several alignments); on a mismatch it
falls back to the next engine, and past the last to the reference itself, and says so.
Must not: decide when to verify, do I/O, log (``s3.py`` and the server do those).

What S3 keeps (``x-amz-checksum-<algorithm>`` on a GET with ``x-amz-checksum-mode:
ENABLED``): CRC32, CRC32C, CRC64NVME (what Amazon S3 stores for every object uploaded
without a checksum since December 2024), SHA-1, SHA-256. ``x-amz-checksum-type: FULL_OBJECT``
(a plain value) is a checksum of the whole body, also for a multipart object.
``COMPOSITE`` (``<base64>-<N>``) is the checksum of the N parts' binary checksums, one after
another: with N = 1 it is the checksum of the body's checksum; with N > 1 it needs the parts'
boundaries, which a GET does not carry: ``Checksum.parts``, and the S3 store asks for the
parts' sizes (GetObjectAttributes ``ObjectParts``, once per object version) and verifies it
(``Checksum.compute`` with ``part_sizes``).

Cost per 110 kB body (docs/benchmarks.md, "Checksums in C"): the compiled CRCs ~3 µs each
(VPCLMULQDQ; ~8 µs with PCLMULQDQ, ~56 µs on the portable tables), zlib's CRC32 17-34 µs,
SHA-1 ~56 µs, SHA-256 ~60 µs, MD5 ~140 µs, the Python CRCs 7-15 ms.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import importlib
import os
import random
import re
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Final

Buffer = bytes | bytearray | memoryview  # what the CRCs read

# ------------------------------------------------------------------- the Python reference


def _table(poly: int) -> tuple[int, ...]:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ poly if c & 1 else c >> 1
        table.append(c)
    return tuple(table)


_CRC32C_TABLE: Final = _table(0x82F63B78)  # Castagnoli, reflected (RFC 3720 B.4)
_CRC64NVME_TABLE: Final = _table(0x9A6C9329AC4BC9B5)  # NVM Express 2.0 §5.2.1.3.4, reflected
_ONES32: Final = 0xFFFFFFFF
_ONES64: Final = 0xFFFFFFFFFFFFFFFF


def _check(name: str, crc: int, width: int) -> None:
    if not isinstance(crc, int):
        raise TypeError(f"{name}() crc must be an int")
    if not 0 <= crc < 1 << width:
        raise ValueError(f"{name}() crc must be in [0, 2**{width})")


def py_crc32c(data: Buffer, crc: int = 0) -> int:
    """CRC-32C (Castagnoli), continuing from ``crc`` (a previous result, as zlib.crc32):
    byte at a time from a table, ~60 ns a byte."""
    _check("crc32c", crc, 32)
    r = crc ^ _ONES32
    table = _CRC32C_TABLE
    for b in memoryview(data).cast("B"):
        r = table[(r ^ b) & 0xFF] ^ (r >> 8)
    return r ^ _ONES32


def py_crc64nvme(data: Buffer, crc: int = 0) -> int:
    """CRC-64/NVME (reflected 0x9a6c9329ac4bc9b5, init and xorout all ones), continuing from
    ``crc``: byte at a time from a table, ~60 ns a byte."""
    _check("crc64nvme", crc, 64)
    r = crc ^ _ONES64
    table = _CRC64NVME_TABLE
    for b in memoryview(data).cast("B"):
        r = table[(r ^ b) & 0xFF] ^ (r >> 8)
    return r ^ _ONES64


def py_crc32(data: Buffer, crc: int = 0) -> int:
    """CRC-32 (zlib's), with the compiled twin's checks on ``crc``."""
    _check("crc32", crc, 32)
    return zlib.crc32(data, crc)


# ------------------------------------------------------------------------- which twin


# What is lost without the compiled CRCs (not built: no C compiler at install; or refused by
# ``self_check``), as the start-up warning says it (``body_checksum``: CRC32C and CRC64NVME
# are then left to ``python_crcs``).
WITHOUT_COMPILED: Final = (
    "stored CRC64NVME and CRC32C checksums are then not verified on whole-object reads (most "
    "objects Amazon S3 holds carry only a CRC64NVME); stored CRC32, SHA-1 and SHA-256 ones "
    "still are; [s3] verify_crc32c = true verifies CRC64NVME and CRC32C in Python, at ~7 ms "
    "of CPU per 110 kB"
)
_refused: list[str] = []  # every compiled engine failed the self-check: the reference serves


@functools.cache
def compiled() -> ModuleType | None:
    """``gateway._checksums``, or None: ``NFSGW_PURE_PYTHON=1`` asks for the Python twins, or
    the extension was not built, or none of its engines passed ``self_check``."""
    if os.environ.get("NFSGW_PURE_PYTHON", "") not in ("", "0") or _refused:
        return None
    try:
        return importlib.import_module("gateway._checksums")
    except ImportError:
        return None


# -------------------------------------------------------------------- the self-check

# Lengths either side of every loop's boundary in the C (the tables' 8 bytes, CLMUL's 128 and
# 16-byte lanes, VPCLMULQDQ's 1024 and 512-byte rounds, 64-byte blocks), and several rounds.
CHECK_LENGTHS: Final = (
    *(0, 1, 7, 8, 9, 15, 16, 17, 63, 64, 65, 127, 128, 129, 143, 255, 256, 511, 512, 513),
    *(1023, 1024, 1025, 1088, 1535, 1536, 2047, 2048, 4095, 4096, 4097, 8191, 8192, 9217),
)
CHECK_OFFSETS: Final = (0, 1, 3, 8, 13)  # where in a buffer each vector starts
CHECKED: Final = ("crc32", "crc32c", "crc64nvme")
_REFERENCE: Final[dict[str, Callable[[Buffer, int], int]]] = {
    "crc32": py_crc32,
    "crc32c": py_crc32c,
    "crc64nvme": py_crc64nvme,
}


@dataclass(frozen=True, slots=True)
class EngineCheck:
    """What ``self_check`` found: ``engine`` computes the CRCs now ("python": the reference,
    the compiled ones being off or all wrong); ``failed`` are the engines that gave a wrong
    value, in the order tried, with what was wrong (``mismatch``: the first one)."""

    engine: str
    failed: tuple[str, ...] = ()
    mismatch: str = ""


@functools.cache
def _vectors() -> tuple[tuple[memoryview, int, dict[str, int]], ...]:
    """The fixed vectors (random bytes from a fixed seed, each at every offset of
    ``CHECK_OFFSETS`` into a larger buffer), a starting CRC for each (0, or a previous
    result), and the reference's values: ~20 ms of Python, once a process."""
    rng = random.Random(0x6E667367)
    buf = memoryview(rng.randbytes(max(CHECK_LENGTHS) + max(CHECK_OFFSETS) + 16))
    out = []
    for i, n in enumerate(CHECK_LENGTHS):
        off = CHECK_OFFSETS[i % len(CHECK_OFFSETS)]
        view = buf[off : off + n]
        start = 0 if i % 2 == 0 else 0x5A5A5A5A
        out.append((view, start, {a: _REFERENCE[a](view, start) for a in CHECKED}))
    return tuple(out)


def _computed(c: ModuleType, algorithm: str, data: Buffer, crc: int) -> int:
    """``algorithm`` over ``data`` from ``crc`` by ``c``'s engine in use (a test's hook)."""
    out: int = getattr(c, algorithm)(data, crc)
    return out


def _disagreement(c: ModuleType) -> str | None:
    for view, start, want in _vectors():
        for algorithm in CHECKED:
            got = _computed(c, algorithm, view, start)
            if got != want[algorithm]:
                return (
                    f"{algorithm} of {len(view)} bytes: {got:#x}, the reference "
                    f"{want[algorithm]:#x}"
                )
    return None


def self_check() -> EngineCheck:
    """Check the compiled engine in use against the reference on the fixed vectors; on a
    mismatch, the next engine this CPU runs (``_checksums.engines``), and past the last
    the reference itself (``compiled`` returns None from then on). What it found."""
    c = compiled()
    if c is None:
        return EngineCheck("python", tuple(_refused))
    engines: tuple[str, ...] = c.engines
    first = engines.index(c.engine) if c.engine in engines else 0
    failed: list[str] = []
    mismatch = ""
    for name in engines[first:]:
        c.use_engine(name)
        why = _disagreement(c)
        if why is None:
            return EngineCheck(name, tuple(failed), mismatch)
        failed.append(name)
        mismatch = mismatch or f"{name}: {why}"
    _refused.extend(failed)
    compiled.cache_clear()
    return EngineCheck("python", tuple(failed), mismatch)


def compiled_missing() -> bool:
    """Whether the compiled CRCs are missing for a reason other than ``NFSGW_PURE_PYTHON``
    (not built, or every engine refused by ``self_check``): what the start-up warning says."""
    return compiled() is None and os.environ.get("NFSGW_PURE_PYTHON", "") in ("", "0")


def fast_crcs() -> bool:
    """Whether CRC32C and CRC64NVME cost microseconds (compiled) rather than milliseconds."""
    return compiled() is not None


def crc32(data: Buffer, crc: int = 0) -> int:
    c = compiled()
    if c is None:
        return zlib.crc32(data, crc)
    out: int = c.crc32(data, crc)
    return out


def crc32c(data: Buffer, crc: int = 0) -> int:
    c = compiled()
    if c is None:
        return py_crc32c(data, crc)
    out: int = c.crc32c(data, crc)
    return out


def crc64nvme(data: Buffer, crc: int = 0) -> int:
    c = compiled()
    if c is None:
        return py_crc64nvme(data, crc)
    out: int = c.crc64nvme(data, crc)
    return out


def page_digest(data: Buffer) -> bytes:
    """A short digest that tells two reply bodies apart (a listing page against the same page
    of the previous listing, ``s3wire.list_reply``): the length and a CRC-64/NVME (compiled,
    ~8 µs per 300 kB page), or without the compiled CRCs zlib's CRC-32 and Adler-32 (64 bits
    as well, ~100 µs; the Python CRC-64 would cost ~20 ms). The first byte names the form:
    digests from the two never compare equal. Equal digests of different bodies take a
    change made to collide with 64 bits of CRC, not chance (2**-64 a page)."""
    n = memoryview(data).nbytes
    c = compiled()
    if c is not None:
        crc: int = c.crc64nvme(data, 0)
        return b"\x01" + n.to_bytes(8, "big") + crc.to_bytes(8, "big")
    return (
        b"\x02"
        + n.to_bytes(8, "big")
        + zlib.crc32(data).to_bytes(4, "big")
        + zlib.adler32(data).to_bytes(4, "big")
    )


# ------------------------------------------------------------------------ what to verify

CRCS: Final = ("crc64nvme", "crc32c", "crc32")
HASHES: Final = ("sha1", "sha256")
PYTHON_CRCS: Final = frozenset({"crc32c", "crc64nvme"})  # ~7 ms per 110 kB without the C
_PLAIN_MD5 = re.compile(r"^[0-9a-fA-F]{32}$")
_CRC_FNS: Final[dict[str, tuple[Callable[[Buffer, int], int], int]]] = {
    "crc32": (crc32, 4),
    "crc32c": (crc32c, 4),
    "crc64nvme": (crc64nvme, 8),
}


def digest(algorithm: str, data: Buffer) -> bytes:
    """``data``'s checksum in the form S3 sends it (big-endian CRCs, raw hash digests)."""
    if (crc := _CRC_FNS.get(algorithm)) is not None:
        fn, size = crc
        return fn(data, 0).to_bytes(size, "big")
    if algorithm == "md5":
        return hashlib.md5(data, usedforsecurity=False).digest()
    return hashlib.new(algorithm, data).digest()


@dataclass(frozen=True, slots=True)
class Checksum:
    """What a whole object's bytes must hash to: ``algorithm`` is one of ``crc32``,
    ``crc32c``, ``crc64nvme``, ``sha1``, ``sha256`` (a stored checksum, ``expected`` decoded
    from base64) or ``md5`` (a single-part object's ETag). ``of_one_part``: a COMPOSITE
    checksum of a one-part multipart upload, the checksum of the body's checksum."""

    algorithm: str
    expected: bytes
    of_one_part: bool = False
    parts: int = 0  # a COMPOSITE checksum of this many (> 1) parts: ``compute`` needs sizes

    def compute(self, data: Buffer, part_sizes: tuple[int, ...] | None = None) -> bytes:
        """What ``data`` gives, to compare with ``expected``; for a COMPOSITE checksum of
        ``parts`` parts, the checksum of the parts' checksums, each over its slice of ``data``
        (``part_sizes``, in part order, must add up to ``len(data)``: ``ValueError``)."""
        if self.parts > 1:
            view = memoryview(data).cast("B")
            if part_sizes is None or len(part_sizes) != self.parts or sum(part_sizes) != len(view):
                raise ValueError(f"{self.parts} part sizes adding up to {len(view)} needed")
            pos = 0
            each = []
            for n in part_sizes:
                each.append(digest(self.algorithm, view[pos : pos + n]))
                pos += n
            return digest(self.algorithm, b"".join(each))
        got = digest(self.algorithm, data)
        return digest(self.algorithm, got) if self.of_one_part else got


def _stored(
    headers: Mapping[str, str], algorithm: str, composite: bool, multipart: bool
) -> Checksum | None:
    value = headers.get("x-amz-checksum-" + algorithm)
    if not value:
        return None
    value, dash, parts = value.partition("-")
    n = 0
    if dash and parts != "1":  # a checksum of N part checksums: needs the parts' boundaries
        if not multipart or not parts.isdigit() or not parts.isascii() or int(parts) < 2:
            return None
        n = int(parts)
    if composite and not dash:  # COMPOSITE without its part count: nothing to rely on
        return None
    try:
        expected = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return None
    return Checksum(algorithm, expected, of_one_part=parts == "1", parts=n)


def body_checksum(
    headers: Mapping[str, str],
    etag: str,
    *,
    stored: bool,
    md5: bool = False,
    python_crcs: bool = False,
    multipart: bool = False,
) -> Checksum | None:
    """The cheapest checksum a whole-object body can be verified against, or None.

    ``stored``: a checksum the store keeps for the whole object (CRC64NVME, CRC32C, CRC32,
    SHA-1, SHA-256, cheapest first; equal costs, so the widest CRC first), also COMPOSITE ones
    of one part; without the compiled CRCs, not CRC32C and CRC64NVME. ``python_crcs``: a
    stored CRC32C or CRC64NVME also then (computed in Python), or with ``stored`` off; the last
    resort, after the MD5 ETag. ``md5``: the ETag, when it is a
    plain MD5 (32 hex digits: a single-part upload; multipart ETags end in ``-<parts>``) and
    the object is not encrypted with SSE-KMS or SSE-C (their ETags are not the MD5 of the
    data). ``multipart``: also a COMPOSITE checksum of several parts (``Checksum.parts``; the
    caller finds the parts' sizes)."""
    composite = headers.get("x-amz-checksum-type", "").upper() == "COMPOSITE"
    fast = fast_crcs()
    if stored:
        for algorithm in (*CRCS, *HASHES):
            if not fast and algorithm in PYTHON_CRCS:
                continue
            if (c := _stored(headers, algorithm, composite, multipart)) is not None:
                return c
    if (
        md5
        and _PLAIN_MD5.match(etag)
        and not headers.get("x-amz-server-side-encryption", "").startswith("aws:kms")
        and "x-amz-server-side-encryption-customer-algorithm" not in headers
    ):
        return Checksum("md5", bytes.fromhex(etag))
    if python_crcs and not (stored and fast):
        for algorithm in CRCS:
            if algorithm in PYTHON_CRCS and (
                c := _stored(headers, algorithm, composite, multipart)
            ):
                return c
    return None
