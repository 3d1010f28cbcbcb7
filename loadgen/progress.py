"""Progress lines on stderr: a redrawn bar on a terminal, a line every few seconds otherwise
(CI logs, pipes). No dependency; safe to call often (drawing is rate-limited).

``Progress`` is ``gateway.progress.CountProgress`` (the drawing is shared with ``nfsgw
pack``'s line): ``Progress(total, label, *, unit=, stream=, enabled=, interval_s=)``,
``update(n, nbytes)``, ``set(done, nbytes)``, ``line()``, ``close()``.

Must not: print to stdout (the Markdown table goes there).
"""

from __future__ import annotations

import sys
from typing import TextIO

from gateway.progress import CountProgress as Progress
from gateway.progress import fmt_bytes

__all__ = ["Progress", "fmt_bytes", "say"]


def say(msg: str, stream: TextIO | None = None) -> None:
    """One status line (stderr)."""
    s = stream or sys.stderr
    print(msg, file=s, flush=True)
