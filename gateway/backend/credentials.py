"""AWS credentials and region for the S3 backend: the botocore chain, kept off the event loop.

Owns: ``CredentialCache`` (explicit keys, or the botocore credential chain: env, shared
files/profiles, SSO, container and instance roles; temporary credentials refreshed before
they expire) and ``resolve_region`` (the AWS region chain). Must not: send S3 requests, sign
anything (``sigv4.py``), know about retries (``s3.py``), or run botocore on the event loop:
botocore may read files and do network I/O (IMDS, STS), so it only ever runs in a thread.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any, Final

import structlog

from gateway.backend.base import AccessDeniedError, BackendError, BackendUnavailable
from gateway.backend.sigv4 import Credentials

log = structlog.get_logger(__name__)

DEFAULT_REGION: Final = "us-east-1"
# botocore refreshes temporary credentials 15 min (advisory) / 10 min (mandatory) before
# expiry; we refresh in the background inside the first window and wait inside the second.
_ADVISORY_REFRESH_S: Final = 15 * 60
_MANDATORY_REFRESH_S: Final = 5 * 60
_REFRESH_RETRY_S: Final = 30.0
# Expiries are looked for this far ahead (to the second); credentials valid for longer are
# looked at again when this much time has passed.
_HORIZON_S: Final = 1 << 16  # ~18 h
_NEVER_S: Final = 1 << 62  # no expiry is that far: refresh_needed(it) is False only without one


def resolve_region(explicit: str | None, profile: str | None) -> str:
    """The region to sign for: ``explicit`` if given, else the AWS chain: ``AWS_REGION``,
    ``AWS_DEFAULT_REGION``, then the ``region`` of the profile (``profile``, else
    ``AWS_PROFILE``/``AWS_DEFAULT_PROFILE``, else ``default``) in the shared config and
    credentials files (``AWS_CONFIG_FILE``, ``AWS_SHARED_CREDENTIALS_FILE``). us-east-1 only
    when the chain has nothing (logged at info).

    Reads files: call it off the event loop. Raises ``ValueError`` when a profile is named
    but found in neither file.
    """
    if explicit:
        return explicit
    for var in ("AWS_REGION", "AWS_DEFAULT_REGION"):
        if value := os.environ.get(var, "").strip():
            return value
    import botocore.exceptions
    import botocore.session

    session = botocore.session.Session(profile=profile)
    try:
        region = session.get_scoped_config().get("region")
    except botocore.exceptions.ProfileNotFound as e:
        raise ValueError(f"AWS profile {session.profile!r} not found: {e}") from e
    if isinstance(region, str) and region.strip():
        return region.strip()
    log.info(
        "s3_region_defaulted",
        region=DEFAULT_REGION,
        profile=session.profile or "default",
        reason="no AWS_REGION, AWS_DEFAULT_REGION or profile region",
    )
    return DEFAULT_REGION


def _expiry_of(provider: Any, now: float) -> float | None:
    """When ``provider``'s credentials expire (epoch seconds, to the second; at most
    ``_HORIZON_S`` ahead, to be looked at again then), from botocore's public
    ``refresh_needed(refresh_in)``: true when fewer than ``refresh_in`` seconds are left. None:
    they never expire (static keys have no such method; refreshable ones may have no expiry).
    Blocking (botocore): in a thread."""
    needed = getattr(provider, "refresh_needed", None)
    if needed is None or not needed(_NEVER_S):
        return None
    if not needed(_HORIZON_S):
        return now + _HORIZON_S
    if needed(0):  # expired already
        return now
    lo, hi = 0, _HORIZON_S  # at least lo and fewer than hi seconds are left
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if needed(mid):
            hi = mid
        else:
            lo = mid
    return now + lo


class CredentialCache:
    """Frozen credentials for the signer, from explicit keys or the botocore chain.

    Resolving or refreshing runs in a thread (``asyncio.to_thread``), single-flight.
    Temporary credentials are cached until close to expiry: inside ``_ADVISORY_REFRESH_S``
    a background refresh starts while the old ones are still used; inside
    ``_MANDATORY_REFRESH_S`` callers wait for it. After a failed refresh, background
    refreshes pause for ``_REFRESH_RETRY_S``.
    """

    def __init__(
        self,
        *,
        static: Credentials | None = None,
        profile: str | None = None,
        anonymous: bool = False,
    ) -> None:
        self._static = static
        self._profile = profile
        self.anonymous = anonymous
        self._provider: Any = None  # botocore.credentials.Credentials (or Refreshable...)
        self._frozen: Credentials | None = static
        self._expiry: float | None = None  # epoch seconds; None = never expires
        self._task: asyncio.Task[Credentials] | None = None
        self._retry_after = 0.0  # monotonic; background refreshes pause after a failure

    async def get(self) -> Credentials | None:
        """The credentials to sign with now; None for anonymous requests."""
        if self.anonymous:
            return None
        frozen = self._frozen
        if frozen is not None:
            if self._expiry is None:
                return frozen
            remaining = self._expiry - time.time()
            if remaining > _ADVISORY_REFRESH_S:
                return frozen
            if remaining > _MANDATORY_REFRESH_S:
                if time.monotonic() >= self._retry_after:
                    self._start_refresh()
                return frozen
        return await asyncio.shield(self._start_refresh())

    def invalidate(self) -> None:
        """Forget cached credentials (the store said they expired)."""
        if self._static is None:
            self._frozen = None

    def _start_refresh(self) -> asyncio.Task[Credentials]:
        task = self._task
        if task is None or task.done():
            task = asyncio.get_running_loop().create_task(self._refresh())
            task.add_done_callback(self._refreshed)
            self._task = task
        return task

    def _refreshed(self, task: asyncio.Task[Credentials]) -> None:
        if not task.cancelled() and task.exception() is not None:  # retrieved: no warning
            self._retry_after = time.monotonic() + _REFRESH_RETRY_S

    async def _refresh(self) -> Credentials:
        try:
            frozen, expiry = await asyncio.to_thread(self._load_blocking)
        except BackendError:
            raise
        except Exception as e:  # botocore: STS/IMDS unreachable, bad profile, ...
            raise BackendUnavailable(f"credentials: {type(e).__name__}: {e}") from e
        self._frozen, self._expiry = frozen, expiry
        return frozen

    def _load_blocking(self) -> tuple[Credentials, float | None]:
        if self._provider is None:
            import botocore.session

            session = botocore.session.Session(profile=self._profile)
            provider = session.get_credentials()
            if provider is None:
                raise AccessDeniedError(
                    "no AWS credentials found (env, shared files, profile, container or "
                    "instance role); pass access_key/secret_key or anonymous=True"
                )
            self._provider = provider
        fc = self._provider.get_frozen_credentials()
        expiry = _expiry_of(self._provider, time.time())
        return Credentials(fc.access_key, fc.secret_key, fc.token or None), expiry

    async def close(self) -> None:
        """Cancel a refresh in flight (its thread finishes on its own)."""
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            # asyncio.wait: our own cancellation still propagates (suppressing CancelledError
            # around ``await task`` would swallow it); a refresh that failed meanwhile is moot.
            await asyncio.wait([task])
            if not task.cancelled():
                task.exception()  # retrieved: no "never retrieved" warning
