"""Handles -> paths for every handle form, on any gateway that shares the secret, with no
shared database and nothing persisted: a client whose gateway fails over to another keeps
every handle it holds working.

Owns: ``Handles``, what the registry holds: ``encode`` (``HandleCodec``), ``peek`` and
``resolve``, and what it takes to turn a hashed handle back into a path: a bounded map
*directory hash -> directory path*, a bounded cache of ``FORM_HASHED``/``FORM_MAPPED``
handles, the walk that finds a directory this gateway does not know yet (single-flight per
export, bounded), a negative cache of what walks did not find, and the old gateways' map
(``legacymap``).
Must not: decide whether the path exists (the caller's ``getattr`` does, and answers STALE),
encode wire types, or persist anything (every gateway rebuilds all of this from listings).

How a handle resolves (forms in ``handles``):

- ``FORM_INLINE``: the path is in the handle. No state, no await.
- ``FORM_NAMED`` (parent hash + name): the parent from the directory map, then the name
  appended: a dict lookup. The map learns every parent this gateway encodes a handle in (one
  entry per directory, not per file), and every subdirectory a walk lists.
- ``FORM_HASHED`` (parent hash + name hash): the handle's cache (filled by ``encode`` here),
  else the parent as above and one scan of the parent's listing that hashes its long names
  (names of up to 42 bytes are never in this form, so only long names are hashed), single
  flight per directory.
- A parent hash the map does not know (another gateway issued the handle, or this one was
  restarted): a *walk* lists directories breadth-first from the export root through the
  namespace (``Namespace.readdir``: cached views are used, missing ones listed once, under
  the namespace's memory budget), learning the hash of every subdirectory it sees, until it
  has found every hash asked for meanwhile. One walk per export at a time (later callers
  join it); at most ``walk_max_dirs`` directories listed, ``walk_concurrency`` at once; each
  listing page yields to the loop. ImageNet-shaped trees (``train/<class>/<file>``) are
  resolved after listing the root and ``train``: every class directory is then known, so one
  walk serves every handle of a fail-over. A hash not found is remembered for
  ``absent_ttl_s`` (bounded), so a client retrying a dead handle does not walk the tree at
  every call. A backend error during a walk reaches its callers as that error (JUKEBOX, IO),
  never as STALE.

Renames and deletions: handles name paths (as ``FORM_INLINE`` always did). A handle of a
renamed or deleted file, or of a file in a renamed directory, resolves to its old path, which
no longer exists: STALE (the walk does not find the old directory, or ``getattr`` does not find
the old name). A new object created at the old path is what the handle names then, exactly as
for inline handles (docs/reliability.md, fail-over).

Collisions: the directory map keeps every path it learns for a hash (at most 4); a second
path for one hash is counted (``collisions``) and logged, and a handle whose hash has several
live candidates containing its name answers STALE, never one of them at random. A scan that
finds two long names with one 128-bit name hash marks that hash ambiguous (STALE, counted).
Resolution never returns a path whose hash differs from the handle's (the map holds only
hashes computed from paths). What cannot be detected: a handle whose directory is gone while
another directory with the same 80-bit hash, never seen together with it, holds the same name
(probability ~ directories / 2^80 per such handle).

The registry calls ``peek`` (synchronous, no I/O: the path of an inline handle or of a hashed
one resolved here lately), checks the export's client list, and only then ``resolve`` (walks
and scans) when ``peek`` had no path: a client an export refuses never makes it list anything.
Hot path: ``peek`` costs one MAC check (~0.3 µs) plus, for the hashed forms, one dict lookup
and a string join (benchmarks/handles_bench.py); ``FORM_INLINE`` handles are unchanged.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import structlog

from gateway.errors import BadHandle, NotDirectory, NotFound, StaleHandle
from gateway.lru import Lru
from gateway.namespace.entries import EntryKind
from gateway.namespace.handles import (
    DIR_HASH_SIZE,
    FORM_HASHED,
    FORM_INLINE,
    FORM_MAPPED,
    FORM_NAMED,
    HEADER_SIZE,
    NAME_INLINE_MAX,
    HandleCodec,
    dir_hash,
    mapped_hash,
    name_hash,
)
from gateway.namespace.index import Namespace
from gateway.namespace.legacymap import LegacyMap
from gateway.namespace.paths import join_path

log = structlog.get_logger(__name__)

NsOf = Callable[[int], Namespace | None]
"""The namespace of an export id (None: this gateway does not serve it)."""

MAX_PATHS_PER_HASH: Final = 4
READDIR_PAGE: Final = 1024
_MISSING: Final = object()


@dataclass(slots=True)
class HandleStats:
    """Gauges (``dir_hashes``, ``hashed_cached``) and counters of handle resolution."""

    dir_hashes: int = 0  # directories in the directory-hash map
    hashed_cached: int = 0  # hashed and mapped handles in the cache
    walks: int = 0  # walks started (a directory hash this gateway did not know)
    walk_dirs: int = 0  # directories listed by walks
    walks_truncated: int = 0  # walks that stopped at walk_max_dirs
    walk_misses: int = 0  # directory hashes a walk did not find (STALE)
    dir_scans: int = 0  # directories whose long names were hashed for a FORM_HASHED handle
    collisions: int = 0  # two paths with one hash seen, or a handle with several candidates
    legacy_lookups: int = 0  # FORM_MAPPED handles read from the old map


class _Walk:
    __slots__ = ("task", "wanted")

    def __init__(self, first: bytes) -> None:
        # directory key -> the paths found for it (empty: not found yet)
        self.wanted: dict[bytes, list[str]] = {first: []}
        self.task: asyncio.Task[None] | None = None


class Handles:
    """Encodes handles and resolves them back to paths. See the module docstring."""

    def __init__(
        self,
        secret: bytes,
        *,
        legacy: LegacyMap | None = None,
        dir_entries: int = 65_536,
        hashed_entries: int = 65_536,
        walk_max_dirs: int = 10_000,
        walk_concurrency: int = 8,
        absent_ttl_s: float = 30.0,
        absent_entries: int = 4096,
        stats: HandleStats | None = None,
    ) -> None:
        self.codec = HandleCodec(secret)
        self.legacy = legacy
        self.stats = stats if stats is not None else HandleStats()
        self._dir_entries = dir_entries
        self._walk_max_dirs = walk_max_dirs
        self._walk_concurrency = walk_concurrency
        self._absent_ttl_s = absent_ttl_s
        self._absent_entries = absent_entries
        # export id (2 B) + dir hash -> the directory paths with that hash (LRU)
        self._dirs: OrderedDict[bytes, tuple[str, ...]] = OrderedDict()
        # export id (2 B) + payload -> path, None: ambiguous (LRU)
        self._hashed: Lru[bytes, str | None] = Lru(hashed_entries)
        # directory key -> monotonic time until which a walk's miss is trusted
        self._absent: OrderedDict[bytes, float] = OrderedDict()
        self._walks: dict[int, _Walk] = {}
        self._scans: dict[tuple[int, str], asyncio.Task[dict[bytes, str | None]]] = {}

    # -- encode --------------------------------------------------------------------------------

    def encode(self, export_id: int, path: str) -> bytes:
        """The handle of ``path``; a hashed one is remembered so this gateway resolves it
        without a walk or a scan."""
        fh = self.codec.encode(export_id, path)
        form = fh[1]
        if form != FORM_INLINE:
            key = fh[2:4] + fh[HEADER_SIZE : HEADER_SIZE + DIR_HASH_SIZE]
            cut = path.rfind("/")
            self._learn_dir(key, path[:cut] if cut >= 0 else "")
            if form == FORM_HASHED:
                self._remember(fh[2:4] + fh[HEADER_SIZE:], path)
        return fh

    # -- decode --------------------------------------------------------------------------------

    def peek(self, fh: bytes) -> tuple[int, str | None, int, bytes]:
        """``(export_id, path, form, payload)`` without I/O: ``path`` is None when the handle
        needs ``resolve`` (a hashed form this gateway has not resolved or issued lately), so
        the caller can check the export's client list before any walk. ``BadHandle``: wrong
        length, version, form or MAC; ``StaleHandle``: a hashed handle known to be
        ambiguous."""
        form, export_id, payload = self.codec.check(fh)
        if form == FORM_INLINE:
            try:
                return export_id, payload.decode("utf-8"), form, payload
            except UnicodeDecodeError as exc:
                raise BadHandle("handle path is not UTF-8") from exc
        if form == FORM_NAMED:
            try:
                name = payload[DIR_HASH_SIZE:].decode("utf-8")
            except UnicodeDecodeError as exc:
                raise BadHandle("handle name is not UTF-8") from exc
            dkey = export_id.to_bytes(2, "big") + payload[:DIR_HASH_SIZE]
            dirs = self._dirs.get(dkey)
            if dirs is not None and len(dirs) == 1:
                self._dirs.move_to_end(dkey)
                d = dirs[0]
                return export_id, f"{d}/{name}" if d else name, form, payload
            return export_id, None, form, payload
        hkey = export_id.to_bytes(2, "big") + payload
        hit = self._hashed.get(hkey, _MISSING)
        if isinstance(hit, str):
            self._hashed.move_to_end(hkey)
            return export_id, hit, form, payload
        if hit is None:
            raise StaleHandle("ambiguous hashed handle")
        return export_id, None, form, payload

    async def resolve(self, export_id: int, form: int, payload: bytes, ns: Namespace) -> str:
        """The path of a handle ``peek`` could not answer, through ``ns`` (the export's
        index): the directory by hash (map or walk), then the name (inline, or by a scan).
        ``StaleHandle``: not found, or ambiguous. Backend errors of a walk or a scan are
        raised as they are."""
        export = export_id.to_bytes(2, "big")
        if form == FORM_MAPPED:
            return await self._legacy_path(export_id, export + payload, payload)
        dirs = await self._find_dir(export_id, ns, export + payload[:DIR_HASH_SIZE])
        if form == FORM_NAMED:
            name = payload[DIR_HASH_SIZE:].decode("utf-8")
            return await self._pick(ns, [join_path(d, name) for d in dirs])
        assert form == FORM_HASHED
        nh = payload[DIR_HASH_SIZE:]
        found: list[str] = []
        for d in dirs:
            names = await self._scan(export_id, ns, d)
            if nh in names:
                name_or_none = names[nh]
                if name_or_none is None:
                    raise StaleHandle("ambiguous name hash")
                found.append(join_path(d, name_or_none))
        return await self._pick(ns, found)

    async def decode(self, fh: bytes, ns_of: NsOf) -> tuple[int, str]:
        """``peek`` then, if needed, ``resolve`` through ``ns_of(export_id)`` (no export
        check: for tests and tools; the registry checks the client in between)."""
        export_id, path, form, payload = self.peek(fh)
        if path is not None:
            return export_id, path
        if form == FORM_MAPPED:  # needs no index
            hkey = export_id.to_bytes(2, "big") + payload
            return export_id, await self._legacy_path(export_id, hkey, payload)
        ns = ns_of(export_id)
        if ns is None:
            raise StaleHandle(f"no export with id {export_id}")
        return export_id, await self.resolve(export_id, form, payload, ns)

    async def _pick(self, ns: Namespace, candidates: list[str]) -> str:
        """The one candidate path (several only after a directory hash collision: then the
        one that exists; none or several: STALE)."""
        if len(candidates) == 1:
            return candidates[0]
        if not candidates:
            raise StaleHandle("no file with the handle's name hash")
        live: list[str] = []
        for p in candidates:
            try:
                await ns.getattr(p)
            except NotFound:
                continue
            live.append(p)
        if len(live) == 1:
            return live[0]
        if live:
            self.stats.collisions += 1
            log.warning("handle_ambiguous", candidates=len(live))
        raise StaleHandle("hashed handle names no single live path")

    async def _legacy_path(self, export_id: int, hkey: bytes, digest: bytes) -> str:
        if self.legacy is None:
            raise StaleHandle("mapped handle and no legacy map in the state directory")
        self.stats.legacy_lookups += 1
        row = await self.legacy.lookup(digest)
        if row is None or row[0] != export_id or mapped_hash(row[0], row[1]) != digest:
            raise StaleHandle("mapped handle unknown to the legacy map")
        self._remember(hkey, row[1])
        return row[1]

    # -- directories by hash -------------------------------------------------------------------

    def _learn_dir(self, key: bytes, path: str) -> None:
        cur = self._dirs.get(key)
        if cur is None:
            self._dirs[key] = (path,)
            if len(self._dirs) > self._dir_entries:
                self._dirs.popitem(last=False)
            self.stats.dir_hashes = len(self._dirs)
        elif path in cur:
            self._dirs.move_to_end(key)
        else:
            self._dirs[key] = (*cur[-(MAX_PATHS_PER_HASH - 1) :], path)
            self._dirs.move_to_end(key)
            self.stats.collisions += 1
            log.warning("handle_dir_hash_collision", paths=[*cur, path])

    async def _find_dir(self, export_id: int, ns: Namespace, dkey: bytes) -> tuple[str, ...]:
        """The directory paths with hash ``dkey``: from the map, else from a walk."""
        for attempt in range(2):
            dirs = self._dirs.get(dkey)
            if dirs:
                self._dirs.move_to_end(dkey)
                return dirs
            now = ns.clock.monotonic()
            until = self._absent.get(dkey)
            if until is not None:
                if until > now:
                    raise StaleHandle("directory hash not found by a recent walk")
                del self._absent[dkey]
            walk = self._walks.get(export_id)
            joined = walk is not None and walk.task is not None and not walk.task.done()
            if walk is not None and joined:
                walk.wanted.setdefault(dkey, [])
            else:
                walk = self._start_walk(export_id, ns, dkey)
            assert walk.task is not None
            await asyncio.shield(walk.task)
            found = walk.wanted.get(dkey)
            if found:
                return tuple(found)
            if joined and attempt == 0:
                # Joined a walk that may have passed the directory before we asked (and the
                # map may have dropped it since): one walk of our own.
                continue
            self.stats.walk_misses += 1
            self._absent[dkey] = ns.clock.monotonic() + self._absent_ttl_s
            while len(self._absent) > self._absent_entries:
                self._absent.popitem(last=False)
        raise StaleHandle("directory hash not found in the export")

    def _start_walk(self, export_id: int, ns: Namespace, dkey: bytes) -> _Walk:
        walk = _Walk(dkey)
        task = asyncio.get_running_loop().create_task(self._walk(export_id, ns, walk))
        walk.task = task
        self._walks[export_id] = walk

        def _done(t: asyncio.Task[None]) -> None:
            if self._walks.get(export_id) is walk:
                del self._walks[export_id]
            if not t.cancelled():
                t.exception()  # retrieved: every caller awaiting it got it

        task.add_done_callback(_done)
        return walk

    async def _walk(self, export_id: int, ns: Namespace, walk: _Walk) -> None:
        """Breadth-first from the root until every wanted hash is found (see the module
        docstring for the bounds)."""
        self.stats.walks += 1
        self._learned(export_id, walk, "")
        if all(walk.wanted.values()):
            return
        level = [""]
        queued = 1
        limit = self._walk_max_dirs
        conc = self._walk_concurrency
        while level:
            deeper: list[str] = []
            for i in range(0, len(level), conc):
                batch = level[i : i + conc]
                results = await asyncio.gather(
                    *(self._walk_dir(export_id, ns, walk, d) for d in batch),
                    return_exceptions=True,
                )
                self.stats.walk_dirs += len(batch)
                for res in results:
                    if isinstance(res, BaseException):
                        if isinstance(res, NotFound | StaleHandle | NotDirectory):
                            continue  # gone (or a file now) since its parent was listed
                        raise res
                    for sub in res:
                        if queued < limit:
                            deeper.append(sub)
                            queued += 1
                if all(walk.wanted.values()):
                    return
            level = deeper
        if queued >= limit:
            self.stats.walks_truncated += 1
            log.warning("handle_walk_truncated", export_id=export_id, dirs=queued)

    async def _walk_dir(self, export_id: int, ns: Namespace, walk: _Walk, d: str) -> list[str]:
        """Lists ``d`` (through the namespace), learns its subdirectories; returns them."""
        subdirs: list[str] = []
        cookie = 0
        while True:
            page = await ns.readdir(d, cookie, READDIR_PAGE)
            for _, e in page.entries:
                if e.kind is EntryKind.DIR:
                    subdirs.append(e.path)
                    self._learned(export_id, walk, e.path)
            if page.eof or not page.entries:
                return subdirs
            cookie = page.entries[-1][0]
            await asyncio.sleep(0)  # a cached directory pages without yielding otherwise

    def _learned(self, export_id: int, walk: _Walk, path: str) -> None:
        key = export_id.to_bytes(2, "big") + dir_hash(export_id, path)
        self._learn_dir(key, path)
        got = walk.wanted.get(key)
        if got is not None and path not in got:
            got.append(path)

    # -- long names by hash --------------------------------------------------------------------

    async def _scan(self, export_id: int, ns: Namespace, d: str) -> dict[bytes, str | None]:
        """name hash -> name (None: two names) of the long names in ``d``; one scan per
        directory at a time."""
        key = (export_id, d)
        task = self._scans.get(key)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._scan_dir(export_id, ns, d))
            self._scans[key] = task

            def _done(t: asyncio.Task[dict[bytes, str | None]]) -> None:
                if self._scans.get(key) is t:
                    del self._scans[key]
                if not t.cancelled():
                    t.exception()

            task.add_done_callback(_done)
        return await asyncio.shield(task)

    async def _scan_dir(self, export_id: int, ns: Namespace, d: str) -> dict[bytes, str | None]:
        self.stats.dir_scans += 1
        prefix = export_id.to_bytes(2, "big") + dir_hash(export_id, d)
        out: dict[bytes, str | None] = {}
        cookie = 0
        while True:
            try:
                page = await ns.readdir(d, cookie, READDIR_PAGE)
            except (NotFound, NotDirectory):
                raise StaleHandle(d) from None
            for _, e in page.entries:
                name = e.name
                if 4 * len(name) <= NAME_INLINE_MAX or len(name.encode()) <= NAME_INLINE_MAX:
                    continue  # short names are in their handles (FORM_NAMED)
                nh = name_hash(name)
                prev = out.get(nh, _MISSING)
                if prev is _MISSING:
                    out[nh] = name
                    self._remember(prefix + nh, e.path)
                elif prev != name:
                    out[nh] = None
                    self._remember(prefix + nh, None)
                    self.stats.collisions += 1
                    log.warning("handle_name_hash_collision", dir=d)
            if page.eof or not page.entries:
                return out
            cookie = page.entries[-1][0]
            await asyncio.sleep(0)

    def _remember(self, key: bytes, path: str | None) -> None:
        self._hashed.put(key, path)
        self.stats.hashed_cached = len(self._hashed)

    async def close(self) -> None:
        """Stop walks and scans in flight; close the legacy map."""
        tasks: list[asyncio.Task[None] | asyncio.Task[dict[bytes, str | None]]] = [
            w.task for w in self._walks.values() if w.task is not None
        ]
        tasks += list(self._scans.values())
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        if self.legacy is not None:
            await self.legacy.close()
