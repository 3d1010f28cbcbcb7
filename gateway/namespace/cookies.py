"""READDIR cookies and cookie verifiers (RFC 1813 §3.3.16) that stay valid across re-listings
(DESIGN §3 "Metadata prefetch").

Owns: ``cookie_hash``, the per-directory cookie state (``Cookies``: a cookie column aligned
with the directory's ``Columns``, salted names, tombstones) and the verifiers
(``Verifiers``). Must not: decide what a directory holds or touch the backend (``Namespace``,
``directory`` and ``listing`` do).

- A cookie is a stable hash of the name (``cookie_hash``), >= ``FIRST_COOKIE``: 0 starts a
  listing, 1 and 2 are left for the handler's "." and "..", and every cookie below
  ``FIRST_COOKIE`` means "from the start". Two names of one directory with the same hash are
  told apart by salting the later one (``Cookies.column``); a name keeps its cookie as long as
  it is in the directory.
- The state (made on a directory's first READDIR) also remembers up to ``keep_removed``
  removed names, so resuming continues at the first name greater than the cookie's name even
  if that name is gone; re-listings and evictions keep present names' cookies. An
  unresolvable cookie is the caller's ``BadCookie``.
- The column is one ``array('q')`` (8 B an entry), recomputed only when the directory's
  columns change; resuming from the cookie a page ended with is found through ``hints``,
  from one a little before it (a reply cut short of its page) in a window of the rows up to
  a recent hint, any other with one scan of the column.
- The 8-byte verifier changes whenever the directory's content changes, but an old verifier is
  accepted whenever its cookie still resolves (the RFC leaves the check to the server), so a
  READDIRPLUS sequence spanning a re-list returns every surviving entry exactly once.
"""

from __future__ import annotations

import hashlib
import itertools
import struct
import sys
from array import array
from collections.abc import Callable
from typing import Final

from gateway.namespace.columns import Columns

FIRST_COOKIE: Final = 3
_HINTS: Final = 64  # sequential readers of one directory resumed without a scan
# Cookies looked for among the _NEAR_ROWS rows up to each of the _NEAR_HINTS latest hints
# before a scan of the whole column (~20 us at 1,281 rows, once a reply).
_NEAR_HINTS: Final = 4
_NEAR_ROWS: Final = 64
_FIXED: Final = 150  # the object and its three dicts, empty
_ITEM: Final = 150  # a dict slot, an int and a name

_U64 = struct.Struct(">Q")
_COOKIE_MASK: Final = (1 << 63) - 1


def cookie_hash(name: str, salt: int = 0) -> int:
    """Stable READDIR cookie of ``name``: 63 bits of blake2b, never below FIRST_COOKIE."""
    raw = name.encode("utf-8")
    if salt:
        raw += b"\0" + str(salt).encode()
    c: int = _U64.unpack(hashlib.blake2b(raw, digest_size=8).digest())[0] & _COOKIE_MASK
    return c if c >= FIRST_COOKIE else c + FIRST_COOKIE


class Cookies:
    """The cookie state of one directory, made on its first READDIR: the cookie of each row of
    its current ``Columns`` (``col``, an ``array('q')``), the names salted because of a
    collision, the last ``keep_removed`` removed names (tombstones) and the cookies handed out
    last (``hints``: a client resumes from the last cookie of a page, found without a scan)."""

    __slots__ = ("col", "collided", "hints", "keep_removed", "of", "removed")

    def __init__(self, keep_removed: int) -> None:
        self.collided: dict[str, int] = {}  # name -> its salted cookie
        self.removed: dict[int, str] = {}  # cookie -> removed name, oldest first
        self.hints: dict[int, str] = {}  # cookie -> name, oldest first
        self.keep_removed = keep_removed
        self.of: Columns | None = None
        self.col = array("q")

    def column(self, cols: Columns, prev: Columns | None = None) -> array[int]:
        """The cookies of ``cols``' rows (computed when ``cols`` is new; ``prev``: the table
        it replaces, whose names keep their cookies if a new name collides with one)."""
        if self.of is cols:
            return self.col
        names = cols.names_of(0, cols.n)
        coll = self.collided
        cs = (
            [coll.get(n) or cookie_hash(n) for n in names]
            if coll
            else list(map(cookie_hash, names))
        )
        if len(set(cs)) != len(cs) or self._hits_tombstone(cs, names):
            cs = self._salted(names, prev)
        self.of, self.col = cols, array("q", cs)
        return self.col

    def _hits_tombstone(self, cs: list[int], names: list[str]) -> bool:
        if not self.removed:
            return False
        return any(names[cs.index(c)] != self.removed[c] for c in self.removed.keys() & set(cs))

    def _salted(self, names: list[str], prev: Columns | None) -> list[int]:
        """Cookies with collisions told apart: tombstones and names that had a cookie keep
        theirs; a later name is salted (``cookie_hash(name, salt)``) until it is unique."""
        coll = self.collided

        def rank(i: int) -> int:
            n = names[i]
            return 0 if n in coll else 1 if prev is not None and prev.find(n) >= 0 else 2

        taken: dict[int, str] = dict(self.removed)
        out = [0] * len(names)
        for i in sorted(range(len(names)), key=rank):
            name = names[i]
            salt = 0
            c = coll.get(name) or cookie_hash(name)
            while (cur := taken.get(c)) is not None and cur != name:
                salt += 1
                c = cookie_hash(name, salt)
            taken[c] = name
            out[i] = c
            if salt:
                coll[name] = c
        return out

    def cookie(self, cols: Columns, r: int, name: str) -> int:
        """The cookie of ``name`` (row ``r`` of ``cols``, or -1 when it is not a row)."""
        if r >= 0:
            return self.column(cols)[r]
        return self.collided.get(name) or cookie_hash(name)

    def start(self, cols: Columns, cookie: int) -> int:
        """The row after the one ``cookie`` names (or after its removed name); -1 if it does
        not resolve."""
        col = self.column(cols)
        hints = self.hints
        name = hints.get(cookie)
        if name is not None:
            r = cols.find(name)
            if r >= 0 and col[r] == cookie:
                return r + 1
        # A reply holds fewer entries than the page it was cut from (the reply filled up):
        # the client resumes a few rows before the row hinted last.
        for name in itertools.islice(reversed(hints.values()), _NEAR_HINTS):
            r = cols.find(name)
            if r >= 0:
                lo = max(0, r - _NEAR_ROWS)
                try:
                    return col[lo : r + 1].index(cookie) + lo + 1
                except ValueError:
                    pass
        try:
            return col.index(cookie) + 1
        except ValueError:
            pass
        name = self.removed.get(cookie)
        return -1 if name is None else cols.after(name)

    def handed_out(self, cookie: int, name: str) -> None:
        hints = self.hints
        hints.pop(cookie, None)  # the newest last, also when handed out before
        hints[cookie] = name
        if len(hints) > _HINTS:
            del hints[next(iter(hints))]

    def remove(self, cookie: int, name: str, present: Callable[[str], bool]) -> None:
        """``name`` (cookie ``cookie``) left the directory: keep its cookie reserved while
        fewer than ``keep_removed`` names were removed after it (``present``: whether a name
        is in the directory now; one that came back keeps its salted cookie)."""
        removed = self.removed
        removed.pop(cookie, None)
        removed[cookie] = name
        while len(removed) > self.keep_removed:
            oc = next(iter(removed))
            oname = removed.pop(oc)
            if not present(oname):
                self.collided.pop(oname, None)

    def nbytes(self) -> int:
        return (
            _FIXED
            + sys.getsizeof(self.col)
            + _ITEM * (len(self.removed) + len(self.hints) + len(self.collided))
        )


class Verifiers:
    """Cookie verifiers of one namespace: the start time's seconds, then a counter, so a
    verifier does not repeat within a run and is unlikely to across restarts."""

    __slots__ = ("_base", "_seq")

    def __init__(self, start_ns: int) -> None:
        self._base = ((start_ns // 10**9) & 0xFFFFFFFF) << 32
        self._seq = itertools.count(1)

    def new(self) -> bytes:
        return _U64.pack(self._base | (next(self._seq) & 0xFFFFFFFF))
