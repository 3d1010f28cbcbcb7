"""One directory's listed entries as a few flat buffers (DESIGN §3 "Index at ImageNet scale").

Owns: packing entries into ``Columns`` (name order), finding a name, building the ``Entry`` of
a row on demand, comparing a listing page with a run of rows without building anything
(``same_files``), folding mutations into new columns (``fold``) and the exact size of it all.
Must not: know about listings in flight, cookies, TTLs or other directories.

Why: a ``SortedDict[str, Entry]`` costs ~540 B and six Python objects per entry, and the
garbage collector walks all of them (1.28 M entries: 0.7-1.4 s pauses). ``Columns`` holds ten
objects per directory whatever its size, none of them holding other objects (arrays and bytes
are not traversed), and ~80 B per entry (ImageNet names, MD5 ETags; measured with
``benchmarks/index_memory.py``). ``Entry`` objects exist only while a caller holds them.

Layout (n rows, in name order == UTF-8 byte order, the order listings use for keys):

- ``names``: every name's UTF-8 followed by NUL (no name holds NUL), ``offs[i]`` where row i
  starts (n + 1 offsets); a run of rows is one slice, compared or split at C speed.
- ``hrows``/``hstarts``: a hash table (rows grouped by ``hash(name) & mask``, where each
  group starts): ``find`` reads a bucket of about one row.
- ``kinds`` (``KIND_*``, one byte a row), ``sizes``, ``mtimes`` (``array('q')``; 0 for
  directories, whose times are the index's).
- ETags: when every file's ETag is 32 lowercase hex digits (S3's MD5), bare or in quotes (the
  fake store), 16 raw bytes a row, the few that are not in ``etag_odd``; otherwise (e.g. the
  local backend's "inode-size-mtime") NUL-terminated strings like the names.

The values are the listing's: a row's mtime is LastModified, never a metadata override (those
are entries of ``Directory.extra``), so a re-list compares equal when nothing changed.
"""

from __future__ import annotations

import sys
from array import array
from bisect import bisect_left
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import accumulate, repeat
from operator import attrgetter
from typing import Final

from gateway.backend.base import ObjectInfo
from gateway.namespace.entries import Entry, EntryKind

KIND_FILE: Final = 0
KIND_DIR: Final = 1
KIND_SYMLINK: Final = 2  # only in folded columns (``fold``): listings show symlinks as files
KINDS: Final = (EntryKind.FILE, EntryKind.DIR, EntryKind.SYMLINK)
KIND_CODE: Final = {EntryKind.FILE: KIND_FILE, EntryKind.DIR: KIND_DIR, EntryKind.SYMLINK: 2}

DirEntry = Callable[[str, str], Entry]
"""(name, path) -> the entry of a directory (the index knows its synthetic times)."""

_ENC: Final = "utf-8"
_ERR: Final = "surrogatepass"  # a lone surrogate never matches a valid name; never raises
_PLUS1: Final = (1).__add__
_KEY = attrgetter("key")
_SIZE = attrgetter("size")
_MTIME = attrgetter("mtime_ns")
_ETAG = attrgetter("etag")
_META = attrgetter("metadata")
# Bytes of the Columns object itself and of the empty containers it holds (getsizeof of the
# buffers is added per instance).
_FIXED: Final = 200


def _strings(items: Sequence[str]) -> tuple[bytes, array[int]]:
    """NUL-terminated UTF-8 of ``items`` and the offset where each starts (plus the end)."""
    if not items:
        return b"", array("I", [0])
    text = "\0".join(items) + "\0"
    buf = text.encode(_ENC, _ERR)
    ascii_only = len(buf) == len(text)
    lens: Iterable[int] = (
        map(len, items) if ascii_only else [len(s.encode(_ENC, _ERR)) for s in items]
    )
    return buf, array("I", accumulate(map(_PLUS1, lens), initial=0))


def _unhex(text: str) -> bytes | None:
    """The bytes of lowercase hex digits ``text`` (and nothing else), or None."""
    try:
        raw = bytes.fromhex(text)
    except ValueError:
        return None
    return raw if raw.hex() == text else None  # no upper case, no spaces


def _hex_etag(etag: str) -> tuple[bytes, bool] | None:
    """(16 raw bytes, quoted) of a 32-lowercase-hex ETag, bare or in quotes; else None."""
    q = len(etag) == 34 and etag[0] == '"' and etag[-1] == '"'
    h = etag[1:-1] if q else etag
    raw = _unhex(h) if len(h) == 32 else None
    return None if raw is None else (raw, q)


class Columns:
    """An immutable table of one directory's entries in name order (module docstring)."""

    __slots__ = (
        "etag_odd",
        "etag_offs",
        "etag_q",
        "etags",
        "hrows",
        "hstarts",
        "kinds",
        "mask",
        "mtimes",
        "allfiles",
        "n",
        "names",
        "nbytes",
        "ndirs",
        "offs",
        "sizes",
    )

    def __init__(
        self,
        names: Sequence[str],
        kinds: bytes | bytearray,
        sizes: Sequence[int],
        mtimes: Sequence[int],
        etags: Sequence[str],
    ) -> None:
        """From parallel sequences, ``names`` sorted and unique (``etags[i]`` of a directory
        is ignored)."""
        n = self.n = len(names)
        self.names, self.offs = _strings(names)
        # A hash table built at C speed: rows sorted by bucket (hash & mask), and where each
        # bucket starts among them. A lookup reads two offsets and (mostly) one row.
        self.mask = mask = (1 << max(0, n - 1).bit_length()) - 1
        buckets = [h & mask for h in map(hash, names)]
        self.hrows = array("I", sorted(range(n), key=buckets.__getitem__))
        buckets.sort()
        self.hstarts = array("I", map(bisect_left, repeat(buckets), range(mask + 2)))
        self.kinds = bytes(kinds)
        self.ndirs = self.kinds.count(KIND_DIR)
        self.allfiles = self.kinds.count(KIND_FILE) == n
        self.sizes = array("q", sizes)
        self.mtimes = array("q", mtimes)
        self.etag_odd: dict[int, str] | None = None
        self.etag_offs: array[int] | None = None
        self.etag_q = False
        self.etags = b""
        self._pack_etags(etags)
        self.nbytes = self._nbytes()

    def _pack_etags(self, etags: Sequence[str]) -> None:
        n = self.n
        if not n:
            return
        if not self.ndirs:  # the usual directory of files: one C-speed conversion
            lens = set(map(len, etags))
            joined = "".join(etags)
            if lens == {32} and (raw := _unhex(joined)) is not None:
                self.etags = raw
                return
            if (
                lens == {34}
                and _quoted_run(joined, n)
                and (raw := _unhex(joined.replace('"', ""))) is not None
            ):
                self.etags, self.etag_q = raw, True
                return
            if not any(map(_hex_etag, etags[:8])):  # e.g. the local backend's: no row by row
                self.etags, self.etag_offs = _strings(etags)
                return
        packed = bytearray(16 * n)
        odd: dict[int, str] = {}
        quoted: bool | None = None
        kinds = self.kinds
        for i, etag in enumerate(etags):
            if kinds[i] == KIND_DIR:
                continue
            got = _hex_etag(etag)
            if got is None or (quoted is not None and got[1] != quoted):
                odd[i] = etag
                continue
            quoted = got[1]
            packed[16 * i : 16 * i + 16] = got[0]
        if len(odd) > n // 4:  # a dict slot and a str (~90 B) each: strings are cheaper
            self.etags, self.etag_offs = _strings(
                [e if k != KIND_DIR else "" for e, k in zip(etags, kinds, strict=True)]
            )
            return
        self.etags, self.etag_q, self.etag_odd = bytes(packed), bool(quoted), odd or None

    # -- reading -------------------------------------------------------------------------------

    def find(self, name: str) -> int:
        """The row of ``name``, or -1."""
        b = hash(name) & self.mask
        starts = self.hstarts
        i, j = starts[b], starts[b + 1]
        if i == j:
            return -1
        key = name.encode(_ENC, _ERR)
        names, offs, hrows = self.names, self.offs, self.hrows
        while i < j:  # one bucket holds ~1 name
            r = hrows[i]
            if names[offs[r] : offs[r + 1] - 1] == key:
                return r
            i += 1
        return -1

    def after(self, name: str) -> int:
        """The first row whose name sorts after ``name`` (resuming after a removed name)."""
        key = name.encode(_ENC, _ERR)
        names, offs = self.names, self.offs
        lo, hi = 0, self.n
        while lo < hi:
            mid = (lo + hi) // 2
            if names[offs[mid] : offs[mid + 1] - 1] <= key:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def name(self, r: int) -> str:
        return self.names[self.offs[r] : self.offs[r + 1] - 1].decode(_ENC, _ERR)

    def names_of(self, lo: int, hi: int) -> list[str]:
        """The names of rows [lo, hi), split at C speed."""
        if lo >= hi:
            return []
        return self.names[self.offs[lo] : self.offs[hi] - 1].decode(_ENC, _ERR).split("\0")

    def kind(self, r: int) -> EntryKind:
        return KINDS[self.kinds[r]]

    def etag(self, r: int) -> str:
        if self.kinds[r] == KIND_DIR:
            return ""
        eo = self.etag_offs
        if eo is not None:
            return self.etags[eo[r] : eo[r + 1] - 1].decode(_ENC, _ERR)
        if self.etag_odd is not None:
            odd = self.etag_odd.get(r)
            if odd is not None:
                return odd
        h = self.etags[16 * r : 16 * r + 16].hex()
        return f'"{h}"' if self.etag_q else h

    def entry(self, r: int, name: str, path: str, dir_entry: DirEntry) -> Entry:
        """The entry of row ``r`` (``name`` is its name, ``path`` its path)."""
        k = self.kinds[r]
        if k == KIND_DIR:
            return dir_entry(name, path)
        m = self.mtimes[r]
        if self.etag_offs is None and self.etag_odd is None:  # the usual case, inline
            etag = self.etags[16 * r : 16 * r + 16].hex()
            if self.etag_q:
                etag = f'"{etag}"'
        else:
            etag = self.etag(r)
        return Entry(name, path, KINDS[k], self.sizes[r], m, m, etag)

    def same_row(self, r: int, kind: int, size: int, mtime_ns: int, etag: str) -> bool:
        if self.kinds[r] != kind:
            return False
        if kind == KIND_DIR:
            return True
        return self.sizes[r] == size and self.mtimes[r] == mtime_ns and self.etag(r) == etag

    def _nbytes(self) -> int:
        """What this table costs in memory (its buffers as allocated, plus a constant)."""
        n = _FIXED + sum(
            map(
                sys.getsizeof,
                (
                    self.names,
                    self.offs,
                    self.hstarts,
                    self.hrows,
                    self.kinds,
                    self.sizes,
                    self.mtimes,
                    self.etags,
                ),
            )
        )
        if self.etag_offs is not None:
            n += sys.getsizeof(self.etag_offs)
        if self.etag_odd:
            n += sys.getsizeof(self.etag_odd) + 90 * len(self.etag_odd)
        return n

    # -- comparing -----------------------------------------------------------------------------

    def same_files(self, p: int, objs: Sequence[ObjectInfo], key_prefix: str) -> bool:
        """Whether the listed objects ``objs`` (keys ``key_prefix`` + name, no metadata) are
        exactly rows [p, p + len(objs)), all files: names, sizes, mtimes and ETags compared a
        run at a time, with no object built per entry."""
        k = len(objs)
        if not k:
            return True
        q = p + k
        if not self.allfiles or q > self.n or any(map(_META, objs)):
            return False
        text = "\0".join(map(_KEY, objs))
        kp = key_prefix
        if kp:
            # Every key starts with the prefix: the first, and one after each separator (the
            # comparison below leaves no NUL inside a key).
            if not text.startswith(kp) or text.count("\0" + kp) != k - 1:
                return False
            text = text[len(kp) :].replace("\0" + kp, "\0")
        if (text + "\0").encode(_ENC, _ERR) != self.names[self.offs[p] : self.offs[q]]:
            return False
        if array("q", map(_SIZE, objs)) != self.sizes[p:q]:
            return False
        if array("q", map(_MTIME, objs)) != self.mtimes[p:q]:
            return False
        etags = list(map(_ETAG, objs))
        eo = self.etag_offs
        if eo is not None:
            return ("\0".join(etags) + "\0").encode(_ENC, _ERR) == self.etags[eo[p] : eo[q]]
        if self.etag_odd is not None and any(p <= r < q for r in self.etag_odd):
            return all(self.etag(p + i) == e for i, e in enumerate(etags))
        joined = "".join(etags)
        want = self.etags[16 * p : 16 * q].hex()
        if not self.etag_q:
            return set(map(len, etags)) == {32} and joined == want
        return (
            set(map(len, etags)) == {34}
            and _quoted_run(joined, k)
            and joined.replace('"', "") == want
        )

    def equal(self, other: Columns) -> bool:
        """Same names, kinds, sizes, mtimes and ETags."""
        if self is other:
            return True
        if (
            self.n != other.n
            or self.names != other.names
            or self.kinds != other.kinds
            or self.sizes != other.sizes
            or self.mtimes != other.mtimes
        ):
            return False
        if (self.etag_offs is None) == (other.etag_offs is None) and (
            self.etag_q == other.etag_q and self.etag_odd == other.etag_odd
        ):
            return self.etags == other.etags and self.etag_offs == other.etag_offs
        return all(self.etag(r) == other.etag(r) for r in range(self.n))

    # -- new tables ----------------------------------------------------------------------------

    def rows(self, keep: Iterable[int]) -> Columns:
        """A table of the rows ``keep`` (in order)."""
        names, kinds, sizes, mtimes, etags = self.lists()
        keep = list(keep)
        return Columns(
            [names[r] for r in keep],
            bytes(kinds[r] for r in keep),
            [sizes[r] for r in keep],
            [mtimes[r] for r in keep],
            [etags[r] for r in keep],
        )

    def lists(self) -> tuple[list[str], bytearray, list[int], list[int], list[str]]:
        """The columns as Python lists (to build a new table)."""
        return (
            self.names_of(0, self.n),
            bytearray(self.kinds),
            self.sizes.tolist(),
            self.mtimes.tolist(),
            [self.etag(r) for r in range(self.n)],
        )


EMPTY: Final = Columns([], b"", [], [], [])


def _quoted_run(joined: str, k: int) -> bool:
    """``joined`` is k strings of 34 characters, each in quotes with none inside."""
    return joined.count('"') == 2 * k and joined[::34] == '"' * k and joined[33::34] == '"' * k


def fold(cols: Columns, extra: Mapping[str, Entry | None]) -> Columns:
    """``cols`` with ``extra`` applied (None: the name is gone; an entry: the row is that
    entry's kind, size, mtime and ETag, added if new)."""
    if not extra:
        return cols
    names, kinds, sizes, mtimes, etags = cols.lists()
    gone: set[int] = set()
    added: list[tuple[str, Entry]] = []
    for name, e in extra.items():
        r = cols.find(name)
        if e is None:
            if r >= 0:
                gone.add(r)
        elif r < 0:
            added.append((name, e))
        else:
            kinds[r] = KIND_CODE[e.kind]
            sizes[r], mtimes[r], etags[r] = _values(e)
    if not gone and not added:
        return Columns(names, kinds, sizes, mtimes, etags)
    rows: list[tuple[str, int, int, int, str]] = [
        (names[r], kinds[r], sizes[r], mtimes[r], etags[r]) for r in range(cols.n) if r not in gone
    ]
    rows += [(name, KIND_CODE[e.kind], *_values(e)) for name, e in added]
    rows.sort(key=lambda t: t[0])
    return Columns(
        [t[0] for t in rows],
        bytes(t[1] for t in rows),
        [t[2] for t in rows],
        [t[3] for t in rows],
        [t[4] for t in rows],
    )


def _values(e: Entry) -> tuple[int, int, str]:
    if e.kind is EntryKind.DIR:
        return 0, 0, ""
    return e.size, e.mtime_ns, e.etag
