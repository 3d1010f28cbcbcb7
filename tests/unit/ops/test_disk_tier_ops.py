"""The disk tier in the composed gateway (``gateway.ops.server`` over ``tests.harness.memory``):
``server.cache_dir`` turns it on, a data warm-up fills it (not memory), resumes, stops at the
budget, and reports progress with an ETA; a restarted gateway on the same directory serves
every file with 0 GETs; /v1/stats and /metrics show both tiers; an unusable directory falls
back to memory only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gateway.backend.memory import MemoryStore
from gateway.exports import ExportConfig
from gateway.ops import cli
from nfsproto.nfs3 import NfsStat3
from tests.harness.memory import MemoryGateway
from tests.unit.ops.helpers import Http, admin_config, sample

OK = NfsStat3.NFS3_OK
N = 12


def files(n: int = N) -> dict[str, bytes]:
    return {f"ds/d/f{i}.jpg": bytes([i]) * (10_000 + i) for i in range(n)}


def gateway(tmp_path: Path, store: MemoryStore, **kw: Any) -> MemoryGateway:
    kw.setdefault("admin", admin_config())
    kw.setdefault("server_cache_dir", tmp_path / "cache")
    export = ExportConfig("/data", "s3://b/ds/", immutable=True)
    return MemoryGateway.of(tmp_path, [export], store=store, **kw)


async def read_every_file(gw: MemoryGateway, n: int = N) -> None:
    root = await gw.mount(b"/data")
    d = await gw.walk(root, "d")
    for i in range(n):
        fh = await gw.walk(d, f"f{i}.jpg")
        r = await gw.read(fh)
        assert r.status == OK and bytes(r.data) == bytes([i]) * (10_000 + i)


async def test_data_warm_up_fills_the_disk_tier_and_a_restart_serves_it_without_gets(
    tmp_path: Path,
) -> None:
    store = MemoryStore("mem")
    for k, v in files().items():
        store.seed(k, v)
    async with gateway(tmp_path, store) as gw:
        http = Http(gw.server.metrics_port)
        status, job = await http.json(
            "POST", "/v1/warmup", {"path": "/data", "data": True, "wait": True}
        )
        assert status == 200 and job["state"] == "done", job
        assert job["tier"] == "disk" and job["files_read"] == N and job["stopped"] is None
        assert job["eta_s"] == 0.0 and not job["listing"]
        assert gw.requests()["get"] == N
        assert gw.gateway.reader.cache.used_bytes == 0  # the disk tier, not memory
        # resumable: a second run skips every file already there
        status, job = await http.json(
            "POST", "/v1/warmup", {"path": "/data", "data": True, "wait": True}
        )
        assert job["files_cached"] == N and job["files_read"] == 0
        assert gw.requests()["get"] == N
        m = await http.metrics()
        assert sample(m, "nfsgw_disk_cache_writes_total") == N
        assert sample(m, "nfsgw_disk_cache_enabled") == 1
        await http.close()
    gw.reset_requests()
    async with gateway(tmp_path, store) as gw:  # a restart on the same cache directory
        http = Http(gw.server.metrics_port)
        await read_every_file(gw)
        assert gw.requests().get("get", 0) == 0
        status, stats = await http.json("GET", "/v1/stats")
        dk = stats["disk_cache"]
        assert dk["hits"] == N and dk["misses"] == 0 and dk["hit_ratio"] == 1.0
        assert stats["data_cache"]["misses"] == N  # memory was cold
        m = await http.metrics()
        assert sample(m, "nfsgw_disk_cache_hits_total") == N
        assert sample(m, "nfsgw_disk_cache_bytes") > 0
        await http.close()


async def test_a_data_warm_up_stops_at_the_disk_budget(tmp_path: Path) -> None:
    store = MemoryStore("mem")
    for k, v in files().items():
        store.seed(k, v)
    # 12 KiB per entry (10 kB body + header, rounded to 4 KiB): room for five
    async with gateway(tmp_path, store, cache_disk=5 * 12288 + 100) as gw:
        http = Http(gw.server.metrics_port)
        status, job = await http.json(
            "POST", "/v1/warmup", {"path": "/data", "data": True, "wait": True}
        )
        assert status == 200 and job["state"] == "done" and job["files_read"] == 5
        assert job["stopped"] == "the disk tier's budget is reached"
        assert gw.requests()["get"] == 5  # nothing fetched that could not be kept
        line = cli._job_line(job)
        assert line.startswith("[") and "stopped: the disk tier's budget" in line
        await http.close()


def test_progress_line_shows_share_and_eta() -> None:
    job = {
        "id": 3,
        "path": "/data",
        "state": "running",
        "data": True,
        "dirs_listed": 10,
        "files_seen": 100,
        "bytes_seen": 1000 << 20,
        "files_read": 40,
        "bytes_read": 300 << 20,
        "files_cached": 10,
        "bytes_cached": 100 << 20,
        "tier": "disk",
        "target_bytes": 800 << 20,
        "listing": True,
        "eta_s": 12.4,
        "errors": 0,
        "elapsed_s": 8.0,
        "stopped": None,
    }
    line = cli._job_line(job)
    assert line.startswith("[##########..........]  50% of 800.0 MiB, ETA >= 12 s warmup #3")
    assert "40 files / 300.0 MiB read into disk, 10 already cached" in line


async def test_no_cache_dir_means_the_state_dirs_cache_and_a_restart_is_warm(
    tmp_path: Path, monkeypatch: Any
) -> None:
    monkeypatch.delenv("CACHE_DIRECTORY", raising=False)
    store = MemoryStore("mem")
    for k, v in files(3).items():
        store.seed(k, v)
    async with gateway(tmp_path, store, server_cache_dir=None) as gw:
        disk = gw.gateway.reader.disk
        assert disk is not None and not disk.shared
        assert Path(disk.root).parent == gw.server.config.server.state_dir / "cache"
        await read_every_file(gw, 3)
        await disk.drain()
        assert gw.requests()["get"] == 3
    async with gateway(tmp_path, store, server_cache_dir=None) as gw:
        before = gw.requests()["get"]
        await read_every_file(gw, 3)
        assert gw.requests()["get"] == before  # the restart served from the disk tier


async def test_a_disk_budget_of_0_means_memory_only(tmp_path: Path) -> None:
    store = MemoryStore("mem")
    for k, v in files(3).items():
        store.seed(k, v)
    async with gateway(tmp_path, store, server_cache_dir=None, cache_disk=0) as gw:
        assert gw.gateway.reader.disk is None
        await read_every_file(gw, 3)
        http = Http(gw.server.metrics_port)
        assert sample(await http.metrics(), "nfsgw_disk_cache_enabled") == 0
        await http.close()


async def test_an_unusable_cache_dir_falls_back_to_memory_only(tmp_path: Path) -> None:
    (tmp_path / "cache").write_text("a file where the directory should be")
    store = MemoryStore("mem")
    for k, v in files(3).items():
        store.seed(k, v)
    async with gateway(tmp_path, store) as gw:  # starts all the same
        assert gw.gateway.reader.disk is None
        await read_every_file(gw, 3)
        assert gw.requests()["get"] == 3


def test_the_disk_flags_reach_the_configuration(capsys: Any) -> None:
    try:
        cli.build_parser().parse_args(["serve", "--help"])
    except SystemExit as e:
        assert e.code == 0
    out = capsys.readouterr().out
    assert "--cache-disk " in out and "--cache-disk-min-free" in out and "--cache-dir" in out
    a = cli.build_parser().parse_args(
        [
            "serve",
            "--export",
            "/data=s3://b/ds/",
            "--cache-dir",
            "/srv/cache",
            "--cache-disk",
            "10G",
            "--cache-disk-min-free",
            "2G",
        ]
    )
    c = cli.config_from_args(a)
    assert str(c.server.cache_dir) == "/srv/cache"
    assert (c.cache.data.disk.budget, c.cache.data.disk.min_free) == (10 << 30, 2 << 30)
