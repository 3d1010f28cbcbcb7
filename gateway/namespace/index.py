"""The index layer: directory entries and attributes of one export, built from listings.

Owns: turning ListObjectsV2 pages into directories (``SortedDict`` name -> ``Entry``), the
whole-directory prefetch on first touch (single-flight per directory), targeted lookups in huge
directories, TTLs with background re-listing, negative lookups from complete listings, the byte
budget (LRU over directories), READDIR cookies and verifiers, and the mutation hooks the write
path calls. Must not: encode handles or wire types, or HEAD an object per file (HEAD only in
``refresh``); backend errors leave as ``GatewayError``s (``_gateway_error``).

Decisions (DESIGN §3), and where this module had to choose:

- **Paths.** Relative to the export: "" is the root, "a/b.jpg" a file; key = prefix + path.
  Keys that cannot be a path are skipped and counted in ``stats.skipped_keys`` (plus the
  backend's ``ListPage.skipped``): an empty segment (``a//b``), ``.`` or ``..``, a name over 255
  UTF-8 bytes, a lone surrogate (not UTF-8) or NUL. The listing never fails because of a key.
- **Directories** are common prefixes and ``dir/`` marker objects (a marker is the key equal to
  the listed prefix; it proves an empty directory exists). **A name that is both an object and a
  prefix is shown as the directory**; the object is unreachable through NFS.
- **Directory times** are synthetic and stable: the namespace's start time (wall clock), moved
  forward only when this gateway mutates the directory (hooks) or a re-list finds its content
  changed, so a client's cached READDIR pages are revalidated. These times are remembered (a
  bounded map) even when the directory itself is evicted. Directory size is ``DIR_SIZE``.
- **File attributes** come from the listing: size, LastModified, ETag. Object metadata, when a
  listing (e.g. the local backend) or a HEAD carries it, overrides: ``mode`` (octal string, e.g.
  "100644" or "644"; only permission bits are kept), ``uid``, ``gid`` (decimal), ``mtime``
  (decimal integer nanoseconds if >= 10**12, else seconds, fractions allowed), and
  ``symlink-target`` (makes the entry a SYMLINK). S3 listings carry no user metadata, so a
  listed symlink shows as a regular file until ``refresh`` (HEAD) reveals it.
- **Prefetch.** The first lookup/getattr/readdir touching directory D lists D completely
  (``Delimiter='/'``, all pages) in one task; concurrent callers ``await asyncio.shield`` it.
  ``getattr(path)`` lists the parent of ``path``. A name the listing has already passed is
  answered at once, even while later pages are still coming. ``NamespaceConfig.prefetch``
  False (``nfsgw serve --no-prefetch``, for comparisons) turns this off for lookups: every
  lookup/getattr of a name costs the targeted request of a huge directory (below), its answer
  kept for one TTL, and never starts or uses a directory listing; READDIR still lists.
- **Huge directories.** Once a listing has fetched more than ``huge_dir_pages`` pages and is
  still paging, a lookup of a name not reached yet costs one targeted LIST (prefix = D + name,
  delimiter '/', ``targeted_max_keys`` keys) that shows both the object ``name`` and the prefix
  ``name/``; only if more than that many keys sort between them ("name-x", "name.jpg" <
  "name/") a second LIST (prefix = D + name + '/', one key) settles whether the directory
  exists. Results are kept per directory (``probes_per_dir``) for one TTL.
- **Partial directories.** A listing stops after ``max_list_pages`` pages; the directory is then
  served in partial mode: names up to the last key seen come from memory, others from targeted
  lookups; READDIR returns the cached part and then reports eof with ``DirPage.truncated`` set
  (and ``stats.truncated_dirs``, a warning log), rather than hold an unbounded listing.
- **TTL.** A directory view is fresh for ``attr_ttl_s`` after its listing *started*
  (``immutable``: forever). A stale view is served while one background re-list runs; a view
  older than ``hard_ttl_factor`` x TTL is not served: callers wait for the re-list. A failed
  background re-list keeps the old view and is retried after ``retry_after_error_s``.
- **Budget.** ``memory_bytes`` bounds the estimated footprint of all directories; the least
  recently used directories are dropped (whole) past it; a directory with a listing in flight,
  and the most recently used one, are never evicted. Footprint per entry: ``ENTRY_OVERHEAD``
  plus the length of its name and path (see ``ENTRY_OVERHEAD``).
- **Cookies.** READDIR cookies are a stable hash of the name (``cookie_hash``), >=
  ``FIRST_COOKIE`` (0 starts a listing; 1 and 2 are left for the handler's "." and ".."; every
  cookie below ``FIRST_COOKIE`` means "from the start"). A per-directory map cookie -> name
  (built on the first READDIR) also remembers up to ``removed_cookies_per_dir`` removed names,
  so resuming continues at the first name greater than the cookie's name even if that name is
  gone; re-listings and evictions keep present names' cookies. An unresolvable cookie raises
  ``BadCookie``. The 8-byte verifier changes whenever the directory's content changes, but an
  old verifier is accepted whenever its cookie still resolves (RFC 1813 §3.3.16 leaves the
  check to the server), so a READDIRPLUS sequence spanning a re-list returns every surviving
  entry exactly once.
- **Mutations** (``upsert``, ``remove``, ``invalidate``) apply at once, also on top of a listing
  in flight (that listing's result cannot undo them), and bump the parent's generation and time.
  A later re-list keeps an entry's metadata-derived attributes (mode, owner, mtime, symlink)
  while the object's ETag and size are unchanged (``_keep_metadata``): a metadata-only change
  made elsewhere (a copy in place keeps the ETag) shows only after a HEAD (``refresh``).
  ``upsert`` also makes every cached ancestor show the path's directories. ``remove`` of the
  last object under an implicit directory (no marker) leaves that directory shown until its
  parent is listed again; whether to write a marker is the write path's decision.
- **Errors.** ``getattr``: ``NotFound`` when the path does not exist (the handler maps it to
  STALE for a handle). ``lookup``/``readdir``: ``NotFound`` for a missing name, ``StaleHandle``
  when the directory itself is gone, ``NotDirectory`` when it is a file; ``.`` and ``..`` are
  resolved here (the root is its own parent).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import math
import struct
import time
from collections import OrderedDict, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Final, Literal

import structlog
from sortedcontainers import SortedDict  # type: ignore[import-untyped]

from gateway.backend.base import (
    AccessDeniedError,
    BackendError,
    BackendUnavailable,
    ListPage,
    ObjectInfo,
    ObjectNotFound,
    ObjectStore,
)
from gateway.clock import Clock
from gateway.errors import (
    AccessDenied,
    BadCookie,
    Busy,
    GatewayError,
    IoError,
    NameTooLong,
    NotDirectory,
    NotFound,
    StaleHandle,
)
from gateway.namespace.config import NamespaceConfig

log = structlog.get_logger(__name__)

NAME_MAX: Final = 255
DIR_SIZE: Final = 4096
FIRST_COOKIE: Final = 3
# Estimated bytes per cached entry, on top of len(name) + len(path): measured with tracemalloc
# over a 100,000-entry directory with its cookie map built (CPython 3.11, 64-bit): 354 B for the
# Entry (slots) object, the name and path str headers, the SortedDict's dict slot and list
# reference and the cookie map's int key and dict slot; plus the etag str (~83 B) and the mtime
# int (32 B), which a real backend allocates per object (the fake store shares them): ~470 B.
ENTRY_OVERHEAD: Final = 480
DIR_OVERHEAD: Final = 1024

_U64 = struct.Struct(">Q")
_COOKIE_MASK: Final = (1 << 63) - 1


class EntryKind(Enum):
    FILE = "file"
    DIR = "dir"
    SYMLINK = "symlink"


@dataclass(slots=True)
class Entry:
    """One name in a directory. Shared with the cache: callers must treat it as read-only.
    ``mode``/``uid``/``gid`` None mean "the export's default"; ``mode`` holds permission bits
    only (the handler adds the file type). ``etag`` is "" for directories."""

    name: str
    path: str
    kind: EntryKind
    size: int
    mtime_ns: int
    ctime_ns: int
    etag: str
    mode: int | None = None
    uid: int | None = None
    gid: int | None = None
    symlink_target: str | None = None


@dataclass(slots=True)
class NamespaceStats:
    """Counters (monotonic) and gauges (``entries``, ``bytes``, ``dirs``) for metrics."""

    lookups: int = 0
    hits: int = 0
    negative_hits: int = 0
    prefetches: int = 0
    relists: int = 0
    list_pages: int = 0
    targeted_lookups: int = 0
    heads: int = 0
    list_errors: int = 0
    entries: int = 0
    bytes: int = 0
    dirs: int = 0
    evictions: int = 0
    skipped_keys: int = 0
    truncated_dirs: int = 0


@dataclass(slots=True)
class DirPage:
    """One READDIR(PLUS) answer: ``entries`` are (cookie, Entry) in name order, at most
    ``max_entries``; ``eof`` is True when the last entry of the directory is included (a handler
    that sends fewer entries than it got must clear it). ``truncated``: the directory is in
    partial mode and entries past ``max_list_pages`` pages are not shown."""

    verifier: bytes
    entries: list[tuple[int, Entry]]
    eof: bool
    truncated: bool = False


def cookie_hash(name: str, salt: int = 0) -> int:
    """Stable READDIR cookie of ``name``: 63 bits of blake2b, never below FIRST_COOKIE."""
    raw = name.encode("utf-8")
    if salt:
        raw += b"\0" + str(salt).encode()
    c: int = _U64.unpack(hashlib.blake2b(raw, digest_size=8).digest())[0] & _COOKIE_MASK
    return c if c >= FIRST_COOKIE else c + FIRST_COOKIE


def split_path(path: str) -> tuple[str, str]:
    """(parent, name) of a non-root path."""
    i = path.rfind("/")
    if i < 0:
        return "", path
    return path[:i], path[i + 1 :]


def join_path(dir_path: str, name: str) -> str:
    return f"{dir_path}/{name}" if dir_path else name


def bad_name(name: str) -> bool:
    """True if ``name`` cannot be one path segment of a file we serve."""
    if not name or name == "." or name == ".." or "/" in name or "\0" in name:
        return True
    if name.isascii():
        return len(name) > NAME_MAX
    try:
        return len(name.encode("utf-8")) > NAME_MAX
    except UnicodeEncodeError:
        return True


def _utf8(s: str) -> bytes:
    return s.encode("utf-8", "surrogatepass")


def parse_metadata(
    meta: Mapping[str, str],
) -> tuple[int | None, int | None, int | None, int | None, str | None]:
    """(mode, uid, gid, mtime_ns, symlink target) from object metadata; bad values are ignored."""
    mode = uid = gid = mtime_ns = None
    v = meta.get("mode")
    if v is not None:
        with contextlib.suppress(ValueError):
            mode = int(v, 8) & 0o7777
    v = meta.get("uid")
    if v is not None:
        with contextlib.suppress(ValueError):
            uid = int(v) if 0 <= int(v) < 2**32 else None
    v = meta.get("gid")
    if v is not None:
        with contextlib.suppress(ValueError):
            gid = int(v) if 0 <= int(v) < 2**32 else None
    v = meta.get("mtime")
    if v is not None:
        with contextlib.suppress(ValueError, OverflowError):
            if "." in v or "e" in v.lower():
                f = float(v)
                mtime_ns = int(f * 1e9) if math.isfinite(f) and f >= 0 else None
            else:
                n = int(v)
                if n >= 0:
                    mtime_ns = n if n >= 10**12 else n * 10**9
    return mode, uid, gid, mtime_ns, meta.get("symlink-target")


def _gateway_error(exc: BackendError) -> GatewayError:
    if isinstance(exc, ObjectNotFound):
        return NotFound(str(exc))
    if isinstance(exc, AccessDeniedError):
        return AccessDenied(str(exc))
    if isinstance(exc, BackendUnavailable):
        return Busy(str(exc))
    return IoError(str(exc))


def _entry_bytes(name: str, path: str) -> int:
    return ENTRY_OVERHEAD + len(name) + len(path)


class _Listing:
    """One listing of a directory in flight."""

    __slots__ = (
        "bytes",
        "entries",
        "invalid",
        "last_seen",
        "marker_seen",
        "overrides",
        "page_fut",
        "pages",
        "relist",
        "started_at",
        "t0",
        "task",
    )

    def __init__(self, started_at: float, relist: bool) -> None:
        # A plain dict while paging (names arrive in order; a SortedDict insert costs ~2 us
        # each), sorted once when the listing is installed.
        self.entries: dict[str, Entry] = {}
        self.overrides: dict[str, Entry | None] = {}
        self.last_seen = b""
        self.pages = 0
        self.bytes = 0
        self.marker_seen = False
        self.invalid = False
        self.relist = relist
        self.started_at = started_at
        self.t0 = time.perf_counter()
        self.task: asyncio.Task[None] | None = None
        self.page_fut: asyncio.Future[None] | None = None


class _Dir:
    __slots__ = (
        "bytes",
        "collided",
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
        "removed",
        "retry_at",
        "verf",
        "view",
    )

    def __init__(self, path: str, key_prefix: str) -> None:
        self.path = path
        self.key_prefix = key_prefix
        self.view: SortedDict[str, Entry] | None = None
        self.exists = True
        self.listed_at = -math.inf
        self.partial = False
        self.last_seen = b""
        self.listing: _Listing | None = None
        self.cookies: dict[int, str] | None = None
        self.collided: dict[str, int] = {}
        self.removed: deque[tuple[int, str]] = deque()
        self.gen = 0
        self.verf = b"\0" * 8
        self.bytes = DIR_OVERHEAD
        self.probes: dict[str, tuple[Entry | None, float]] = {}
        self.retry_at = -math.inf


_Fresh = Literal["fresh", "stale", "expired", "none"]


class Namespace:
    """The index of one export. See the module docstring for the rules."""

    def __init__(
        self,
        store: ObjectStore,
        prefix: str,
        *,
        clock: Clock,
        config: NamespaceConfig | None = None,
        stats: NamespaceStats | None = None,
    ) -> None:
        if prefix and not prefix.endswith("/"):
            raise ValueError("export prefix must be empty or end in '/'")
        self.store = store
        self.prefix = prefix
        self.clock = clock
        self.config = config if config is not None else NamespaceConfig()
        self.stats = stats if stats is not None else NamespaceStats()
        self._ttl = math.inf if self.config.immutable else self.config.attr_ttl_s
        self._hard_ttl = self._ttl * self.config.hard_ttl_factor
        self._dirs: OrderedDict[str, _Dir] = OrderedDict()
        self._start_ns = clock.time_ns()
        self._dir_times: OrderedDict[str, int] = OrderedDict()
        self._verf_seq = itertools.count(1)
        self._verf_base = ((self._start_ns // 10**9) & 0xFFFFFFFF) << 32
        self._probing: dict[tuple[str, str], asyncio.Task[Entry | None]] = {}
        self._root = self._dir_entry("", "")

    # -- public API ----------------------------------------------------------------------------

    async def getattr(self, path: str, *, current: bool = False) -> Entry:
        """Attributes of ``path`` (lists its parent on first touch). NotFound if absent.
        ``current``: a parent view past its TTL is not served while it is re-listed; the
        caller waits for the new listing (READ uses it: a file deleted from the bucket must not
        be served from the data cache past the TTL)."""
        if not path:
            return self._root
        parent, name = split_path(path)
        e = await self._lookup_in(self._dir(parent), name, current=current)
        if e is None:
            raise NotFound(path)
        return e

    async def lookup(self, dir_path: str, name: str) -> Entry:
        """The entry ``name`` in directory ``dir_path``; "." is the directory, ".." its parent."""
        self.stats.lookups += 1
        if name == "." or name == "..":
            target = dir_path if name == "." else split_path(dir_path)[0]
            if dir_path:
                here = await self._getattr_dir(dir_path)
                if name == ".":
                    return here
            return await self.getattr(target) if target else self._root
        if bad_name(name):
            if len(name.encode("utf-8", "surrogatepass")) > NAME_MAX:
                raise NameTooLong(name[:64])
            raise NotFound(name)
        if dir_path:
            self._check_not_file(dir_path)
        d = self._dir(dir_path)
        e = await self._lookup_in(d, name)
        if e is None:
            if not d.exists:
                await self._raise_dir_missing(dir_path)
            raise NotFound(join_path(dir_path, name))
        return e

    async def readdir(
        self, dir_path: str, cookie: int, verifier: bytes, max_entries: int = 1024
    ) -> DirPage:
        """Up to ``max_entries`` entries after ``cookie`` (0 = from the start) in name order.
        ``verifier`` is not required to match the current one: a cookie that resolves is
        honoured (see the module docstring); one that does not raises BadCookie."""
        if dir_path:
            self._check_not_file(dir_path)
        d = self._dir(dir_path)
        view = await self._view(d)
        if not d.exists:
            await self._raise_dir_missing(dir_path)
        cookies = self._cookies(d)
        if cookie < FIRST_COOKIE:
            names: Iterable[str] = view.irange()
        else:
            after = cookies.get(cookie)
            if after is None:
                raise BadCookie(f"cookie {cookie} in {dir_path!r}")
            names = view.irange(minimum=after, inclusive=(False, True))
        out: list[tuple[int, Entry]] = []
        collided = d.collided
        eof = True
        for name in names:
            if len(out) >= max_entries:
                eof = False
                break
            c = collided.get(name) if collided else None
            out.append((c if c is not None else cookie_hash(name), view[name]))
        return DirPage(d.verf, out, eof, d.partial)

    async def refresh(self, path: str) -> Entry:
        """Re-read one file's attributes and metadata with a HEAD (e.g. for READLINK, or after
        a PreconditionFailed). Directories are answered from the index without a request."""
        if not path:
            return self._root
        parent, name = split_path(path)
        pd = self._dirs.get(parent)
        cached: Entry | None = pd.view.get(name) if pd is not None and pd.view is not None else None
        if cached is not None and cached.kind is EntryKind.DIR:
            return cached
        self.stats.heads += 1
        try:
            info = await self.store.head(self.prefix + path)
        except ObjectNotFound:
            # Maybe a directory without a marker: ask the listing (it may be cached).
            e = await self.getattr(path)
            if e.kind is EntryKind.DIR:
                return e
            self.remove(path)
            raise NotFound(path) from None
        except BackendError as exc:
            raise _gateway_error(exc) from exc
        entry = self._file_entry(name, path, info)
        if cached is None or cached != entry:
            self._set_child(parent, name, entry)
        return entry

    def upsert(self, item: ObjectInfo | Entry) -> Entry:
        """Record an object this gateway just wrote (``ObjectInfo`` with its full key; a key
        ending in '/' is a directory marker) or an ``Entry``. Makes its ancestors directories."""
        if isinstance(item, Entry):
            entry = item
        else:
            if not item.key.startswith(self.prefix):
                raise ValueError(f"key {item.key!r} outside export prefix {self.prefix!r}")
            rel = item.key[len(self.prefix) :]
            if rel.endswith("/"):
                path = rel[:-1]
                entry = self._dir_entry(split_path(path)[1], path)
            else:
                entry = self._file_entry(split_path(rel)[1], rel, item)
        if not entry.path:
            return self._root
        parent, name = split_path(entry.path)
        self._set_child(parent, name, entry)
        if entry.kind is EntryKind.DIR:
            d = self._dirs.get(entry.path)
            if d is not None:
                d.exists = True
        self._ensure_ancestors(parent)
        return entry

    def remove(self, path: str) -> None:
        """Forget ``path`` at once (a REMOVE/RMDIR/RENAME source): no ghost in lookups or
        READDIR; a directory's cached subtree is dropped."""
        if not path:
            return
        parent, name = split_path(path)
        self._set_child(parent, name, None)
        self._forget_subtree(path)

    def invalidate(self, path: str, subtree: bool = False) -> None:
        """Something changed at ``path`` in a way the caller cannot describe: the parent's and
        the path's own listings (and with ``subtree`` every cached descendant) must be redone
        before they are served again."""
        if path:
            parent, name = split_path(path)
            pd = self._dirs.get(parent)
            if pd is not None:
                pd.probes.pop(name, None)
                self._expire(pd)
                self._changed(pd)
            else:
                self._bump_dir_time(parent)
        d = self._dirs.get(path)
        if d is not None:
            self._expire(d)
            self._changed(d)
        if subtree:
            self._forget_subtree(path, keep_self=True)

    async def quiesce(self) -> None:
        """Wait for every listing and targeted lookup in flight (tests, shutdown)."""
        while True:
            tasks: list[asyncio.Task[object]] = [
                d.listing.task
                for d in self._dirs.values()
                if d.listing is not None and d.listing.task is not None
            ]
            tasks += list(self._probing.values())
            if not tasks:
                return
            await asyncio.gather(*tasks, return_exceptions=True)

    async def close(self) -> None:
        for d in list(self._dirs.values()):
            if d.listing is not None and d.listing.task is not None:
                d.listing.task.cancel()
        for t in list(self._probing.values()):
            t.cancel()
        await self.quiesce()

    def cached_dirs(self) -> list[str]:
        return list(self._dirs)

    # -- directories, freshness, listing -------------------------------------------------------

    def _dir(self, path: str) -> _Dir:
        d = self._dirs.get(path)
        if d is None:
            d = _Dir(path, f"{self.prefix}{path}/" if path else self.prefix)
            self._dirs[path] = d
            self._account(d.bytes, 0)
            self.stats.dirs = len(self._dirs)
        else:
            self._dirs.move_to_end(path)
        return d

    def _freshness(self, d: _Dir) -> _Fresh:
        if d.view is None:
            return "none"
        if d.listed_at == -math.inf:  # invalidated: re-list before serving (also if immutable)
            return "expired"
        age = self.clock.monotonic() - d.listed_at
        if age <= self._ttl:
            return "fresh"
        if age <= self._hard_ttl:
            return "stale"
        return "expired"

    async def _view(self, d: _Dir) -> SortedDict[str, Entry]:
        """The directory's complete (or partial-mode) view, waiting for a listing if needed."""
        state = self._freshness(d)
        if state == "stale":
            self._background_relist(d)
        if d.view is not None and state != "expired":
            return d.view
        while True:
            lst = self._start_listing(d)
            await self._wait(lst)
            if not lst.invalid:  # else it predates an invalidate(): list again
                break
        assert d.view is not None  # a listing that did not raise installed a view
        return d.view

    def _background_relist(self, d: _Dir) -> None:
        if d.listing is None and self.clock.monotonic() >= d.retry_at:
            self._start_listing(d)

    def _start_listing(self, d: _Dir) -> _Listing:
        if d.listing is not None:
            return d.listing
        lst = _Listing(self.clock.monotonic(), relist=d.view is not None)
        d.listing = lst
        if lst.relist:
            self.stats.relists += 1
        else:
            self.stats.prefetches += 1
        lst.task = asyncio.get_running_loop().create_task(self._run_listing(d, lst))
        lst.task.add_done_callback(self._listing_done)
        return lst

    @staticmethod
    def _listing_done(task: asyncio.Task[None]) -> None:
        if not task.cancelled():
            task.exception()  # retrieved here; waiters get it through their shield

    async def _wait(self, lst: _Listing) -> None:
        assert lst.task is not None
        await asyncio.shield(lst.task)

    async def _next_page(self, lst: _Listing) -> None:
        """Wait until ``lst`` ingests another page or ends."""
        fut = lst.page_fut
        if fut is None:
            fut = lst.page_fut = asyncio.get_running_loop().create_future()
        await asyncio.shield(fut)

    @staticmethod
    def _wake(lst: _Listing) -> None:
        fut = lst.page_fut
        if fut is not None:
            lst.page_fut = None
            if not fut.done():
                fut.set_result(None)

    async def _run_listing(self, d: _Dir, lst: _Listing) -> None:
        cfg = self.config
        token: str | None = None
        partial = False
        try:
            while True:
                try:
                    page = await self.store.list_page(
                        d.key_prefix, delimiter="/", token=token, max_keys=cfg.list_page_keys
                    )
                except BackendError as exc:
                    raise _gateway_error(exc) from exc
                lst.pages += 1
                self.stats.list_pages += 1
                self._ingest(d, lst, page)
                if page.next_token is None:
                    break
                if lst.pages >= cfg.max_list_pages:
                    partial = True
                    break
                token = page.next_token
        except BaseException as exc:
            self._wake(lst)
            self._account(-lst.bytes, -len(lst.entries))
            if d.listing is lst:
                d.listing = None
            if not isinstance(exc, asyncio.CancelledError):
                self.stats.list_errors += 1
                d.retry_at = self.clock.monotonic() + cfg.retry_after_error_s
                log.warning("dir_listing_failed", dir=d.path, error=repr(exc), relist=lst.relist)
            raise
        self._install(d, lst, partial)
        self._wake(lst)

    def _ingest(self, d: _Dir, lst: _Listing, page: ListPage) -> None:
        kp = d.key_prefix
        n = len(kp)
        entries = lst.entries
        overrides = lst.overrides
        dir_path = d.path
        skipped = page.skipped
        added = 0
        added_bytes = 0
        for obj in page.objects:
            key = obj.key
            name = key[n:]
            if not name and key == kp:
                lst.marker_seen = True
                continue
            if not key.startswith(kp) or bad_name(name):
                skipped += 1
                continue
            if name in overrides:
                continue
            old = entries.get(name)
            if old is not None and old.kind is EntryKind.DIR:
                continue
            path = f"{dir_path}/{name}" if dir_path else name
            entries[name] = self._file_entry(name, path, obj)
            if old is None:
                added += 1
                added_bytes += _entry_bytes(name, path)
        for cp in page.prefixes:
            name = cp[n:-1]
            if not cp.startswith(kp) or not cp.endswith("/") or bad_name(name):
                skipped += 1
                continue
            if name in overrides:
                continue
            path = f"{dir_path}/{name}" if dir_path else name
            old = entries.get(name)
            entries[name] = self._dir_entry(name, path)
            if old is None:
                added += 1
                added_bytes += _entry_bytes(name, path)
        last = b""
        if page.objects:
            last = _utf8(page.objects[-1].key)
        if page.prefixes:
            last = max(last, _utf8(page.prefixes[-1]))
        if last > lst.last_seen:
            lst.last_seen = last
        lst.bytes += added_bytes
        if skipped:
            lst.marker_seen = True  # unpathable keys still prove the directory exists
        self.stats.skipped_keys += skipped
        self._account(added_bytes, added)
        self._wake(lst)
        self._evict()

    def _install(self, d: _Dir, lst: _Listing, partial: bool) -> None:
        if d.listing is lst:
            d.listing = None
        if self._dirs.get(d.path) is not d:
            # Dropped meanwhile (cannot happen while a listing is in flight; defensive).
            self._account(-lst.bytes, -len(lst.entries))
            return
        new_entries = lst.entries
        for name, e in lst.overrides.items():
            path = join_path(d.path, name)
            had = name in new_entries
            if e is None:
                if had:
                    del new_entries[name]
                    lst.bytes -= _entry_bytes(name, path)
                    self._account(-_entry_bytes(name, path), -1)
            else:
                new_entries[name] = e
                if not had:
                    lst.bytes += _entry_bytes(name, path)
                    self._account(_entry_bytes(name, path), 1)
        old = d.view
        if old is not None:
            self._keep_metadata(old, new_entries, lst.overrides)
        new: SortedDict[str, Entry] = SortedDict(new_entries)
        changed = old is None
        if old is not None:
            changed = self._merge_cookies(d, old, new)
        # Swap in the new view; the old one's bytes go.
        old_bytes = d.bytes - DIR_OVERHEAD
        self._account(-old_bytes, -(len(old) if old is not None else 0))
        d.view = new
        d.bytes = DIR_OVERHEAD + lst.bytes
        d.partial = partial
        d.last_seen = lst.last_seen
        d.listed_at = -math.inf if lst.invalid else lst.started_at
        d.exists = not d.path or bool(new) or lst.marker_seen
        d.probes.clear()
        d.retry_at = -math.inf
        if changed:
            self._changed(d, bump_time=old is not None)
        seconds = time.perf_counter() - lst.t0
        log.info(
            "dir_prefetched",
            dir=d.path,
            entries=len(new),
            pages=lst.pages,
            seconds=round(seconds, 6),
            relist=lst.relist,
            partial=partial,
        )
        if partial:
            self.stats.truncated_dirs += 1
            log.warning("dir_truncated", dir=d.path, pages=lst.pages, entries=len(new))
        self._evict()

    @staticmethod
    def _keep_metadata(
        old: Mapping[str, Entry], new: dict[str, Entry], overrides: Mapping[str, Entry | None]
    ) -> None:
        """Listings carry no object metadata: an object whose version is unchanged (same
        ETag and size) keeps the entry a HEAD or an ``upsert`` gave it, so a re-list does not
        turn a symlink back into a file or a chmod back into the export's default."""
        for name, e in new.items():
            if e.kind is not EntryKind.FILE or name in overrides:
                continue
            o = old.get(name)
            if (
                o is not None
                and o is not e
                and o.kind is not EntryKind.DIR
                and o.etag == e.etag
                and o.size == e.size
                and e.mode is None
                and e.uid is None
                and e.gid is None
                and e.symlink_target is None
            ):
                new[name] = o

    def _merge_cookies(
        self, d: _Dir, old: SortedDict[str, Entry], new: Mapping[str, Entry]
    ) -> bool:
        """Carry the cookie map from ``old`` to ``new``; True if the content changed."""
        changed = len(old) != len(new)
        for name, e in old.items():
            ne = new.get(name)
            if ne is None:
                changed = True
                if d.cookies is not None:
                    self._tombstone(d, name)
            elif not changed and (
                ne.kind is not e.kind
                or ne.size != e.size
                or ne.mtime_ns != e.mtime_ns
                or ne.etag != e.etag
            ):
                changed = True
        if d.cookies is not None and (changed or len(old) != len(new)):
            for name in new:
                if name not in old:
                    self._register(d, name)
        return changed

    # -- lookups -------------------------------------------------------------------------------

    async def _lookup_in(self, d: _Dir, name: str, *, current: bool = False) -> Entry | None:
        """``name`` in ``d``, or None when it is known to be absent (``current``: see
        ``getattr``)."""
        if not self.config.prefetch:
            return await self._probe(d, name)
        waited = False
        while True:
            state = self._freshness(d)
            if state == "stale":
                self._background_relist(d)
            view = d.view
            if view is not None and (
                state == "fresh" or (state == "stale" and not current) or waited
            ):
                e: Entry | None = view.get(name)
                if e is not None:
                    self.stats.hits += 1
                    return e
                if d.partial and not self._reached(d.last_seen, d, name):
                    return await self._probe(d, name)
                self.stats.negative_hits += 1
                return None
            lst = self._start_listing(d)
            if lst.invalid:  # predates an invalidate(): let it end, then list again
                await self._wait(lst)
                continue
            if name in lst.overrides:
                self.stats.hits += 1
                return lst.overrides[name]
            if lst.last_seen and self._reached(lst.last_seen, d, name):
                e = lst.entries.get(name)
                if e is None:
                    self.stats.negative_hits += 1
                else:
                    self.stats.hits += 1
                return e
            if lst.pages > self.config.huge_dir_pages:
                return await self._probe(d, name)
            await self._next_page(lst)
            assert lst.task is not None
            if lst.task.done():
                await self._wait(lst)  # raises the listing's error, if any
                waited = not lst.invalid

    @staticmethod
    def _reached(last_seen: bytes, d: _Dir, name: str) -> bool:
        # Both "name" and "name/" sort at or before the key "name/": once the listing has
        # passed it, neither can appear later.
        return _utf8(f"{d.key_prefix}{name}/") <= last_seen

    async def _probe(self, d: _Dir, name: str) -> Entry | None:
        now = self.clock.monotonic()
        hit = d.probes.get(name)
        if hit is not None and hit[1] > now:
            if hit[0] is None:
                self.stats.negative_hits += 1
            else:
                self.stats.hits += 1
            return hit[0]
        key = (d.path, name)
        task = self._probing.get(key)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._targeted(d, name))
            self._probing[key] = task

            def _done(t: asyncio.Task[Entry | None], key: tuple[str, str] = key) -> None:
                self._probing.pop(key, None)
                if not t.cancelled():
                    t.exception()

            task.add_done_callback(_done)
        return await asyncio.shield(task)

    async def _targeted(self, d: _Dir, name: str) -> Entry | None:
        started = self.clock.monotonic()
        kp = d.key_prefix + name
        path = join_path(d.path, name)
        try:
            self.stats.targeted_lookups += 1
            page = await self.store.list_page(
                kp, delimiter="/", max_keys=self.config.targeted_max_keys
            )
            is_dir = f"{kp}/" in page.prefixes
            obj = next((o for o in page.objects if o.key == kp), None)
            if not is_dir and page.next_token is not None:
                last = b""
                if page.objects:
                    last = _utf8(page.objects[-1].key)
                if page.prefixes:
                    last = max(last, _utf8(page.prefixes[-1]))
                if last < _utf8(f"{kp}/"):
                    self.stats.targeted_lookups += 1
                    page2 = await self.store.list_page(f"{kp}/", delimiter="/", max_keys=1)
                    is_dir = bool(page2.objects or page2.prefixes)
        except BackendError as exc:
            raise _gateway_error(exc) from exc
        e: Entry | None
        if is_dir:
            e = self._dir_entry(name, path)
        elif obj is not None:
            e = self._file_entry(name, path, obj)
        else:
            e = None
        if self._dirs.get(d.path) is d:
            lst = d.listing
            if lst is not None and name in lst.overrides:
                return lst.overrides[name]  # a mutation raced with the probe: it wins
            if len(d.probes) >= self.config.probes_per_dir:
                d.probes.clear()
            d.probes[name] = (e, started + self._ttl)
        return e

    async def _getattr_dir(self, path: str) -> Entry:
        e = await self.getattr(path)
        if e.kind is not EntryKind.DIR:
            raise NotDirectory(path)
        return e

    def _check_not_file(self, dir_path: str) -> None:
        parent, name = split_path(dir_path)
        pd = self._dirs.get(parent)
        if pd is not None and pd.view is not None and self._freshness(pd) != "expired":
            e = pd.view.get(name)
            if e is not None and e.kind is not EntryKind.DIR:
                raise NotDirectory(dir_path)

    async def _raise_dir_missing(self, dir_path: str) -> None:
        """``dir_path``'s own listing is empty: it is a file, or gone."""
        try:
            e = await self.getattr(dir_path)
        except NotFound:
            raise StaleHandle(dir_path) from None
        if e.kind is not EntryKind.DIR:
            raise NotDirectory(dir_path)
        raise StaleHandle(dir_path)

    # -- entries -------------------------------------------------------------------------------

    def _file_entry(self, name: str, path: str, info: ObjectInfo) -> Entry:
        meta = info.metadata
        if not meta:
            return Entry(
                name, path, EntryKind.FILE, info.size, info.mtime_ns, info.mtime_ns, info.etag
            )
        mode, uid, gid, mtime_ns, target = parse_metadata(meta)
        mt = info.mtime_ns if mtime_ns is None else mtime_ns
        kind = EntryKind.FILE if target is None else EntryKind.SYMLINK
        return Entry(name, path, kind, info.size, mt, mt, info.etag, mode, uid, gid, target)

    def _dir_entry(self, name: str, path: str) -> Entry:
        t = self._dir_times.get(path, self._start_ns)
        return Entry(name, path, EntryKind.DIR, DIR_SIZE, t, t, "")

    # -- cookies -------------------------------------------------------------------------------

    def _cookies(self, d: _Dir) -> dict[int, str]:
        if d.cookies is None:
            d.cookies = {}
            assert d.view is not None
            for name in d.view:
                self._register(d, name)
        return d.cookies

    @staticmethod
    def _register(d: _Dir, name: str) -> None:
        assert d.cookies is not None
        salt = 0
        c = cookie_hash(name)
        while True:
            cur = d.cookies.get(c)
            if cur is None:
                d.cookies[c] = name
                break
            if cur == name:
                break
            salt += 1
            c = cookie_hash(name, salt)
        if salt:
            d.collided[name] = c

    def _tombstone(self, d: _Dir, name: str) -> None:
        assert d.cookies is not None
        c = d.collided.get(name, cookie_hash(name))
        d.removed.append((c, name))
        while len(d.removed) > self.config.removed_cookies_per_dir:
            oc, oname = d.removed.popleft()
            if d.view is None or oname not in d.view:
                if d.cookies.get(oc) == oname:
                    del d.cookies[oc]
                d.collided.pop(oname, None)

    # -- mutations -----------------------------------------------------------------------------

    def _set_child(self, parent: str, name: str, entry: Entry | None) -> None:
        d = self._dirs.get(parent)
        if d is None:
            self._bump_dir_time(parent)
            return
        path = join_path(parent, name)
        lst = d.listing
        if lst is not None:
            lst.overrides[name] = entry
        view = d.view
        if view is not None:
            old = view.get(name)
            if entry is None:
                if old is not None:
                    del view[name]
                    d.bytes -= _entry_bytes(name, path)
                    self._account(-_entry_bytes(name, path), -1)
                    if d.cookies is not None:
                        self._tombstone(d, name)
            elif old is None or not (old.kind is EntryKind.DIR and entry.kind is not EntryKind.DIR):
                view[name] = entry
                if old is None:
                    d.bytes += _entry_bytes(name, path)
                    self._account(_entry_bytes(name, path), 1)
                    if d.cookies is not None:
                        self._register(d, name)
        d.probes.pop(name, None)
        if entry is not None:
            d.exists = True
        self._changed(d)

    def _ensure_ancestors(self, path: str) -> None:
        # All the way up: views listed at different times need not agree with each other.
        while path:
            parent, name = split_path(path)
            pd = self._dirs.get(parent)
            if pd is not None:
                e = pd.view.get(name) if pd.view is not None else None
                if e is None or e.kind is not EntryKind.DIR:
                    self._set_child(parent, name, self._dir_entry(name, path))
            d = self._dirs.get(path)
            if d is not None:
                d.exists = True
            path = parent

    def _expire(self, d: _Dir) -> None:
        d.listed_at = -math.inf
        d.retry_at = -math.inf
        if d.listing is not None:
            d.listing.invalid = True

    def _forget_subtree(self, path: str, keep_self: bool = False) -> None:
        lead = f"{path}/" if path else ""
        doomed = [
            p for p in self._dirs if (p.startswith(lead) and p != path) or (p == path and path)
        ]
        for p in doomed:
            if keep_self and p == path:
                continue
            d = self._dirs[p]
            if d.listing is not None:
                # Its result predates the change: keep it only as an expired view.
                self._expire(d)
                continue
            self._drop(d)

    def _drop(self, d: _Dir) -> None:
        del self._dirs[d.path]
        self._account(-d.bytes, -(len(d.view) if d.view is not None else 0))
        self.stats.dirs = len(self._dirs)

    def _changed(self, d: _Dir, bump_time: bool = True) -> None:
        d.gen += 1
        d.verf = _U64.pack(self._verf_base | (next(self._verf_seq) & 0xFFFFFFFF))
        if bump_time:
            self._bump_dir_time(d.path)

    def _bump_dir_time(self, path: str) -> None:
        t = max(self.clock.time_ns(), self._dir_times.get(path, self._start_ns) + 1)
        self._dir_times[path] = t
        self._dir_times.move_to_end(path)
        while len(self._dir_times) > self.config.dir_times_max:
            self._dir_times.popitem(last=False)
        if not path:
            self._root.mtime_ns = self._root.ctime_ns = t
            return
        parent, name = split_path(path)
        pd = self._dirs.get(parent)
        if pd is not None and pd.view is not None:
            e = pd.view.get(name)
            if e is not None and e.kind is EntryKind.DIR:
                e.mtime_ns = e.ctime_ns = t

    # -- budget --------------------------------------------------------------------------------

    def _account(self, nbytes: int, nentries: int) -> None:
        self.stats.bytes += nbytes
        self.stats.entries += nentries

    def _evict(self) -> None:
        budget = self.config.memory_bytes
        if self.stats.bytes <= budget:
            return
        mru = next(reversed(self._dirs), None)
        for path in list(self._dirs):
            if self.stats.bytes <= budget:
                break
            d = self._dirs[path]
            if d.listing is not None or path == mru:
                continue
            self._drop(d)
            self.stats.evictions += 1
