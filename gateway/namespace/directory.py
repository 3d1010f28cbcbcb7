"""One cached directory of the index: its view (``Columns`` plus a few whole entries on top),
the listing in flight, its cookies, verifier, probe results, freshness, and the state changes
that touch only it.

Owns: reading the view (``get``, ``kind``), applying one mutation (``set_child``), swapping in
a finished listing (``install``: what a re-list keeps, whether the content changed), cutting a
READDIR page (``rows``: a ``Rows``, no ``Entry`` per plain file; ``page``) and what the
directory costs (``bytes``). Each change returns what changed so the caller keeps the budget
and the generation. Must not: await, talk to the
backend, read a clock or know about other directories (``Namespace`` owns the collection,
TTLs, the budget, times).

- **The view** is ``cols`` (the last listing, compact; ``columns``) and ``extra``: name ->
  ``Entry`` (or None: gone) for the few names that differ from ``cols``: mutations made since
  the listing, and entries whose attributes came from object metadata (a HEAD or a write:
  mode, owner, mtime, symlink). ``extra`` wins. Mutations are folded into new columns
  (``compact``) before a READDIR page is cut when they add or remove names (``adds``,
  ``removes``), and once more than an eighth of the directory (at least 64) accumulated.
- **Mutations** apply at once, also on top of a listing in flight (``Listing.overrides``: that
  listing's result cannot undo them). A directory entry is never replaced by a file entry (the
  directory wins, as in listings).
- **Re-lists keep metadata**: listings carry no object metadata, so an entry whose object
  version is unchanged (same ETag and size) keeps the attributes a HEAD or a write gave it. A
  metadata-only change made elsewhere (a copy in place keeps the ETag) shows only after a HEAD
  (``Namespace.refresh``).
- **Changed** (a new verifier, a new directory time, the TTL back to its minimum) means the
  names, kinds, sizes, mtimes or ETags a client sees differ; an unchanged re-list keeps the
  columns and cookie column objects as they are.
"""

from __future__ import annotations

import math
import re
from array import array
from dataclasses import MISSING, dataclass, fields
from operator import attrgetter
from typing import Final, Literal

from gateway.errors import BadCookie
from gateway.namespace.columns import KIND_DIR, KIND_FILE, Columns, DirEntry, fold
from gateway.namespace.cookies import FIRST_COOKIE, Cookies
from gateway.namespace.entries import DIR_OVERHEAD, ENTRY_BYTES, DirPage, Entry, EntryKind
from gateway.namespace.listing import Listing, PageDigests
from gateway.namespace.paths import join_path

Fresh = Literal["fresh", "stale", "expired", "none"]

_ABSENT: Final = Entry("", "", EntryKind.FILE, 0, 0, 0, "")  # "not in extra"
# Every Entry field with a default (mode, owner, atime, symlink, special file, rdev, ...) and
# the values a listed file has in them: an entry that differs in any is no plain row.
_OPTIONAL: Final = attrgetter(
    *(f.name for f in fields(Entry) if f.default is not MISSING or f.default_factory is not MISSING)
)
_LISTED: Final = _OPTIONAL(_ABSENT)
_NOT_FILE: Final = re.compile(b"[^%c]" % KIND_FILE)  # a row of ``Columns.kinds`` that is no file
_MIN_FOLD: Final = 64  # extra entries kept before folding, whatever the directory's size
# Entries built for lookups kept for the next ones: a client's LOOKUP, ACCESS, GETATTR and READs
# of one file come together (measured: a lookup builds its entry in ~1.3 us, finds it here in
# ~0.1 us). Cleared whenever the view changes.
_RECENT: Final = 16


def _plain(e: Entry) -> bool:
    """An entry a listing could have produced: a file with no metadata over its attributes
    (a directory's attributes are the index's)."""
    if e.kind is EntryKind.DIR:
        return True
    return e.kind is EntryKind.FILE and e.ctime_ns == e.mtime_ns and _OPTIONAL(e) == _LISTED


class Directory:
    """One directory's cached state (see the module docstring)."""

    __slots__ = (
        "adds",
        "bytes",
        "cols",
        "cookies",
        "exists",
        "extra",
        "fresh_until",
        "unfolded",
        "gen",
        "key_prefix",
        "last_seen",
        "listed_at",
        "listing",
        "pages",
        "partial",
        "path",
        "probes",
        "recent",
        "removes",
        "retry_at",
        "ttl",
        "unannounced",
        "verf",
        "watch",
    )

    def __init__(self, path: str, key_prefix: str, ttl: float) -> None:
        self.path = path
        self.key_prefix = key_prefix
        self.cols: Columns | None = None  # None: never listed
        self.extra: dict[str, Entry | None] = {}
        self.recent: dict[str, Entry] = {}  # file entries built for the last lookups
        self.unfolded = 0  # mutations recorded in extra since it was last folded
        self.adds = 0  # names in extra that are not in cols
        self.removes = 0  # names of cols that extra removes
        self.exists = True
        self.listed_at = -math.inf  # monotonic start of the listing the view came from
        self.fresh_until = -math.inf  # listed_at + the TTL, less some jitter
        self.ttl = ttl  # the TTL the next listing gets: grows while re-lists find no change
        self.partial = False  # the view stops at last_seen (max_list_pages)
        self.last_seen = b""
        self.listing: Listing | None = None
        # The pages of the listing ``cols`` came from (a re-list skips the same ones); dropped
        # whenever ``cols`` changes otherwise.
        self.pages: PageDigests | None = None
        self.cookies: Cookies | None = None  # made on the first READDIR
        self.gen = 0
        self.verf = b"\0" * 8
        self.bytes = DIR_OVERHEAD  # what this directory costs, in the budget
        # name -> (entry or None for absent, monotonic expiry) from targeted lookups
        self.probes: dict[str, tuple[Entry | None, float]] = {}
        self.retry_at = -math.inf
        self.unannounced = False  # listed ahead of any client: the watcher is told on first use
        # The store's change token armed when the listing ``cols`` came from started
        # (``ObjectStore.watch_listing``: a local export's inotify watch), or None.
        self.watch: object | None = None

    def freshness(self, now: float, hard_ttl: float) -> Fresh:
        """ "fresh" until ``fresh_until``; then "stale" (served while re-listed) until
        ``hard_ttl`` after the listing started; then (or once expired) "expired"."""
        if self.cols is None:
            return "none"
        if self.listed_at == -math.inf:  # invalidated: re-list before serving (even immutable)
            return "expired"
        if now < self.fresh_until:
            return "fresh"
        return "stale" if now - self.listed_at <= hard_ttl else "expired"

    def listed(self, started_at: float, jitter: float) -> None:
        """The view comes from a listing that started at ``started_at`` (-inf: one that
        predates an invalidate): fresh for ``ttl`` less the fraction ``jitter`` of it."""
        self.listed_at = started_at
        self.fresh_until = (
            -math.inf if started_at == -math.inf else started_at + self.ttl * (1 - jitter)
        )

    def expire(self) -> None:
        """Re-list before serving the view again (also on an immutable export)."""
        self.listed_at = self.fresh_until = -math.inf
        self.retry_at = -math.inf
        if self.listing is not None:
            self.listing.invalid = True

    # -- reading the view ----------------------------------------------------------------------

    def count(self) -> int:
        """Entries in the view."""
        return 0 if self.cols is None else self.cols.n + self.adds - self.removes

    def get(self, name: str, dir_entry: DirEntry) -> Entry | None:
        """``name``'s entry in the view (there must be one), or None."""
        recent = self.recent
        e = recent.get(name)
        if e is not None:
            return e
        cols = self.cols
        assert cols is not None
        if self.extra:
            e = self.extra.get(name, _ABSENT)
            if e is not _ABSENT:
                if e is not None and e.kind is EntryKind.DIR:
                    return dir_entry(name, e.path)
                return e
        r = cols.find(name)
        if r < 0:
            return None
        e = cols.entry(r, name, join_path(self.path, name), dir_entry)
        if e.kind is not EntryKind.DIR:  # a directory's times are the index's, read anew
            if len(recent) >= _RECENT:
                del recent[next(iter(recent))]
            recent[name] = e
        return e

    def kind(self, name: str) -> EntryKind | None:
        """``name``'s kind in the view (None: absent or no view), without building an entry."""
        cols = self.cols
        if cols is None:
            return None
        if self.extra:
            e = self.extra.get(name, _ABSENT)
            if e is not _ABSENT:
                return None if e is None else e.kind
        r = cols.find(name)
        return None if r < 0 else cols.kind(r)

    # -- changes ---------------------------------------------------------------------------------

    def set_child(self, name: str, entry: Entry | None) -> tuple[int, int]:
        """``name`` is now ``entry`` (None: gone); (bytes, entries) added to the budget."""
        lst = self.listing
        if lst is not None:
            lst.overrides[name] = entry
        self.recent.clear()
        nentries = 0
        cols = self.cols
        if cols is not None:
            r = cols.find(name)
            prev = self.extra.get(name, _ABSENT)
            if prev is _ABSENT:
                old = None if r < 0 else cols.kind(r)
            else:
                old = None if prev is None else prev.kind
            if entry is None or old is not EntryKind.DIR or entry.kind is EntryKind.DIR:
                if prev is not _ABSENT:
                    self._pending(prev, r, -1)
                    del self.extra[name]
                if not self._same_as_row(entry, r):
                    self.extra[name] = entry
                    self._pending(entry, r, 1)
                    self.unfolded += 1
                nentries = (entry is not None) - (old is not None)
                if entry is None and old is not None and self.cookies is not None:
                    self.cookies.remove(self.cookies.cookie(cols, r, name), name, self._present)
                if self.unfolded > max(_MIN_FOLD, cols.n // 8):
                    self.compact()
        self.probes.pop(name, None)
        if entry is not None:
            self.exists = True
        return self.recost(), nentries

    def _same_as_row(self, e: Entry | None, r: int) -> bool:
        if e is None or r < 0 or not _plain(e):
            return False
        cols = self.cols
        assert cols is not None
        if e.kind is EntryKind.DIR:
            return cols.kinds[r] == KIND_DIR
        return cols.same_row(r, KIND_FILE, e.size, e.mtime_ns, e.etag)

    def _pending(self, e: Entry | None, r: int, sign: int) -> None:
        if e is None:
            if r >= 0:
                self.removes += sign
        elif r < 0:
            self.adds += sign

    def _present(self, name: str) -> bool:
        return self.kind(name) is not None

    def compact(self) -> None:
        """Fold ``extra`` into new columns: names added and removed, and plain attributes;
        entries with metadata stay in ``extra`` over their (listed) row."""
        cols = self.cols
        assert cols is not None
        if not self.extra:
            return
        folding: dict[str, Entry | None] = {}
        keep: dict[str, Entry | None] = {}
        for name, e in self.extra.items():
            r = cols.find(name)
            if e is None:
                if r >= 0:
                    folding[name] = None
            elif r < 0 or _plain(e):
                folding[name] = e
                if not _plain(e):
                    keep[name] = e
            else:
                keep[name] = e
        self._set_cols(fold(cols, folding))
        self.extra = keep
        self.adds = self.removes = self.unfolded = 0

    def _set_cols(self, new: Columns) -> None:
        old = self.cols
        self.cols = new
        if new is not old:
            self.recent.clear()
            self.pages = None
        if self.cookies is not None and new is not old:
            self.cookies.column(new, old)

    def recost(self) -> int:
        """Bring ``bytes`` up to date; the change."""
        n = DIR_OVERHEAD + ENTRY_BYTES * (len(self.extra) + len(self.probes))
        if self.cols is not None:
            n += self.cols.nbytes
        if self.cookies is not None:
            n += self.cookies.nbytes()
        if self.pages is not None:
            n += self.pages.nbytes
        delta = n - self.bytes
        self.bytes = n
        return delta

    def install(self, lst: Listing, partial: bool) -> tuple[bool, int, int]:
        """Make finished listing ``lst`` the view, with the mutations made meanwhile and the
        metadata a re-list keeps; (content changed, bytes, entries added to the budget)."""
        old_count = self.count()
        held = lst.count(), lst.bytes  # what the budget counts for the listing until now
        if self.adds or self.removes:
            self.compact()
        old_cols, old_extra = self.cols, self.extra
        cols, listed_meta = lst.result(self.path)
        extra: dict[str, Entry | None] = dict(listed_meta)
        for name, e in old_extra.items():  # what a re-list keeps
            if e is None or e.kind is EntryKind.DIR or name in extra:
                continue
            r = cols.find(name)
            if (
                r >= 0
                and cols.kinds[r] == KIND_FILE
                and cols.sizes[r] == e.size
                and cols.etag(r) == e.etag
            ):
                extra[name] = e  # the same object version: what a HEAD or write gave it
        cookies = self.cookies
        if old_cols is not None and cookies is not None and cols is not old_cols:
            now = set(cols.names_of(0, cols.n))
            for name in sorted(set(old_cols.names_of(0, old_cols.n)) - now):
                c = cookies.cookie(old_cols, old_cols.find(name), name)
                cookies.remove(c, name, now.__contains__)
        self._set_cols(cols)
        # cols is what these pages make (and a re-list of the same pages keeps): ListObjectsV2
        # pages carry no metadata, a partial listing is not kept.
        self.pages = None if partial or listed_meta else lst.record()
        self.recent.clear()
        self.extra = {}
        self.adds = self.removes = self.unfolded = 0
        for name, e in (*extra.items(), *lst.overrides.items()):
            r = cols.find(name)
            prev = self.extra.pop(name, _ABSENT)
            if prev is not _ABSENT:
                self._pending(prev, r, -1)
            if not self._same_as_row(e, r):
                self.extra[name] = e
                self._pending(e, r, 1)
        changed = old_cols is None or _differs(old_cols, old_extra, cols, self.extra)
        self.partial = partial
        self.last_seen = lst.last_seen
        self.exists = not self.path or self.count() > 0 or lst.marker_seen
        self.probes.clear()
        self.retry_at = -math.inf
        return changed, self.recost() - held[1], self.count() - old_count - held[0]

    # -- READDIR ---------------------------------------------------------------------------------

    def rows(self, cookie: int, max_entries: int, keep_removed: int, dir_entry: DirEntry) -> Rows:
        """Up to ``max_entries`` rows of the view after ``cookie`` (below ``FIRST_COOKIE``: from
        the start), as a ``Rows``; BadCookie if the cookie does not resolve."""
        if self.adds or self.removes:
            self.compact()
        cols = self.cols
        assert cols is not None
        if self.cookies is None:
            self.cookies = Cookies(keep_removed)
        cookies = self.cookies
        col = cookies.column(cols)
        if cookie < FIRST_COOKIE:
            start = 0
        else:
            start = cookies.start(cols, cookie)
            if start < 0:
                raise BadCookie(f"cookie {cookie} in {self.path!r}")
        stop = min(cols.n, start + max_entries)
        names = cols.names_of(start, stop)
        d = self.path
        special: dict[int, Entry] = {}
        if not cols.allfiles:  # directories (times from the index) and folded symlinks
            for m in _NOT_FILE.finditer(cols.kinds, start, stop):
                i = m.start() - start
                name = names[i]
                special[i] = cols.entry(m.start(), name, join_path(d, name), dir_entry)
        extra = self.extra
        if extra:  # metadata and mutations not folded; a removal (None) shows the row
            if len(extra) <= len(names):
                found = ((cols.find(name) - start, e) for name, e in extra.items())
            else:
                found = ((i, extra.get(name)) for i, name in enumerate(names))
            for i, e in found:
                if e is not None and 0 <= i < len(names):
                    special[i] = dir_entry(names[i], e.path) if e.kind is EntryKind.DIR else e
        if names:
            cookies.handed_out(col[stop - 1], names[-1])
        return Rows(
            self.verf, stop == cols.n, self.partial, d, cols, start, names, col[start:stop], special
        )

    def page(
        self, cookie: int, max_entries: int, keep_removed: int, dir_entry: DirEntry
    ) -> DirPage:
        """``rows`` as (cookie, Entry) pairs."""
        return self.rows(cookie, max_entries, keep_removed, dir_entry).page()


@dataclass(eq=False, repr=False, slots=True)
class Rows:
    """One READDIR(PLUS) page as rows of a directory's columns (no ``Entry`` per row): rows
    [``start``, ``start`` + len(``names``)) of ``cols``, their ``cookies``, and ``special``:
    index in the page -> the entry to show instead of the row's listed values (directories,
    symlinks, entries with metadata or mutations). Every other row is a file as a listing
    shows it: its attributes are its path, size and mtime (``attrs.listed_file_fields``).
    ``eof``: the directory's last row is included; ``truncated``: partial mode."""

    verifier: bytes
    eof: bool
    truncated: bool
    path: str
    cols: Columns
    start: int
    names: list[str]
    cookies: array[int]
    special: dict[int, Entry]

    def sizes(self) -> array[int]:
        return self.cols.sizes[self.start : self.start + len(self.names)]

    def mtimes(self) -> array[int]:
        return self.cols.mtimes[self.start : self.start + len(self.names)]

    def page(self) -> DirPage:
        """The rows as (cookie, Entry) pairs."""
        out: list[tuple[int, Entry]] = []
        cols, d, special, start = self.cols, self.path, self.special, self.start
        for i, (c, name) in enumerate(zip(self.cookies, self.names, strict=True)):
            e = special.get(i)
            if e is None:
                e = cols.entry(start + i, name, f"{d}/{name}" if d else name, _no_dir)
            out.append((c, e))
        return DirPage(self.verifier, out, self.eof, self.truncated)


def _no_dir(name: str, path: str) -> Entry:
    raise AssertionError(f"directory row {path!r} not in Rows.special")


def _differs(
    old: Columns,
    old_extra: dict[str, Entry | None],
    new: Columns,
    new_extra: dict[str, Entry | None],
) -> bool:
    """Whether a client sees other names, kinds, sizes, mtimes or ETags."""
    if new is old and _signature(old_extra) == _signature(new_extra):
        return False
    return not fold(old, old_extra).equal(fold(new, new_extra))


def _signature(extra: dict[str, Entry | None]) -> dict[str, tuple[object, ...] | None]:
    return {
        n: None if e is None else (e.kind, e.size, e.mtime_ns, e.etag) for n, e in extra.items()
    }
