"""A set of disjoint half-open byte ranges: which bytes of a staged file were written.

Owns: merging, cutting and querying ranges. Must not: do I/O. Ranges are kept sorted and
coalesced (touching ranges merge), so a sequential writer keeps one range whatever its
number of WRITEs, and lookups are a bisect.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator


class Extents:
    __slots__ = ("_ends", "_starts", "total")

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []
        self.total = 0  # bytes covered

    def __len__(self) -> int:
        return len(self._starts)

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return iter(zip(self._starts, self._ends, strict=True))

    def __repr__(self) -> str:
        return f"Extents({list(self)!r})"

    def add(self, start: int, end: int) -> int:
        """Cover ``[start, end)``; returns how many bytes were not covered before."""
        if end <= start:
            return 0
        s, e = self._starts, self._ends
        # The first range that ends at or after ``start`` and the first that starts after
        # ``end``: everything in between touches [start, end) and merges with it.
        i = bisect.bisect_left(e, start)
        j = bisect.bisect_right(s, end)
        covered = 0
        lo, hi = start, end
        for k in range(i, j):
            covered += min(e[k], end) - max(s[k], start) if e[k] > start and s[k] < end else 0
            lo = min(lo, s[k])
            hi = max(hi, e[k])
        removed = sum(e[k] - s[k] for k in range(i, j))
        s[i:j] = [lo]
        e[i:j] = [hi]
        self.total += (hi - lo) - removed
        return (end - start) - covered

    def truncate(self, size: int) -> int:
        """Forget every byte at or after ``size``; returns how many bytes were dropped."""
        s, e = self._starts, self._ends
        i = bisect.bisect_left(e, size + 1)  # first range that ends after size
        dropped = 0
        if i < len(s) and s[i] < size:
            dropped += e[i] - size
            e[i] = size
            i += 1
        for k in range(i, len(s)):
            dropped += e[k] - s[k]
        del s[i:], e[i:]
        self.total -= dropped
        return dropped

    def covers(self, start: int, end: int) -> bool:
        """True if every byte of ``[start, end)`` is covered (an empty range is)."""
        if end <= start:
            return True
        i = bisect.bisect_right(self._starts, start) - 1
        return i >= 0 and self._ends[i] >= end

    def overlapping(self, start: int, end: int) -> list[tuple[int, int]]:
        """The covered parts of ``[start, end)``, clipped to it, in order."""
        s, e = self._starts, self._ends
        out: list[tuple[int, int]] = []
        i = bisect.bisect_right(e, start)
        while i < len(s) and s[i] < end:
            out.append((max(s[i], start), min(e[i], end)))
            i += 1
        return out

    def clear(self) -> None:
        self._starts.clear()
        self._ends.clear()
        self.total = 0
