"""READDIR cookies and cookie verifiers (RFC 1813 §3.3.16) that stay valid across re-listings
(DESIGN §3 "Metadata prefetch").

Owns: ``cookie_hash``, the per-directory map cookie -> name (``CookieMap``), carrying that map
across a re-list (``carry``) and the verifiers (``Verifiers``). Must not: decide what a
directory holds or touch the backend (``Namespace`` and ``listing`` do).

- A cookie is a stable hash of the name (``cookie_hash``), >= ``FIRST_COOKIE``: 0 starts a
  listing, 1 and 2 are left for the handler's "." and "..", and every cookie below
  ``FIRST_COOKIE`` means "from the start". Two names of one directory with the same hash are
  told apart by salting the later one (``CookieMap.add``).
- The map (built on a directory's first READDIR) also remembers up to ``keep_removed`` removed
  names, so resuming continues at the first name greater than the cookie's name even if that
  name is gone; re-listings and evictions keep present names' cookies. An unresolvable cookie
  is the caller's ``BadCookie``.
- The 8-byte verifier changes whenever the directory's content changes, but an old verifier is
  accepted whenever its cookie still resolves (the RFC leaves the check to the server), so a
  READDIRPLUS sequence spanning a re-list returns every surviving entry exactly once.
"""

from __future__ import annotations

import hashlib
import itertools
import struct
from collections import deque
from collections.abc import Container, Iterable, Mapping
from typing import Final

from gateway.namespace.entries import Entry

FIRST_COOKIE: Final = 3

_U64 = struct.Struct(">Q")
_COOKIE_MASK: Final = (1 << 63) - 1


def cookie_hash(name: str, salt: int = 0) -> int:
    """Stable READDIR cookie of ``name``: 63 bits of blake2b, never below FIRST_COOKIE."""
    raw = name.encode("utf-8")
    if salt:
        raw += b"\0" + str(salt).encode()
    c: int = _U64.unpack(hashlib.blake2b(raw, digest_size=8).digest())[0] & _COOKIE_MASK
    return c if c >= FIRST_COOKIE else c + FIRST_COOKIE


class CookieMap:
    """cookie -> name for one directory: its present names and its last ``keep_removed``
    removed ones."""

    __slots__ = ("collided", "keep_removed", "names", "removed")

    def __init__(self, names: Iterable[str], keep_removed: int) -> None:
        self.names: dict[int, str] = {}
        self.collided: dict[str, int] = {}  # name -> its salted cookie
        self.removed: deque[tuple[int, str]] = deque()
        self.keep_removed = keep_removed
        for name in names:
            self.add(name)

    def name(self, cookie: int) -> str | None:
        return self.names.get(cookie)

    def cookie(self, name: str) -> int:
        """The cookie of a name in the map."""
        c = self.collided.get(name) if self.collided else None
        return c if c is not None else cookie_hash(name)

    def add(self, name: str) -> None:
        salt = 0
        c = cookie_hash(name)
        while True:
            cur = self.names.get(c)
            if cur is None:
                self.names[c] = name
                break
            if cur == name:
                break
            salt += 1
            c = cookie_hash(name, salt)
        if salt:
            self.collided[name] = c

    def remove(self, name: str, present: Container[str] | None) -> None:
        """``name`` left the directory: keep its cookie (a tombstone) while fewer than
        ``keep_removed`` names were removed after it. ``present``: the directory's names
        now (a name that came back keeps its cookie)."""
        c = self.collided.get(name, cookie_hash(name))
        self.removed.append((c, name))
        while len(self.removed) > self.keep_removed:
            oc, oname = self.removed.popleft()
            if present is None or oname not in present:
                if self.names.get(oc) == oname:
                    del self.names[oc]
                self.collided.pop(oname, None)


def carry(cookies: CookieMap | None, old: Mapping[str, Entry], new: Mapping[str, Entry]) -> bool:
    """A re-list replaces ``old`` by ``new``: carry the cookie map over (tombstones for the
    names gone, cookies for the new ones); True if the content changed (names, kinds, sizes,
    mtimes or ETags), which calls for a new verifier."""
    changed = len(old) != len(new)
    for name, e in old.items():
        ne = new.get(name)
        if ne is None:
            changed = True
            if cookies is not None:
                cookies.remove(name, old)
        elif not changed and (
            ne.kind is not e.kind
            or ne.size != e.size
            or ne.mtime_ns != e.mtime_ns
            or ne.etag != e.etag
        ):
            changed = True
    if cookies is not None and changed:
        for name in new:
            if name not in old:
                cookies.add(name)
    return changed


class Verifiers:
    """Cookie verifiers of one namespace: the start time's seconds, then a counter, so a
    verifier does not repeat within a run and is unlikely to across restarts."""

    __slots__ = ("_base", "_seq")

    def __init__(self, start_ns: int) -> None:
        self._base = ((start_ns // 10**9) & 0xFFFFFFFF) << 32
        self._seq = itertools.count(1)

    def new(self) -> bytes:
        return _U64.pack(self._base | (next(self._seq) & 0xFFFFFFFF))
