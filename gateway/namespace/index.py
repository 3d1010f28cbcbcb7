"""The index of one export (``Namespace``): which directories are cached and how fresh they
are, lookups, READDIR, HEAD-backed refreshes, and the mutation hooks the write path calls.

Owns: the collection of cached directories (LRU under a byte budget), when to list (prefetch on
first touch; re-lists past the TTL are ``schedule``'s decision) and when to ask a targeted
question instead (``probes``), synthetic directory times, and the errors lookups answer with.
Must not: encode handles or wire types, HEAD an object per file (HEAD only in ``refresh``), or
import the write path or ``gateway.exports`` (they import this). Backend failures leave as
``GatewayError``s (``gateway.errors.from_backend``; a missing object means NOENT here: a name is
being resolved).

Decisions (DESIGN §3 "Metadata prefetch"); the others are documented where they are
implemented (``paths``, ``objmeta``, ``entries``, ``columns``, ``cookies``, ``listing``,
``directory``, ``schedule``, ``probes``):

- **Prefetch.** The first lookup/getattr/readdir touching directory D lists D completely (all
  pages) in one task; concurrent callers wait on it. ``getattr(path)`` lists the parent of
  ``path``. ``NamespaceConfig.prefetch`` False (``nfsgw serve --no-prefetch``, for comparisons)
  turns this off for lookups: every lookup/getattr of a name costs a targeted lookup, its
  answer kept for one TTL, and never starts or uses a directory listing; READDIR still lists.
- **Huge directories.** Once a listing has fetched more than ``huge_dir_pages`` pages and is
  still paging, a lookup of a name it has not reached yet costs one targeted lookup
  (``probes``) instead of waiting for the whole listing.
- **Partial directories.** A listing stops after ``max_list_pages`` pages; the directory is
  then served in partial mode: names up to the last key seen come from memory, others from
  targeted lookups; READDIR returns the cached part and then reports eof with
  ``DirPage.truncated`` set (and ``stats.truncated_dirs``, a warning log), rather than hold an
  unbounded listing.
- **TTL, re-lists, change notification, listing ahead**: ``schedule`` (with the table of
  how a lookup is answered in each state of its directory).
- **Budget.** ``memory_bytes`` bounds what all directories cost (``Directory.bytes``: their
  columns' buffers as allocated, the entries kept whole, cookies, and ``entries`` constants
  per directory and per entry being listed); the least recently used directories are dropped
  (whole) past it; a directory with a listing in flight, and the most recently used one, are
  never evicted.
- **Directory times** are synthetic and stable: the namespace's start time (wall clock), moved
  forward only when this gateway mutates the directory (hooks) or a re-list finds its content
  changed, so a client's cached READDIR pages are revalidated. These times are remembered (a
  bounded map, ``dir_times_max``) even when the directory itself is evicted.
- **Mutations** (``upsert``, ``remove``, ``invalidate``) apply at once (``directory``) and bump
  the parent's generation, verifier and time. ``upsert`` also makes every cached ancestor show
  the path's directories. ``remove`` of the last object under an implicit directory (no
  marker) leaves that directory shown until its parent is listed again; whether to write a
  marker is the write path's decision.
- **Errors.** ``getattr``: ``NotFound`` when the path does not exist (the caller maps it to
  STALE for a handle). ``lookup``/``readdir``: ``NotFound`` for a missing name, ``StaleHandle``
  when the directory itself is gone, ``NotDirectory`` when it is a file; ``.`` and ``..`` are
  resolved here (the root is its own parent).
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import Final, Literal, Protocol

import structlog

from gateway.backend.base import BackendError, ListPage, ObjectInfo, ObjectStore
from gateway.clock import Clock
from gateway.errors import NameTooLong, NotDirectory, NotFound, StaleHandle, from_backend
from gateway.namespace.columns import Columns
from gateway.namespace.config import NamespaceConfig
from gateway.namespace.cookies import Verifiers
from gateway.namespace.dirattrs import DirAttrs
from gateway.namespace.directory import Directory, Rows
from gateway.namespace.entries import (
    DirPage,
    Entry,
    EntryKind,
    NamespaceStats,
    file_entry,
)
from gateway.namespace.listing import Listing, reached
from gateway.namespace.moved import Moved
from gateway.namespace.paths import NAME_MAX, bad_name, join_path, key_order, split_path
from gateway.namespace.probes import Probes
from gateway.namespace.schedule import JITTER as JITTER  # re-exported: tests read it here
from gateway.namespace.schedule import ListingSchedule

log = structlog.get_logger(__name__)


class DirWatcher(Protocol):
    """Told of every finished listing, every directory the index drops and every page a
    client's READDIR asks for (the data prefetcher, ``gateway.data.prefetch``)."""

    def listed(self, store: ObjectStore, key_prefix: str, cols: Columns) -> None: ...

    def dropped(self, store: ObjectStore, key_prefix: str) -> None: ...

    def browsing(self) -> None: ...


class _NoWatcher:
    """A ``DirWatcher`` told of nothing: an export without data prefetch."""

    __slots__ = ()

    def listed(self, store: ObjectStore, key_prefix: str, cols: Columns) -> None:
        pass

    def dropped(self, store: ObjectStore, key_prefix: str) -> None:
        pass

    def browsing(self) -> None:
        pass


NO_WATCHER: Final[DirWatcher] = _NoWatcher()
"""The default ``Namespace`` watcher. With it, a directory listed ahead of the clients is not
kept "unannounced" (there is nobody to announce it to): ``peek`` answers from it at once."""


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
        watcher: DirWatcher = NO_WATCHER,
    ) -> None:
        if prefix and not prefix.endswith("/"):
            raise ValueError("export prefix must be empty or end in '/'")
        self.store = store
        self.prefix = prefix
        self.clock = clock
        self.config = config if config is not None else NamespaceConfig()
        self.stats = stats if stats is not None else NamespaceStats()
        cfg = self.config
        self._schedule = ListingSchedule(cfg, clock, self.stats, store)
        self._dirs: OrderedDict[str, Directory] = OrderedDict()
        self._start_ns = clock.time_ns()
        self._dir_times: OrderedDict[str, int] = OrderedDict()
        self._verifiers = Verifiers(self._start_ns)
        self._probes = Probes(
            store,
            clock=clock,
            config=cfg,
            stats=self.stats,
            ttl=self._schedule.ttl,
            dir_entry=self._dir_entry,
            kept=lambda d: self._dirs.get(d.path) is d,
            recost=lambda d: self._account(d.recost(), 0),
        )
        # Directory attributes from marker metadata, and renamed files (silly renames).
        self.dir_attrs = DirAttrs(cfg.dir_times_max)
        self.moved = Moved(cfg.dir_times_max)
        self._root = self._dir_entry("", "")
        self.watcher = watcher
        """Told of listings, drops and client READDIRs (the data prefetcher, or nobody)."""
        self.generation = 0
        """Bumped by every change that can alter an answer already given (a directory's
        children or attributes, a mutation, a drop): what the fast path (``gateway.fastpath``)
        kept from ``peek`` is valid while this is unchanged and the parent is still fresh."""

    # -- public API ----------------------------------------------------------------------------

    async def getattr(self, path: str, *, current: bool = False) -> Entry:
        """Attributes of ``path`` (lists its parent on first touch). NotFound if absent.
        ``current`` (READ uses it): when the parent's view is past its TTL and its re-list has
        already passed ``path``, the re-list's answer, else the view's; never a wait for the
        re-list (a file deleted from the bucket stops being served once that re-list has
        passed it, or ended)."""
        if not path:
            return self._root
        parent, name = split_path(path)
        e = await self._lookup_in(self._dir(parent), name, current=current)
        if e is None:
            moved = self.moved.target(path)  # a handle of a file renamed since (``moved``)
            if moved is not None:
                return await self.getattr(moved, current=current)
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
            if len(key_order(name)) > NAME_MAX:
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

    def peek(self, dir_path: str, name: str) -> tuple[Entry | None, Directory] | None:
        """``name`` in ``dir_path`` if the index answers it now, without a wait, a listing or
        a re-list: ``(entry, directory)``, ``(None, directory)`` when it is known to be absent,
        or None when only ``getattr``/``lookup`` can say (the directory not listed, past its
        TTL, being listed, partial, listed ahead and not yet announced, prefetch off). Counts
        nothing (the caller counts what it answers). ``name`` must be a valid name."""
        d = self._dirs.get(dir_path)
        if (
            d is None
            or d.cols is None
            or d.listing is not None
            or d.partial
            or d.unannounced
            or not self.clock.monotonic() < d.fresh_until
            or not self.config.prefetch
        ):
            return None
        e = d.get(name, self._dir_entry)
        if e is None:
            if not d.exists or not d.count():
                return None  # a file or gone: lookup's answer (NOTDIR, STALE)
            return None, d
        self._dirs.move_to_end(dir_path)
        return e, d

    @property
    def root(self) -> Entry:
        """The export root's entry (``getattr("")``)."""
        return self._root

    async def readdir(self, dir_path: str, cookie: int, max_entries: int = 1024) -> DirPage:
        """Up to ``max_entries`` entries after ``cookie`` (0 = from the start) in name order.
        The client's cookie verifier is not checked: a cookie that resolves is honoured
        (``cookies``); one that does not raises BadCookie."""
        return (await self.readdir_rows(dir_path, cookie, max_entries)).page()

    async def readdir_rows(
        self, dir_path: str, cookie: int, max_entries: int = 1024, *, client: bool = False
    ) -> Rows:
        """``readdir``'s page as rows of the directory's columns (``directory.Rows``).
        ``client``: a client's READDIR asked for it (the watcher is told: a client listing
        goes before data prefetch); not the gateway's own walks (warm-up, handles, rmdir)."""
        if client:
            self.watcher.browsing()
        if dir_path:
            self._check_not_file(dir_path)
        d = self._dir(dir_path)
        await self._view(d)
        if not d.exists:
            await self._raise_dir_missing(dir_path)
        if client and cookie == 0:
            self._schedule.list_ahead(dir_path, self._dirs, self._start_listing_of)
        try:
            return d.rows(cookie, max_entries, self.config.removed_cookies_per_dir, self._dir_entry)
        finally:
            self._account(d.recost(), 0)
            self._evict()

    async def refresh(self, path: str) -> Entry:
        """Re-read one file's attributes and metadata with a HEAD (e.g. for READLINK, or after
        the object changed under a pinned read). Directories are answered from the index
        without a request. NotFound if the path is gone."""
        if not path:
            return self._root
        parent, name = split_path(path)
        pd = self._dirs.get(parent)
        cached: Entry | None = None
        if pd is not None and pd.cols is not None:
            cached = pd.get(name, self._dir_entry)
        if cached is not None and cached.kind is EntryKind.DIR:
            return cached
        self.stats.heads += 1
        try:
            info = await self.store.head(self.prefix + path)
        except BackendError as exc:
            err = from_backend(exc, NotFound)
            if not isinstance(err, NotFound):
                raise err from exc
            # Maybe a directory without a marker: ask the listing (it may be cached).
            e = await self.getattr(path)
            if e.kind is EntryKind.DIR:
                return e
            self.remove(path)
            raise NotFound(path) from None
        entry = file_entry(name, path, info)
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
                if item.metadata:
                    self._marker(path, item.metadata)
                entry = self._dir_entry(split_path(path)[1], path)
            else:
                entry = file_entry(split_path(rel)[1], rel, item)
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
        self.dir_attrs.forget(path)

    def invalidate(self, path: str, subtree: bool = False) -> None:
        """Something changed at ``path`` in a way the caller cannot describe: the parent's and
        the path's own listings (and with ``subtree`` every cached descendant) must be redone
        before they are served again."""
        if path:
            parent, name = split_path(path)
            pd = self._dirs.get(parent)
            if pd is not None:
                pd.probes.pop(name, None)
                pd.expire()
                pd.ttl = self._schedule.ttl
                self._changed(pd)
            else:
                self._bump_dir_time(parent)
        d = self._dirs.get(path)
        if d is not None:
            d.expire()
            d.ttl = self._schedule.ttl
            self._changed(d)
        if subtree:
            self._forget_subtree(path, keep_self=True)

    async def quiesce(self) -> None:
        """Wait for every listing and targeted lookup in flight (tests, shutdown)."""
        while True:
            # (a listing cancelled before it ran never cleared ``d.listing``: done, not waited)
            tasks: list[asyncio.Task[object]] = [
                d.listing.task
                for d in self._dirs.values()
                if d.listing is not None
                and d.listing.task is not None
                and not d.listing.task.done()
            ]
            tasks += [t for t in self._probes.tasks() if not t.done()]
            if not tasks:
                return
            await asyncio.gather(*tasks, return_exceptions=True)

    async def close(self) -> None:
        for d in list(self._dirs.values()):
            if d.listing is not None and d.listing.task is not None:
                d.listing.task.cancel()
        for t in self._probes.tasks():
            t.cancel()
        await self.quiesce()

    def cached_dirs(self) -> list[str]:
        return list(self._dirs)

    # -- directories, freshness, listing -------------------------------------------------------

    def _dir(self, path: str) -> Directory:
        d = self._dirs.get(path)
        if d is None:
            d = Directory(
                path, f"{self.prefix}{path}/" if path else self.prefix, self._schedule.ttl
            )
            self._dirs[path] = d
            self._account(d.bytes, 0)
            self.stats.dirs = len(self._dirs)
        else:
            self._dirs.move_to_end(path)
        return d

    async def _view(self, d: Directory) -> None:
        """Until the directory has a complete (or partial-mode) view, listing if needed."""
        self._used(d)
        state = self._schedule.freshness(d)
        if state == "stale":
            self._schedule.relist_in_background(d, self._start_listing)
        if d.cols is not None and state != "expired":
            return
        while True:
            lst = self._start_listing(d)
            await lst.wait()
            if not lst.invalid:  # else it predates an invalidate(): list again
                break
        assert d.cols is not None  # a listing that did not raise installed a view

    def _used(self, d: Directory) -> None:
        """A caller uses ``d``: if it was listed ahead of the clients, the watcher (data
        prefetch) hears of it now, or when its listing ends."""
        if d.listing is not None:
            d.listing.ahead = False
        if d.unannounced:
            d.unannounced = False
            if d.cols is not None:
                self.watcher.listed(self.store, d.key_prefix, d.cols)

    def _start_listing_of(self, path: str) -> Listing:
        return self._start_listing(self._dir(path))

    def _start_listing(self, d: Directory) -> Listing:
        """The directory's listing in flight, started if there is none (single-flight)."""
        if d.listing is not None:
            return d.listing
        lst = Listing(self.clock.monotonic(), d.cols, d.pages)
        lst.watch = self._schedule.watch(d.key_prefix)  # armed before the listing reads
        d.listing = lst
        if lst.relist:
            self.stats.relists += 1
        else:
            self.stats.prefetches += 1
        lst.start(self._run_listing(d, lst))
        return lst

    async def _run_listing(self, d: Directory, lst: Listing) -> None:
        cfg = self.config

        def on_page(page: ListPage) -> None:
            self._ingest(d, lst, page)

        def on_received() -> None:
            self.stats.list_pages += 1
            lst.wake()

        try:
            partial = await lst.run(
                self.store,
                d.key_prefix,
                page_keys=cfg.list_page_keys,
                max_pages=cfg.max_list_pages,
                on_page=on_page,
                on_received=on_received,
            )
        except BaseException as exc:
            lst.wake()
            self._account(-lst.bytes, -lst.count())
            if d.listing is lst:
                d.listing = None
            if not isinstance(exc, asyncio.CancelledError):
                self.stats.list_errors += 1
                d.retry_at = self.clock.monotonic() + cfg.retry_after_error_s
                log.warning("dir_listing_failed", dir=d.path, error=repr(exc), relist=lst.relist)
            raise
        if lst.unchanged:  # its pages were not parsed: what they skipped, as the last time
            self.stats.skipped_keys += lst.skipped
        self._install(d, lst, partial)
        lst.wake()

    def _ingest(self, d: Directory, lst: Listing, page: ListPage) -> None:
        added, nbytes, skipped = lst.ingest(page, d.key_prefix, d.path)
        self.stats.skipped_keys += skipped
        self._account(nbytes, added)
        lst.wake()
        self._evict()

    def _install(self, d: Directory, lst: Listing, partial: bool) -> None:
        if d.listing is lst:
            d.listing = None
        if self._dirs.get(d.path) is not d:
            # Dropped meanwhile (cannot happen while a listing is in flight; defensive).
            self._account(-lst.bytes, -lst.count())
            return
        relist = d.cols is not None
        changed, nbytes, nentries = d.install(lst, partial)
        self._account(nbytes, nentries)
        if changed:
            self._changed(d, bump_time=relist)
        self._schedule.installed(d, lst, relist=relist, changed=changed)
        entries = d.count()
        seconds = time.perf_counter() - lst.t0
        log.info(
            "dir_prefetched",
            dir=d.path,
            entries=entries,
            pages=lst.pages,
            seconds=round(seconds, 6),
            relist=lst.relist,
            changed=changed,
            ttl_s=d.ttl,
            partial=partial,
        )
        if partial:
            self.stats.truncated_dirs += 1
            log.warning("dir_truncated", dir=d.path, pages=lst.pages, entries=entries)
        if d.cols is not None:
            if lst.ahead and not relist and self.watcher is not NO_WATCHER:
                d.unannounced = True  # no client asked yet: told on first use (_used)
            else:
                self.watcher.listed(self.store, d.key_prefix, d.cols)
        self._evict()

    # -- lookups -------------------------------------------------------------------------------

    async def _lookup_in(self, d: Directory, name: str, *, current: bool = False) -> Entry | None:
        """``name`` in ``d``, or None when it is known to be absent (``current``: see
        ``getattr``). The states and answers: the table in ``schedule``."""
        if not self.config.prefetch:
            return await self._probes.lookup(d, name)
        self._used(d)
        waited = False
        while True:
            state = self._schedule.freshness(d)
            if state == "stale":
                self._schedule.relist_in_background(d, self._start_listing)
                lst = d.listing
                if current and lst is not None and not lst.invalid:
                    got = self._from_listing(d, lst, name)
                    if got is not False:
                        return got
            if d.cols is not None and (state == "fresh" or state == "stale" or waited):
                e: Entry | None = d.get(name, self._dir_entry)
                if e is not None:
                    self.stats.hits += 1
                    return e
                if d.partial and not reached(d.last_seen, d.key_prefix, name):
                    return await self._probes.lookup(d, name)
                self.stats.negative_hits += 1
                return None
            lst = self._start_listing(d)
            if lst.invalid:  # predates an invalidate(): let it end, then list again
                await lst.wait()
                continue
            got = self._from_listing(d, lst, name)
            if got is not False:
                return got
            if lst.pages > self.config.huge_dir_pages:
                return await self._probes.lookup(d, name)
            await lst.next_page()
            assert lst.task is not None
            if lst.task.done():
                await lst.wait()  # raises the listing's error, if any
                waited = not lst.invalid

    def _from_listing(self, d: Directory, lst: Listing, name: str) -> Entry | Literal[False] | None:
        """``name`` as listing ``lst`` has it, if it has settled it; else False."""
        if name in lst.overrides:
            self.stats.hits += 1
            return lst.overrides[name]
        if lst.last_seen and reached(lst.last_seen, d.key_prefix, name):
            e = lst.get(name, join_path(d.path, name), self._dir_entry)
            if e is None:
                self.stats.negative_hits += 1
            else:
                self.stats.hits += 1
            return e
        return False

    async def _getattr_dir(self, path: str) -> Entry:
        e = await self.getattr(path)
        if e.kind is not EntryKind.DIR:
            raise NotDirectory(path)
        return e

    def _check_not_file(self, dir_path: str) -> None:
        d = self._dirs.get(dir_path)
        if d is not None and d.count():
            return  # listed with children: a directory (it wins over an object of its name)
        parent, name = split_path(dir_path)
        pd = self._dirs.get(parent)
        if pd is not None and pd.cols is not None and self._schedule.freshness(pd) != "expired":
            kind = pd.kind(name)
            if kind is not None and kind is not EntryKind.DIR:
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

    def _dir_entry(self, name: str, path: str) -> Entry:
        t = self._dir_times.get(path, self._start_ns)
        return self.dir_attrs.entry(name, path, t, self._dirs.get(path))

    def _marker(self, path: str, metadata: Mapping[str, str]) -> None:
        """Directory ``path``'s marker carries ``metadata`` (``dirattrs``); an explicit mtime
        there is the directory's time until its next change."""
        self.generation += 1
        mtime = self.dir_attrs.record(path, metadata)
        if mtime is not None:
            self._dir_times[path] = mtime
            self._dir_times.move_to_end(path)

    # -- mutations -----------------------------------------------------------------------------

    def _set_child(self, parent: str, name: str, entry: Entry | None) -> None:
        d = self._dirs.get(parent)
        if d is None:
            self._bump_dir_time(parent)
            return
        self._account(*d.set_child(name, entry))
        self._changed(d)

    def _ensure_ancestors(self, path: str) -> None:
        # All the way up: views listed at different times need not agree with each other.
        while path:
            parent, name = split_path(path)
            pd = self._dirs.get(parent)
            if pd is not None and pd.kind(name) is not EntryKind.DIR:
                self._set_child(parent, name, self._dir_entry(name, path))
            d = self._dirs.get(path)
            if d is not None:
                d.exists = True
            path = parent

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
                d.expire()
                continue
            self._drop(d)

    def _changed(self, d: Directory, bump_time: bool = True) -> None:
        self.generation += 1
        d.gen += 1
        d.verf = self._verifiers.new()
        if bump_time:
            self._bump_dir_time(d.path)

    def _bump_dir_time(self, path: str) -> None:
        self.generation += 1
        t = max(self.clock.time_ns(), self._dir_times.get(path, self._start_ns) + 1)
        self._dir_times[path] = t
        self._dir_times.move_to_end(path)
        while len(self._dir_times) > self.config.dir_times_max:
            self._dir_times.popitem(last=False)
        if not path:
            self._root.mtime_ns = self._root.ctime_ns = t
        # Entries of directories are built when asked for (``_dir_entry``): they read it.

    # -- budget --------------------------------------------------------------------------------

    def _account(self, nbytes: int, nentries: int) -> None:
        self.stats.bytes += nbytes
        self.stats.entries += nentries

    def _drop(self, d: Directory) -> None:
        self.generation += 1
        del self._dirs[d.path]
        self.watcher.dropped(self.store, d.key_prefix)
        self._account(-d.bytes, -d.count())
        self.stats.dirs = len(self._dirs)

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
