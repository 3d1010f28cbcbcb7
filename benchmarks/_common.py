"""What the benchmark scripts share: the import path, starting and waiting, where results go.

Owns: ``sys.path`` for a script run either way (``python benchmarks/x.py`` or ``python -m
benchmarks.x``): the repository (``gateway``, ``loadgen``, ``tests``) and ``benchmarks/``
(sibling scripts, imported by their bare names as mypy names them); the start-and-wait loop
(``loadgen.waiting.wait_until``), ``free_port`` (``loadgen.gwprocess``'s), ``settle`` (a
gateway with nothing in flight), ``results_dir`` and ``write_results``. Must not: run
anything on import.

A script starts with

    sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/: _common
    from _common import ROOT, wait_until  # puts the repository on sys.path too
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for _p in (str(ROOT / "benchmarks"), str(ROOT)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from loadgen.gwmetrics import Samples  # noqa: E402
from loadgen.gwprocess import GatewayProcess, free_port  # noqa: E402
from loadgen.waiting import NotReady, wait_until  # noqa: E402

__all__ = [
    "ROOT",
    "NotReady",
    "free_port",
    "metric",
    "results_dir",
    "settle",
    "wait_until",
    "write_results",
]


def results_dir(name: str) -> Path:
    """The default directory of a benchmark's results and logs: /var/tmp/nfsgw-<name>."""
    return Path(f"/var/tmp/nfsgw-{name}")


def write_results(out: Path, result: object) -> Path:
    """``result`` as ``out/results.json`` (indented); its path."""
    path = out / "results.json"
    path.write_text(json.dumps(result, indent=2))
    return path


def metric(m: Samples, name: str) -> float:
    """One sample of ``/metrics`` (0 when absent)."""
    return m.get(name, 0.0)


def settle(gw: GatewayProcess, timeout_s: float = 60.0) -> None:
    """Until the gateway has no backend GET nor prefetch in flight (twice in a row, 0.2 s
    apart); after ``timeout_s`` it returns anyway (a gateway that never calms down is the
    next measurement's to show)."""
    deadline = time.monotonic() + timeout_s
    quiet = 0
    while time.monotonic() < deadline and quiet < 2:
        m = gw.metrics()
        busy = metric(m, "nfsgw_data_fetches_inflight") + metric(m, "nfsgw_prefetch_inflight")
        quiet = quiet + 1 if busy == 0 else 0
        time.sleep(0.2)
