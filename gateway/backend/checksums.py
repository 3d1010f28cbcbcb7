"""Body checksums, sans-I/O: which checksum a GET reply lets the S3 store verify a
whole-object body against (``body_checksum``), and computing it (``Checksum.compute``,
``digest``, the CRCs ``crc32``, ``crc32c``, ``crc64nvme``), and ``page_digest``, which
tells a listing page from the previous one.

Owns: the CRCs S3 stores, twice: compiled (``gateway._checksums``, C, built by the package's
own build) and the pure-Python reference here (``py_crc32c``, ``py_crc64nvme``; CRC32 is
zlib's), which must give the same values for the same bytes (tests/unit/gateway/
test_checksums.py, and the C under ASan/UBSan in test_checksums_sanitizers.py). The compiled
ones are used unless ``NFSGW_PURE_PYTHON=1`` or the extension was not built (``compiled``).
Must not: decide when to verify, do I/O, log (``s3.py`` does those).

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


@functools.cache
def compiled() -> ModuleType | None:
    """``gateway._checksums``, or None: ``NFSGW_PURE_PYTHON=1`` asks for the Python twins, or
    the extension was not built."""
    if os.environ.get("NFSGW_PURE_PYTHON", "") not in ("", "0"):
        return None
    try:
        return importlib.import_module("gateway._checksums")
    except ImportError:
        return None


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
