"""Listings of the local-directory backend: S3-shaped pages (UTF-8 byte order, delimiter
roll-up into common prefixes, opaque continuation tokens) of a directory tree, and the rests
of listings kept for their next page.

Owns: ``Lister`` (blocking: it runs in the store's pool threads or in its lister process),
``_Continuations``, the etag and token formats a listing shares with ``LocalStore``. Must not:
map keys to paths itself (``LocalStore`` gives it ``prefix_dir`` and ``resolves_inside``),
run on the event loop, or import nfsproto or anything above the backend layer.

- One ``scandir`` per listing: the rest of a one-level page is kept for the request that
  continues it while its directory is unchanged (``_Continuations``), and a ``stat`` only for
  the files that make the page.
- Entries named ``.nfsgw-*`` are the store's own and hidden; names on disk that are not UTF-8
  are skipped and counted in ``ListPage.skipped``, as are symlinks resolving outside the root.
- A directory ``a`` is the zero-byte marker object ``a/``; a listing of prefix ``a/`` starts
  with it.
"""

from __future__ import annotations

import base64
import bisect
import os
import stat
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from operator import itemgetter
from typing import Final

from gateway.backend.base import BackendError, ListPage, ObjectInfo

HIDDEN_PREFIX: Final = ".nfsgw-"
_FIRST = itemgetter(0)

QUIET_NS: Final = 1_000_000_000
"""A listing's rest is kept for its next page only if its directory had not changed for this
long: directory mtimes move in clock ticks, so a directory changed within the last tick could
change again without its mtime moving."""
CONTINUATION_TTL_S: Final = 30.0
CONTINUATION_ITEMS_MAX: Final = 100_000
"""Entries kept in all listings' rests together (~300 B each: ~30 MB at most); a rest larger
than this is not kept (its next page scans the directory again)."""


def etag(st: os.stat_result) -> str:
    """``<inode>-<size>-<mtime_ns>`` in hex: it changes whenever the file is replaced."""
    return f"{st.st_ino:x}-{st.st_size:x}-{st.st_mtime_ns:x}"


def object_info(key: str, st: os.stat_result) -> ObjectInfo:
    size = 0 if stat.S_ISDIR(st.st_mode) else st.st_size
    return ObjectInfo(key, size, etag(st), st.st_mtime_ns)


def encode_token(key: str) -> str:
    return base64.urlsafe_b64encode(key.encode("utf-8")).decode("ascii")


def decode_token(token: str) -> str:
    try:
        return base64.urlsafe_b64decode(token.encode("ascii")).decode("utf-8")
    except (ValueError, UnicodeError):
        raise BackendError(f"bad continuation token {token!r}") from None


def _is_utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # os.fsdecode's surrogate escapes: bytes that are not UTF-8
        return False
    return True


class Lister:
    """Pages of the tree ``LocalStore`` serves. ``prefix_dir(dir_key)`` is the directory of a
    key prefix ending in '/' ('' = the root; None when no key can start so);
    ``resolves_inside(path)`` whether a symlink's target stays under the root."""

    def __init__(
        self, prefix_dir: Callable[[str], str | None], resolves_inside: Callable[[str], bool]
    ) -> None:
        self._prefix_dir = prefix_dir
        self._resolves_inside = resolves_inside
        self._continued = _Continuations()

    def list_blocking(
        self, prefix: str, delimiter: str | None, after: str, max_keys: int
    ) -> ListPage:
        skipped = [0]
        dir_key, _, name_prefix = prefix.rpartition("/")
        dir_key = dir_key + "/" if dir_key else ""
        # (key or common prefix, its info, a file not stat-ed yet, or None for a prefix)
        items: list[tuple[str, ObjectInfo | os.DirEntry[str] | None]]
        stamp = None
        if delimiter == "/":
            dir_path = self._prefix_dir(dir_key)
            stamp = _quiet_stamp(dir_path) if dir_path is not None else None
            rest = self._continued.take(prefix, after, stamp) if after else None
            if rest is not None:
                items = rest
            else:
                items = self._one_level(dir_key, dir_path, name_prefix, skipped)
                items.sort(key=_FIRST)  # code-point order == UTF-8 byte order
        else:
            flat = sorted(self._walk(dir_key, name_prefix, skipped), key=lambda o: o.key)
            items = list(_roll_up(flat, prefix, delimiter or None))
            items.sort(key=_FIRST)
        if after and items and items[0][0] <= after:
            items = items[bisect.bisect_right(items, after, key=_FIRST) :]
        page, rest = items[:max_keys], items[max_keys:]
        objects: list[ObjectInfo] = []
        info_of = object_info
        for k, info in page:
            if isinstance(info, os.DirEntry):
                # Only the page's files are stat-ed (a 1,000-key page of a 1,281-file
                # directory: not the other 281, nor the first page's 1,000 again).
                try:
                    info = info_of(k, info.stat())
                except FileNotFoundError:  # removed while we looked
                    continue
            if info is not None:
                objects.append(info)
        prefixes = [k for k, info in page if info is None]
        next_token = None
        if rest:
            next_token = encode_token(page[-1][0])
            if stamp is not None:
                self._continued.put(prefix, page[-1][0], stamp, rest)
        return ListPage(objects, prefixes, next_token, skipped[0])

    def _entries(self, dir_path: str, skipped: list[int]) -> list[os.DirEntry[str]]:
        """The entries of ``dir_path`` a listing may show: not ours, UTF-8, and symlinks
        only when they resolve inside the root (counted in ``skipped`` otherwise)."""
        out: list[os.DirEntry[str]] = []
        try:
            it = os.scandir(dir_path)
        except (FileNotFoundError, NotADirectoryError):
            return out
        with it:
            for e in it:
                name = e.name
                if name.startswith(HIDDEN_PREFIX):
                    continue
                if not name.isascii() and not _is_utf8(name):
                    skipped[0] += 1
                    continue
                if e.is_symlink() and not self._resolves_inside(e.path):
                    skipped[0] += 1
                    continue
                out.append(e)
        return out

    def _marker(self, dir_key: str, dir_path: str) -> ObjectInfo | None:
        """The directory's own marker object (``a/`` in a listing of prefix ``a/``)."""
        if not dir_key:
            return None
        try:
            st = os.stat(dir_path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        return object_info(dir_key, st) if stat.S_ISDIR(st.st_mode) else None

    def _one_level(
        self, dir_key: str, dir_path: str | None, name_prefix: str, skipped: list[int]
    ) -> list[tuple[str, ObjectInfo | os.DirEntry[str] | None]]:
        """The directory's marker, subdirectories (as prefixes) and files (not stat-ed yet:
        only those that make the page are), unsorted; one loop, no generator (this runs for
        every entry of every re-list)."""
        items: list[tuple[str, ObjectInfo | os.DirEntry[str] | None]] = []
        if dir_path is None:
            return items
        if not name_prefix and (m := self._marker(dir_key, dir_path)) is not None:
            items.append((dir_key, m))
        for e in self._entries(dir_path, skipped):
            name = e.name
            if name_prefix and not name.startswith(name_prefix):
                continue
            try:
                if e.is_dir():
                    items.append((f"{dir_key}{name}/", None))
                elif e.is_file():
                    items.append((f"{dir_key}{name}", e))
            except FileNotFoundError:  # removed while we looked
                continue
        return items

    def _walk(self, dir_key: str, name_prefix: str, skipped: list[int]) -> Iterator[ObjectInfo]:
        """Every object (files and directory markers) whose key starts with
        ``dir_key + name_prefix``."""
        dir_path = self._prefix_dir(dir_key)
        if dir_path is None:
            return
        if not name_prefix and (m := self._marker(dir_key, dir_path)) is not None:
            yield m
        stack = [(dir_key, dir_path, name_prefix)]
        while stack:
            k, p, np = stack.pop()
            for e in self._entries(p, skipped):
                if np and not e.name.startswith(np):
                    continue
                try:
                    if e.is_dir():
                        sub = f"{k}{e.name}/"
                        yield object_info(sub, e.stat())
                        stack.append((sub, e.path, ""))
                    elif e.is_file():
                        yield object_info(f"{k}{e.name}", e.stat())
                except FileNotFoundError:
                    continue


# ------------------------------------------------------------------------------ helpers


Stamp = tuple[int, int]
Rest = list[tuple[str, ObjectInfo | os.DirEntry[str] | None]]


def _quiet_stamp(dir_path: str) -> Stamp | None:
    """(inode, mtime_ns) of a directory unchanged for ``QUIET_NS``, else None."""
    try:
        st = os.stat(dir_path)
    except OSError:
        return None
    if time.time_ns() - st.st_mtime_ns < QUIET_NS:
        return None
    return st.st_ino, st.st_mtime_ns


class _Continuations:
    """The rest of a one-level listing (its entries past the page, sorted, files not stat-ed),
    kept for the request that continues it: a directory of 1,281 files is scanned once per
    listing, not once per 1,000-key page. A rest is used once, only while its directory's
    stamp is unchanged (no entry added, removed or renamed since), within
    ``CONTINUATION_TTL_S``; the oldest are dropped past ``CONTINUATION_ITEMS_MAX`` entries. Used
    from the pool's threads, hence the lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rests: OrderedDict[tuple[str, str], tuple[Stamp, float, Rest]] = OrderedDict()
        self._items = 0

    def put(self, prefix: str, last_key: str, stamp: Stamp, rest: Rest) -> None:
        if len(rest) > CONTINUATION_ITEMS_MAX:
            return
        with self._lock:
            old = self._rests.pop((prefix, last_key), None)
            if old is not None:
                self._items -= len(old[2])
            self._rests[(prefix, last_key)] = (stamp, time.monotonic(), rest)
            self._items += len(rest)
            while self._items > CONTINUATION_ITEMS_MAX:
                self._items -= len(self._rests.popitem(last=False)[1][2])

    def take(self, prefix: str, after: str, stamp: Stamp | None) -> Rest | None:
        with self._lock:
            hit = self._rests.pop((prefix, after), None)
            if hit is not None:
                self._items -= len(hit[2])
        if hit is None or stamp is None or hit[0] != stamp:
            return None
        if time.monotonic() - hit[1] > CONTINUATION_TTL_S:
            return None
        return hit[2]


def _roll_up(
    flat: list[ObjectInfo], prefix: str, delimiter: str | None
) -> list[tuple[str, ObjectInfo | None]]:
    """S3's delimiter semantics over a sorted flat listing: a key with ``delimiter`` after
    ``prefix`` becomes the common prefix up to and including it."""
    if not delimiter:
        return [(o.key, o) for o in flat]
    out: list[tuple[str, ObjectInfo | None]] = []
    seen: set[str] = set()
    n = len(prefix)
    for o in flat:
        i = o.key.find(delimiter, n)
        if i < 0:
            out.append((o.key, o))
        else:
            cp = o.key[: i + len(delimiter)]
            if cp not in seen:
                seen.add(cp)
                out.append((cp, None))
    return out
