"""Stateless NFSv3 file handles that survive restarts and fail-over, and stable fileids.

Owns: the handle format, its keyed MAC, the persistent map of long paths (SQLite in the state
directory), the server secret file and ``fileid``. Must not: know about directories, listings or
the backend; it never decides whether a path exists (the namespace does).

Handle layout (at most NFS3_FHSIZE = 64 bytes, RFC 1813 §2.5)::

    0      1      2..3        4..11        12..
    ver    form   export id   MAC (8 B)    payload
                  (u16 BE)

- ``ver`` = 1. ``form`` = 0: the payload is the path relative to the export in UTF-8 (at most
  ``INLINE_MAX`` = 52 bytes; the root is the empty payload). ``form`` = 1: the payload is the
  16-byte ``blake2b(export id + path)`` and the path lives in the map.
- MAC = blake2b(key=secret, digest_size=8) over bytes 0..3 and the payload. A keyed blake2b is
  ~0.3 µs here against ~1.4 µs for ``hmac.digest(..., "sha256")``; 64 bits are plenty against
  guessing (an attacker gets one guess per RPC) and a forged handle only ever names a path.

Short handles (the common case: ImageNet paths are ~30 bytes) are encoded and decoded without any
I/O or await. Long handles are made durable before the client can hold them: ``encode`` records
the path in memory and queues it; ``flush`` (or ``encode_async``) awaits one batched SQLite
transaction on the codec's single database thread. Handlers that return handles call
``encode_async`` (or ``encode`` for many, then ``flush`` once when ``needs_flush``) before
replying, so a gateway killed right after the reply still resolves the handle on restart.
``encode`` also schedules a background flush when an event loop is running, so a forgotten flush
costs at most durability, never correctness within the process. Decoding a long handle whose
hash is neither in the bounded memory cache nor queued reads SQLite on that same thread.

The map is per state directory: a fleet that shares the secret but not the SQLite file resolves
short handles everywhere, long ones only on the gateway that issued them (STALE elsewhere).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import os
import sqlite3
import struct
import tempfile
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Final

import structlog

from gateway.errors import BadHandle, StaleHandle

log = structlog.get_logger(__name__)

FHSIZE: Final = 64  # NFS3_FHSIZE, RFC 1813 §2.4
VERSION: Final = 1
FORM_INLINE: Final = 0
FORM_HASHED: Final = 1
HEADER_SIZE: Final = 12
MAC_SIZE: Final = 8
HASH_SIZE: Final = 16
INLINE_MAX: Final = FHSIZE - HEADER_SIZE  # 52 bytes of path
MAX_EXPORT_ID: Final = 0xFFFF
SECRET_SIZE: Final = 32
SECRET_FILE: Final = "handle.secret"
ROOT_FILEID: Final = 1

_HEAD = struct.Struct(">BBH")
_U64 = struct.Struct(">Q")


def load_or_create_secret(state_dir: Path) -> bytes:
    """The handle secret in ``state_dir/handle.secret``: 32 random bytes, mode 0600, created
    atomically (write a temp file, then ``link`` it into place so two gateways starting at once
    agree on one secret). Copy the file to every gateway of a fleet."""
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / SECRET_FILE
    for _ in range(2):
        try:
            secret = path.read_bytes()
        except FileNotFoundError:
            pass
        else:
            if len(secret) != SECRET_SIZE:
                raise ValueError(f"{path}: expected {SECRET_SIZE} bytes, found {len(secret)}")
            return secret
        fd, tmp = tempfile.mkstemp(prefix=".secret-", dir=state_dir)
        try:
            os.fchmod(fd, 0o600)
            os.write(fd, os.urandom(SECRET_SIZE))
            os.fsync(fd)
            os.close(fd)
            with contextlib.suppress(FileExistsError):  # another process won the race
                os.link(tmp, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
    raise RuntimeError(f"could not create {path}")


def fileid(export_id: int, path: str) -> int:
    """A stable 64-bit file id: ``ROOT_FILEID`` for the export root, else the first 8 bytes of
    ``blake2b(export id + path)``, never 0 and never ``ROOT_FILEID``. Identical on every gateway
    and across restarts (it does not depend on the secret)."""
    if not path:
        return ROOT_FILEID
    digest = hashlib.blake2b(
        export_id.to_bytes(2, "big") + path.encode("utf-8"), digest_size=8
    ).digest()
    fid: int = _U64.unpack(digest)[0]
    if fid <= ROOT_FILEID:
        fid += 2
    return fid


def _path_hash(export_id: int, raw: bytes) -> bytes:
    return hashlib.blake2b(export_id.to_bytes(2, "big") + raw, digest_size=HASH_SIZE).digest()


class HandleCodec:
    """Encodes ``(export_id, path)`` to a file handle and back. See the module docstring."""

    def __init__(
        self,
        secret: bytes,
        db_path: Path | None,
        *,
        cache_entries: int = 100_000,
    ) -> None:
        if len(secret) < 16:
            raise ValueError("handle secret must be at least 16 bytes")
        self._mac_base = hashlib.blake2b(key=secret, digest_size=MAC_SIZE)
        self._db_path = db_path
        self._cache_entries = cache_entries
        # hash -> (export id, path): long paths known durable (or memory-only without a db).
        self._cache: OrderedDict[bytes, tuple[int, str]] = OrderedDict()
        # Queued for the next flush; also answers decode until written.
        self._pending: dict[bytes, tuple[int, str]] = {}
        self._executor: ThreadPoolExecutor | None = None
        self._conn: sqlite3.Connection | None = None  # used only on the executor's thread
        self._last_write: asyncio.Future[None] | None = None
        self._flush_task: asyncio.Task[None] | None = None
        self.long_encoded = 0
        self.db_lookups = 0

    # -- MAC -----------------------------------------------------------------------------------

    def _mac(self, head: bytes, payload: bytes) -> bytes:
        h = self._mac_base.copy()
        h.update(head)
        h.update(payload)
        return h.digest()

    # -- encode --------------------------------------------------------------------------------

    def encode(self, export_id: int, path: str) -> bytes:
        """The handle of ``path``. Synchronous; for a long path the map entry may not be durable
        until ``flush`` completes (see ``needs_flush``)."""
        if not 0 <= export_id <= MAX_EXPORT_ID:
            raise ValueError(f"export id {export_id} out of range")
        raw = path.encode("utf-8")
        if len(raw) <= INLINE_MAX:
            head = _HEAD.pack(VERSION, FORM_INLINE, export_id)
            return head + self._mac(head, raw) + raw
        digest = _path_hash(export_id, raw)
        self.long_encoded += 1
        if digest in self._cache:
            self._cache.move_to_end(digest)
        elif digest not in self._pending:
            self._pending[digest] = (export_id, path)
            self._schedule_flush()
        head = _HEAD.pack(VERSION, FORM_HASHED, export_id)
        return head + self._mac(head, digest) + digest

    async def encode_async(self, export_id: int, path: str) -> bytes:
        """``encode``, then wait until a long path's map entry is durable."""
        fh = self.encode(export_id, path)
        if fh[1] == FORM_HASHED and self.needs_flush:
            await self.flush()
        return fh

    @property
    def needs_flush(self) -> bool:
        return bool(self._pending) or (self._last_write is not None and not self._last_write.done())

    async def flush(self) -> None:
        """Wait until every long path encoded so far is in SQLite (one transaction per batch,
        on the codec's one database thread, whose FIFO order makes waiting on the newest
        write enough)."""
        if self._pending:
            batch = self._pending
            self._pending = {}
            if self._db_path is None:
                for digest, val in batch.items():
                    self._remember(digest, val)
            else:
                loop = asyncio.get_running_loop()
                fut = loop.run_in_executor(self._db_executor(), self._db_write, batch)
                self._last_write = fut
                try:
                    await asyncio.shield(fut)
                except BaseException:
                    if fut.done() and not fut.cancelled() and fut.exception() is not None:
                        # Not durable: queue again so a later flush retries.
                        for digest, val in batch.items():
                            self._pending.setdefault(digest, val)
                    raise
                for digest, val in batch.items():
                    self._remember(digest, val)
                return
        if self._last_write is not None and not self._last_write.done():
            await asyncio.shield(self._last_write)

    def _schedule_flush(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        if self._flush_task is None or self._flush_task.done():
            self._flush_task = loop.create_task(self._background_flush())

    async def _background_flush(self) -> None:
        try:
            await self.flush()
        except Exception as exc:  # retried by the next flush; the caller's flush reports it
            log.warning("handle_map_write_failed", error=repr(exc))

    def _remember(self, digest: bytes, val: tuple[int, str]) -> None:
        self._cache[digest] = val
        self._cache.move_to_end(digest)
        while len(self._cache) > self._cache_entries:
            self._cache.popitem(last=False)

    # -- decode --------------------------------------------------------------------------------

    def _check(self, fh: bytes) -> tuple[int, int, bytes]:
        """(form, export id, payload) of a well-formed handle with a valid MAC."""
        n = len(fh)
        if n < HEADER_SIZE or n > FHSIZE:
            raise BadHandle(f"handle length {n}")
        version, form, export_id = _HEAD.unpack_from(fh)
        if version != VERSION:
            raise BadHandle(f"handle version {version}")
        if form == FORM_HASHED:
            if n != HEADER_SIZE + HASH_SIZE:
                raise BadHandle("hashed handle length")
        elif form != FORM_INLINE:
            raise BadHandle(f"handle form {form}")
        fh = bytes(fh)
        payload = fh[HEADER_SIZE:]
        if not hmac.compare_digest(self._mac(fh[:4], payload), fh[4:HEADER_SIZE]):
            raise BadHandle("handle MAC")
        return form, export_id, payload

    def decode_nowait(self, fh: bytes) -> tuple[int, str] | None:
        """``decode`` without I/O: None when a long handle needs the database."""
        form, export_id, payload = self._check(fh)
        if form == FORM_INLINE:
            try:
                return export_id, payload.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise BadHandle("handle path is not UTF-8") from exc
        hit = self._cache.get(payload)
        if hit is None:
            hit = self._pending.get(payload)
        if hit is not None:
            if hit[0] != export_id:
                raise BadHandle("handle export mismatch")
            return hit
        return None

    async def decode(self, fh: bytes) -> tuple[int, str]:
        """``(export_id, path)``. ``BadHandle``: wrong length, version, form or MAC (forged,
        truncated, another fleet's secret). ``StaleHandle``: a long handle unknown to the map."""
        hit = self.decode_nowait(fh)
        if hit is not None:
            return hit
        digest = bytes(fh[HEADER_SIZE:])
        export_id = _HEAD.unpack_from(fh)[2]
        if self._db_path is None:
            raise StaleHandle("long handle not in memory")
        loop = asyncio.get_running_loop()
        self.db_lookups += 1
        found = await loop.run_in_executor(self._db_executor(), self._db_read, digest)
        if found is None or found[0] != export_id:
            raise StaleHandle("long handle unknown to the handle map")
        if _path_hash(found[0], found[1].encode("utf-8")) != digest:
            raise StaleHandle("handle map entry does not match its hash")
        self._remember(digest, found)
        return found

    # -- SQLite (runs only on the single database thread) --------------------------------------

    def _db_executor(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nfsgw-fhmap")
        return self._executor

    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            assert self._db_path is not None
            self._db_path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self._db_path, isolation_level=None)
            # WAL + synchronous=NORMAL: a committed transaction survives a crash of the
            # process (not necessarily a power cut).
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute(
                "CREATE TABLE IF NOT EXISTS handle_paths ("
                " hash BLOB PRIMARY KEY, export_id INTEGER NOT NULL, path TEXT NOT NULL"
                ") WITHOUT ROWID"
            )
            self._conn = conn
        return self._conn

    def _db_write(self, batch: dict[bytes, tuple[int, str]]) -> None:
        conn = self._db()
        conn.execute("BEGIN")
        try:
            conn.executemany(
                "INSERT OR IGNORE INTO handle_paths (hash, export_id, path) VALUES (?, ?, ?)",
                [(d, e, p) for d, (e, p) in batch.items()],
            )
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def _db_read(self, digest: bytes) -> tuple[int, str] | None:
        row = (
            self._db()
            .execute("SELECT export_id, path FROM handle_paths WHERE hash = ?", (digest,))
            .fetchone()
        )
        if row is None:
            return None
        return int(row[0]), str(row[1])

    def _db_close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    async def close(self) -> None:
        """Flush pending long paths, then close the database and its thread."""
        if self._flush_task is not None and not self._flush_task.done():
            await self._flush_task
        await self.flush()
        if self._executor is not None:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(self._executor, self._db_close)
            self._executor.shutdown(wait=False)
            self._executor = None
