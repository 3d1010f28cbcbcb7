"""How a ``nfsgw-loadgen`` command runs and ends, shared by ``cli`` and ``demo``: the event loop
(uvloop when installed) and the end of a run (report.json/md and plots written, the Markdown
table printed, the exit status).

Must not: parse arguments, start servers or run workloads (``loadgen.bench`` does), or import
them at module level (every command starts here).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from loadgen.report import RunReport

__all__ = ["exit_status", "report", "run"]


def run(coro: Coroutine[Any, Any, int]) -> int:
    """Run on uvloop when it is installed (the delay proxy and the client cost less CPU, which
    the server under test shares on a small machine)."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - a dependency on Linux
        return asyncio.run(coro)
    return uvloop.run(coro)


def report(result: RunReport, out_dir: str | Path, *, plots: bool = True) -> list[Path]:
    """Write the run's report files into ``out_dir``, print its table; the paths written."""
    # Imported here: ``nfsgw-loadgen make-dataset``/``proxy`` do not load the workload.
    from loadgen.bench import write_outputs
    from loadgen.report import to_markdown

    paths = write_outputs(result, out_dir, plots=plots)
    print(to_markdown(result), flush=True)
    return paths


def exit_status(result: RunReport) -> int:
    """1 when a target failed (a wrong byte, an NFS error, a dead node), else 0."""
    return 1 if any(t.error for t in result.targets) else 0
