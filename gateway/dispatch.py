"""(program, version, procedure) -> handler; the one place where outcomes become replies.

Owns: decoding the call header and arguments, authentication flavours, the RPC-level errors of
RFC 5531 (PROG_UNAVAIL, PROG_MISMATCH, PROC_UNAVAIL, GARBAGE_ARGS, SYSTEM_ERR, RPC_MISMATCH,
AUTH_ERROR, also for an ``AuthRefused`` a later rule raises: an export's ``sec``) and the
mapping of a failed call to its reply (STYLE §3): a ``GatewayError``
answers the body the handler attached to it (``GatewayError.with_body``) or else the
procedure's bare result built from the status (``Procedure.fail_body``); a backend failure
that escaped its layer is translated (``errors.as_gateway_error``); anything else becomes
SERVERFAULT, logged with its traceback. Every failure is logged here once, at the level its
error type carries, and counted by the status of the reply. ``CancelledError`` is never
caught here. Non-idempotent calls go through the duplicate-request cache (``gateway.drc``)
once their arguments decode: a retransmission is answered with the original's reply, and the
original runs to its end even if its connection closes. Must not: build wire bytes by hand.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, MutableMapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import structlog

from gateway.drc import DuplicateRequestCache, identity
from gateway.errors import ServerFault, as_gateway_error
from gateway.transport import Peer
from nfsproto import rpc
from nfsproto.nfs3 import NfsStat3
from nfsproto.rpc import AcceptStat, AuthFlavor, AuthStat
from nfsproto.xdr import Buffer, Reader, Writer, XdrError

log = structlog.get_logger(__name__)

A = TypeVar("A")
R = TypeVar("R")

# The call being served (xid, procedure name, client address): set once per call (each runs
# in its own task, so it ends with the call); ``add_call`` puts it in every log line logged
# while serving it, in any layer. One ContextVar set instead of structlog's
# bind_contextvars of three keys (~0.1 against ~1.5 µs per call).
CALL: ContextVar[tuple[int, str, str] | None] = ContextVar("nfsgw_call", default=None)
MAX_CREDS = 1024  # AUTH_SYS bodies kept decoded


def add_call(_logger: object, _method: str, event: MutableMapping[str, Any]) -> Any:
    """structlog processor: the call being served (``CALL``), unless the line names one."""
    c = CALL.get()
    if c is not None:
        event.setdefault("xid", c[0])
        event.setdefault("proc", c[1])
        event.setdefault("client", c[2])
    return event


class AuthRefused(Exception):
    """A caller's credential is refused by a rule found past the header (an export's
    ``sec``): answered as an RPC AUTH_ERROR with ``stat`` (RFC 5531 §9), not an NFS status."""

    def __init__(self, stat: AuthStat, why: str) -> None:
        super().__init__(why)
        self.stat = stat


@dataclass(slots=True)
class CallContext:
    """Who is calling. ``uid``/``gid``/``gids`` start as the raw AUTH_SYS values (AUTH_NONE
    maps to nobody); ``Gateway.resolve`` maps them by the export's squash rule and sets
    ``export_id`` to the export whose rule applied."""

    xid: int
    prog: int
    vers: int
    proc: int
    peer: Peer
    flavor: int
    uid: int = 65534
    gid: int = 65534
    gids: tuple[int, ...] = ()
    machinename: bytes = b""
    export_id: int | None = None


@dataclass(frozen=True, slots=True)
class Procedure(Generic[A, R]):
    name: str
    unpack_args: Callable[[Reader], A]
    pack_res: Callable[[Writer, R], None]
    handler: Callable[[CallContext, A], Awaitable[R]]
    # The procedure's bare failure result from a status, when the error carries no body
    # (for NFSv3 the result type itself: every one is built from its status alone). None:
    # the procedure has no failure result (NULL, UMNT, PORTMAP...): errors become SYSTEM_ERR.
    fail_body: Callable[[NfsStat3], R] | None = None
    # Procedures that accept any auth flavour (NULL: RPCSEC_GSS context set-up probes it).
    any_auth: bool = False


@dataclass(slots=True)
class Program:
    name: str
    versions: dict[int, dict[int, Procedure[Any, Any]]] = field(default_factory=dict)

    @property
    def low(self) -> int:
        return min(self.versions)

    @property
    def high(self) -> int:
        return max(self.versions)


class CallObserver:
    """Counts calls; metrics subclasses it. Labels: program.procedure name and outcome."""

    def call(self, proc: str, status: str, seconds: float) -> None:
        pass

    def rpc_error(self, kind: str) -> None:
        pass


class Dispatcher:
    def __init__(
        self, observer: CallObserver | None = None, drc: DuplicateRequestCache | None = None
    ) -> None:
        self.programs: dict[int, Program] = {}
        self.observer = observer or CallObserver()
        self.drc = drc
        # AUTH_SYS body -> decoded: a client sends the same few credentials on every call.
        self._creds: dict[bytes, rpc.AuthSys] = {}

    def register(
        self, prog: int, name: str, vers: int, procs: dict[int, Procedure[Any, Any]]
    ) -> None:
        self.programs.setdefault(prog, Program(name)).versions[vers] = procs

    async def handle(self, record: Buffer, peer: Peer) -> list[Buffer] | None:
        r = Reader(record)
        try:
            hdr = rpc.unpack_call(r)
        except rpc.RpcDecodeError as e:
            return self._header_error(e, peer)
        prog = self.programs.get(hdr.prog)
        w = Writer()
        if prog is None:
            self.observer.rpc_error("prog_unavail")
            rpc.pack_accepted_reply(w, hdr.xid, AcceptStat.PROG_UNAVAIL)
            return w.buffers()
        procs = prog.versions.get(hdr.vers)
        if procs is None:
            self.observer.rpc_error("prog_mismatch")
            rpc.pack_prog_mismatch(w, hdr.xid, prog.low, prog.high)
            return w.buffers()
        proc = procs.get(hdr.proc)
        if proc is None:
            self.observer.rpc_error("proc_unavail")
            rpc.pack_accepted_reply(w, hdr.xid, AcceptStat.PROC_UNAVAIL)
            return w.buffers()
        ctx = CallContext(hdr.xid, hdr.prog, hdr.vers, hdr.proc, peer, hdr.cred.flavor)
        if hdr.cred.flavor == AuthFlavor.AUTH_SYS:
            body = bytes(hdr.cred.body)
            a = self._creds.get(body)
            if a is None:
                try:
                    a = rpc.unpack_auth_sys(body)
                except rpc.AuthError as e:
                    return self._auth_error(w, hdr.xid, e.stat, peer, str(e))
                if len(self._creds) >= MAX_CREDS:
                    self._creds.clear()
                self._creds[body] = a
            ctx.uid, ctx.gid, ctx.gids, ctx.machinename = a.uid, a.gid, tuple(a.gids), a.machinename
        elif hdr.cred.flavor != AuthFlavor.AUTH_NONE and not proc.any_auth:
            return self._auth_error(
                w, hdr.xid, AuthStat.AUTH_TOOWEAK, peer, f"unsupported flavor {hdr.cred.flavor}"
            )
        if hdr.verf.flavor not in (AuthFlavor.AUTH_NONE, AuthFlavor.AUTH_SYS) and not proc.any_auth:
            return self._auth_error(
                w,
                hdr.xid,
                AuthStat.AUTH_BADVERF,
                peer,
                f"unsupported verifier flavor {hdr.verf.flavor}",
            )
        args_at = r.pos
        try:
            args = proc.unpack_args(r)
        except XdrError as e:
            self.observer.rpc_error("garbage_args")
            log.info(
                "garbage_args",
                xid=hdr.xid,
                proc=f"{prog.name}.{proc.name}",
                client=peer.host,
                error=str(e),
            )
            rpc.pack_accepted_reply(w, hdr.xid, AcceptStat.GARBAGE_ARGS)
            return w.buffers()
        drc = self.drc
        if drc is not None and drc.caches(hdr.prog, hdr.vers, hdr.proc):
            ident = identity(hdr.cred.flavor, hdr.cred.body)
            key = drc.key(
                peer.host, hdr.xid, hdr.prog, hdr.vers, hdr.proc, ident, r.buffer[args_at:]
            )
            if key is not None:

                async def execute() -> tuple[bytes, bool]:
                    bufs, status = await self._call(w, ctx, prog, proc, args)
                    # JUKEBOX: nothing was done and the client retries; not kept.
                    return b"".join(bufs), status != "NFS3ERR_JUKEBOX"

                reply = await drc.run(key, execute)
                return None if reply is None else [reply]
        return (await self._call(w, ctx, prog, proc, args))[0]

    async def _call(
        self, w: Writer, ctx: CallContext, prog: Program, proc: Procedure[Any, Any], args: Any
    ) -> tuple[list[Buffer], str]:
        """The reply to a decoded call, and the status it carries ("ok", the NFS status's
        name or "SYSTEM_ERR")."""
        name = f"{prog.name}.{proc.name}"
        # Every log line below this call (handlers, namespace, backend) carries these; each
        # call runs in its own task, so the binding ends with it (STYLE §6, ``add_call``).
        CALL.set((ctx.xid, name, ctx.peer.host))
        t0 = time.perf_counter()
        try:
            res = await proc.handler(ctx, args)
        except AuthRefused as e:  # an export's sec (gateway.policy.check_client)
            return self._auth_error(w, ctx.xid, e.stat, ctx.peer, str(e)), "AUTH_ERROR"
        except Exception as exc:  # CancelledError is a BaseException: never caught here
            res = self._failure(ctx, name, proc, exc)
            if res is None:
                return self._system_err(w, ctx, name, t0), "SYSTEM_ERR"
        s = getattr(res, "status", None)
        status = "ok" if s is None or int(s) == 0 else s.name
        rpc.pack_success_header(w, ctx.xid)
        try:
            proc.pack_res(w, res)
        except XdrError as e:
            log.error(
                "reply_encode_failed", xid=ctx.xid, proc=name, client=ctx.peer.host, error=str(e)
            )
            return self._system_err(Writer(), ctx, name, t0), "SYSTEM_ERR"
        self.observer.call(name, status, time.perf_counter() - t0)
        return w.buffers(), status

    @staticmethod
    def _failure(ctx: CallContext, name: str, proc: Procedure[Any, Any], exc: Exception) -> Any:
        """The reply body for a failed call (None: SYSTEM_ERR), the failure logged once."""
        kw = {"xid": ctx.xid, "proc": name, "client": ctx.peer.host}
        e = as_gateway_error(exc)
        if e is None:
            log.exception("call_crashed", **kw)
            e = ServerFault(f"{type(exc).__name__}: {exc}")
        elif proc.fail_body is None:
            log.warning("system_err", status=e.status.name, error=str(e), **kw)
        else:
            getattr(log, e.log_level)("call_failed", status=e.status.name, error=str(e), **kw)
        if proc.fail_body is None:
            return None
        return e.body if e.body is not None else proc.fail_body(e.status)

    def _system_err(self, w: Writer, ctx: CallContext, name: str, t0: float) -> list[Buffer]:
        self.observer.call(name, "SYSTEM_ERR", time.perf_counter() - t0)
        rpc.pack_accepted_reply(w, ctx.xid, AcceptStat.SYSTEM_ERR)
        return w.buffers()

    def _auth_error(
        self, w: Writer, xid: int, stat: AuthStat, peer: Peer, why: str
    ) -> list[Buffer]:
        self.observer.rpc_error("auth_error")
        log.info("auth_rejected", xid=xid, client=peer.host, auth_stat=stat.name, error=why)
        rpc.pack_auth_error(w, xid, stat)
        return w.buffers()

    def _header_error(self, e: rpc.RpcDecodeError, peer: Peer) -> list[Buffer] | None:
        w = Writer()
        if e.xid is None:
            self.observer.rpc_error("dropped")
            log.info("record_dropped", client=peer.host, error=str(e))
            return None
        if e.rpc_mismatch:
            self.observer.rpc_error("rpc_mismatch")
            rpc.pack_rpc_mismatch(w, e.xid)
            return w.buffers()
        if e.auth_stat is not None:
            return self._auth_error(w, e.xid, e.auth_stat, peer, str(e))
        self.observer.rpc_error("garbage_args")
        rpc.pack_accepted_reply(w, e.xid, AcceptStat.GARBAGE_ARGS)
        return w.buffers()
