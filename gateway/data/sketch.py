"""Frequency sketch for the data cache's admission filter (TinyLFU-style).

Owns: a bounded, approximate count of how often each block key was *visited* recently, with
aging. Must not: hold keys, grow with the number of distinct keys, or use ``hash()`` (string
hashing is salted per process, which would make eviction decisions, and the simulation tests,
differ from run to run).

A count-min sketch: 4 rows of ``width`` saturating counters (0..15, one byte each), one
multiply-shift index per row from a 64-bit key hash, conservative update (only the counters
that hold the current minimum are incremented, which keeps over-estimates rare). After
``sample_size`` increments every counter is halved (``bytearray.translate``, C speed: ~1 ms
per MiB of table), so old popularity decays and a new working set can take over.

The table grows with the cache (``ensure_capacity``) without losing counts: a row index is the
top ``bits`` bits of ``hash * C_row``, so after doubling the width the new index ``i`` maps to
the old ``i >> 1`` and each old counter is simply duplicated.
"""

from __future__ import annotations

import zlib
from typing import Final

__all__ = ["FrequencySketch", "key_hash"]

_M64: Final = (1 << 64) - 1
_ROW_MULT: Final = (
    0x9E3779B97F4A7C15,
    0xC2B2AE3D27D4EB4F,
    0x165667B19E3779F9,
    0xD6E8FEB86659FD93,
)
_MAX_COUNT: Final = 15
_HALVE: Final = bytes(i >> 1 for i in range(256))
# Table width per row: 8 counters per cache entry keeps four-row collisions (the only kind
# that over-estimates) below 1 % with twice as many distinct keys as entries in flight.
_COUNTERS_PER_ENTRY: Final = 8
_MIN_BITS: Final = 6
_MAX_BITS: Final = 22  # 4 rows x 4 Mi counters = 16 MiB; enough for ~500k cache entries
_SAMPLE_PER_ENTRY: Final = 10  # age after 10 x capacity increments (as Caffeine does)


def key_hash(store: str, key: str, etag: str, block: int) -> int:
    """A deterministic, well-mixed 64-bit hash of one block key."""
    h = zlib.crc32(f"{store}\0{key}\0{etag}".encode("utf-8", "surrogatepass"))
    z = (h ^ (block * 0x9E3779B97F4A7C15)) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64  # splitmix64 finaliser
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


class FrequencySketch:
    """Approximate visit counts (0..15) for 64-bit key hashes."""

    __slots__ = ("_bits", "_width", "_table", "_capacity", "_sample_size", "_additions")

    def __init__(self, capacity: int) -> None:
        self._capacity = 0
        self._bits = 0
        self._width = 0
        self._table = bytearray()
        self._sample_size = 0
        self._additions = 0
        self._resize(max(1, capacity))

    @property
    def capacity(self) -> int:
        """Number of cache entries the table is sized for."""
        return self._capacity

    def _resize(self, capacity: int) -> None:
        bits = max(_MIN_BITS, min(_MAX_BITS, (capacity * _COUNTERS_PER_ENTRY - 1).bit_length()))
        if bits > self._bits and self._table:
            # Duplicate each counter (row by row) until the width matches: see module doc.
            table = self._table
            width = self._width
            while width < (1 << bits):
                grown = bytearray(8 * width)
                for row in range(4):
                    old = table[row * width : (row + 1) * width]
                    base = row * 2 * width
                    grown[base : base + 2 * width : 2] = old
                    grown[base + 1 : base + 2 * width : 2] = old
                table = grown
                width *= 2
            self._table = table
        elif not self._table:
            self._table = bytearray(4 << bits)
        self._bits = max(bits, self._bits)
        self._width = 1 << self._bits
        self._capacity = capacity
        self._sample_size = _SAMPLE_PER_ENTRY * capacity

    def ensure_capacity(self, entries: int) -> None:
        """Grow (doubling) when the cache holds more entries than the table was sized for."""
        if entries > self._capacity:
            self._resize(max(entries, 2 * self._capacity))

    def _indexes(self, h: int) -> tuple[int, int, int, int]:
        shift = 64 - self._bits
        w = self._width
        m0, m1, m2, m3 = _ROW_MULT
        return (
            ((h * m0) & _M64) >> shift,
            w + (((h * m1) & _M64) >> shift),
            2 * w + (((h * m2) & _M64) >> shift),
            3 * w + (((h * m3) & _M64) >> shift),
        )

    def estimate(self, h: int) -> int:
        t = self._table
        a, b, c, d = self._indexes(h)
        return min(t[a], t[b], t[c], t[d])

    def increment(self, h: int) -> None:
        t = self._table
        idx = self._indexes(h)
        low = min(t[i] for i in idx)
        if low >= _MAX_COUNT:
            return
        for i in idx:
            if t[i] == low:
                t[i] = low + 1
        self._additions += 1
        if self._additions >= self._sample_size:
            self._table = self._table.translate(_HALVE)
            self._additions //= 2
