"""One cached directory of the index: its view (name -> ``Entry`` in name order), the listing
in flight, its cookie map, verifier, probe results, and the state changes that touch only it.

Owns: applying one mutation to the view (``set_child``), swapping in a finished listing
(``install``) and cutting a READDIR page (``page``); each returns what changed so the caller
keeps the budget and the generation. Must not: await, talk to the backend, read a clock or
know about other directories (``Namespace`` owns the collection, TTLs, the budget, times).

**Mutations** apply at once, also on top of a listing in flight (``Listing.overrides``: that
listing's result cannot undo them). A directory entry is never replaced by a file entry (the
directory wins, as in listings).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from sortedcontainers import SortedDict  # type: ignore[import-untyped]

from gateway.errors import BadCookie
from gateway.namespace.cookies import FIRST_COOKIE, CookieMap, carry
from gateway.namespace.entries import DIR_OVERHEAD, DirPage, Entry, EntryKind, entry_bytes
from gateway.namespace.listing import Listing, keep_metadata
from gateway.namespace.paths import join_path


class Directory:
    """One directory's cached state (see the module docstring)."""

    __slots__ = (
        "bytes",
        "cookies",
        "exists",
        "gen",
        "key_prefix",
        "last_seen",
        "listed_at",
        "listing",
        "partial",
        "path",
        "probes",
        "retry_at",
        "verf",
        "view",
    )

    def __init__(self, path: str, key_prefix: str) -> None:
        self.path = path
        self.key_prefix = key_prefix
        self.view: SortedDict[str, Entry] | None = None
        self.exists = True
        self.listed_at = -math.inf  # monotonic start of the listing the view came from
        self.partial = False  # the view stops at last_seen (max_list_pages)
        self.last_seen = b""
        self.listing: Listing | None = None
        self.cookies: CookieMap | None = None  # built on the first READDIR
        self.gen = 0
        self.verf = b"\0" * 8
        self.bytes = DIR_OVERHEAD  # the budget's estimate of this directory
        # name -> (entry or None for absent, monotonic expiry) from targeted lookups
        self.probes: dict[str, tuple[Entry | None, float]] = {}
        self.retry_at = -math.inf

    def expire(self) -> None:
        """Re-list before serving the view again (also on an immutable export)."""
        self.listed_at = -math.inf
        self.retry_at = -math.inf
        if self.listing is not None:
            self.listing.invalid = True

    def cookie_map(self, keep_removed: int) -> CookieMap:
        if self.cookies is None:
            assert self.view is not None
            self.cookies = CookieMap(self.view, keep_removed)
        return self.cookies

    def set_child(self, name: str, entry: Entry | None) -> tuple[int, int]:
        """``name`` is now ``entry`` (None: gone); (bytes, entries) added to the budget."""
        nbytes = nentries = 0
        lst = self.listing
        if lst is not None:
            lst.overrides[name] = entry
        view = self.view
        if view is not None:
            path = join_path(self.path, name)
            old = view.get(name)
            if entry is None:
                if old is not None:
                    del view[name]
                    nbytes, nentries = -entry_bytes(name, path), -1
                    if self.cookies is not None:
                        self.cookies.remove(name, view)
            elif old is None or not (old.kind is EntryKind.DIR and entry.kind is not EntryKind.DIR):
                view[name] = entry
                if old is None:
                    nbytes, nentries = entry_bytes(name, path), 1
                    if self.cookies is not None:
                        self.cookies.add(name)
        self.bytes += nbytes
        self.probes.pop(name, None)
        if entry is not None:
            self.exists = True
        return nbytes, nentries

    def install(self, lst: Listing, partial: bool) -> tuple[bool, int, int]:
        """Make finished listing ``lst`` the view, with the mutations made meanwhile and the
        metadata a re-list keeps; (content changed, bytes, entries added to the budget)."""
        nbytes = nentries = 0
        new_entries = lst.entries
        for name, e in lst.overrides.items():
            path = join_path(self.path, name)
            had = name in new_entries
            if e is None:
                if had:
                    del new_entries[name]
                    lst.bytes -= entry_bytes(name, path)
                    nbytes -= entry_bytes(name, path)
                    nentries -= 1
            else:
                new_entries[name] = e
                if not had:
                    lst.bytes += entry_bytes(name, path)
                    nbytes += entry_bytes(name, path)
                    nentries += 1
        old = self.view
        if old is not None:
            keep_metadata(old, new_entries, lst.overrides)
        new: SortedDict[str, Entry] = SortedDict(new_entries)
        changed = old is None or carry(self.cookies, old, new)
        # Swap in the new view; the old one's bytes go.
        nbytes -= self.bytes - DIR_OVERHEAD
        nentries -= len(old) if old is not None else 0
        self.view = new
        self.bytes = DIR_OVERHEAD + lst.bytes
        self.partial = partial
        self.last_seen = lst.last_seen
        self.listed_at = -math.inf if lst.invalid else lst.started_at
        self.exists = not self.path or bool(new) or lst.marker_seen
        self.probes.clear()
        self.retry_at = -math.inf
        return changed, nbytes, nentries

    def page(self, cookie: int, max_entries: int, keep_removed: int) -> DirPage:
        """Up to ``max_entries`` entries of the view after ``cookie`` (below ``FIRST_COOKIE``:
        from the start); BadCookie if the cookie does not resolve."""
        view = self.view
        assert view is not None
        cookies = self.cookie_map(keep_removed)
        names: Iterable[str]
        if cookie < FIRST_COOKIE:
            names = view.irange()
        else:
            after = cookies.name(cookie)
            if after is None:
                raise BadCookie(f"cookie {cookie} in {self.path!r}")
            names = view.irange(minimum=after, inclusive=(False, True))
        out: list[tuple[int, Entry]] = []
        eof = True
        for name in names:
            if len(out) >= max_entries:
                eof = False
                break
            out.append((cookies.cookie(name), view[name]))
        return DirPage(self.verf, out, eof, self.partial)
