"""The gateway's one error hierarchy. Each subclass carries the NFS status it maps to; only
``dispatch`` turns them into replies (STYLE §3).
"""

from __future__ import annotations

from typing import ClassVar

from gateway.backend.base import (
    AccessDeniedError,
    BackendError,
    BackendUnavailable,
    ObjectNotFound,
)
from nfsproto.nfs3 import NfsStat3


class GatewayError(Exception):
    status: ClassVar[NfsStat3] = NfsStat3.NFS3ERR_SERVERFAULT


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


class TooSmall(GatewayError):
    status = NfsStat3.NFS3ERR_TOOSMALL


class NotSupported(GatewayError):
    status = NfsStat3.NFS3ERR_NOTSUPP


class IoError(GatewayError):
    """The backend failed for good (after retries)."""

    status = NfsStat3.NFS3ERR_IO


class Busy(GatewayError):
    """The backend is unavailable for now: the client should retry later."""

    status = NfsStat3.NFS3ERR_JUKEBOX


class ServerFault(GatewayError):
    status = NfsStat3.NFS3ERR_SERVERFAULT


def from_backend(e: BackendError) -> GatewayError:
    """The one translation of backend failures (after the backend's own retries)."""
    if isinstance(e, ObjectNotFound):
        return StaleHandle(str(e))
    if isinstance(e, AccessDeniedError):
        return AccessDenied(str(e))
    if isinstance(e, BackendUnavailable):
        return Busy(str(e))
    return IoError(str(e))
