"""Whether an export's backend answers, said once: the start-up probe, its retries, the
diagnosis of what is wrong and the one log line per cause.

Owns: ``BackendProbe``, one per export: a one-key LIST of the export's prefix (what ``/readyz``
has always sent), bounded by ``PROBE_TIMEOUT_S``; at start, and after any failed probe, a
background task repeats it with back-off (``RETRY_FIRST_S`` doubling up to ``RETRY_MAX_S``)
until the backend answers. ``diagnose`` turns what the store raised into a ``Diagnosis``: a
stable ``cause``, what is wrong and the fix, from the exception's class and the messages of
``gateway.backend.s3`` (``_error``: ``NoSuchBucket``, the S3 error code of a 403, "the bucket
is in region R"; ``BackendUnavailable``: connection errors and timeouts; the credential chain's
"credentials: ..." and "no AWS credentials found").

Logging: ``export_backend_failed`` (error) when the cause changes (the first failure, or a
different one), never once per retry; ``export_backend_recovered`` (info) once when it answers
again. Fields: ``export``, ``backend`` (the export's URL), ``endpoint``, ``cause``,
``problem``, ``fix``, ``error`` (the store's own message), ``attempts``.

Must not: touch the NFS side, or send more than one probe at a time per export (a probe in
flight is joined, ``/readyz`` and the retry loop share it).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, Final

import structlog

from gateway.backend.base import AccessDeniedError, BackendError, BackendUnavailable, ObjectStore

__all__ = ["BackendProbe", "Diagnosis", "diagnose"]

log = structlog.get_logger(__name__)

PROBE_TIMEOUT_S: Final = 5.0
"""One probe (the store's own retries included)."""
RETRY_FIRST_S: Final = 1.0
RETRY_MAX_S: Final = 15.0
"""Back-off of the background retries: 1, 2, 4, 8, 15, 15, ... s (a LIST every 15 s at most
while a backend is down)."""

_REGION = re.compile(r"the bucket is in region ([A-Za-z0-9-]+)|expecting '([A-Za-z0-9-]+)'")
_SERVER_ERROR = re.compile(r"HTTP 5\d\d")


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """What a failed probe says: ``cause`` (one of ``unreachable``, ``no_such_bucket``,
    ``bad_credentials``, ``no_credentials``, ``access_denied``, ``wrong_region``,
    ``server_error``, ``error``), the problem and its fix in words, and the store's message."""

    cause: str
    problem: str
    fix: str
    error: str

    def reason(self) -> str:
        """One line for ``/readyz`` and ``STATUS=``."""
        return f"{self.problem} ({self.error}); fix: {self.fix}"


def diagnose(e: BaseException, *, timeout_s: float = PROBE_TIMEOUT_S) -> Diagnosis:
    """The cause of a failed probe, from what the store raised (see the module docstring)."""
    if isinstance(e, TimeoutError):
        return Diagnosis(
            "unreachable",
            f"the endpoint did not answer in {timeout_s:g} s",
            "check --s3-endpoint-url (s3.endpoint_url), DNS, proxies and firewalls",
            f"no answer in {timeout_s:g} s",
        )
    text = str(e) or type(e).__name__
    if "NoSuchBucket" in text:
        return Diagnosis(
            "no_such_bucket",
            "the bucket does not exist",
            "create the bucket or fix the name in the export's backend URL",
            text,
        )
    m = _REGION.search(text)
    if m is not None:
        region = m[1] or m[2]
        return Diagnosis(
            "wrong_region",
            f"the bucket is in region {region}",
            f'--s3-region {region} (s3.region = "{region}")',
            text,
        )
    if "AuthorizationHeaderMalformed" in text or "PermanentRedirect" in text:
        return Diagnosis(
            "wrong_region",
            "the bucket is in another region",
            "set --s3-region (s3.region) to the bucket's region",
            text,
        )
    if isinstance(e, AccessDeniedError):
        if "no AWS credentials found" in text:
            return Diagnosis(
                "no_credentials",
                "no credentials were found",
                "set AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or a profile (--s3-profile, "
                "AWS_PROFILE), or s3.anonymous = true for a public bucket",
                text,
            )
        if any(c in text for c in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "Token")):
            return Diagnosis(
                "bad_credentials",
                "the store refused the credentials",
                "check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or the profile "
                "(--s3-profile, AWS_PROFILE)",
                text,
            )
        return Diagnosis(
            "access_denied",
            "the credentials may not list the bucket",
            "grant s3:ListBucket (and s3:GetObject) on the bucket to these credentials, or "
            "use others (--s3-profile)",
            text,
        )
    if isinstance(e, BackendUnavailable):
        if text.startswith("credentials:"):
            return Diagnosis(
                "no_credentials",
                "the credential chain failed",
                "check AWS_PROFILE / --s3-profile, the shared config files and the instance or "
                "container role",
                text,
            )
        if _SERVER_ERROR.search(text):
            return Diagnosis(
                "server_error",
                "the store answers with server errors",
                "check the store's health; the gateway keeps retrying",
                text,
            )
        return Diagnosis(
            "unreachable",
            "the endpoint does not answer",
            "check --s3-endpoint-url (s3.endpoint_url), DNS and the network",
            text,
        )
    if isinstance(e, BackendError) and ": region: " in text:
        return Diagnosis("no_credentials", "the profile was not found", "check --s3-profile", text)
    return Diagnosis("error", "the backend failed", "see the error", text)


@dataclass(eq=False, repr=False)
class BackendProbe:
    """The answer of one export's backend (see the module docstring). ``store`` is the bucket
    itself (not a pack's wrapper, whose listings may come from its index)."""

    export: str
    backend: str
    endpoint: str
    store: ObjectStore
    prefix: str
    _: KW_ONLY
    # Omitted: the module's (read at construction, so a test may set them)
    timeout_s: float = field(default_factory=lambda: PROBE_TIMEOUT_S)
    retry_first_s: float = field(default_factory=lambda: RETRY_FIRST_S)
    retry_max_s: float = field(default_factory=lambda: RETRY_MAX_S)
    on_change: Callable[[], None] | None = None
    quiet: bool = False  # changes logged at debug level (a worker other than the owner)
    answered: bool | None = field(init=False, default=None)
    """None until the first probe ends; then whether the last one answered."""
    diagnosis: Diagnosis | None = field(init=False, default=None)
    """Why the last probe failed (None when it answered)."""
    attempts: int = field(init=False, default=0)
    """Failed probes since the backend last answered."""
    first: asyncio.Event = field(init=False, default_factory=asyncio.Event)
    """Set when the first probe has ended (either way)."""
    _logged: str | None = field(init=False, default=None)  # the cause last logged
    _failing_since: float = field(init=False, default=0.0)
    _inflight: asyncio.Task[Diagnosis | None] | None = field(init=False, default=None)
    _retrying: asyncio.Task[None] | None = field(init=False, default=None)

    @property
    def started(self) -> bool:
        """Whether the background probing was started (``start``)."""
        return self._retrying is not None

    @property
    def reason(self) -> str | None:
        """Why the export is not ready (None: it answered)."""
        if self.answered is None:
            return "backend not probed yet"
        return None if self.diagnosis is None else self.diagnosis.reason()

    def start(self, *, wait_first: bool = False) -> None:
        """Probe now (after the first back-off with ``wait_first``), and keep retrying in the
        background until the backend answers."""
        if self._retrying is None or self._retrying.done():
            self._retrying = asyncio.get_running_loop().create_task(
                self._retry(wait_first), name=f"backend-probe:{self.export}"
            )

    async def check(self) -> Diagnosis | None:
        """One probe (joined if one is in flight): None if the backend answered. A failure
        (re)starts the background retries."""
        task = self._inflight
        if task is None or task.done():
            task = self._inflight = asyncio.get_running_loop().create_task(self._once())
        return await asyncio.shield(task)

    async def _once(self) -> Diagnosis | None:
        try:
            async with asyncio.timeout(self.timeout_s):
                await self.store.list_page(self.prefix, delimiter="/", max_keys=1)
        except Exception as e:  # any failure is a diagnosis; a bug shows as cause "error"
            self._failed(diagnose(e, timeout_s=self.timeout_s))
        else:
            self._answered()
        finally:
            self.first.set()
        return self.diagnosis

    def _failed(self, d: Diagnosis) -> None:
        if self.attempts == 0:
            self._failing_since = time.monotonic()
        self.attempts += 1
        changed = self.answered is not False or self.diagnosis != d
        self.answered, self.diagnosis = False, d
        if d.cause != self._logged:
            self._logged = d.cause
            self._log(
                log.error,
                "export_backend_failed",
                cause=d.cause,
                problem=d.problem,
                fix=d.fix,
                error=d.error,
                attempts=self.attempts,
                retrying=True,
            )
        if changed and self.on_change is not None:
            self.on_change()
        self.start(wait_first=True)  # (a no-op from the retry loop itself)

    def _answered(self) -> None:
        was, self.answered, self.diagnosis = self.answered, True, None
        if self._logged is not None:
            self._log(
                log.info,
                "export_backend_recovered",
                was=self._logged,
                attempts=self.attempts,
                after_s=round(time.monotonic() - self._failing_since, 3),
            )
            self._logged = None
        self.attempts = 0
        if was is not True and self.on_change is not None:
            self.on_change()

    def _log(self, loud: Callable[..., Any], event: str, **kw: Any) -> None:
        """A change of cause or a recovery, naming the export (debug when ``quiet``)."""
        (log.debug if self.quiet else loud)(
            event, export=self.export, backend=self.backend, endpoint=self.endpoint, **kw
        )

    async def _retry(self, wait_first: bool) -> None:
        delay = self.retry_first_s
        if wait_first:
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.retry_max_s)
        while await self.check() is not None:
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.retry_max_s)

    async def close(self) -> None:
        for t in (self._retrying, self._inflight):
            if t is not None and not t.done():
                t.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await t
        self._retrying = self._inflight = None
