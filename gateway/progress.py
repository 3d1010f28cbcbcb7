"""Progress lines on a stream (stderr by default): redrawn in place on a terminal, one line
every few seconds otherwise (CI logs, pipes). Drawing is rate-limited, so counting is cheap.

Two lines share the drawing (``ProgressLine``): ``Progress`` (``nfsgw pack`` and its verify:
files and bytes whose totals may still be being counted, the fraction by bytes) and
``CountProgress`` (the load generator's: a known number of files or objects, the fraction by
count; ``loadgen.progress.Progress`` is this one).

Must not: import anything of the project (the gateway, ``loadgen`` and the benchmarks use
it), or print to stdout (reports and tables go there).
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["CountProgress", "Progress", "ProgressLine", "duration", "fmt_bytes"]


def fmt_bytes(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"  # pragma: no cover - the loop always returns


def duration(s: float) -> str:
    """``s`` seconds for a person: "42 s", "3 min 07 s", "2 h 05 min"."""
    s = max(0, int(s))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


class ProgressLine:
    """The drawing: ``line()`` written over itself on a terminal (carriage return, then the
    rest of the row erased), as one line of its own otherwise; every ``interval_s`` at most
    (``tty_interval_s`` on a terminal, 5 s otherwise, unless given)."""

    def __init__(
        self,
        label: str,
        stream: TextIO | None,
        *,
        enabled: bool,
        interval_s: float | None,
        tty_interval_s: float,
    ) -> None:
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.interval_s = (
            interval_s if interval_s is not None else (tty_interval_s if self.tty else 5.0)
        )
        self.t0 = time.monotonic()
        self._drawn = False

    def line(self, now: float | None = None) -> str:
        raise NotImplementedError

    def _draw(self, now: float) -> None:
        if not self.enabled:
            return
        text = self.line(now)
        self.stream.write("\r" + text + "\x1b[K" if self.tty else text + "\n")
        self.stream.flush()
        self._drawn = True


class Progress(ProgressLine):
    """``nfsgw pack``'s line: ``add(files, nbytes)``; ``total_files``/``total_bytes`` may
    grow while they are counted (``counting``): the ETA is then a lower bound ("ETA >= ...")."""

    def __init__(
        self, label: str, stream: TextIO | None = None, *, interval_s: float | None = None
    ) -> None:
        super().__init__(label, stream, enabled=True, interval_s=interval_s, tty_interval_s=0.25)
        self.files = 0
        self.bytes = 0
        self.total_files = 0
        self.total_bytes = 0
        self.counting = True
        self._last = self.t0

    def add(self, files: int, nbytes: int) -> None:
        self.files += files
        self.bytes += nbytes
        self.tick()

    def tick(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < self.interval_s:
            return
        self._last = now
        self._draw(now)

    def line(self, now: float | None = None) -> str:
        now = time.monotonic() if now is None else now
        dt = max(now - self.t0, 1e-9)
        rate = self.bytes / dt
        total = max(self.total_bytes, self.bytes)
        frac = self.bytes / total if total else 0.0
        n = int(frac * 20)
        eta = ""
        if rate > 0 and total:
            eta = f", ETA {'>= ' if self.counting else ''}{duration((total - self.bytes) / rate)}"
        of = "" if self.counting else f"/{max(self.total_files, self.files)}"
        return (
            f"{self.label} [{'#' * n}{'.' * (20 - n)}] {frac:4.0%} {self.files}{of} files, "
            f"{self.bytes / 1e6:.1f}/{total / 1e6:.1f} MB, {rate / 1e6:.1f} MB/s{eta}"
        )

    def close(self) -> None:
        if self._drawn and self.tty:
            self.stream.write("\n")
            self.stream.flush()


class CountProgress(ProgressLine):
    """The load generator's line: ``CountProgress(total, "upload")``; ``update(files,
    nbytes)`` adds; ``close()`` prints the final line. ``enabled=False`` makes it silent."""

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
        super().__init__(label, stream, enabled=enabled, interval_s=interval_s, tty_interval_s=0.2)
        self.total = max(0, total)
        self.unit = unit
        self.done = 0
        self.nbytes = 0
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

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if not self.enabled:
            return
        text = self.line()
        self.stream.write(("\r" + text + "\x1b[K\n") if self.tty else text + "\n")
        self.stream.flush()
