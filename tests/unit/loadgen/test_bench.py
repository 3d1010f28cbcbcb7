"""``compare`` with extra NFS targets (no gateway started, so no backend counters), and the
``--target`` syntax."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from loadgen.bench import compare, parse_targets
from loadgen.dataset import Manifest, ManifestEntry
from loadgen.workload import WorkloadSpec
from tests.unit.loadgen.fakenfs import FakeNfsServer


def test_target_syntax() -> None:
    assert parse_targets(["ganesha=nfs://h:2049/x", "nfs://h/y?mountport=20048"]) == [
        ("ganesha", "nfs://h:2049/x"),
        ("nfs-2", "nfs://h/y?mountport=20048"),
    ]


async def test_compare_extra_targets_side_by_side(tmp_path: Path) -> None:
    files = {f"c{c}/f{i}.JPEG": bytes([c, i]) * (100 + i) for c in range(2) for i in range(3)}
    entries = [
        ManifestEntry(p, len(b), hashlib.sha256(b).hexdigest()) for p, b in sorted(files.items())
    ]
    Manifest(entries, {}).write(tmp_path / "m.tsv")
    good = await FakeNfsServer(files).start()
    corrupt = dict(files)
    corrupt["c1/f2.JPEG"] = bytes(len(files["c1/f2.JPEG"]))
    bad = await FakeNfsServer(corrupt).start()
    try:
        spec = WorkloadSpec(target="", manifest=str(tmp_path / "m.tsv"), workers=2, batch_size=2)
        run = await compare(
            spec,
            s3_url=None,
            s3_endpoint_url=None,
            configs=[],
            extra_targets=[("good", good.url), ("bad", bad.url)],
            epochs=2,
            in_process=True,
            show_progress=False,
            command="test",
        )
    finally:
        await good.close()
        await bad.close()
    assert [t.name for t in run.targets] == ["good", "bad"]
    g, b = run.targets
    assert g.error is None and [e.files for e in g.epochs] == [6, 6]
    assert all(e.requests_per_image is None and e.cache is None for e in g.epochs)
    assert b.error is not None and "c1/f2.JPEG" in b.error
    assert run.backend_latency_ms is None and run.dataset["files"] == 6


async def test_compare_needs_s3_for_gateway_configs(tmp_path: Path) -> None:
    Manifest([], {}).write(tmp_path / "m.tsv")
    spec = WorkloadSpec(target="", manifest=str(tmp_path / "m.tsv"))
    with pytest.raises(ValueError, match="--s3"):
        await compare(spec, s3_url=None, s3_endpoint_url=None, configs=["both"], extra_targets=[])


async def test_counters_from_urls() -> None:
    """``epochs --proxy-url --metrics-url``: counts read over HTTP and differenced."""
    from aiohttp import web

    from loadgen.bench import Counters
    from loadgen.proxy import DelayProxy
    from tests.unit.loadgen.test_report import METRICS

    page = {"text": "# nothing yet\n"}

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=page["text"])

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    port = runner.addresses[0][1]
    try:
        async with DelayProxy("http://127.0.0.1:9") as proxy:
            c = Counters(
                proxy_url=proxy.endpoint_url, metrics_url=f"http://127.0.0.1:{port}/metrics"
            )
            before = await c.snapshot()
            proxy.counts["GET"] += 10
            proxy.counts["LIST"] += 3
            page["text"] = METRICS
            d = Counters.diff(await c.snapshot(), before)
    finally:
        await runner.cleanup()
    assert d["backend"] == {"GET": 10, "LIST": 3}
    assert d["gateway_backend"] == {"LIST": 3, "GET": 11}
    assert d["gateway_rpc"] == {"READ": 10}
    assert d["cache"] == {"data": 0.75, "metadata": 0.9}
    assert d["prefetch"] is None  # this gateway page has no data prefetch series


def test_configs_keep_their_meaning_and_data_adds_data_prefetch() -> None:
    from loadgen.bench import CONFIG_ALIASES, CONFIGS

    assert list(CONFIGS) == ["nfsgw-off", "nfsgw-prefetch", "nfsgw-both", "nfsgw-data"]
    # Data prefetch is the gateway's default: the first three turn it off explicitly.
    for name in ("nfsgw-off", "nfsgw-prefetch", "nfsgw-both"):
        assert "--no-data-prefetch" in CONFIGS[name]
    assert CONFIGS["nfsgw-data"] == []
    assert CONFIGS["nfsgw-both"] == ["--no-data-prefetch"]
    assert {CONFIG_ALIASES[a] for a in ("off", "prefetch", "both", "data")} == set(CONFIGS)
