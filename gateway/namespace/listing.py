"""Reading directories from the backend: one whole-directory listing in flight (paging,
comparing a re-list's pages with the view or building new columns, letting callers wait for
the next page) and the targeted lookup of one name.

Owns: every LIST request the index makes and the translation of their failures
(``gateway.errors.from_backend``: a missing object there means NOENT, a name being resolved).
Must not: hold the index's state (which directories are cached, their TTLs, the budget: that
is ``Namespace``; the view and what a re-list keeps of it: ``Directory``) or HEAD objects.

- **Directories** are common prefixes and ``dir/`` marker objects (``Delimiter='/'``); a marker
  is the key equal to the listed prefix and proves an empty directory exists (so do keys that
  cannot be a path). **A name that is both an object and a prefix is shown as the
  directory**; the object is unreachable through NFS.
- **One listing in flight** per directory (``Listing``): callers ``await asyncio.shield`` its
  task or its next page, so a cancelled caller never cancels the listing. A name the listing
  has passed (``reached``) is answered at once, even while later pages are still coming.
- **Targeted lookups** (``targeted_lookup``): one LIST with prefix = D + name, delimiter '/',
  ``targeted_max_keys`` keys, shows both the object ``name`` and the prefix ``name/``; only if
  more than that many keys sort between them ("name-x", "name.jpg" < "name/") a second LIST
  (prefix = D + name + '/', one key) settles whether the directory exists.
- **A re-list costs what changed** (``Listing``): its pages are compared with the view's
  columns as they arrive, a run of rows at a time (``Columns.same_files``: no object per
  entry); new columns are built only from the first difference on, starting from the rows
  found unchanged. An unchanged directory keeps its columns (the same objects).
- **An unchanged page is not even parsed** (``PageDigests``): the listing that made the
  view's columns left the digest of each of its pages (``ListPage.digest``; a few bytes and
  the continuation token a page); a re-list asks the store for each page "unless its digest is
  still this" (``list_page_if_changed``, when the store has it) and holds the pages that
  come back ``Unchanged``, unparsed. The entries' names, sizes, ETags and times are in the
  page's bytes, so when every page is the same as before, in the same order and number, the
  directory is the same: nothing is parsed, compared or built. At the first page that differs
  (or when the held pages pass ``HELD_MAX_BYTES``) the held pages are parsed and the re-list
  goes on as above, from the first page: what it finds is what the comparison alone finds.
  Held pages do not advance the listing's ``last_seen`` (lookups meanwhile are answered by
  the view, as for any re-list in the background).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass
from operator import attrgetter

from gateway.backend.base import BackendError, ListPage, ObjectInfo, ObjectStore, Unchanged
from gateway.errors import NotFound, from_backend
from gateway.namespace.columns import KIND_DIR, KIND_FILE, Columns, DirEntry
from gateway.namespace.entries import (
    BUILD_ENTRY_BYTES,
    Entry,
    EntryKind,
    NamespaceStats,
    file_entry,
)
from gateway.namespace.paths import NAME_MAX, bad_name, join_path, key_order

_KEY = attrgetter("key")
_META = attrgetter("metadata")
_SIZE = attrgetter("size")
_MTIME = attrgetter("mtime_ns")
_ETAG = attrgetter("etag")

# Bytes of pages a re-list holds unparsed (``PageDigests``): past it, they are parsed and the
# re-list compares its pages as they come (~30 pages of 1,000 keys in SeaweedFS's form).
HELD_MAX_BYTES = 8 << 20


@dataclass(slots=True, eq=False)
class PageDigests:
    """What a complete listing leaves for the next one of the same directory, whose columns
    it made: each page's digest (all of one length, one after another) and next token, and
    what the listing as a whole found (``last_seen``, a marker, keys skipped)."""

    digests: bytes
    size: int
    tokens: tuple[str | None, ...]
    last_seen: bytes
    marker_seen: bool
    skipped: int

    def __len__(self) -> int:
        return len(self.tokens)

    def digest(self, i: int) -> bytes:
        return self.digests[i * self.size : (i + 1) * self.size]

    @property
    def nbytes(self) -> int:
        """Roughly what it costs (in the index budget)."""
        return (
            120
            + len(self.digests)
            + len(self.last_seen)
            + sum(50 + len(t) for t in self.tokens if t is not None)
        )


class Builder:
    """The entries of a listing that builds new columns, in the order they arrive (packed and
    sorted once, by ``finish``), with a name -> position map for lookups meanwhile and for a
    prefix that turns an object already seen into the directory of the same name."""

    __slots__ = ("etags", "index", "kinds", "meta", "mtimes", "names", "sizes")

    def __init__(self) -> None:
        self.names: list[str] = []
        self.kinds = bytearray()
        self.sizes: list[int] = []
        self.mtimes: list[int] = []
        self.etags: list[str] = []
        self.index: dict[str, int] = {}
        self.meta: dict[str, Entry] = {}  # entries whose listing carried metadata

    def __len__(self) -> int:
        return len(self.names)

    def seed(self, cols: Columns, rows: Iterable[int]) -> None:
        """Start from rows of ``cols`` (those a re-list had found unchanged)."""
        names, kinds, sizes, mtimes, etags = cols.lists()
        keep = list(rows)
        if len(keep) != cols.n:
            names = [names[r] for r in keep]
            kinds = bytearray(kinds[r] for r in keep)
            sizes = [sizes[r] for r in keep]
            mtimes = [mtimes[r] for r in keep]
            etags = [etags[r] for r in keep]
        self.index.update(zip(names, itertools.count(len(self.names))))
        self.names += names
        self.kinds += kinds
        self.sizes += sizes
        self.mtimes += mtimes
        self.etags += etags

    def file(self, name: str, path: str, obj: ObjectInfo) -> bool:
        """Add a listed object; False if the name was there already."""
        i = self.index.get(name)
        if i is not None and self.kinds[i] == KIND_DIR:
            return False  # the directory of the same name wins
        if obj.metadata:
            self.meta[name] = file_entry(name, path, obj)
        if i is not None:
            self.sizes[i], self.mtimes[i], self.etags[i] = obj.size, obj.mtime_ns, obj.etag
            return False
        self.index[name] = len(self.names)
        self.names.append(name)
        self.kinds.append(KIND_FILE)
        self.sizes.append(obj.size)
        self.mtimes.append(obj.mtime_ns)
        self.etags.append(obj.etag)
        return True

    def files(self, objs: Sequence[ObjectInfo], kp: str) -> bool:
        """Add a page of listed objects at C speed when it is the usual one: every key is
        ``kp`` + a good ASCII name (``bad_name``) not added before, and no object carries
        metadata; False (nothing added: take ``file`` one at a time) otherwise."""
        k = len(objs)
        keys = list(map(_KEY, objs))
        if (
            not k
            or any(map(_META, objs))
            or sum(map(str.startswith, keys, itertools.repeat(kp))) != k
        ):
            return False
        text = "\0".join(keys)
        if text.count("\0") != k - 1 or not text.isascii():
            return False
        # No NUL inside a key: every separator is followed by the prefix, cut with it.
        text = (text.replace("\0" + kp, "\0") if kp else text)[len(kp) :]
        if "/" in text:
            return False
        names = text.split("\0")
        lens = list(map(len, names))
        seen = set(names)
        if (
            min(lens) < 1
            or max(lens) > NAME_MAX
            or len(seen) != k
            or "." in seen
            or ".." in seen
            or not self.index.keys().isdisjoint(seen)
        ):
            return False
        self.index.update(zip(names, itertools.count(len(self.names))))
        self.names += names
        self.kinds += bytes([KIND_FILE]) * k
        self.sizes += map(_SIZE, objs)
        self.mtimes += map(_MTIME, objs)
        self.etags += map(_ETAG, objs)
        return True

    def dir(self, name: str) -> bool:
        """Add a listed common prefix; False if the name was there already."""
        i = self.index.get(name)
        if i is not None:
            self.kinds[i] = KIND_DIR
            self.sizes[i] = self.mtimes[i] = 0
            self.etags[i] = ""
            self.meta.pop(name, None)
            return False
        self.index[name] = len(self.names)
        self.names.append(name)
        self.kinds.append(KIND_DIR)
        self.sizes.append(0)
        self.mtimes.append(0)
        self.etags.append("")
        return True

    def get(self, name: str, path: str, dir_entry: DirEntry) -> Entry | None:
        i = self.index.get(name)
        if i is None:
            return None
        if self.kinds[i] == KIND_DIR:
            return dir_entry(name, path)
        e = self.meta.get(name)
        if e is not None:
            return e
        m = self.mtimes[i]
        return Entry(name, path, EntryKind.FILE, self.sizes[i], m, m, self.etags[i])

    def finish(self) -> Columns:
        names = self.names
        if sorted(names) == names:
            return Columns(names, self.kinds, self.sizes, self.mtimes, self.etags)
        order = sorted(range(len(names)), key=names.__getitem__)
        return Columns(
            [names[i] for i in order],
            bytes(self.kinds[i] for i in order),
            [self.sizes[i] for i in order],
            [self.mtimes[i] for i in order],
            [self.etags[i] for i in order],
        )


class Listing:
    """One listing of a directory in flight: what it found so far, the mutations made
    meanwhile (``overrides``: they win over what the listing reports), how far it got.

    A first listing builds (``builder``). A re-list compares its pages with the view's columns
    (``base``) as they arrive, building nothing: a run of rows at a time while every page is
    the next rows' files (``pos``), else name by name (``matched``, a byte per row). At the
    first difference it starts a ``Builder`` from the rows found unchanged so far; a re-list
    that finds nothing different ends with ``result()`` returning ``base`` itself."""

    __slots__ = (
        "base",
        "builder",
        "bytes",
        "digests",
        "held",
        "held_bytes",
        "invalid",
        "known",
        "last_seen",
        "marker_seen",
        "matched",
        "nmatched",
        "overrides",
        "ahead",
        "page_fut",
        "pages",
        "pos",
        "relist",
        "shadowed",
        "skipped",
        "started_at",
        "t0",
        "task",
        "tokens",
        "unchanged",
        "watch",
    )

    def __init__(
        self, started_at: float, base: Columns | None, known: PageDigests | None = None
    ) -> None:
        self.base = base
        # The pages of the listing that made ``base`` (None: parse every page), the pages held
        # unparsed while they are the same, whether every page was (then ``base`` stands).
        self.known = known if base is not None else None
        self.held: list[Unchanged] = []
        self.held_bytes = 0
        self.unchanged = False
        self.digests: list[bytes] = []  # this listing's pages, for the next (``record``)
        self.tokens: list[str | None] = []
        self.skipped = 0
        self.builder: Builder | None = Builder() if base is None else None
        self.pos = 0  # rows of base matched, in order (while ``matched`` is None)
        self.matched: bytearray | None = None
        self.nmatched = 0
        self.shadowed: list[tuple[str, ObjectInfo]] = []  # objects behind a directory row
        self.overrides: dict[str, Entry | None] = {}
        self.last_seen = b""
        self.pages = 0
        self.bytes = 0  # the builder's, in the budget
        self.marker_seen = False
        self.invalid = False  # predates an invalidate(): its result is served expired
        self.relist = base is not None
        self.ahead = False  # started ahead of a client (``ListingSchedule.list_ahead``)
        self.started_at = started_at
        self.t0 = time.perf_counter()
        self.watch: object | None = None  # the store's change token, armed as it started
        self.task: asyncio.Task[None] | None = None
        self.page_fut: asyncio.Future[None] | None = None

    def count(self) -> int:
        """Entries this listing holds (in the budget's entry count)."""
        return len(self.builder) if self.builder is not None else 0

    def start(self, coro: Coroutine[object, object, None]) -> None:
        self.task = asyncio.get_running_loop().create_task(coro)
        self.task.add_done_callback(_retrieve)

    async def wait(self) -> None:
        """Until the listing ends; raises its error."""
        assert self.task is not None
        await asyncio.shield(self.task)

    async def next_page(self) -> None:
        """Until the listing ingests another page or ends."""
        fut = self.page_fut
        if fut is None:
            fut = self.page_fut = asyncio.get_running_loop().create_future()
        await asyncio.shield(fut)

    def wake(self) -> None:
        fut = self.page_fut
        if fut is not None:
            self.page_fut = None
            if not fut.done():
                fut.set_result(None)

    async def run(
        self,
        store: ObjectStore,
        key_prefix: str,
        *,
        page_keys: int,
        max_pages: int,
        on_page: Callable[[ListPage], None],
        on_received: Callable[[], None],
    ) -> bool:
        """Page through the directory ``key_prefix``: ``on_received`` for each page received,
        ``on_page`` for each page to ingest (a page held unparsed, the same as before, only
        later and if a page differs: ``flush``); True if it stopped after ``max_pages``
        pages with more to come (partial)."""
        token: str | None = None
        known = self.known
        if_changed = None if known is None else getattr(store, "list_page_if_changed", None)
        while True:
            i = self.pages
            try:
                if if_changed is not None and known is not None and i < len(known):
                    got: ListPage | Unchanged = await if_changed(
                        key_prefix,
                        delimiter="/",
                        token=token,
                        max_keys=page_keys,
                        known=known.digest(i),
                    )
                else:
                    got = await store.list_page(
                        key_prefix, delimiter="/", token=token, max_keys=page_keys
                    )
                self.pages += 1
                if isinstance(got, Unchanged):
                    assert known is not None
                    self.held.append(got)
                    self.held_bytes += got.nbytes
                    self.digests.append(got.digest)
                    next_token = known.tokens[i]
                    self.tokens.append(next_token)
                    on_received()
                    if self.held_bytes > HELD_MAX_BYTES:
                        if_changed = None
                        self.flush(on_page)
                else:
                    if_changed = None  # a page differs: parse and compare from here on
                    self.flush(on_page)
                    self.digests.append(got.digest)
                    next_token = got.next_token
                    self.tokens.append(next_token)
                    on_received()
                    on_page(got)
            except BackendError as exc:
                raise from_backend(exc, NotFound) from exc
            if next_token is None:
                break
            if self.pages >= max_pages:
                self.flush(on_page)
                return True
            token = next_token
        if self.held:
            if known is not None and len(self.held) == len(known) == self.pages:
                self.unchanged = True  # every page as before: so is the directory
                self.held = []
                self.last_seen = known.last_seen
                self.marker_seen = known.marker_seen
                self.skipped = known.skipped
            else:
                self.flush(on_page)
        return False

    def flush(self, on_page: Callable[[ListPage], None]) -> None:
        """Parse the pages held so far and hand them to ``on_page`` (``ingest``), in order."""
        held, self.held = self.held, []
        self.held_bytes = 0
        self.known = None
        for u in held:
            on_page(u.parse())

    def record(self) -> PageDigests | None:
        """What this (complete, not partial) listing leaves for the next one; None if a page
        came without a digest."""
        digests = self.digests
        if not digests or not digests[0] or len(set(map(len, digests))) != 1:
            return None
        return PageDigests(
            b"".join(digests),
            len(digests[0]),
            tuple(self.tokens),
            self.last_seen,
            self.marker_seen,
            self.skipped,
        )

    def get(self, name: str, path: str, dir_entry: DirEntry) -> Entry | None:
        """``name`` as this listing has it so far (the caller checks ``reached`` and
        ``overrides``)."""
        if self.builder is not None:
            return self.builder.get(name, path, dir_entry)
        base = self.base
        assert base is not None
        r = base.find(name)
        if r < 0 or (r >= self.pos if self.matched is None else not self.matched[r]):
            return None
        return base.entry(r, name, path, dir_entry)

    def ingest(self, page: ListPage, key_prefix: str, dir_path: str) -> tuple[int, int, int]:
        """Take in ``page``'s children of ``dir_path``; (entries and bytes the listing holds
        now more than before, keys skipped)."""
        entries, nbytes = self.count(), self.bytes
        skipped = self._ingest(page, key_prefix, dir_path)
        if skipped:
            self.marker_seen = True  # unpathable keys still prove the directory exists
            self.skipped += skipped
        return self.count() - entries, self.bytes - nbytes, skipped

    def _ingest(self, page: ListPage, kp: str, dir_path: str) -> int:
        objs = page.objects
        if objs and objs[0].key == kp:  # the marker sorts first
            self.marker_seen = True
            objs = objs[1:]
        last = page_end(page)
        if last > self.last_seen:
            self.last_seen = last
        if self.builder is None:
            base = self.base
            assert base is not None
            if self.matched is None and not page.prefixes and base.same_files(self.pos, objs, kp):
                self.pos += len(objs)
                return page.skipped
            skipped = self._compare(base, objs, page.prefixes, kp)
            if skipped >= 0:
                return skipped + page.skipped
            self._diverge(dir_path)
        return self._build(objs, page.prefixes, kp, dir_path) + page.skipped

    def _compare(
        self, base: Columns, objs: Sequence[ObjectInfo], prefixes: Sequence[str], kp: str
    ) -> int:
        """Match a page name by name against ``base``; the keys skipped, or -1 at the first
        difference."""
        m = self.matched
        if m is None:
            m = self.matched = bytearray(base.n)
            m[: self.pos] = b"\1" * self.pos
            self.nmatched = self.pos
        n = len(kp)
        skipped = 0
        for obj in objs:
            key = obj.key
            name = key[n:]
            if not key.startswith(kp) or bad_name(name):
                skipped += 1
                continue
            r = base.find(name)
            if r < 0 or obj.metadata or m[r]:
                return -1
            if base.kinds[r] == KIND_DIR:
                self.shadowed.append((name, obj))  # its prefix is compared when it comes
                continue
            if not base.same_row(r, KIND_FILE, obj.size, obj.mtime_ns, obj.etag):
                return -1
            m[r] = 1
            self.nmatched += 1
        for cp in prefixes:
            name = cp[n:-1]
            if not cp.startswith(kp) or not cp.endswith("/") or bad_name(name):
                skipped += 1
                continue
            r = base.find(name)
            if r < 0 or base.kinds[r] != KIND_DIR or m[r]:
                return -1
            m[r] = 1
            self.nmatched += 1
        return skipped

    def _diverge(self, dir_path: str) -> None:
        """The listing differs from ``base``: build from the rows found unchanged so far."""
        base = self.base
        assert base is not None and self.builder is None
        b = self.builder = Builder()
        if self.matched is None:
            b.seed(base, range(self.pos))
        else:
            b.seed(base, itertools.compress(range(base.n), self.matched))
        for name, obj in self.shadowed:
            b.file(name, join_path(dir_path, name), obj)
        self.matched = None
        self.shadowed = []
        self.bytes += len(b) * BUILD_ENTRY_BYTES

    def _build(
        self, objs: Sequence[ObjectInfo], prefixes: Sequence[str], kp: str, dir_path: str
    ) -> int:
        """Add a page to the builder; the keys skipped."""
        b = self.builder
        assert b is not None
        n = len(kp)
        before = len(b)
        skipped = 0
        for obj in () if b.files(objs, kp) else objs:
            key = obj.key
            name = key[n:]
            if not key.startswith(kp) or bad_name(name):
                skipped += 1
                continue
            b.file(name, f"{dir_path}/{name}" if dir_path else name, obj)
        for cp in prefixes:
            name = cp[n:-1]
            if not cp.startswith(kp) or not cp.endswith("/") or bad_name(name):
                skipped += 1
                continue
            b.dir(name)
        self.bytes += (len(b) - before) * BUILD_ENTRY_BYTES
        return skipped

    def result(self, dir_path: str) -> tuple[Columns, dict[str, Entry]]:
        """The listing's columns (``base`` itself when nothing differed) and the entries whose
        listing carried metadata."""
        base = self.base
        if self.builder is None:
            assert base is not None
            if self.unchanged or (self.pos if self.matched is None else self.nmatched) == base.n:
                return base, {}
            self._diverge(dir_path)  # rows gone
        b = self.builder
        assert b is not None
        return b.finish(), b.meta


def _retrieve(task: asyncio.Task[None]) -> None:
    if not task.cancelled():
        task.exception()  # retrieved here; waiters get it through their shield


def page_end(page: ListPage) -> bytes:
    """The last key or prefix of ``page`` in listing order (b"" for an empty page)."""
    last = b""
    if page.objects:
        last = key_order(page.objects[-1].key)
    if page.prefixes:
        last = max(last, key_order(page.prefixes[-1]))
    return last


def reached(last_seen: bytes, key_prefix: str, name: str) -> bool:
    """Whether a listing of ``key_prefix`` that got to ``last_seen`` has settled ``name``:
    both "name" and "name/" sort at or before the key "name/", so once the listing has passed
    it, neither can appear later."""
    return key_order(f"{key_prefix}{name}/") <= last_seen


async def targeted_lookup(
    store: ObjectStore, key: str, max_keys: int, stats: NamespaceStats
) -> tuple[bool, ObjectInfo | None]:
    """(whether ``key/`` is a directory, the object ``key`` or None): one LIST, two when the
    first does not reach ``key/``."""
    try:
        stats.targeted_lookups += 1
        page = await store.list_page(key, delimiter="/", max_keys=max_keys)
        is_dir = f"{key}/" in page.prefixes
        obj = next((o for o in page.objects if o.key == key), None)
        if not is_dir and page.next_token is not None and page_end(page) < key_order(f"{key}/"):
            stats.targeted_lookups += 1
            page2 = await store.list_page(f"{key}/", delimiter="/", max_keys=1)
            is_dir = bool(page2.objects or page2.prefixes)
    except BackendError as exc:
        raise from_backend(exc, NotFound) from exc
    return is_dir, obj
