"""Helpers shared by the NFS procedure handlers: failure bodies, re-reading the entry a handle
names (or an optional one), name validation, ACCESS computation.

A handler answers a failure by raising a ``GatewayError``; where the reply must carry more than
the status (``wcc_data``, ``post_op_attr``), it wraps the steps in ``on_failure(body)``, so any
error leaving them, whichever layer raised it, carries that body to ``dispatch``. Handlers do
not catch errors to build replies. Must not: encode replies or log failures (dispatch does).
"""

from __future__ import annotations

import contextlib
import copy
import inspect
from collections.abc import Callable
from types import TracebackType

from gateway.attrs import fattr
from gateway.dispatch import CallContext
from gateway.errors import (
    GatewayError,
    InvalidArgument,
    NameTooLong,
    NotFound,
    StaleHandle,
    as_gateway_error,
)
from gateway.exports import Export
from gateway.namespace import Entry, EntryKind
from gateway.policy import R_OK, W_OK, X_OK, mode_bits
from gateway.registry import Gateway
from nfsproto.limits import NAME_MAX
from nfsproto.nfs3 import (
    ACCESS3_DELETE,
    ACCESS3_EXECUTE,
    ACCESS3_EXTEND,
    ACCESS3_LOOKUP,
    ACCESS3_MODIFY,
    ACCESS3_READ,
    Fattr3,
    NfsStat3,
)

# status -> the procedure's failure result (sync, or a coroutine that awaits post-op state)
FailureBody = Callable[[NfsStat3], object]


def on_failure(body: FailureBody) -> _OnFailure:
    """``async with on_failure(lambda s: Remove3Res(s, wcc)):`` -- any error leaving the block
    answers ``body(status)`` (awaited when it is a coroutine, e.g. post-op attributes read
    after a mutation). An error that already carries a body (raised in the block with
    ``with_body``) keeps it. A backend failure that escaped its layer is translated here
    (``errors.as_gateway_error``: a handle named the object, missing means STALE), so no
    failure skips the body. The body goes on a copy of the error: the same instance can reach
    several calls (a failed single-flight listing)."""
    return _OnFailure(body)


class _OnFailure:
    __slots__ = ("_body",)

    def __init__(self, body: FailureBody) -> None:
        self._body = body

    async def __aenter__(self) -> None:
        return None

    async def __aexit__(
        self,
        typ: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        err = as_gateway_error(exc) if exc is not None else None
        if err is None or err.body is not None:
            return  # no error, a bug (dispatch answers SERVERFAULT), or a body already set
        if err is exc:
            err = copy.copy(err)
        body = self._body(err.status)
        if inspect.isawaitable(body):
            body = await body
        raise err.with_body(body) from exc


async def handle_entry(export: Export, path: str, *, head: bool = False) -> Entry:
    """The entry a handle names, read again: from the index, or with one HEAD (``head``: the
    object changed since it was listed). Its object gone: the handle is stale (NFS3ERR_STALE),
    not a missing name."""
    try:
        return await (export.ns.refresh(path) if head else export.ns.getattr(path))
    except NotFound:
        raise StaleHandle(path) from None


async def resolve_opt(gw: Gateway, ctx: CallContext, fh: bytes) -> tuple[Export, Entry] | None:
    """``gw.resolve``, or None where the handle does not resolve (stale, forged, another
    export's): for a reply whose attributes of that object are optional (LINK's file)."""
    with contextlib.suppress(GatewayError):
        return await gw.resolve(ctx, fh)
    return None


def check_name(name: bytes) -> str:
    """A component name from the wire -> str. NUL and '/' are invalid in a component;
    names must be UTF-8 (object keys are)."""
    if len(name) > NAME_MAX:
        raise NameTooLong(f"name of {len(name)} bytes")
    if not name or b"/" in name or b"\0" in name:
        raise InvalidArgument(f"bad name {name!r}")
    try:
        return name.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidArgument(f"name {name!r} is not UTF-8") from None


def access_bits(
    export: Export,
    e: Entry,
    uid: int,
    gid: int,
    gids: tuple[int, ...],
    requested: int,
    a: Fattr3 | None = None,
) -> int:
    """RFC 1813 §3.3.4: the subset of ``requested`` the caller is allowed, from the mode bits
    (root may do anything but execute a file with no x bit). A read-only export never grants
    MODIFY, EXTEND or DELETE. ``a``: ``fattr(export, e)`` if the caller has it already."""
    if a is None:
        a = fattr(export, e)
    if uid == 0:
        r = w = True
        x = e.kind == EntryKind.DIR or bool(a.mode & 0o111)
    else:
        bits = mode_bits(a.mode, a.uid, a.gid, uid, gid, gids)
        r, w, x = bool(bits & R_OK), bool(bits & W_OK), bool(bits & X_OK)
    allowed = 0
    if r:
        allowed |= ACCESS3_READ
    if w and not export.cfg.read_only:
        allowed |= ACCESS3_MODIFY | ACCESS3_EXTEND
        if e.kind == EntryKind.DIR:
            allowed |= ACCESS3_DELETE
    if x:
        allowed |= ACCESS3_LOOKUP if e.kind == EntryKind.DIR else ACCESS3_EXECUTE
    return allowed & requested
