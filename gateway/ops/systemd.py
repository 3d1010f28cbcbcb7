"""systemd service notifications (``sd_notify(3)``) over ``$NOTIFY_SOCKET``, and the watchdog.

Owns: the datagram protocol to the service manager: ``READY=1`` once every listener is up
(``gateway.ops.server`` sends it after the first backend probes and the pack indexes, both
bounded; a backend that does not answer is named in ``STATUS=``, not waited for),
``RELOADING=1`` + ``MONOTONIC_USEC`` around a SIGHUP reload, ``STOPPING=1`` (with
``EXTEND_TIMEOUT_USEC`` covering the drain) at shutdown, ``STATUS=`` one-line summaries, and
``WATCHDOG=1`` every half ``$WATCHDOG_USEC`` from a task on the event loop, so a wedged loop
stops the pings and systemd restarts the service. Must not: block (the socket is non-blocking
and a lost datagram is only logged), or do anything when ``$NOTIFY_SOCKET`` is unset (not
under systemd, or ``Type=simple``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from collections.abc import Mapping

import structlog

log = structlog.get_logger(__name__)


class Notifier:
    """Sends ``KEY=VALUE`` lines to the service manager; a no-op without ``NOTIFY_SOCKET``."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        addr = env.get("NOTIFY_SOCKET", "")
        self._addr: str | bytes | None = None
        if addr.startswith("@"):  # abstract namespace
            self._addr = b"\0" + addr[1:].encode()
        elif addr.startswith("/"):
            self._addr = addr
        elif addr:
            log.warning("notify_socket_unsupported", address=addr)
        self._sock: socket.socket | None = None
        self.watchdog_s: float | None = None
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        if usec.isdigit() and int(usec) > 0 and (not pid or pid == str(os.getpid())):
            self.watchdog_s = int(usec) / 1e6
        self._watchdog: asyncio.Task[None] | None = None
        self.sent = 0
        self._warned = False

    @property
    def enabled(self) -> bool:
        return self._addr is not None

    def notify(self, **fields: object) -> bool:
        """``notify(READY=1, STATUS="...")``: one datagram. False if not sent."""
        if self._addr is None:
            return False
        msg = "\n".join(f"{k}={v}" for k, v in fields.items()).encode()
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                self._sock.setblocking(False)
            self._sock.sendto(msg, self._addr)
        except OSError as e:
            if not self._warned:  # once: a dead manager socket must not flood the log
                self._warned = True
                log.warning("notify_failed", error=str(e), fields=sorted(fields))
            return False
        self.sent += 1
        return True

    def ready(self, status: str) -> None:
        self.notify(READY=1, STATUS=status, MAINPID=os.getpid())

    def reloading(self) -> None:
        self.notify(RELOADING=1, MONOTONIC_USEC=time.monotonic_ns() // 1000)

    def stopping(self, drain_timeout_s: float) -> None:
        # The drain may take up to drain_timeout_s: ask for that much more stop time.
        extend = int((drain_timeout_s + 5.0) * 1e6)
        self.notify(STOPPING=1, STATUS="draining", EXTEND_TIMEOUT_USEC=extend)

    def status(self, text: str) -> None:
        self.notify(STATUS=text)

    # -- watchdog -----------------------------------------------------------------------------

    def start_watchdog(self) -> None:
        if self.watchdog_s is None or self._addr is None or self._watchdog is not None:
            return
        self._watchdog = asyncio.get_running_loop().create_task(self._pinger(self.watchdog_s / 2))

    async def _pinger(self, every_s: float) -> None:
        while True:
            self.notify(WATCHDOG=1)
            await asyncio.sleep(every_s)

    async def close(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watchdog
            self._watchdog = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None
