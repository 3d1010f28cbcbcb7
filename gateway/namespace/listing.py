"""Reading directories from the backend: one whole-directory listing in flight (paging, turning
pages into entries, letting callers wait for the next page), the targeted lookup of one name,
and what a re-list keeps from the view it replaces.

Owns: every LIST request the index makes and the translation of their failures
(``gateway.errors.from_backend``: a missing object there means NOENT, a name being resolved).
Must not: hold the index's state (which directories are cached, their TTLs, the budget: that
is ``Namespace``) or HEAD objects.

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
- **Re-lists keep metadata** (``keep_metadata``): listings carry no object metadata, so an
  entry whose object version is unchanged (same ETag and size) keeps the attributes a HEAD or
  a write gave it (mode, owner, mtime, symlink). A metadata-only change made elsewhere (a copy
  in place keeps the ETag) shows only after a HEAD (``Namespace.refresh``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Mapping

from gateway.backend.base import BackendError, ListPage, ObjectInfo, ObjectStore
from gateway.errors import NotFound, from_backend
from gateway.namespace.entries import Entry, EntryKind, NamespaceStats, entry_bytes, file_entry
from gateway.namespace.paths import bad_name, key_order


class Listing:
    """One listing of a directory in flight: the entries seen so far, the mutations made
    meanwhile (``overrides``: they win over what the listing reports), how far it got."""

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
        self.invalid = False  # predates an invalidate(): its result is served expired
        self.relist = relist
        self.started_at = started_at
        self.t0 = time.perf_counter()
        self.task: asyncio.Task[None] | None = None
        self.page_fut: asyncio.Future[None] | None = None

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
    ) -> bool:
        """Page through the directory ``key_prefix``, handing each page to ``on_page``; True
        if it stopped after ``max_pages`` pages with more to come (partial)."""
        token: str | None = None
        while True:
            try:
                page = await store.list_page(
                    key_prefix, delimiter="/", token=token, max_keys=page_keys
                )
            except BackendError as exc:
                raise from_backend(exc, NotFound) from exc
            self.pages += 1
            on_page(page)
            if page.next_token is None:
                return False
            if self.pages >= max_pages:
                return True
            token = page.next_token

    def ingest(
        self,
        page: ListPage,
        key_prefix: str,
        dir_path: str,
        dir_entry: Callable[[str, str], Entry],
    ) -> tuple[int, int, int]:
        """Add ``page``'s children of ``dir_path``; (entries added, their bytes, keys
        skipped)."""
        kp = key_prefix
        n = len(kp)
        entries = self.entries
        overrides = self.overrides
        skipped = page.skipped
        added = 0
        added_bytes = 0
        for obj in page.objects:
            key = obj.key
            name = key[n:]
            if not name and key == kp:
                self.marker_seen = True
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
            entries[name] = file_entry(name, path, obj)
            if old is None:
                added += 1
                added_bytes += entry_bytes(name, path)
        for cp in page.prefixes:
            name = cp[n:-1]
            if not cp.startswith(kp) or not cp.endswith("/") or bad_name(name):
                skipped += 1
                continue
            if name in overrides:
                continue
            path = f"{dir_path}/{name}" if dir_path else name
            old = entries.get(name)
            entries[name] = dir_entry(name, path)
            if old is None:
                added += 1
                added_bytes += entry_bytes(name, path)
        last = page_end(page)
        if last > self.last_seen:
            self.last_seen = last
        self.bytes += added_bytes
        if skipped:
            self.marker_seen = True  # unpathable keys still prove the directory exists
        return added, added_bytes, skipped


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


def keep_metadata(
    old: Mapping[str, Entry], new: dict[str, Entry], overrides: Mapping[str, Entry | None]
) -> None:
    """In a re-list's ``new`` entries, keep ``old``'s entry of every file whose object is
    unchanged (same ETag and size) and whose listing shows no metadata, so a re-list does not
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
