"""How the users of one cache directory share it without a coordinator: the fetch claims
among the worker processes of a shared tier, and, for an unshared one, who else uses the
directory and what its sole user knows is there. Blocking functions ``DiskStore`` runs on its
executor, and the two holders of what they took.

Owns: ``<cache_dir>/v2/locks/<3 hex>`` (the claims: ``flock`` on a lock stripe, ``claim``,
held by a ``Claim``), ``locks/owner`` and ``locks/guests`` (``presence``, held by a
``Presence``), and the sole user's Bloom filter of names (``NameFilter``). Must not: run on
the event loop (but ``Claim.release`` and ``Presence.mark``, which make no blocking call),
or know the budget, the batches or the bundle format beyond an entry's name.

One user, no look-ups
---------------------
A miss costs a round trip to the tier's threads and a failed ``open`` (in a cold epoch ~8 % of
the gateway's busy CPU: every prefetch and fetch looks first). An unshared tier skips it when
it can know the name is not there. Its first user takes ``v2/locks/owner`` (``flock``, for its
life); any other unshared user of the directory (a second gateway pointed at it, a second store
in one process) is a *guest*: it holds ``v2/locks/guests`` shared and writes a fresh nonce into
it before it writes anything (``presence``). The owner keeps a Bloom filter of the
names it knows are there (``NameFilter``: built by its first scan, plus every name it
writes or finds present, and built again by a scan only after a guest came or once it holds
more names than it was sized for; < 1 % false "present"; 128 KiB-16 MiB) and answers a look-up
"absent" from it while the nonce it maps (no system call) is the one it read before that scan;
a changed nonce drops the filter until a scan finds no guest. A false "absent" can only cost a
second GET of bytes that are on disk, never a wrong byte: a guest that came and left between
two of the owner's scans, or a cache directory shared across hosts (one page cache per host:
not supported). A shared tier (several workers) always looks (``DiskStore._absent``).
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
from typing import Final

from gateway.data.disk.entries import exists
from gateway.data.disk.fileformat import GUESTS_LOCK, LOCKS, OWNER_LOCK, DiskKey

__all__ = ["NO_CLAIM", "Claim", "NameFilter", "Presence", "claim", "guests_present", "presence"]


class Claim:
    """The right to fetch one entry among the processes sharing the tier (``claim``): held
    until ``release``; ``present`` when the entry turned up instead (read it)."""

    __slots__ = ("fd", "present")

    def __init__(self, fd: int, present: bool) -> None:
        self.fd = fd
        self.present = present

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # drops the flock; a lock file has no data to flush
            self.fd = -1


NO_CLAIM: Final = Claim(-1, False)


def claim(root: str, k: DiskKey) -> tuple[int, bool]:
    """Try to claim the fetch of ``k`` among the processes sharing ``root``: (fd, False) when
    this process now holds the claim (an exclusive ``flock`` on ``k``'s lock stripe, released
    by closing ``fd``, or by the kernel when the process dies, even by SIGKILL); (-1, True)
    when the entry's name is already there (read it: a read verifies); (-1, False) when
    another process holds the stripe (try again later). Stripes are never unlinked (no
    lock-then-unlink race); two entries on one stripe (1 in 4,096) serialise their fetches,
    which is all it costs."""
    path = os.path.join(root, k.name[:2], k.name)
    if exists(path):
        return -1, True
    lock = os.path.join(root, LOCKS, k.name[:3])
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return -1, False
    except BaseException:
        os.close(fd)
        raise
    if exists(path):  # published between the first look and the lock
        os.close(fd)
        return -1, True
    return fd, False


# -- who else uses the directory, and what a sole user knows is there ----------------------


class Presence:
    """This process's place among the users of the tier that do not share it (``presence``):
    the *owner* (``owner_fd`` >= 0: holds ``locks/owner``) or a *guest* (holds ``locks/guests``
    shared for its life, and wrote a fresh nonce into it on arrival). The owner maps the
    first 8 bytes of ``locks/guests`` (``mark``): a guest's arrival changes them before it
    writes any entry, so the owner sees it without a system call (same host: one page cache)."""

    __slots__ = ("_map", "guests_fd", "owner_fd")

    def __init__(self, owner_fd: int, guests_fd: int) -> None:
        self.owner_fd = owner_fd
        self.guests_fd = guests_fd
        self._map = mmap.mmap(guests_fd, _MARK, prot=mmap.PROT_READ) if owner_fd >= 0 else None

    @property
    def owner(self) -> bool:
        return self.owner_fd >= 0

    def mark(self) -> bytes:
        """The owner's view of the last guest's nonce (b"" for a guest)."""
        return self._map[:_MARK] if self._map is not None else b""

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None
        for fd in (self.owner_fd, self.guests_fd):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)  # drops the flock
        self.owner_fd = self.guests_fd = -1


_MARK: Final = 8  # bytes of the guests' nonce at the start of locks/guests


def presence(root: str) -> Presence:
    """Take this process's place (``Presence``): the first unshared user to take
    ``locks/owner`` (an exclusive ``flock``, non-blocking, held for the process's life and
    dropped by the kernel when it dies) is the owner; any other (a second gateway on the same
    directory, a second store in one process: each open is its own lock) takes
    ``locks/guests`` shared, held likewise (the owner's ``guests_present``), then writes a
    fresh nonce at its start (the owner's ``Presence.mark``). Blocking (a guest may wait out
    an owner's check): the executor's."""
    flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC
    owner = os.open(os.path.join(root, LOCKS, OWNER_LOCK), flags, 0o600)
    guests = -1
    try:
        try:
            fcntl.flock(owner, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(owner)
            owner = -1
        guests = os.open(os.path.join(root, LOCKS, GUESTS_LOCK), flags, 0o600)
        if owner >= 0:
            if os.fstat(guests).st_size < _MARK:
                os.ftruncate(guests, _MARK)  # extends with zeros: never overwrites a nonce
        else:
            fcntl.flock(guests, fcntl.LOCK_SH)
            os.pwrite(guests, os.urandom(_MARK), 0)
        return Presence(owner, guests)
    except BaseException:
        for fd in (owner, guests):
            if fd >= 0:
                os.close(fd)
        raise


def guests_present(guests_fd: int) -> bool:
    """Whether any guest holds ``locks/guests`` (the owner's question): an exclusive,
    non-blocking ``flock`` that is dropped at once when it was granted."""
    try:
        fcntl.flock(guests_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    fcntl.flock(guests_fd, fcntl.LOCK_UN)
    return False


class NameFilter:
    """The entry names a sole user of the tier knows are there: a Bloom filter over the names'
    first 64 bits (``DiskKey.hash64``; the names are BLAKE2b, so those bits are uniform),
    ``bits`` (a power of two) and 4 probes by double hashing. Never a false "absent" for a
    name added; a false "present" (< 1 % while it holds at most ``bits / 10`` names, the
    size ``sized_for`` picks) only costs the look-up it would have made anyway. Names are never
    removed (an evicted or dropped name stays "present" until the next scan rebuilds it)."""

    __slots__ = ("_bits", "_mask", "count")

    PROBES: Final = 4
    MIN_BITS: Final = 1 << 20  # 128 KiB
    MAX_BITS: Final = 1 << 27  # 16 MiB

    def __init__(self, bits: int) -> None:
        if bits <= 0 or bits & (bits - 1):
            raise ValueError("bits must be a power of two")
        self._bits = bytearray(bits >> 3)
        self._mask = bits - 1
        self.count = 0

    @classmethod
    def sized_for(cls, names: int) -> NameFilter:
        """A filter for ``names`` now and as many more written before the next scan: ~10-20
        bits per name, within ``MIN_BITS``..``MAX_BITS``."""
        want = 20 * max(names, 1)
        bits = cls.MIN_BITS
        while bits < want and bits < cls.MAX_BITS:
            bits <<= 1
        return cls(bits)

    @property
    def nbytes(self) -> int:
        return len(self._bits)

    @property
    def capacity(self) -> int:
        """Names it holds at < 1 % false "present" (10 bits each)."""
        return (self._mask + 1) // 10

    def add(self, h: int) -> None:
        m, b = self._mask, self._bits
        x, step = h & 0xFFFFFFFF, (h >> 32) | 1
        for _ in range(self.PROBES):
            i = x & m
            b[i >> 3] |= 1 << (i & 7)
            x += step
        self.count += 1

    def __contains__(self, h: int) -> bool:
        m, b = self._mask, self._bits
        x, step = h & 0xFFFFFFFF, (h >> 32) | 1
        for _ in range(self.PROBES):
            i = x & m
            if not b[i >> 3] & (1 << (i & 7)):
                return False
            x += step
        return True
