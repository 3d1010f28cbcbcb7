"""The duplicate-request cache (DRC): the replies of non-idempotent NFS calls, kept so a call a
client sends again (same XID, same arguments) after a lost connection is answered with the
original reply instead of being executed a second time.

Why: a client whose connection drops re-sends its outstanding calls with their XIDs (RFC 5531
§9; the Linux client reconnects and retransmits). A REMOVE or RENAME that ran but whose reply
was lost would otherwise run again and answer NFS3ERR_NOENT, so ``rm``/``mv`` fail although
they succeeded. knfsd and nfs-ganesha keep such a cache; so do we.

What is cached: the whole reply record of SETATTR, CREATE, MKDIR, SYMLINK, MKNOD, REMOVE,
RMDIR, RENAME and LINK (``CACHED_PROCS``), successes and failures alike (a replay must see
what the original saw), except NFS3ERR_JUKEBOX (nothing was done; the client retries anyway).
WRITE and COMMIT are not cached: a WRITE stages the same bytes at the same offset again and
answers the same count and verifier, and COMMIT uploads what is staged (nothing, the second
time), so running them twice gives the same result and reply; caching them would hash up to
1 MiB of data per WRITE.

The key (``DrcKey``): client address, XID, program, version, procedure and a 128-bit BLAKE2b
of the credential's identity (flavour and AUTH_SYS body without its time stamp, which a
client may refresh when it re-encodes) and of the argument bytes. **The client's port is not
part of it** (knfsd's is): the Linux client reuses its source port when it reconnects only
where it can bind it again, a NAT or a TCP proxy (a fail-over address) gives it a new one,
and with ``nconnect`` a retransmission may leave on another connection; a key with the port
would miss all of those and the call would run twice. What the port protected against, two
clients behind one address sending the same XID, needs here the same XID *and* the same
procedure, credential and arguments, which is then the same request with the same answer.

A replay that arrives while the original still runs waits for it and gets its reply: the
original runs in a task of its own (``run``), not in the calling connection's task, so a
connection that drops mid-call does not cancel a half-done mutation (its retransmission on
the next connection finds it running and waits). Those tasks are bounded: calls running in
the cache count against ``max_entries`` like finished ones; with every slot taken by a running
call, a new call runs uncached in its connection's task (``bypassed``).

Bounds: ``max_entries`` entries and ``max_bytes`` bytes (the reply plus a fixed estimate of
the entry's overhead), evicting the oldest finished entry; entries older than ``max_age_s``
are not answered from and are dropped. One cache per process: with ``--workers N`` the calls
for read-write exports are routed to one owner worker, so its cache sees every retransmission.

Must not: decode arguments or replies (the key hashes bytes; the dispatcher says what status
a reply carries), block the loop, or keep a call running past ``close``.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple

import structlog

from gateway.clock import Clock
from gateway.settings import MiB, int_in, seconds, setting, size
from nfsproto import nfs3
from nfsproto.nfs3 import Nfs3Proc
from nfsproto.rpc import AuthFlavor
from nfsproto.xdr import Buffer

log = structlog.get_logger(__name__)

CACHED_PROCS: Final = frozenset(
    (nfs3.PROGRAM, nfs3.VERSION, int(p))
    for p in (
        Nfs3Proc.SETATTR,
        Nfs3Proc.CREATE,
        Nfs3Proc.MKDIR,
        Nfs3Proc.SYMLINK,
        Nfs3Proc.MKNOD,
        Nfs3Proc.REMOVE,
        Nfs3Proc.RMDIR,
        Nfs3Proc.RENAME,
        Nfs3Proc.LINK,
    )
)

# What an entry costs besides its reply: the key tuple (host string, three ints, XID, a
# 16-byte digest), the entry object and the OrderedDict node; measured with
# sys.getsizeof at about 330 bytes on CPython 3.11, rounded up.
DRC_ENTRY_CHARGE_BYTES: Final = 400


@dataclass(frozen=True, slots=True)
class DrcConfig:
    """Bounds of the duplicate-request cache: keys of the ``[server]`` table (inlined into
    ``registry.NfsConfig``). ``max_entries = 0`` turns the cache off."""

    max_entries: int = field(
        default=16384,
        metadata=setting(
            int_in(0, 1 << 22),
            "replies of non-idempotent calls kept for retransmissions (0: no cache)",
            key="drc_max_entries",
        ),
    )
    max_bytes: int = field(
        default=16 * MiB,
        metadata=setting(size(0, 1 << 34), "memory for those replies", key="drc_memory"),
    )
    max_age_s: float = field(
        default=300.0,
        metadata=setting(
            seconds(1.0),
            "how long a reply is kept for a retransmission",
            key="drc_max_age_s",
        ),
    )


@dataclass(slots=True)
class DrcStats:
    """Counters read by ``gateway.ops.metrics`` (layer ``drc``)."""

    hits: int = 0  # retransmissions answered from a finished entry
    waits: int = 0  # retransmissions that waited for the original still running
    stored: int = 0  # replies stored
    bypassed: int = 0  # calls run uncached: every slot held a running call
    evicted_space: int = 0  # finished entries dropped for max_entries / max_bytes
    evicted_age: int = 0  # finished entries dropped past max_age_s
    entries: int = 0  # entries, running ones included
    running: int = 0  # calls running in the cache
    bytes: int = 0  # charged bytes of finished entries


class DrcKey(NamedTuple):
    host: str
    xid: int
    prog: int
    vers: int
    proc: int
    digest: bytes


@dataclass(slots=True)
class _Done:
    reply: bytes
    at: float  # clock.monotonic() when the call finished


# The call's reply record, and whether it may be kept (False: answered, not cached).
Execute = Callable[[], Coroutine[Any, Any, tuple[bytes, bool]]]


def identity(flavor: int, cred_body: Buffer) -> bytes:
    """The credential as the key sees it: the flavour, and for AUTH_SYS its body without the
    stamp (RFC 5531 §A.1: the first 4 bytes, which may change when a client re-encodes)."""
    body = memoryview(cred_body)
    if flavor == AuthFlavor.AUTH_SYS:
        body = body[4:]
    return flavor.to_bytes(4, "big") + bytes(body)


class DuplicateRequestCache:
    def __init__(self, config: DrcConfig, clock: Clock) -> None:
        self.config = config
        self.clock = clock
        self.stats = DrcStats()
        self._done: collections.OrderedDict[DrcKey, _Done] = collections.OrderedDict()
        self._running: dict[DrcKey, asyncio.Task[tuple[bytes, bool]]] = {}

    def caches(self, prog: int, vers: int, proc: int) -> bool:
        """Whether calls of this procedure go through the cache (a set lookup: the hot path
        of every other call pays only this)."""
        return (prog, vers, proc) in CACHED_PROCS and self.config.max_entries > 0

    def key(
        self,
        host: str,
        xid: int,
        prog: int,
        vers: int,
        proc: int,
        ident: bytes,
        args: Buffer,
    ) -> DrcKey | None:
        """The key of a call, or None when its procedure is not cached (or the cache is off)."""
        if not self.caches(prog, vers, proc):
            return None
        h = hashlib.blake2b(ident, digest_size=16)
        h.update(args)
        return DrcKey(host, xid, prog, vers, proc, h.digest())

    async def run(self, key: DrcKey, execute: Execute) -> bytes | None:
        """The reply to the call ``key``: a finished entry's, the running original's (waited
        for), or ``execute``'s, run in a task of its own and kept. None: the original was
        cancelled (the gateway is stopping) and there is no reply to send."""
        now = self.clock.monotonic()
        self._expire(now)
        done = self._done.get(key)
        if done is not None:
            self.stats.hits += 1
            log.info("drc_replayed", xid=key.xid, client=key.host, age_s=round(now - done.at, 3))
            return done.reply
        task = self._running.get(key)
        if task is not None:
            self.stats.waits += 1
            log.info("drc_joined", xid=key.xid, client=key.host)
        elif len(self._running) >= self.config.max_entries:
            self.stats.bypassed += 1
            reply, _ = await execute()
            return reply
        else:
            task = asyncio.get_running_loop().create_task(execute())
            self._running[key] = task
            self._evict()  # running calls count against max_entries too
            self._count()
            task.add_done_callback(lambda t: self._finished(key, t))
        # Cancelling this caller (its connection closed) leaves the task running.
        await asyncio.wait((task,))
        if task.cancelled():
            return None
        return task.result()[0]

    def _finished(self, key: DrcKey, task: asyncio.Task[tuple[bytes, bool]]) -> None:
        if self._running.get(key) is task:
            del self._running[key]
        if not task.cancelled() and task.exception() is None:
            reply, keep = task.result()
            charge = len(reply) + DRC_ENTRY_CHARGE_BYTES
            if keep and charge <= self.config.max_bytes:
                old = self._done.pop(key, None)
                if old is not None:
                    self.stats.bytes -= len(old.reply) + DRC_ENTRY_CHARGE_BYTES
                self._done[key] = _Done(reply, self.clock.monotonic())
                self.stats.bytes += charge
                self.stats.stored += 1
        self._evict()
        self._count()

    def _expire(self, now: float) -> None:
        """Drop finished entries past the age limit (the oldest are first)."""
        limit = now - self.config.max_age_s
        done = self._done
        while done:
            key, first = next(iter(done.items()))
            if first.at >= limit:
                break
            del done[key]
            self.stats.bytes -= len(first.reply) + DRC_ENTRY_CHARGE_BYTES
            self.stats.evicted_age += 1
        self._count()

    def _evict(self) -> None:
        c = self.config
        done = self._done
        while done and (
            len(done) + len(self._running) > c.max_entries or self.stats.bytes > c.max_bytes
        ):
            _, first = done.popitem(last=False)
            self.stats.bytes -= len(first.reply) + DRC_ENTRY_CHARGE_BYTES
            self.stats.evicted_space += 1

    def _count(self) -> None:
        self.stats.running = len(self._running)
        self.stats.entries = len(self._done) + len(self._running)

    async def close(self, timeout_s: float) -> None:
        """Let the calls still running finish within ``timeout_s``, cancel the rest, forget
        everything."""
        tasks = list(self._running.values())
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=max(timeout_s, 0.0))
            for t in pending:
                t.cancel()
            if pending:
                log.warning("drc_calls_cancelled", calls=len(pending))
                await asyncio.wait(pending)
        self._done.clear()
        self._running.clear()
        self.stats.bytes = 0
        self._count()
