"""The local-directory backend (``file:///dir``): the ``ObjectStore`` contract over a
directory tree, for tests and for exporting a local directory.

Owns: the mapping key <-> path, S3-shaped listings (UTF-8 byte order, delimiter roll-up into
common prefixes, opaque continuation tokens), etags, atomic puts, multipart uploads and the
metadata sidecar. Must not: block the event loop (every file operation runs in this store's
small thread pool, or in its lister process), follow a key outside the root, or import nfsproto.

Model:

- Key ``a/b.jpg`` is the file ``<root>/a/b.jpg``. Every directory ``<root>/a`` is also the
  zero-byte "directory marker" object ``a/`` (S3 exports get those from MKDIR), so empty
  directories show up as common prefixes, and a listing of prefix ``a/`` starts with the
  object ``a/`` itself, as on S3 when the marker exists.
- Keys are refused (``InvalidKey``) when absolute, empty, or containing an empty, ``.``,
  ``..`` or ``.nfsgw-*`` segment or a NUL; a resolved path (symlinks followed) must stay
  inside the root. Names on disk that are not UTF-8 are skipped and counted in
  ``ListPage.skipped``. Entries named ``.nfsgw-*`` are ours and hidden.
- A key cannot be both an object and a prefix here (a file ``a`` and a file ``a/b``): such a
  put fails with ``BackendError``.
- ETag: ``<inode>-<size>-<mtime_ns>`` in hex; it changes whenever the file is replaced.
- Metadata lives in ``<root>/.nfsgw-meta/m/<h[:2]>/<h>.json`` (``h`` = SHA-256 of the key)
  together with the etag (inode for directories) it was written for: a file replaced
  behind our back loses its stale metadata instead of inheriting it. Listings carry no
  metadata (like S3).
- put writes ``<dir>/.nfsgw-tmp-<random>`` and renames it over the target (atomic);
  multipart parts live in ``<root>/.nfsgw-meta/uploads/<id>/``.
- delete of a missing key succeeds (S3 semantics); delete of ``a/`` removes the directory
  only when empty.
- Listings: one ``scandir`` per listing (the rest of a page is kept for the next,
  ``_Continuations``), a ``stat`` per file that makes the page. With ``list_process``
  (``open_store`` sets it) one-level listings run in a lister process of their own
  (``_child_list``): there the ``stat`` calls do not trade the interpreter lock with the event
  loop and the READ threads, which cost ~8x the listing's own CPU during a cold epoch; it is
  started on the first listing and again after it dies (that listing fails, the next works).

One module although it is past 600 lines: every operation below is a blocking half over the
one model above (paths, markers, sidecars, atomic installs) and an async half that sends it
to the pool; split, no part would read without the others.
"""

from __future__ import annotations

import asyncio
import base64
import bisect
import contextlib
import contextvars
import errno
import functools
import hashlib
import json
import multiprocessing
import os
import shutil
import stat
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Coroutine, Iterator, Mapping
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from operator import itemgetter
from pathlib import Path
from typing import BinaryIO, Final, TypeVar

from gateway.backend.base import (
    AccessDeniedError,
    BackendError,
    GetResult,
    ListPage,
    ObjectInfo,
    ObjectNotFound,
    PreconditionFailed,
    RequestObserver,
    StoreBase,
    StoreTraits,
)
from gateway.backend.dirwatch import DirWatch, WatchToken
from gateway.fileio import fsync_dir, pread_all

T = TypeVar("T")

HIDDEN_PREFIX: Final = ".nfsgw-"
META_DIR: Final = ".nfsgw-meta"
_TMP_PREFIX: Final = ".nfsgw-tmp-"
_COPY_CHUNK: Final = 1 << 20
_FIRST = itemgetter(0)

QUIET_NS: Final = 1_000_000_000
"""A listing's rest is kept for its next page only if its directory had not changed for this
long: directory mtimes move in clock ticks, so a directory changed within the last tick could
change again without its mtime moving."""
CONTINUATION_TTL_S: Final = 30.0
CONTINUATION_ITEMS_MAX: Final = 100_000
"""Entries kept in all listings' rests together (~300 B each: ~30 MB at most); a rest larger
than this is not kept (its next page scans the directory again)."""


class InvalidKey(BackendError):
    """A key that cannot name a file under the root (absolute, ``..``, empty segment...)."""


def _etag(st: os.stat_result) -> str:
    return f"{st.st_ino:x}-{st.st_size:x}-{st.st_mtime_ns:x}"


def _encode_token(key: str) -> str:
    return base64.urlsafe_b64encode(key.encode("utf-8")).decode("ascii")


def _decode_token(token: str) -> str:
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


class LocalStore(StoreBase):
    """``ObjectStore`` over the directory ``root``. ``workers`` bounds the threads doing
    file I/O; ``fsync=True`` makes put/complete durable before they return."""

    traits = StoreTraits("local", latency_to_hide=False, endpoint="local")

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        workers: int = 8,
        fsync: bool = False,
        create: bool = False,
        observer: RequestObserver | None = None,
        name: str | None = None,
        list_process: bool = False,
    ) -> None:
        path = Path(root)
        if create:
            path.mkdir(parents=True, exist_ok=True)
        if not path.is_dir():
            raise ValueError(f"{root}: not a directory")
        self.root = os.path.realpath(path)
        self.name = name or f"file://{self.root}"
        self.fsync = fsync
        self._observer = observer
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="nfsgw-local")
        self._meta_root = os.path.join(self.root, META_DIR)
        self._continued = _Continuations()
        self._list_process = list_process
        self._lister: ProcessPoolExecutor | None = None
        self._watch: DirWatch | None = None

    async def close(self) -> None:
        if self._watch is not None:
            self._watch.close()
        await asyncio.to_thread(self._pool.shutdown, True)
        if self._lister is not None:
            lister, self._lister = self._lister, None
            await asyncio.to_thread(lister.shutdown, True, cancel_futures=True)

    # ------------------------------------------------------------------ change notification

    def watch_listing(self, prefix: str) -> WatchToken | None:
        """Called as a one-level listing of ``prefix`` (a directory: "" or ending in "/")
        starts: a token for ``unchanged_since``, or None when the kernel cannot watch it
        (``dirwatch``). Optional ``ObjectStore`` capability (the namespace skips the re-list
        of a directory nothing changed in)."""
        if prefix and not prefix.endswith("/"):
            return None
        try:
            path = self._path(prefix)[0] if prefix else self.root
        except InvalidKey:
            return None
        if self._watch is None:
            self._watch = DirWatch()
        return self._watch.arm(path)

    def unchanged_since(self, token: object) -> bool:
        """Whether nothing changed in the directory ``token`` was armed for since then."""
        w = self._watch
        return w is not None and isinstance(token, WatchToken) and w.unchanged(token)

    # ------------------------------------------------------------------------- plumbing

    async def _run(self, op: str, fn: Callable[[], T] | Coroutine[object, object, T]) -> T:
        """Run ``fn`` in the pool (log context follows; or await it), map OS errors, report
        to the observer once."""
        loop = asyncio.get_running_loop()
        ctx = contextvars.copy_context()
        t0 = time.perf_counter()
        outcome = "error"
        try:
            if isinstance(fn, Coroutine):
                result = await fn
            else:
                result = await loop.run_in_executor(self._pool, ctx.run, fn)
            outcome = "ok"
            return result
        except ObjectNotFound:
            outcome = "not_found"
            raise
        except PreconditionFailed:
            outcome = "precondition"
            raise
        except (FileNotFoundError, NotADirectoryError) as e:
            outcome = "not_found"
            raise ObjectNotFound(f"{op}: {e}") from e
        except PermissionError as e:
            raise AccessDeniedError(f"{op}: {e}") from e
        except OSError as e:
            raise BackendError(f"{op}: {e}") from e
        finally:
            if self._observer is not None:
                self._observer(op, outcome, time.perf_counter() - t0)

    def _split(self, key: str) -> tuple[list[str], bool]:
        """Segments of ``key`` and whether it is a directory marker; refuses bad keys."""
        if not key or key[0] == "/":
            raise InvalidKey(f"invalid key {key!r}")
        is_dir = key[-1] == "/"
        segs = (key[:-1] if is_dir else key).split("/")
        for s in segs:
            if not s or s in (".", "..") or "\0" in s or s.startswith(HIDDEN_PREFIX):
                raise InvalidKey(f"invalid key {key!r}")
        return segs, is_dir

    def _path(self, key: str) -> tuple[str, bool]:
        segs, is_dir = self._split(key)
        return os.path.join(self.root, *segs), is_dir

    def _check_inside(self, path: str) -> None:
        """Symlinks may point anywhere; what they resolve to must stay under the root."""
        self._check_real(path, os.path.realpath(path))

    def _check_opened(self, fd: int, path: str) -> None:
        """``_check_inside`` for a file already open: where the kernel says ``fd`` is (one
        readlink of /proc/self/fd, and no window between the check and the open), instead of
        ``realpath``'s lstat per path component in Python (15 % of a cold epoch's CPU)."""
        try:
            real = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # no /proc
            real = os.path.realpath(path)
        self._check_real(path, real.removesuffix(" (deleted)"))

    def _check_real(self, path: str, real: str) -> None:
        if real != self.root and not real.startswith(self.root + os.sep):
            raise InvalidKey(f"{path}: resolves outside the export root")

    def _prefix_dir(self, dir_key: str) -> str | None:
        """The directory for a key prefix ending in '/' ('' = root); None if the prefix
        cannot exist here."""
        if not dir_key:
            return self.root
        try:
            return self._path(dir_key)[0]
        except InvalidKey:
            return None

    # ----------------------------------------------------------------------- metadata

    def _meta_path(self, key: str) -> str:
        h = hashlib.sha256(key.encode("utf-8")).hexdigest()
        return os.path.join(self._meta_root, "m", h[:2], h + ".json")

    def _read_meta(self, key: str, st: os.stat_result) -> dict[str, str]:
        try:
            with open(self._meta_path(key), "rb") as f:
                doc = json.load(f)
        except (FileNotFoundError, NotADirectoryError, ValueError):
            return {}
        if not isinstance(doc, dict) or doc.get("key") != key:
            return {}
        if stat.S_ISDIR(st.st_mode):
            if doc.get("ino") != st.st_ino:
                return {}
        elif doc.get("etag") != _etag(st):
            return {}
        meta = doc.get("meta")
        return {str(k): str(v) for k, v in meta.items()} if isinstance(meta, dict) else {}

    def _write_meta(self, key: str, st: os.stat_result, meta: Mapping[str, str] | None) -> None:
        path = self._meta_path(key)
        if not meta:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            return
        doc = {
            "key": key,
            "etag": _etag(st),
            "ino": st.st_ino,
            "meta": {k.lower(): v for k, v in meta.items()},
        }
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{uuid.uuid4().hex}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(doc, f)
        os.replace(tmp, path)

    def _drop_meta(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._meta_path(key))

    # ------------------------------------------------------------------------ listing

    async def _list_page(
        self, prefix: str, delimiter: str | None, token: str | None, after: str | None, limit: int
    ) -> ListPage:
        start = _decode_token(token) if token else (after or "")
        if self._list_process and delimiter == "/":
            return await self._run("list", self._list_in_process(prefix, start, max(1, limit)))
        return await self._run(
            "list", functools.partial(self._list_blocking, prefix, delimiter, start, max(1, limit))
        )

    async def _list_in_process(self, prefix: str, after: str, max_keys: int) -> ListPage:
        """``_list_blocking`` (one level) in the lister process (see ``_child_list``)."""
        if self._lister is None:
            self._lister = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
        lister = self._lister
        call = functools.partial(_child_list, self.root, prefix, after, max_keys)
        try:
            # submitted from a thread: the first submit spawns the process (~10 ms)
            fut = await asyncio.to_thread(lister.submit, call)
            rows, prefixes, token, skipped = await asyncio.wrap_future(fut)
        except BrokenProcessPool:
            if self._lister is lister:  # the next listing starts a new one
                self._lister = None
            raise BackendError("local listing: the lister process died") from None
        objects = [ObjectInfo(k, size, etag, mtime) for k, size, etag, mtime in rows]
        return ListPage(objects, prefixes, token, skipped)

    def _list_blocking(
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
        info_of = self._info
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
            next_token = _encode_token(page[-1][0])
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
                if e.is_symlink():
                    try:
                        self._check_inside(e.path)
                    except InvalidKey:
                        skipped[0] += 1
                        continue
                out.append(e)
        return out

    def _info(self, key: str, st: os.stat_result) -> ObjectInfo:
        size = 0 if stat.S_ISDIR(st.st_mode) else st.st_size
        return ObjectInfo(key, size, _etag(st), st.st_mtime_ns)

    def _marker(self, dir_key: str, dir_path: str) -> ObjectInfo | None:
        """The directory's own marker object (``a/`` in a listing of prefix ``a/``)."""
        if not dir_key:
            return None
        try:
            st = os.stat(dir_path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        return self._info(dir_key, st) if stat.S_ISDIR(st.st_mode) else None

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
                        yield self._info(sub, e.stat())
                        stack.append((sub, e.path, ""))
                    elif e.is_file():
                        yield self._info(f"{k}{e.name}", e.stat())
                except FileNotFoundError:
                    continue

    # -------------------------------------------------------------------- head / get

    async def head(self, key: str) -> ObjectInfo:
        return await self._run("head", functools.partial(self._head_blocking, key))

    def _head_blocking(self, key: str) -> ObjectInfo:
        path, is_dir = self._path(key)
        self._check_inside(path)
        st = os.stat(path)
        if stat.S_ISDIR(st.st_mode) != is_dir:
            raise ObjectNotFound(f"head {key}: no such object")
        info = self._info(key, st)
        info.metadata = self._read_meta(key, st)
        return info

    async def _get(self, key: str, start: int, end: int | None, if_match: str | None) -> GetResult:
        return await self._run(
            "get", functools.partial(self._get_blocking, key, start, end, if_match)
        )

    def _get_blocking(
        self, key: str, start: int, end: int | None, if_match: str | None
    ) -> GetResult:
        path, is_dir = self._path(key)
        if is_dir:
            self._check_inside(path)
            st = os.stat(path)
            if not stat.S_ISDIR(st.st_mode):
                raise ObjectNotFound(f"get {key}: no such object")
            if if_match is not None and _etag(st) != if_match:
                raise PreconditionFailed(f"get {key}: etag changed")
            data = b""
        else:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                self._check_opened(fd, path)
                st = os.fstat(fd)  # the version we read: puts rename, never rewrite in place
                if stat.S_ISDIR(st.st_mode):
                    raise ObjectNotFound(f"get {key}: no such object")
                if if_match is not None and _etag(st) != if_match:
                    raise PreconditionFailed(f"get {key}: etag changed")
                lo = min(start, st.st_size)
                hi = st.st_size if end is None else min(max(end, lo), st.st_size)
                data = pread_all(fd, hi - lo, lo)
            finally:
                os.close(fd)
        size = 0 if is_dir else st.st_size
        return GetResult(data, _etag(st), size, st.st_mtime_ns, self._read_meta(key, st))

    # ------------------------------------------------------------------------- writes

    async def put(
        self, key: str, data: bytes, metadata: Mapping[str, str] | None = None
    ) -> ObjectInfo:
        return await self._run("put", functools.partial(self._put_blocking, key, data, metadata))

    def _put_blocking(
        self, key: str, data: bytes, metadata: Mapping[str, str] | None
    ) -> ObjectInfo:
        path, is_dir = self._path(key)
        if is_dir:
            if data:
                raise BackendError(f"put {key}: a directory marker cannot hold data here")
            self._makedirs(path)
            st = os.stat(path)
            self._write_meta(key, st, metadata)
            return ObjectInfo(key, 0, _etag(st), st.st_mtime_ns, dict(metadata or {}))

        def write(f: BinaryIO) -> None:
            f.write(data)

        return self._install(key, path, write, metadata)

    def _makedirs(self, path: str) -> None:
        try:
            os.makedirs(path, exist_ok=True)
        except (FileExistsError, NotADirectoryError) as e:
            raise BackendError(f"{path}: a parent is a file (key is both object and prefix)") from e
        self._check_inside(path)

    def _install(
        self,
        key: str,
        path: str,
        write: Callable[[BinaryIO], None],
        metadata: Mapping[str, str] | None,
    ) -> ObjectInfo:
        """Write a temp file next to ``path`` with ``write``, record metadata, rename."""
        parent = os.path.dirname(path)
        self._makedirs(parent)
        tmp = os.path.join(parent, f"{_TMP_PREFIX}{uuid.uuid4().hex}")
        try:
            with open(tmp, "wb") as f:
                write(f)
                f.flush()
                if self.fsync:
                    os.fsync(f.fileno())
                st = os.fstat(f.fileno())
            if os.path.isdir(path):
                raise BackendError(f"put {key}: a directory of that name exists")
            self._write_meta(key, st, metadata)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        if self.fsync:
            fsync_dir(parent)
        return ObjectInfo(key, st.st_size, _etag(st), st.st_mtime_ns, dict(metadata or {}))

    async def copy(
        self, src: str, dst: str, metadata: Mapping[str, str] | None = None
    ) -> ObjectInfo:
        return await self._run("copy", functools.partial(self._copy_blocking, src, dst, metadata))

    def _copy_blocking(self, src: str, dst: str, metadata: Mapping[str, str] | None) -> ObjectInfo:
        spath, sdir = self._path(src)
        dpath, ddir = self._path(dst)
        if sdir or ddir:
            raise BackendError(f"copy {src} -> {dst}: directory markers cannot be copied here")
        self._check_inside(spath)
        with open(spath, "rb") as fsrc:
            st = os.fstat(fsrc.fileno())
            if stat.S_ISDIR(st.st_mode):
                raise ObjectNotFound(f"copy {src}: no such object")
            meta = dict(metadata) if metadata is not None else self._read_meta(src, st)

            def write(f: BinaryIO) -> None:
                shutil.copyfileobj(fsrc, f, _COPY_CHUNK)

            return self._install(dst, dpath, write, meta)

    async def delete(self, key: str) -> None:
        await self._run("delete", functools.partial(self._delete_blocking, key))

    def _delete_blocking(self, key: str) -> None:
        path, is_dir = self._path(key)
        self._check_inside(os.path.dirname(path))
        try:
            if is_dir:
                os.rmdir(path)
            else:
                os.unlink(path)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return
        except OSError as e:
            if not is_dir or e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
            return  # the prefix stays while it has children, as on S3
        finally:
            self._drop_meta(key)

    # ---------------------------------------------------------------------- multipart

    def _upload_dir(self, upload_id: str) -> str:
        if not upload_id or not all(c in "0123456789abcdef" for c in upload_id):
            raise ObjectNotFound(f"no such upload {upload_id!r}")
        return os.path.join(self._meta_root, "uploads", upload_id)

    async def create_multipart(self, key: str, metadata: Mapping[str, str] | None = None) -> str:
        return await self._run(
            "create_multipart", functools.partial(self._create_mp_blocking, key, metadata)
        )

    def _create_mp_blocking(self, key: str, metadata: Mapping[str, str] | None) -> str:
        _, is_dir = self._path(key)
        if is_dir:
            raise BackendError(f"create_multipart {key}: not for directory markers")
        upload_id = uuid.uuid4().hex
        d = self._upload_dir(upload_id)
        os.makedirs(d)
        with open(os.path.join(d, "info.json"), "w", encoding="utf-8") as f:
            json.dump({"key": key, "meta": dict(metadata) if metadata else None}, f)
        return upload_id

    def _upload_info(self, key: str, upload_id: str) -> tuple[str, dict[str, str] | None]:
        d = self._upload_dir(upload_id)
        try:
            with open(os.path.join(d, "info.json"), encoding="utf-8") as f:
                doc = json.load(f)
        except FileNotFoundError:
            raise ObjectNotFound(f"no such upload {upload_id}") from None
        if doc.get("key") != key:
            raise ObjectNotFound(f"upload {upload_id} is not for {key!r}")
        meta = doc.get("meta")
        return d, ({str(k): str(v) for k, v in meta.items()} if isinstance(meta, dict) else None)

    async def upload_part(self, key: str, upload_id: str, part_no: int, data: bytes) -> str:
        if not 1 <= part_no <= 10000:
            raise ValueError(f"part number {part_no} not in 1..10000")
        return await self._run(
            "upload_part",
            functools.partial(self._upload_part_blocking, key, upload_id, part_no, data),
        )

    def _upload_part_blocking(self, key: str, upload_id: str, part_no: int, data: bytes) -> str:
        d, _ = self._upload_info(key, upload_id)
        final = os.path.join(d, f"part-{part_no:05d}")
        tmp = f"{final}.{uuid.uuid4().hex}.tmp"
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            st = os.fstat(f.fileno())
        os.replace(tmp, final)
        return _etag(st)

    async def complete_multipart(
        self, key: str, upload_id: str, parts: list[tuple[int, str]]
    ) -> ObjectInfo:
        return await self._run(
            "complete_multipart",
            functools.partial(self._complete_mp_blocking, key, upload_id, parts),
        )

    def _complete_mp_blocking(
        self, key: str, upload_id: str, parts: list[tuple[int, str]]
    ) -> ObjectInfo:
        d, meta = self._upload_info(key, upload_id)
        if not parts:
            raise BackendError(f"complete_multipart {key}: no parts")
        ordered = sorted(parts)
        files = []
        for n, etag in ordered:
            p = os.path.join(d, f"part-{n:05d}")
            try:
                st = os.stat(p)
            except FileNotFoundError:
                raise BackendError(f"complete_multipart {key}: part {n} missing") from None
            if _etag(st) != etag:
                raise BackendError(f"complete_multipart {key}: part {n} etag mismatch")
            files.append(p)

        def write(f: BinaryIO) -> None:
            for p in files:
                with open(p, "rb") as src:
                    shutil.copyfileobj(src, f, _COPY_CHUNK)

        path, _ = self._path(key)
        info = self._install(key, path, write, meta)
        shutil.rmtree(d, ignore_errors=True)
        return info

    async def abort_multipart(self, key: str, upload_id: str) -> None:
        await self._run(
            "abort_multipart", functools.partial(self._abort_mp_blocking, key, upload_id)
        )

    def _abort_mp_blocking(self, key: str, upload_id: str) -> None:
        try:
            d, _ = self._upload_info(key, upload_id)
        except ObjectNotFound:
            return
        shutil.rmtree(d, ignore_errors=True)


# ------------------------------------------------------------------------------ helpers


_CHILD_STORES: dict[str, LocalStore] = {}


def _child_list(
    root: str, prefix: str, after: str, max_keys: int
) -> tuple[list[tuple[str, int, str, int]], list[str], str | None, int]:
    """A one-level listing page, run in the lister process: its ``scandir`` and a ``stat``
    per file there do not hand the interpreter lock back and forth with the gateway's event
    loop and READ threads, which made a re-list of a 1,281-file folder cost 8 ms of CPU alone
    and ~65 ms during a cold epoch (a thread waiting for the lock after each ``stat``). The
    page travels back as plain tuples (cheap to unpickle); the rest of a listing stays in
    this process's ``_Continuations`` for the next page."""
    store = _CHILD_STORES.get(root)
    if store is None:
        store = _CHILD_STORES[root] = LocalStore(root)
    page = store._list_blocking(prefix, "/", after, max_keys)
    rows = [(o.key, o.size, o.etag, o.mtime_ns) for o in page.objects]
    return rows, page.prefixes, page.next_token, page.skipped


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
