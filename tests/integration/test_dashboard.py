"""The Grafana dashboard and the alert rules against a real Prometheus (Debian's
``prometheus``; skipped where it is absent): Prometheus scrapes a gateway (over SeaweedFS)
every second during a short loadgen run, with the alert rules loaded; then every panel's
expression is evaluated through the HTTP API (each must parse, each panel must return data),
every alert rule must have been evaluated without error, and every metric they name must be
in the live /metrics of this gateway and in the metric table."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from loadgen.bench import run_target
from loadgen.dataset import DatasetSpec, make_dataset
from loadgen.gwprocess import GatewayProcess, free_port
from loadgen.nfsclient import NfsClient, NfsError
from loadgen.seaweed import SeaweedServer
from loadgen.workload import WorkloadSpec
from tests import dashboards as d

pytestmark = [
    pytest.mark.s3,
    pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus (Debian package)"),
]

# The gateway under test. Panels for metrics that exist only in some configurations (a disk
# cache tier, several workers) need them switched on here: [section] tables and serve flags.
GATEWAY_SECTIONS: dict[str, dict[str, object]] = {}
GATEWAY_FLAGS: list[str] = []
CLASSES, PER_CLASS = 3, 10
SCRAPE_S = 1


class Prometheus:
    """``prometheus`` on 127.0.0.1 scraping ``target`` (job "nfsgw") with ``rules`` loaded."""

    def __init__(self, work: Path, target: str, rules: Path) -> None:
        work.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.config = work / "prometheus.yml"
        self.config.write_text(
            "global:\n"
            f"  scrape_interval: {SCRAPE_S}s\n"
            f"  evaluation_interval: {SCRAPE_S}s\n"
            f"rule_files: [{json.dumps(str(rules))}]\n"
            "scrape_configs:\n"
            "  - job_name: nfsgw\n"
            f"    static_configs: [{{targets: [{json.dumps(target)}]}}]\n"
        )
        self.log = work / "prometheus.log"
        self.argv = [
            "prometheus",
            f"--config.file={self.config}",
            f"--storage.tsdb.path={work / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--log.level=warn",
        ]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # bounded
            assert self.proc.poll() is None, self.log.read_text()
            with contextlib.suppress(OSError):
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2)
                return
            time.sleep(0.2)
        raise AssertionError("prometheus did not get ready in 30 s:\n" + self.log.read_text())

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def api(self, path: str, **params: str) -> Any:
        """GET /api/v1/PATH; the parsed body (errors come back as {"status": "error"})."""
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:  # 400 for a parse error, with a JSON body
            return json.loads(e.read())

    def query(self, expr: str) -> Any:
        return self.api("query", query=expr)


@pytest.fixture
def prometheus_for() -> Iterator[list[Prometheus]]:
    started: list[Prometheus] = []
    yield started
    for p in started:
        p.stop()


async def _load(gw: GatewayProcess, manifest: Path) -> None:
    """A lookup of a missing name (an NFS3ERR_NOENT reply, first: a series Prometheus has not
    seen before needs two scrapes for a rate), then two epochs (cold, warm)."""
    c = await NfsClient.connect(gw.url)
    try:
        with pytest.raises(NfsError, match="NOENT"):
            await c.lookup(c.root, b"no-such-class")
    finally:
        await c.close()
    spec = WorkloadSpec(target="", manifest=str(manifest), workers=4, batch_size=5)
    tr = await run_target(spec, "nfsgw", gw.url, epochs=2, in_process=True, show_progress=False)
    assert tr.error is None, gw.log_tail()


def _wait_for_scrape(prom: Prometheus, expr: str, want: float) -> None:
    """Until ``expr`` is at least ``want`` > 0 in Prometheus (bounded)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        r = prom.query(expr)
        res = r["data"]["result"] if r["status"] == "success" else []
        if res and float(res[0]["value"][1]) >= want > 0:
            return
        time.sleep(0.5)
    raise AssertionError(f"prometheus: {expr} never reached {want}")


async def test_dashboard_and_alerts_in_prometheus(
    seaweed: SeaweedServer,
    s3_bucket: str,
    tmp_path: Path,
    prometheus_for: list[Prometheus],
) -> None:
    creds = seaweed.store_kwargs()
    manifest = tmp_path / "m.tsv"
    await make_dataset(
        DatasetSpec(classes=CLASSES, per_class_min=PER_CLASS, per_class_max=PER_CLASS, seed=2),
        s3_url=f"s3://{s3_bucket}/train",
        s3_endpoint_url=creds["endpoint_url"],
        s3_region=creds["region"],
        access_key=creds["access_key"],
        secret_key=creds["secret_key"],
        concurrency=8,
        manifest_path=manifest,
        progress=False,
    )
    export = {
        "path": "/data",
        "backend": f"s3://{s3_bucket}/train",
        "read_only": True,
        "insecure": True,
    }
    # Two workers (the supervisor's series) and a disk tier: every panel has its series.
    sections = {**GATEWAY_SECTIONS, "server": {"cache_dir": str(tmp_path / "cache")}}
    gw = GatewayProcess(
        tmp_path / "gw", [export], sections=sections, flags=GATEWAY_FLAGS, s3=seaweed, workers=2
    )
    await asyncio.to_thread(gw.start)
    try:
        target = gw.metrics_url.removeprefix("http://").removesuffix("/metrics")
        prom = Prometheus(tmp_path / "prom", target, d.ALERTS)
        prometheus_for.append(prom)
        await asyncio.to_thread(prom.start)
        # Scrapes before the load, so rates start from them (Prometheus starts scraping a few
        # seconds after it is ready: its discovery sends targets every 5 s).
        await asyncio.to_thread(_wait_for_scrape, prom, "count_over_time(up[1m])", 2.0)
        await _load(gw, manifest)
        opened = gw.metrics()["nfsgw_files_opened_total"]
        await asyncio.to_thread(_wait_for_scrape, prom, "max(nfsgw_files_opened_total)", opened)
        # Two more: a series first seen in the load (the NOENT replies) has a rate only from
        # its second sample on, and scrapes during the load may have timed out.
        await asyncio.to_thread(_next_scrapes, prom, 2)
        live = gw.http("/metrics").decode()
        # Queried while the gateway runs: once its scrapes fail, its series go stale.
        await asyncio.to_thread(_check, prom, live, target)
    finally:
        await asyncio.to_thread(gw.stop)


def _next_scrapes(prom: Prometheus, n: int) -> None:
    """Until ``n`` more scrapes of the gateway have succeeded (bounded)."""
    start: float | None = None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        r = prom.query('sum_over_time(up{job="nfsgw"}[5m])')  # +1 per successful scrape
        if r["status"] == "success" and r["data"]["result"]:
            got = float(r["data"]["result"][0]["value"][1])
            start = got if start is None else start
            if got >= start + n:
                return
        time.sleep(0.2)
    raise AssertionError(f"prometheus did not scrape the gateway {n} more times")


def _check(prom: Prometheus, live: str, target: str) -> None:
    """The assertions on the names, the panels and the rules (blocking: in a thread)."""
    # Every metric named exists: in the table, and in this gateway's /metrics (a sample, or
    # a declared family: a labelled counter has no series before its first event).
    live_names = {
        line.split("{")[0].split(" ")[0]
        for line in live.splitlines()
        if line and not line.startswith("#")
    }
    for line in live.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            suffixes = ("_bucket", "_sum", "_count") if kind == "histogram" else ("",)
            live_names |= {name + s for s in suffixes}
    exprs = [(p["title"], t["expr"]) for p in d.panels() for t in p["targets"]]
    rules = prom.api("rules")["data"]["groups"]
    rule_list = [r for g in rules for r in g["rules"]]
    assert sorted(r["name"] for r in rule_list) == sorted(d.alert_names())
    named = {n for _, e in exprs for n in d.metric_names(e)}
    named |= {n for r in rule_list for n in d.metric_names(r["query"])}
    assert not sorted(n for n in named if d.table_family(n) is None)
    assert not sorted(named - live_names), "named but not exported by the gateway"

    # Every panel query parses; every panel returns data.
    empty = []
    for title in dict.fromkeys(t for t, _ in exprs):
        got = False
        for t, e in exprs:
            if t != title:
                continue
            r = prom.query(d.grafana_to_promql(e))
            assert r["status"] == "success", (title, e, r.get("error"))
            got = got or bool(r["data"]["result"])
        if not got:
            empty.append(title)
    assert not empty, f"panels without data: {empty}"
    values = prom.api("label/instance/values", **{"match[]": "nfsgw_start_time_seconds"})
    assert values["data"] == [target]  # the $instance variable's query

    # Every alert rule was evaluated without error, and its expression parses on its own.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        rule_list = [r for g in prom.api("rules")["data"]["groups"] for r in g["rules"]]
        if all(r["health"] != "unknown" for r in rule_list):
            break
        time.sleep(0.5)
    for r in rule_list:
        assert r["health"] == "ok", (r["name"], r.get("lastError"))
        assert prom.query(r["query"])["status"] == "success", r["name"]
    promtool = shutil.which("promtool")
    if promtool is not None:
        out = subprocess.run(
            [promtool, "check", "rules", str(d.ALERTS)], capture_output=True, text=True
        )
        assert out.returncode == 0, out.stdout + out.stderr
