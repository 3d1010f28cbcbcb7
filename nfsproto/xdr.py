"""XDR (RFC 4506) primitives: a bounded Reader over a memoryview cursor and a Writer to a
buffer list.

Owns: decoding and encoding of XDR base types. Must not: do I/O, read clocks, or import
anything from the project. Every decode is bounded: a length field larger than the bytes
that remain, or than the caller's limit, raises ``XdrError`` before anything is allocated.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from typing import Final, TypeVar

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
    "PAD",
    "XDR_FALSE",
    "XDR_TRUE",
    "as_bool",
    "member",
]

Buffer = bytes | bytearray | memoryview

U32: Final = struct.Struct(">I")
I32: Final = struct.Struct(">i")
U64: Final = struct.Struct(">Q")
I64: Final = struct.Struct(">q")

# Encoded pieces for codecs that build a fused ``bytes`` before one ``Writer.raw``.
PAD: Final = (b"", b"\0\0\0", b"\0\0", b"\0")  # PAD[n & 3] pads n bytes to the 4-byte unit
XDR_FALSE: Final = b"\0\0\0\0"  # bool FALSE, "no value follows", and the word 0
XDR_TRUE: Final = b"\0\0\0\1"

# Opaques at least this long are appended to the Writer's buffer list by reference instead of
# being copied into the current chunk (a 1 MiB READ reply must not copy its payload).
ZERO_COPY_MIN: Final = 2048


def pad4(n: int) -> int:
    """Length of ``n`` bytes rounded up to the XDR 4-byte unit."""
    return (n + 3) & ~3


class XdrError(ValueError):
    """Malformed XDR: short input, a length over its limit, an unknown discriminant,
    non-zero padding or trailing bytes."""


_E = TypeVar("_E")


def as_bool(v: int) -> bool:
    """An XDR bool already unpacked as an integer (from a fused layout)."""
    if v > 1:
        raise XdrError(f"bad bool value {v}")
    return v == 1


def member(members: Mapping[int, _E], v: int, what: str) -> _E:
    """The enum member for the wire value ``v``, from a ``{m.value: m}`` table: a dict lookup
    costs a fraction of ``IntEnum(v)``, which raises ValueError instead of XdrError. Packers
    use it too, to refuse a value that has no wire form."""
    m = members.get(v)
    if m is None:
        raise XdrError(f"unknown {what} value {v}")
    return m


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

    # The methods a decoder calls per field (take, u32, u64, boolean, enum, opaque, fixed)
    # check the bound inline instead of calling _need: that call was a quarter of the time of
    # a READDIRPLUS reply decode.

    def _short(self, n: int) -> XdrError:
        p = self.pos
        return XdrError(f"short input: need {n} bytes at offset {p}, have {self._end - p}")

    def _need(self, n: int) -> int:
        p = self.pos
        if n < 0 or p + n > self._end:
            raise self._short(n)
        self.pos = p + n
        return p

    def take(self, s: struct.Struct) -> tuple[int, ...]:
        """Unpack a precompiled fixed layout of integers."""
        p = self.pos
        q = p + s.size
        if q > self._end:
            raise self._short(s.size)
        self.pos = q
        return s.unpack_from(self._buf, p)

    def u32(self) -> int:
        p = self.pos
        if p + 4 > self._end:
            raise self._short(4)
        self.pos = p + 4
        v: int = U32.unpack_from(self._buf, p)[0]
        return v

    def i32(self) -> int:
        p = self._need(4)
        v: int = I32.unpack_from(self._buf, p)[0]
        return v

    def u64(self) -> int:
        p = self.pos
        if p + 8 > self._end:
            raise self._short(8)
        self.pos = p + 8
        v: int = U64.unpack_from(self._buf, p)[0]
        return v

    def i64(self) -> int:
        p = self._need(8)
        v: int = I64.unpack_from(self._buf, p)[0]
        return v

    def boolean(self) -> bool:
        p = self.pos
        if p + 4 > self._end:
            raise self._short(4)
        self.pos = p + 4
        v: int = U32.unpack_from(self._buf, p)[0]
        if v > 1:
            raise XdrError(f"bad bool value {v}")
        return v == 1

    # Discriminant of an XDR optional-data (``*T``) or a list's "value follows". An alias, not
    # a wrapper: it is read once per list entry.
    optional = boolean

    def enum(self, members: Mapping[int, _E], what: str) -> _E:
        """An XDR enum (a signed int) as its member in ``members`` (see ``member``)."""
        p = self.pos
        if p + 4 > self._end:
            raise self._short(4)
        self.pos = p + 4
        return member(members, I32.unpack_from(self._buf, p)[0], what)

    def fixed(self, n: int) -> memoryview:
        """Fixed-length opaque of ``n`` bytes (plus padding)."""
        p = self.pos
        q = p + ((n + 3) & ~3)
        if n < 0 or q > self._end:
            raise self._short(q - p)
        if n & 3 and any(self._buf[p + n : q]):
            raise XdrError("non-zero XDR padding")
        self.pos = q
        return self._buf[p : p + n]

    def opaque(self, limit: int) -> memoryview:
        """Variable-length opaque of at most ``limit`` bytes. The length is checked against the
        limit and the remaining input before anything is sliced."""
        p = self.pos
        end = self._end
        if p + 4 > end:
            raise self._short(4)
        n: int = U32.unpack_from(self._buf, p)[0]
        if n > limit:
            raise XdrError(f"opaque length {n} exceeds limit {limit}")
        p += 4
        q = p + ((n + 3) & ~3)
        if q > end:
            raise XdrError(f"opaque length {n} exceeds the {end - p} bytes left")
        if n & 3 and any(self._buf[p + n : q]):
            raise XdrError("non-zero XDR padding")
        self.pos = q
        return self._buf[p : p + n]

    def opaque_bytes(self, limit: int) -> bytes:
        return bytes(self.opaque(limit))

    # XDR string: kept as bytes (file names are opaque octets on the wire).
    string = opaque_bytes

    def count(self, limit: int, min_item_size: int = 4) -> int:
        """Array length prefix, bounded by ``limit`` and by what the input could hold."""
        n = self.u32()
        if n > limit:
            raise XdrError(f"array length {n} exceeds limit {limit}")
        if n * min_item_size > self._end - self.pos:
            raise XdrError(f"array length {n} exceeds the input left")
        return n

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
        self._cur += XDR_TRUE if v else XDR_FALSE

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
            self._cur += PAD[ln & 3]

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
