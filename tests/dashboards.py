"""What the dashboard and alert tests share: the committed dashboard JSON and alert rules, the
metric names an expression uses, and the metric table they are checked against."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from gateway.ops.metricdefs import METRICS, SUPERVISOR_METRICS, Kind, MetricDef

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD_JSON = ROOT / "contrib" / "grafana" / "nfsgw.json"
DASHBOARD_PY = ROOT / "contrib" / "grafana" / "dashboard.py"
ALERTS = ROOT / "contrib" / "prometheus" / "nfsgw-alerts.yml"

# The metric table every name must come from. A table of families declared elsewhere (the
# supervisor's, for several workers) is added here when its panels are.
TABLE: tuple[MetricDef, ...] = METRICS + SUPERVISOR_METRICS

_NAME = re.compile(r"\bnfsgw_[a-z0-9_]+\b")
_HIST_SUFFIXES = ("_bucket", "_sum", "_count")


def generator() -> ModuleType:
    """contrib/grafana/dashboard.py as a module (contrib/ is not a package)."""
    spec = importlib.util.spec_from_file_location("nfsgw_dashboard", DASHBOARD_PY)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up while it loads
    spec.loader.exec_module(mod)
    return mod


def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD_JSON.read_text())
    return data


def panels() -> list[dict[str, Any]]:
    return [p for p in dashboard()["panels"] if p["type"] != "row"]


def metric_names(expr: str) -> set[str]:
    return set(_NAME.findall(expr))


def table_family(sample: str) -> MetricDef | None:
    """The table's family a sample name belongs to (a histogram's _bucket/_sum/_count too)."""
    by_name = {m.name: m for m in TABLE}
    if sample in by_name:
        return by_name[sample]
    for suffix in _HIST_SUFFIXES:
        base = sample.removesuffix(suffix)
        if base != sample and base in by_name and by_name[base].kind is Kind.HISTOGRAM:
            return by_name[base]
    return None


def alert_names() -> list[str]:
    return re.findall(r"^\s*- alert: (\w+)\s*$", ALERTS.read_text(), flags=re.M)


def grafana_to_promql(expr: str, rate_interval: str = "1m") -> str:
    """A panel's expression as Grafana sends it with every gateway selected."""
    return expr.replace("$__rate_interval", rate_interval).replace("$instance", ".*")


_SELECTOR = re.compile(r"\b(nfsgw_[a-z0-9_]+)\b(?:\{([^}]*)\})?")
_MATCHER = re.compile(r'\s*([a-zA-Z_]\w*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*,?')
# Labels Prometheus adds when it scrapes (a gateway's /metrics has none of them).
TARGET_LABELS = frozenset({"instance", "job"})

Matcher = tuple[str, str, str]  # label, operator, value


def selectors(expr: str) -> list[tuple[str, tuple[Matcher, ...]]]:
    """Every ``nfsgw_name{matchers}`` of a PromQL expression (no braces: no matchers)."""
    out = []
    for name, body in _SELECTOR.findall(expr):
        matchers = tuple(_MATCHER.findall(body)) if body else ()
        out.append((name, matchers))
    return out


def matches(labels: dict[str, str], matchers: tuple[Matcher, ...]) -> bool:
    """Whether a series' labels satisfy PromQL matchers (target labels ignored)."""
    for label, op, value in matchers:
        if label in TARGET_LABELS:
            continue
        have = labels.get(label, "")
        if op == "=":
            ok = have == value
        elif op == "!=":
            ok = have != value
        elif op == "=~":
            ok = re.fullmatch(value, have) is not None
        else:
            ok = re.fullmatch(value, have) is None
        if not ok:
            return False
    return True
