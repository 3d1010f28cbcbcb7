"""XDR (RFC 4506) primitives: a bounded Reader over a memoryview cursor and a Writer to a
buffer list.

Owns: decoding and encoding of XDR base types. Must not: do I/O, read clocks, or import
anything from the project. Every decode is bounded: a length field larger than the bytes
that remain, or than the caller's limit, raises ``XdrError`` before anything is allocated.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import Final

__all__ = [
    "XdrError",
    "Reader",
    "Writer",
    "Buffer",
    "U32",
    "I32",
    "U64",
    "I64",
    "pad4",
]

Buffer = bytes | bytearray | memoryview

U32: Final = struct.Struct(">I")
I32: Final = struct.Struct(">i")
U64: Final = struct.Struct(">Q")
I64: Final = struct.Struct(">q")
_U32_2: Final = struct.Struct(">II")

_PAD: Final = (b"", b"\0\0\0", b"\0\0", b"\0")

# Opaques at least this long are appended to the Writer's buffer list by reference instead of
# being copied into the current chunk (a 1 MiB READ reply must not copy its payload).
ZERO_COPY_MIN: Final = 2048


def pad4(n: int) -> int:
    """Length of ``n`` bytes rounded up to the XDR 4-byte unit."""
    return (n + 3) & ~3


class XdrError(ValueError):
    """Malformed XDR: short input, a length over its limit, an unknown discriminant,
    non-zero padding or trailing bytes."""


class Reader:
    """Cursor over one message. Opaque results are memoryview slices of the input (no copy)."""

    __slots__ = ("_buf", "pos", "_end")

    def __init__(self, data: Buffer, pos: int = 0, end: int | None = None) -> None:
        mv = data if isinstance(data, memoryview) else memoryview(data)
        if mv.format != "B" or mv.ndim != 1:
            mv = mv.cast("B")
        self._buf = mv
        self.pos = pos
        self._end = len(mv) if end is None else end

    @property
    def buffer(self) -> memoryview:
        return self._buf

    def remaining(self) -> int:
        return self._end - self.pos

    def _need(self, n: int) -> int:
        p = self.pos
        if n < 0 or p + n > self._end:
            raise XdrError(f"short input: need {n} bytes at offset {p}, have {self._end - p}")
        self.pos = p + n
        return p

    def take(self, s: struct.Struct) -> tuple[int, ...]:
        """Unpack a precompiled fixed layout of integers."""
        p = self._need(s.size)
        return s.unpack_from(self._buf, p)

    def u32(self) -> int:
        p = self._need(4)
        v: int = U32.unpack_from(self._buf, p)[0]
        return v

    def i32(self) -> int:
        p = self._need(4)
        v: int = I32.unpack_from(self._buf, p)[0]
        return v

    def u64(self) -> int:
        p = self._need(8)
        v: int = U64.unpack_from(self._buf, p)[0]
        return v

    def i64(self) -> int:
        p = self._need(8)
        v: int = I64.unpack_from(self._buf, p)[0]
        return v

    def boolean(self) -> bool:
        v = self.u32()
        if v > 1:
            raise XdrError(f"bad bool value {v}")
        return v == 1

    def enum(self, valid: frozenset[int] | range, what: str = "enum") -> int:
        v = self.i32()
        if v not in valid:
            raise XdrError(f"unknown {what} value {v}")
        return v

    def fixed(self, n: int) -> memoryview:
        """Fixed-length opaque of ``n`` bytes (plus padding)."""
        p = self._need(pad4(n))
        self._check_pad(p + n, pad4(n) - n)
        return self._buf[p : p + n]

    def opaque(self, limit: int) -> memoryview:
        """Variable-length opaque of at most ``limit`` bytes. The length is checked against the
        limit and the remaining input before anything is sliced."""
        n = self.u32()
        if n > limit:
            raise XdrError(f"opaque length {n} exceeds limit {limit}")
        if pad4(n) > self._end - self.pos:
            raise XdrError(f"opaque length {n} exceeds the {self._end - self.pos} bytes left")
        p = self.pos
        self.pos = p + pad4(n)
        self._check_pad(p + n, pad4(n) - n)
        return self._buf[p : p + n]

    def opaque_bytes(self, limit: int) -> bytes:
        return bytes(self.opaque(limit))

    def string(self, limit: int) -> bytes:
        """XDR string: kept as bytes (file names are opaque octets on the wire)."""
        return bytes(self.opaque(limit))

    def count(self, limit: int, min_item_size: int = 4) -> int:
        """Array length prefix, bounded by ``limit`` and by what the input could hold."""
        n = self.u32()
        if n > limit:
            raise XdrError(f"array length {n} exceeds limit {limit}")
        if n * min_item_size > self._end - self.pos:
            raise XdrError(f"array length {n} exceeds the input left")
        return n

    def optional(self) -> bool:
        """Discriminant of an XDR optional-data (``*T``) or a list's "value follows"."""
        return self.boolean()

    def _check_pad(self, at: int, n: int) -> None:
        if n and any(self._buf[at : at + n]):
            raise XdrError("non-zero XDR padding")

    def done(self) -> None:
        if self.pos != self._end:
            raise XdrError(f"{self._end - self.pos} trailing bytes")


class Writer:
    """Accumulates encoded bytes. Small fields go into a growing bytearray; large opaques are
    appended to the buffer list by reference. ``buffers()`` is ready for
    ``transport.writelines``."""

    __slots__ = ("_parts", "_cur", "_size_done")

    def __init__(self) -> None:
        self._parts: list[Buffer] = []
        self._cur = bytearray()
        self._size_done = 0

    def __len__(self) -> int:
        return self._size_done + len(self._cur)

    def pack(self, s: struct.Struct, *values: int) -> None:
        self._cur += s.pack(*values)

    def raw(self, data: Buffer) -> None:
        """Already-encoded bytes (must be a multiple of 4 long to keep alignment)."""
        self._cur += data

    def u32(self, v: int) -> None:
        self._cur += U32.pack(v)

    def i32(self, v: int) -> None:
        self._cur += I32.pack(v)

    def u64(self, v: int) -> None:
        self._cur += U64.pack(v)

    def i64(self, v: int) -> None:
        self._cur += I64.pack(v)

    def boolean(self, v: bool) -> None:
        self._cur += U32.pack(1 if v else 0)

    def fixed(self, data: Buffer, n: int | None = None) -> None:
        ln = len(data) if n is None else n
        if len(data) != ln:
            raise XdrError(f"fixed opaque must be {ln} bytes, got {len(data)}")
        self._append_data(data, ln)

    def opaque(self, data: Buffer, limit: int | None = None) -> None:
        ln = len(data)
        if limit is not None and ln > limit:
            raise XdrError(f"opaque length {ln} exceeds limit {limit}")
        self._cur += U32.pack(ln)
        self._append_data(data, ln)

    string = opaque

    def _append_data(self, data: Buffer, ln: int) -> None:
        if ln >= ZERO_COPY_MIN:
            if self._cur:
                self._parts.append(self._cur)
                self._size_done += len(self._cur)
                self._cur = bytearray()
            self._parts.append(data)
            self._size_done += ln
        else:
            self._cur += data
        if ln & 3:
            self._cur += _PAD[ln & 3]

    def buffers(self) -> list[Buffer]:
        """The encoded message as a list of buffers (the Writer must not be used after)."""
        if self._cur:
            self._parts.append(self._cur)
            self._size_done += len(self._cur)
            self._cur = bytearray()
        return self._parts

    def getvalue(self) -> bytes:
        """The encoded message joined into one bytes object (copies; for tests and small
        messages)."""
        return b"".join(self.buffers())

    def extend(self, buffers: Iterable[Buffer]) -> None:
        """Append already-encoded buffers (each a multiple of 4 bytes long)."""
        for b in buffers:
            self._append_data(b, len(b))
