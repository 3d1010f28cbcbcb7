"""The gateway's one error hierarchy. Each subclass carries the NFS status it maps to and the
level dispatch logs it at; only ``dispatch`` turns them into replies (STYLE §3). A handler that
must answer a failure with a body (``wcc_data``, ``post_op_attr``) raises the error with the
body attached (``raise err.with_body(res)``, or ``handlers.common.on_failure`` around a block)
and dispatch sends that body; without one, dispatch sends the procedure's bare result.

``from_backend`` is the one translation of backend failures; the namespace, data and write
layers call it at their boundary, saying what a missing object means there (NOENT for a name
being looked up, STALE for an object a handle points to). ``as_gateway_error`` is the safety
net for a backend failure that escaped that boundary (a handle named its object: STALE).

Must not: know procedures or result types (the body is opaque here), or log.
"""

from __future__ import annotations

from typing import ClassVar, Self

from gateway.backend.base import (
    AccessDeniedError,
    BackendError,
    BackendUnavailable,
    ObjectNotFound,
    PreconditionFailed,
)
from nfsproto.nfs3 import NfsStat3


class GatewayError(Exception):
    status: ClassVar[NfsStat3] = NfsStat3.NFS3ERR_SERVERFAULT
    # structlog level dispatch logs a failure of this kind at ("debug" for the everyday
    # answers a client expects, like NOENT on a negative lookup).
    log_level: ClassVar[str] = "debug"
    # The procedure's full failure result (e.g. ``Remove3Res(status, wcc)``), set by
    # ``with_body``; None: dispatch builds the bare body from ``status``. Only on an error
    # raised for this call: one error instance can reach several calls (a failed
    # single-flight listing), so a body is attached to a copy (``handlers.common.on_failure``).
    body: object = None

    def with_body(self, body: object) -> Self:
        """Attach the failure result the reply carries (its status is ``self.status``);
        returns ``self`` for ``raise``."""
        self.body = body
        return self


class NotFound(GatewayError):
    status = NfsStat3.NFS3ERR_NOENT


class NotDirectory(GatewayError):
    status = NfsStat3.NFS3ERR_NOTDIR


class IsDirectory(GatewayError):
    status = NfsStat3.NFS3ERR_ISDIR


class StaleHandle(GatewayError):
    status = NfsStat3.NFS3ERR_STALE


class BadHandle(GatewayError):
    status = NfsStat3.NFS3ERR_BADHANDLE


class BadCookie(GatewayError):
    status = NfsStat3.NFS3ERR_BAD_COOKIE


class NameTooLong(GatewayError):
    status = NfsStat3.NFS3ERR_NAMETOOLONG


class InvalidArgument(GatewayError):
    status = NfsStat3.NFS3ERR_INVAL


class ReadOnly(GatewayError):
    status = NfsStat3.NFS3ERR_ROFS


class AccessDenied(GatewayError):
    status = NfsStat3.NFS3ERR_ACCES


class CrossDevice(GatewayError):
    """Two handles of different exports in one call (RENAME, LINK)."""

    status = NfsStat3.NFS3ERR_XDEV


class PermissionDenied(GatewayError):
    status = NfsStat3.NFS3ERR_PERM


class Exists(GatewayError):
    status = NfsStat3.NFS3ERR_EXIST


class NotEmpty(GatewayError):
    status = NfsStat3.NFS3ERR_NOTEMPTY


class NotSync(GatewayError):
    """SETATTR's guard (sattrguard3) does not match the object's ctime."""

    status = NfsStat3.NFS3ERR_NOT_SYNC


class TooSmall(GatewayError):
    status = NfsStat3.NFS3ERR_TOOSMALL


class NotSupported(GatewayError):
    status = NfsStat3.NFS3ERR_NOTSUPP


class FileTooBig(GatewayError):
    """A write or size past what the write path can store."""

    status = NfsStat3.NFS3ERR_FBIG


class VersionChanged(GatewayError):
    """The object changed since its attributes were read (a pinned ranged GET failed its
    If-Match): the caller refreshes the entry and retries; if it escapes, the handle is stale."""

    status = NfsStat3.NFS3ERR_STALE


class IoError(GatewayError):
    """The backend failed for good (after retries)."""

    status = NfsStat3.NFS3ERR_IO
    log_level = "warning"


class Busy(GatewayError):
    """The backend is unavailable for now: the client should retry later."""

    status = NfsStat3.NFS3ERR_JUKEBOX
    log_level = "info"


class ServerFault(GatewayError):
    status = NfsStat3.NFS3ERR_SERVERFAULT
    log_level = "error"


def from_backend(e: BackendError, missing: type[NotFound | StaleHandle]) -> GatewayError:
    """The one translation of backend failures (after the backend's own retries).
    ``missing``: what an absent object means to the caller: ``NotFound`` where a name is
    being resolved, ``StaleHandle`` where a handle pointed at the object."""
    if isinstance(e, PreconditionFailed):
        return VersionChanged(str(e))
    if isinstance(e, ObjectNotFound):
        return missing(str(e))
    if isinstance(e, AccessDeniedError):
        return AccessDenied(str(e))
    if isinstance(e, BackendUnavailable):
        return Busy(str(e))
    return IoError(str(e))


def as_gateway_error(e: BaseException) -> GatewayError | None:
    """``e`` as the error a reply answers: itself, or a backend failure that escaped its
    layer's translation (an object named by a handle: missing means STALE); None for
    anything else (a bug: dispatch answers SERVERFAULT)."""
    if isinstance(e, GatewayError):
        return e
    if isinstance(e, BackendError):
        return from_backend(e, StaleHandle)
    return None
