"""The Grafana dashboard and the alert rules, without a Prometheus: the JSON is the
generator's output and importable as it is (a datasource variable, unique ids, every panel on
it), every metric they name is in the metric table, and docs/operations.md describes every
panel and every alert. tests/integration/test_dashboard.py evaluates them in a real one."""

from __future__ import annotations

import re

from gateway.ops.metricdefs import SUPERVISOR_METRICS
from gateway.ops.metrics import Metrics
from tests import dashboards as d

DOCS = d.ROOT / "docs" / "operations.md"


def _section(title: str) -> str:
    text = DOCS.read_text()
    m = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## )", text, flags=re.M | re.S)
    assert m is not None, f"docs/operations.md has no '## {title}' section"
    return m.group(1)


def test_json_is_the_generators_output() -> None:
    assert d.DASHBOARD_JSON.read_text() == d.generator().render(), (
        "contrib/grafana/nfsgw.json is out of date: python contrib/grafana/dashboard.py"
    )


def test_importable_as_it_is() -> None:
    dash = d.dashboard()
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert variables["instance"]["datasource"]["uid"] == "${datasource}"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    assert "__inputs" not in dash  # nothing to fill in on import
    for p in d.panels():
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["description"] and p["targets"], p["title"]
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "${datasource}"
            assert 'instance=~"$instance"' in t["expr"], (p["title"], t["expr"])
    # no two panels overlap
    cells = set()
    for p in d.panels():
        g = p["gridPos"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + 8)}
        assert not cells & mine, p["title"]
        cells |= mine


def test_every_metric_named_is_in_the_table() -> None:
    named = {n for p in d.panels() for t in p["targets"] for n in d.metric_names(t["expr"])}
    named |= d.metric_names(d.ALERTS.read_text())
    missing = sorted(n for n in named if d.table_family(n) is None)
    assert not missing, f"not in gateway/ops/metricdefs.py: {missing}"
    assert len(named) >= 30  # the names are found at all


def test_docs_describe_every_panel_and_alert() -> None:
    dash_doc = _section("Dashboard")
    for p in d.panels():
        assert f"**{p['title']}**" in dash_doc, f"docs: panel {p['title']!r} not described"
    alerts_doc = _section("Alerts")
    names = d.alert_names()
    assert len(names) >= 8
    for name in names:
        assert f"`{name}`" in alerts_doc, f"docs: alert {name} not described"


def test_every_series_selected_exists_at_start() -> None:
    """A fresh gateway's /metrics has a series for every selector of the dashboard and the
    alerts (at 0), so panels and alerts read 0 rather than "no data" until something happens.
    The supervisor's families exist only in a supervisor's /metrics (workers > 1)."""
    m = Metrics()
    m.prepare()
    series: dict[str, list[dict[str, str]]] = {}
    for fam in m.registry.collect():
        for s in fam.samples:
            series.setdefault(s.name, []).append(s.labels)
    supervisor = {f.name for f in SUPERVISOR_METRICS}
    exprs = [d.grafana_to_promql(t["expr"]) for p in d.panels() for t in p["targets"]]
    exprs.append(d.ALERTS.read_text())
    checked, missing = 0, []
    for expr in exprs:
        for name, matchers in d.selectors(expr):
            fam = d.table_family(name)
            if fam is not None and fam.name in supervisor:
                continue
            checked += 1
            if not any(d.matches(labels, matchers) for labels in series.get(name, ())):
                missing.append(f"{name}{{{', '.join(''.join(x) for x in matchers)}}}")
    assert not missing, f"no series at start for: {sorted(set(missing))}"
    assert checked >= 40
