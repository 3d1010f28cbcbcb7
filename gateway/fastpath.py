"""The fast path: the calls an epoch sends most, answered in the transport's receive callback.

Owns: answering GETATTR, LOOKUP (hit, and miss in a listed directory), ACCESS and READ of a
small file whose bytes are in memory, straight from the record bytes (no Task, no await, no
call objects), and the memory it keeps for that: a table of handles already checked
(``Hot``: export, entry, until when its parent is fresh, the attributes XDR-encoded, a
permission memo),
a table of LOOKUP arguments already answered, and per connection the identity each
credential maps to on each export (client check and squash decided once). Everything else --
a miss, a write, another procedure, an odd credential, a bad handle, any error -- returns
None, and the caller hands the record to the ordinary path (``dispatch``), which answers it
exactly as it would have: the fast path only ever answers what the ordinary path answers the
same way (``tests/unit/gateway/test_fastpath.py`` compares the two byte for byte).

Validity: what a table keeps was true when the index answered it (``Namespace.peek``) and
stays true while the export's index generation is unchanged (every change, re-list that
found one, mutation or drop bumps it) and the parent directory is still inside the TTL it
had then (a re-list that extends it costs one refill from the index; no table holds a
``Directory``, so a directory the index drops is freed at once); a
config reload clears everything (``clear``). The tables are bounded (``max_entries`` each:
the oldest go first).

Mechanics (parsing the record, building the reply) are ``gateway._fastwire`` (C) or its
pure-Python twin ``gateway.fastwire``: ``NFSGW_PURE_PYTHON=1`` picks the twin, as does a
missing extension (one warning). Decisions (validity, permissions, fills) stay here.

Must not: await, log per call, count anything the ordinary path would not count, or answer a
call for a read-write export in a worker that is not the owner (``local_only``: those go to
the owner, ``gateway.forward``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import structlog

from gateway import fastwire
from gateway.attrs import fattr
from gateway.backend import checksums
from gateway.dispatch import CallContext
from gateway.errors import GatewayError
from gateway.exports import Export
from gateway.handlers.common import access_bits
from gateway.handlers.mutate import MAX_KEY
from gateway.namespace import Entry, EntryKind
from gateway.namespace.index import Namespace
from gateway.namespace.paths import bad_name, join_path, split_path
from gateway.policy import R_OK, X_OK, client_denied, flavor_denied, permits, squash
from gateway.registry import Gateway
from gateway.transport import Peer
from nfsproto import rpc
from nfsproto.nfs3 import fattr3_bytes
from nfsproto.xdr import Buffer, XdrError

log = structlog.get_logger(__name__)

ALL_ACCESS: Final = 0x3F  # the six ACCESS3 bits
MAX_ENTRIES: Final = 32768  # per table; both full: ~32 MiB at ImageNet path lengths (~1 KiB a file)
MAX_IDENTS: Final = 256  # (credential, export) pairs remembered per connection
_NAMES: Final = {
    fastwire.GETATTR: "NFS3.GETATTR",
    fastwire.LOOKUP: "NFS3.LOOKUP",
    fastwire.ACCESS: "NFS3.ACCESS",
    fastwire.READ: "NFS3.READ",
}


def load_wire() -> tuple[object, str]:
    """The mechanics module and its name: the C extension unless ``NFSGW_PURE_PYTHON=1`` or
    it cannot be imported (then the twin; a missing extension is said once, as a warning)."""
    c = fastwire.compiled()
    if c is not None:
        return c, "native"
    why = fastwire.compiled_error()
    if why is not None and "NFSGW_PURE_PYTHON" not in why:
        # No C compiler at install: the CRCs are missing too, and this is the one warning.
        crcs = f"; {checksums.WITHOUT_COMPILED}" if checksums.compiled_missing() else ""
        log.warning(
            "fast_path_pure_python",
            reason=f"the compiled fast path is not available: {why}; the Python twin serves "
            "the same bytes at a higher CPU cost: reinstall with a C compiler (pip install -e .)"
            + crcs,
        )
    return fastwire, "python"


@dataclass(slots=True)
class FastStats:
    """Calls the fast path answered, and records it handed to the ordinary path."""

    answered: int = 0
    declined: int = 0
    fills: int = 0  # table entries made from the index


class Hot:
    """A handle already checked: what it names and how to answer for it."""

    __slots__ = (
        "allowed",
        "attr",
        "ctx",
        "entry",
        "export",
        "fh",
        "gen",
        "key",
        "ns",
        "parent",
        "until",
        "read",
        "search",
    )

    def __init__(self, export: Export, entry: Entry, until: float, attr: bytes) -> None:
        self.export = export
        self.ns: Namespace = export.ns
        self.entry = entry
        self.until = until  # the parent's fresh_until when filled (inf: the export's root)
        self.gen = export.ns.generation
        self.attr = attr
        self.key = export.prefix + entry.path
        self.ctx: CallContext | None = None  # the identity the memo below is for
        self.allowed = 0  # ACCESS bits ``ctx`` has
        self.read = False  # whether ``ctx`` may READ it
        self.search = False  # whether ``ctx`` may LOOKUP in it (a directory)
        # Filled by a LOOKUP that answered it: the directory and this entry's handle. The
        # LOOKUP table maps its arguments to this object (no third object per file for the
        # garbage collector to walk: benchmarks/gc_scale.py).
        self.parent: Hot | None = None
        self.fh = b""


def _hit(h: Hot) -> None:
    """Count what the ordinary path counts when it resolves ``h``'s handle: an index hit in
    its parent (the root, path "", has none)."""
    if h.entry.path:
        h.ns.stats.hits += 1


class Session:
    """One connection's view: its peer and the identity each (credential, export) maps to
    (None: the ordinary path must answer, e.g. a client the export refuses)."""

    __slots__ = ("epoch", "idents", "peer")

    def __init__(self, peer: Peer, epoch: int) -> None:
        self.peer = peer
        self.epoch = epoch
        self.idents: dict[tuple[bytes, int], CallContext | None] = {}


Observe = Callable[[str, str, float], None]


class FastPath:
    def __init__(
        self,
        gw: Gateway,
        observe: Observe,
        *,
        local_only: bool = False,
        max_entries: int = MAX_ENTRIES,
        wire: object | None = None,
    ) -> None:
        self._gw = gw
        self._observe = observe
        self._local_only = local_only
        self._max = max_entries
        if wire is None:
            wire, self.kind = load_wire()
        else:
            self.kind = "native" if wire is not fastwire else "python"
        w = wire
        self._parse: Callable[[Buffer], fastwire.Call | None] = w.parse_call  # type: ignore[attr-defined]
        self._r_getattr: Callable[[int, bytes], bytes] = w.reply_getattr  # type: ignore[attr-defined]
        self._r_access: Callable[[int, bytes, int], bytes] = w.reply_access  # type: ignore[attr-defined]
        self._r_lookup: Callable[[int, bytes, bytes, bytes], bytes] = w.reply_lookup  # type: ignore[attr-defined]
        self._r_noent: Callable[[int, bytes], bytes] = w.reply_lookup_noent  # type: ignore[attr-defined]
        self._r_read: Callable[[int, bytes, int, bool], bytes] = w.reply_read_head  # type: ignore[attr-defined]
        self._files: dict[bytes, Hot] = {}
        self._lookups: dict[bytes, Hot] = {}  # a LOOKUP's arguments -> the child it answered
        self._contexts: dict[tuple[int, int, int, tuple[int, ...]], CallContext] = {}
        self._epoch = 0
        self.stats = FastStats()

    def session(self, peer: Peer) -> Session:
        return Session(peer, self._epoch)

    def clear(self) -> None:
        """Forget everything (a configuration reload: exports, squash, client lists)."""
        self._files.clear()
        self._lookups.clear()
        self._contexts.clear()
        self._epoch += 1

    # -- the call --------------------------------------------------------------------------

    def answer(self, record: Buffer, s: Session) -> list[Buffer] | None:
        """The reply to ``record`` (buffers of one complete reply record), or None: the
        ordinary path must answer it."""
        t0 = time.perf_counter()
        call = self._parse(record)
        if call is None:
            self.stats.declined += 1
            return None
        xid, proc, cred, fh, x, y = call
        try:
            out = self._answer(s, xid, proc, cred, fh, x, y)
        except GatewayError:
            out = None  # a bad or stale handle: the ordinary path answers (and logs) it
        except Exception:
            # A bug here must not cost the client its answer or the connection: logged, and
            # the ordinary path answers.
            log.exception("fast_path_failed", xid=xid, proc=_NAMES[proc], client=s.peer.host)
            out = None
        if out is None:
            self.stats.declined += 1
            return None
        self.stats.answered += 1
        self._observe(_NAMES[proc], out[1], time.perf_counter() - t0)
        return out[0]

    def _answer(
        self, s: Session, xid: int, proc: int, cred: bytes, fh: bytes, x: object, y: object
    ) -> tuple[list[Buffer], str] | None:
        if proc == fastwire.LOOKUP:
            assert isinstance(x, bytes) and isinstance(y, bytes)
            return self._lookup(s, xid, cred, fh, x, y)
        h = self._hot(fh)
        if h is None:
            return None
        ctx = self._ident(s, cred, h.export)
        if ctx is None:
            return None
        if proc == fastwire.GETATTR:
            _hit(h)
            return [self._r_getattr(xid, h.attr)], "ok"
        if h.ctx is not ctx:
            self._memo(h, ctx)
        if proc == fastwire.ACCESS:
            assert isinstance(x, int)
            _hit(h)
            return [self._r_access(xid, h.attr, h.allowed & x)], "ok"
        assert isinstance(x, int) and isinstance(y, int)
        return self._read(h, xid, x, y)

    def _read(self, h: Hot, xid: int, offset: int, count: int) -> tuple[list[Buffer], str] | None:
        e = h.entry
        if e.kind is not EntryKind.FILE or not h.read:
            return None
        gw = self._gw
        reader = gw.reader
        size = e.size
        data: Buffer
        if offset >= min(offset + min(count, gw.config.rsize), size):
            # Nothing to send (past the end, or a count of 0): answered without the data,
            # as the ordinary path does; a reader's last READ, the one that sees EOF, is this.
            data, eof = b"", offset >= size
        else:
            if size > reader.config.small_file_max:
                return None
            got = reader.read_cached(
                h.export.store.name, h.key, e.etag, size, offset, min(count, gw.config.rsize)
            )
            if got is None:
                return None
            data, eof = got
        _hit(h)
        if offset == 0:
            gw.stats.files_opened += 1
        n = len(data)
        return [self._r_read(xid, h.attr, n, eof), data, fastwire.pad(n)], "ok"

    def _lookup(
        self, s: Session, xid: int, cred: bytes, fh: bytes, raw: bytes, key: bytes
    ) -> tuple[list[Buffer], str] | None:
        c = self._lookups.get(key)
        if c is not None and c.parent is not None:
            d = c.parent
            ns = d.ns
            if (
                d.gen == ns.generation
                and c.gen == ns.generation
                and ns.clock.monotonic() < min(c.until, d.until)
                and self._files.get(fh) is d
            ):
                if not self._may_search(s, cred, d):
                    return None
                if c.fh not in self._files:
                    self._put(self._files, c.fh, c)
                _hit(d)
                ns.stats.lookups += 1
                ns.stats.hits += 1
                return [self._r_lookup(xid, c.fh, c.attr, d.attr)], "ok"
        dh = self._hot(fh)
        if dh is None or dh.entry.kind is not EntryKind.DIR:
            return None
        d = dh
        if not self._may_search(s, cred, d):
            return None  # the ordinary path refuses it (and counts and logs the refusal)
        try:
            name = raw.decode("utf-8")
        except UnicodeDecodeError:
            return None
        if bad_name(name):
            return None
        export, dpath = d.export, d.entry.path
        path = join_path(dpath, name)
        if len((export.prefix + path).encode()) > MAX_KEY:
            return None
        ns = d.ns
        got = ns.peek(dpath, name)
        if got is None:
            return None
        child, directory = got
        _hit(d)
        ns.stats.lookups += 1
        if child is None:
            ns.stats.negative_hits += 1
            # What dispatch logs for a NotFound (an everyday answer: debug, filtered out
            # unless asked for).
            log.debug(
                "call_failed",
                status="NFS3ERR_NOENT",
                error=path,
                xid=xid,
                proc="NFS3.LOOKUP",
                client=s.peer.host,
            )
            return [self._r_noent(xid, d.attr)], "NFS3ERR_NOENT"
        ns.stats.hits += 1
        cfh = self._gw.handle_for(export, child.path)
        c = self._put(
            self._files, cfh, Hot(export, child, directory.fresh_until, self._attr(export, child))
        )
        c.parent, c.fh = d, cfh
        self._put(self._lookups, key, c)
        return [self._r_lookup(xid, cfh, c.attr, d.attr)], "ok"

    def _may_search(self, s: Session, cred: bytes, d: Hot) -> bool:
        """Whether ``cred`` may LOOKUP in directory ``d`` (False also where the ordinary path
        must decide: an identity it refuses)."""
        ctx = self._ident(s, cred, d.export)
        if ctx is None:
            return False
        if d.ctx is not ctx:
            self._memo(d, ctx)
        return d.search

    # -- tables ----------------------------------------------------------------------------

    def _hot(self, fh: bytes) -> Hot | None:
        """The checked handle ``fh``, from the table while valid, else from the index now
        (None: only the ordinary path can answer for it)."""
        h = self._files.get(fh)
        if h is not None:
            ns = h.ns
            if h.gen == ns.generation and (ns.clock.monotonic() < h.until):
                return h
        gw = self._gw
        export_id, path, _form, _payload = gw.handles.peek(fh)  # BadHandle: ordinary path
        export = gw.exports.get(export_id)
        if path is None or export is None:
            return None
        if self._local_only and not export.cfg.read_only:
            return None
        if not path:
            entry, until = export.ns.root, math.inf
        else:
            dpath, name = split_path(path)
            got = export.ns.peek(dpath, name)
            if got is None or got[0] is None:
                return None
            entry, until = got[0], got[1].fresh_until
        return self._put(self._files, fh, Hot(export, entry, until, self._attr(export, entry)))

    def _put(self, table: dict[bytes, Hot], key: bytes, value: Hot) -> Hot:
        if len(table) >= self._max and key not in table:
            del table[next(iter(table))]
        table[key] = value
        self.stats.fills += 1
        return value

    @staticmethod
    def _attr(export: Export, e: Entry) -> bytes:
        return fattr3_bytes(fattr(export, e))

    @staticmethod
    def _memo(h: Hot, ctx: CallContext) -> None:
        e, export = h.entry, h.export
        h.allowed = access_bits(export, e, ctx.uid, ctx.gid, ctx.gids, ALL_ACCESS)
        h.read = permits(ctx, export, e, R_OK, read=True)
        h.search = e.kind is EntryKind.DIR and permits(ctx, export, e, X_OK)
        h.ctx = ctx

    def _ident(self, s: Session, cred: bytes, export: Export) -> CallContext | None:
        """The identity ``cred`` maps to on ``export`` for this connection (client check and
        squash applied), or None where the ordinary path must answer."""
        if s.epoch != self._epoch:
            s.idents.clear()
            s.epoch = self._epoch
        k = (cred, export.id)
        try:
            return s.idents[k]
        except KeyError:
            pass
        ctx = self._new_ident(s.peer, cred, export)
        if len(s.idents) >= MAX_IDENTS:
            s.idents.clear()
        s.idents[k] = ctx
        return ctx

    def _new_ident(self, peer: Peer, cred: bytes, export: Export) -> CallContext | None:
        if client_denied(export.cfg, peer.host, peer.port) is not None:
            return None
        flavor = int.from_bytes(cred[:4], "big")
        if flavor_denied(export.cfg, flavor) is not None:  # the ordinary path refuses it
            return None
        ctx = CallContext(0, fastwire.NFS_PROGRAM, 3, 0, peer, flavor)
        if flavor == rpc.AuthFlavor.AUTH_SYS:
            try:
                a = rpc.unpack_auth_sys(cred[8:])
            except (rpc.AuthError, XdrError):
                return None
            ctx.uid, ctx.gid, ctx.gids, ctx.machinename = a.uid, a.gid, tuple(a.gids), a.machinename
        squash(ctx, export.cfg)
        ctx.export_id = export.id
        # One context per identity and export, whatever the connection: the permission memo
        # of a table entry is shared by every connection of the same user.
        k = (export.id, ctx.uid, ctx.gid, ctx.gids)
        got = self._contexts.get(k)
        if got is None:
            if len(self._contexts) >= MAX_IDENTS:
                self._contexts.clear()
            got = self._contexts[k] = ctx
        return got
