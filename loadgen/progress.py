"""Progress lines on stderr: a redrawn bar on a terminal, a line every few seconds otherwise
(CI logs, pipes). No dependency; safe to call often (drawing is rate-limited).

Must not: print to stdout (the Markdown table goes there).
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["Progress", "fmt_bytes", "say"]


def fmt_bytes(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"  # pragma: no cover - the loop always returns


def say(msg: str, stream: TextIO | None = None) -> None:
    """One status line (stderr)."""
    s = stream or sys.stderr
    print(msg, file=s, flush=True)


class Progress:
    """``Progress(total, "upload")``; ``update(files, nbytes)`` adds; ``close()`` prints the
    final line. ``enabled=False`` makes it silent."""

    def __init__(
        self,
        total: int,
        label: str,
        *,
        unit: str = "files",
        stream: TextIO | None = None,
        enabled: bool = True,
        interval_s: float | None = None,
    ) -> None:
        self.total = max(0, total)
        self.label = label
        self.unit = unit
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.interval_s = interval_s if interval_s is not None else (0.2 if self.tty else 5.0)
        self.done = 0
        self.nbytes = 0
        self.t0 = time.monotonic()
        self._last_draw = 0.0
        self._closed = False

    def update(self, n: int = 1, nbytes: int = 0) -> None:
        self.done += n
        self.nbytes += nbytes
        now = time.monotonic()
        if now - self._last_draw >= self.interval_s:
            self._last_draw = now
            self._draw(now)

    def set(self, done: int, nbytes: int) -> None:
        self.done = done
        self.nbytes = nbytes
        self.update(0, 0)

    def line(self, now: float | None = None) -> str:
        now = time.monotonic() if now is None else now
        dt = max(now - self.t0, 1e-9)
        frac = self.done / self.total if self.total else 1.0
        width = 24
        fill = min(width, int(frac * width))
        bar = "#" * fill + "." * (width - fill)
        rate = self.done / dt
        parts = [
            f"{self.label:<22} [{bar}] {frac * 100:5.1f}%",
            f"{self.done}/{self.total} {self.unit}",
        ]
        if self.nbytes:
            parts.append(f"{fmt_bytes(self.nbytes)} ({fmt_bytes(self.nbytes / dt)}/s)")
        parts.append(f"{rate:.0f} {self.unit}/s")
        if 0 < self.done < self.total and rate > 0:
            parts.append(f"ETA {(self.total - self.done) / rate:.0f}s")
        else:
            parts.append(f"{dt:.1f}s")
        return "  ".join(parts)

    def _draw(self, now: float) -> None:
        if not self.enabled:
            return
        text = self.line(now)
        if self.tty:
            self.stream.write("\r" + text + "\x1b[K")
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if not self.enabled:
            return
        text = self.line()
        self.stream.write(("\r" + text + "\x1b[K\n") if self.tty else text + "\n")
        self.stream.flush()
