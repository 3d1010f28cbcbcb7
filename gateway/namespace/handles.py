"""The NFSv3 file handle format, its keyed MAC, stable fileids and the server secret.

Owns: turning ``(export id, path)`` into handle bytes and checking handle bytes (length,
version, form, MAC), the two path hashes a handle may carry (``dir_hash``, ``name_hash``),
``fileid`` and the secret file. Must not: know about directories, listings, the backend or
any state: encoding is a pure function of the secret and the path (the same path gives the
same handle on every gateway that shares the secret, across restarts), and turning a hashed
handle back into a path is ``gateway.namespace.resolve``'s job.

Handle layout (at most NFS3_FHSIZE = 64 bytes, RFC 1813 §2.5)::

    0      1      2..3        4..11        12..
    ver    form   export id   MAC (8 B)    payload (at most 52 B)
                  (u16 BE)

``ver`` = 1. The form says what the payload is:

- ``FORM_INLINE`` (0): the path relative to the export in UTF-8, at most ``INLINE_MAX`` = 52
  bytes (the root is the empty payload). ImageNet paths (~30 bytes) are all of this form.
- ``FORM_NAMED`` (2): ``dir_hash`` of the parent directory (10 bytes), then the file's name in
  UTF-8 (1 to ``NAME_INLINE_MAX`` = 42 bytes: a UUID plus ".jpg" fits). Paths over 52 bytes
  whose last name is short: ``train/<long category name>/<uuid>.jpg``.
- ``FORM_HASHED`` (3): ``dir_hash`` of the parent (10 bytes), then ``name_hash`` of the name
  (16 bytes). Names over 42 bytes.
- ``FORM_MAPPED`` (1): issued by gateways before these forms existed (a 16-byte hash of the
  path, looked up in the issuing gateway's SQLite map); only decoded now, see
  ``gateway.namespace.legacymap``.

MAC = blake2b(key=secret, digest_size=8) over bytes 0..3 and the payload: it covers the
hashes, so a client cannot make up a handle whose hashes point anywhere. A keyed blake2b is
~0.3 µs here against ~1.4 µs for ``hmac.digest(..., "sha256")``; 64 bits are plenty against
guessing (one guess per RPC). The path hashes are keyless blake2b (``dir_hash`` over the
export id and the directory's path, ``name_hash`` over the name), so any gateway computes
them from a listing, whatever its secret. Sizes: 80 bits name a directory (an accidental
collision among 10^6 directories has probability ~4e-13, and ``resolve`` detects collisions
among the directories it knows); 128 bits name a file within its directory.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import struct
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Final

from gateway.errors import BadHandle
from nfsproto.limits import NFS3_FHSIZE

VERSION: Final = 1
FORM_INLINE: Final = 0
FORM_MAPPED: Final = 1
FORM_NAMED: Final = 2
FORM_HASHED: Final = 3
HEADER_SIZE: Final = 12
MAC_SIZE: Final = 8
INLINE_MAX: Final = NFS3_FHSIZE - HEADER_SIZE  # 52 bytes of path
DIR_HASH_SIZE: Final = 10
NAME_HASH_SIZE: Final = 16
NAME_INLINE_MAX: Final = INLINE_MAX - DIR_HASH_SIZE  # 42 bytes of name
MAPPED_HASH_SIZE: Final = 16
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


def dir_hash(export_id: int, dir_path: str) -> bytes:
    """The 10-byte hash that names directory ``dir_path`` ("" the root) of an export in
    ``FORM_NAMED`` and ``FORM_HASHED`` handles."""
    return _dir_hash_raw(export_id.to_bytes(2, "big"), dir_path.encode("utf-8"))


def name_hash(name: str) -> bytes:
    """The 16-byte hash that names a file within its directory in ``FORM_HASHED`` handles."""
    return _name_hash_raw(name.encode("utf-8"))


def mapped_hash(export_id: int, path: str) -> bytes:
    """The 16-byte hash of a ``FORM_MAPPED`` handle (what the old map was keyed by)."""
    raw = export_id.to_bytes(2, "big") + path.encode("utf-8")
    return hashlib.blake2b(raw, digest_size=MAPPED_HASH_SIZE).digest()


def _dir_hash_raw(export: bytes, raw: bytes) -> bytes:
    return hashlib.blake2b(export + raw, digest_size=DIR_HASH_SIZE, person=b"nfsgw-d").digest()


def _name_hash_raw(raw: bytes) -> bytes:
    return hashlib.blake2b(raw, digest_size=NAME_HASH_SIZE, person=b"nfsgw-n").digest()


class HandleCodec:
    """Encodes ``(export_id, path)`` to handle bytes and checks handle bytes. Stateless apart
    from a one-entry memo of the last parent directory hashed (a READDIRPLUS reply encodes the
    handles of one directory's files in a row)."""

    __slots__ = ("_mac_base", "_memo")

    def __init__(self, secret: bytes) -> None:
        if len(secret) < 16:
            raise ValueError("handle secret must be at least 16 bytes")
        self._mac_base = hashlib.blake2b(key=secret, digest_size=MAC_SIZE)
        self._memo: tuple[bytes, bytes] = (b"\xff", b"")  # (export id + parent path, dir hash)

    def _mac(self, head: bytes, payload: bytes) -> bytes:
        h = self._mac_base.copy()
        h.update(head)
        h.update(payload)
        return h.digest()

    def encode(self, export_id: int, path: str) -> bytes:
        """The handle of ``path`` (the same bytes on every gateway with this secret)."""
        if not 0 <= export_id <= MAX_EXPORT_ID:
            raise ValueError(f"export id {export_id} out of range")
        raw = path.encode("utf-8")
        if len(raw) <= INLINE_MAX:
            head = _HEAD.pack(VERSION, FORM_INLINE, export_id)
            return head + self._mac(head, raw) + raw
        export = export_id.to_bytes(2, "big")
        cut = raw.rfind(b"/")
        parent, name = (raw[:cut], raw[cut + 1 :]) if cut >= 0 else (b"", raw)
        if not name:
            raise ValueError(f"path {path!r} ends in '/'")
        memo_key = export + parent
        memo = self._memo
        if memo[0] == memo_key:
            dh = memo[1]
        else:
            dh = _dir_hash_raw(export, parent)
            self._memo = (memo_key, dh)
        if len(name) <= NAME_INLINE_MAX:
            form, payload = FORM_NAMED, dh + name
        else:
            form, payload = FORM_HASHED, dh + _name_hash_raw(name)
        head = _HEAD.pack(VERSION, form, export_id)
        return head + self._mac(head, payload) + payload

    def listed_ids(self, export_id: int) -> Callable[[bytes], tuple[int, bytes | None]]:
        """For export ``export_id``: a path's UTF-8 -> (its ``fileid``, its handle as ``encode``
        makes it, or None when that is not ``FORM_INLINE``: call ``encode``), the path
        hashed from one bytes object (READDIRPLUS does this ~1.3 M times for ImageNet). The
        values are ``fileid``'s and ``encode``'s (tests/unit/gateway/test_handles.py)."""
        if not 0 <= export_id <= MAX_EXPORT_ID:
            raise ValueError(f"export id {export_id} out of range")
        head = _HEAD.pack(VERSION, FORM_INLINE, export_id)
        mac = self._mac_base.copy()
        mac.update(head)
        export = export_id.to_bytes(2, "big")
        blake2b = hashlib.blake2b

        def ids(raw: bytes) -> tuple[int, bytes | None]:
            if not raw:
                return ROOT_FILEID, head + self._mac(head, raw)
            fid = int.from_bytes(blake2b(export + raw, digest_size=8).digest(), "big")
            if fid <= ROOT_FILEID:
                fid += 2
            if len(raw) > INLINE_MAX:
                return fid, None
            h = mac.copy()
            h.update(raw)
            return fid, head + h.digest() + raw

        return ids

    def check(self, fh: bytes) -> tuple[int, int, bytes]:
        """(form, export id, payload) of a well-formed handle with a valid MAC. ``BadHandle``:
        wrong length, version, form or MAC (forged, truncated, another fleet's secret)."""
        n = len(fh)
        if n < HEADER_SIZE or n > NFS3_FHSIZE:
            raise BadHandle(f"handle length {n}")
        version, form, export_id = _HEAD.unpack_from(fh)
        if version != VERSION:
            raise BadHandle(f"handle version {version}")
        size = n - HEADER_SIZE
        if form == FORM_INLINE:
            pass
        elif form == FORM_NAMED:
            if size <= DIR_HASH_SIZE:
                raise BadHandle("named handle length")
        elif form == FORM_HASHED:
            if size != DIR_HASH_SIZE + NAME_HASH_SIZE:
                raise BadHandle("hashed handle length")
        elif form == FORM_MAPPED:
            if size != MAPPED_HASH_SIZE:
                raise BadHandle("mapped handle length")
        else:
            raise BadHandle(f"handle form {form}")
        fh = bytes(fh)
        payload = fh[HEADER_SIZE:]
        if not hmac.compare_digest(self._mac(fh[:4], payload), fh[4:HEADER_SIZE]):
            raise BadHandle("handle MAC")
        return form, export_id, payload
