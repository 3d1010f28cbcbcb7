"""``nfsgw-loadgen`` end to end against the fake NFS server (the CLI in a subprocess): a local
dataset, ``epochs`` writing the report, and a corrupted file failing the run."""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
from pathlib import Path

from loadgen.cli import build_parser, main
from loadgen.dataset import Manifest
from tests.unit.loadgen.fakenfs import FakeNfsServer


async def run_cli(*args: str, timeout_s: float = 120.0) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "loadgen.cli",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with asyncio.timeout(timeout_s):
            out, err = await proc.communicate()
    except TimeoutError:
        proc.kill()
        raise
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def test_make_dataset_writes_tree_and_manifest(tmp_path: Path) -> None:
    rc = main(
        [
            "make-dataset",
            "--classes",
            "2",
            "--files-per-class",
            "3-4",
            "--mean-size",
            "2000",
            "--sd-size",
            "1000",
            "--out",
            str(tmp_path / "tree"),
            "--manifest",
            str(tmp_path / "m.tsv"),
            "--quiet",
        ]
    )
    assert rc == 0
    m = Manifest.read(tmp_path / "m.tsv")
    assert 6 <= len(m.entries) <= 8
    for e in m.entries:
        assert m.check(e.path, (tmp_path / "tree" / e.path).read_bytes()) is None


def test_parser_defaults() -> None:
    a = build_parser().parse_args(["compare", "--manifest", "m.tsv"])
    assert a.configs == "off,prefetch,both,data" and a.backend_latency_ms == 10.0
    assert a.compute_time == 0.103 and a.batch_size == 64 and a.pattern == "kernel"
    d = build_parser().parse_args(["demo"])
    assert (d.classes, d.files_per_class, d.epochs, d.backend_latency_ms) == (50, "200", 2, 10.0)
    assert d.configs == "off,prefetch,both,data"


async def test_epochs_report_and_a_corrupted_file(tmp_path: Path) -> None:
    # make-dataset runs its own event loop: in a thread, away from this test's loop.
    rc = await asyncio.to_thread(
        main,
        [
            "make-dataset",
            "--classes",
            "3",
            "--files-per-class",
            "4",
            "--mean-size",
            "3000",
            "--out",
            str(tmp_path / "tree"),
            "--manifest",
            str(tmp_path / "m.tsv"),
            "--quiet",
        ],
    )
    assert rc == 0
    files = {
        str(p.relative_to(tmp_path / "tree")): p.read_bytes()
        for p in sorted((tmp_path / "tree").rglob("*.JPEG"))
    }
    assert len(files) == 12
    server = await FakeNfsServer(files).start()
    try:
        common = ["--target", server.url, "--manifest", str(tmp_path / "m.tsv"), "--quiet"]
        rc, out, err = await run_cli(
            "epochs",
            *common,
            "--nodes",
            "2",
            "--workers",
            "2",
            "--batch-size",
            "2",
            "--epochs",
            "2",
            "--out",
            str(tmp_path / "report"),
        )
        assert rc == 0, err
        assert "| target | 1 | " in out and "| target | 2 | " in out
        report = json.loads((tmp_path / "report" / "report.json").read_text())
        (t,) = report["targets"]
        assert [e["files"] for e in t["epochs"]] == [12, 12]
        assert t["epochs"][0]["rpc"] == {"GETATTR": 12, "ACCESS": 12, "READ": 12}
        # Epoch 2 is reshuffled across the two nodes: a node opening a file for the first
        # time asks ACCESS (a per-node access cache), the others only GETATTR.
        rpc2 = t["epochs"][1]["rpc"]
        assert rpc2["GETATTR"] == 12 and rpc2["READ"] == 12 and 0 < rpc2["ACCESS"] < 12
        assert t["epochs"][0]["requests_per_image"] is None  # no counters for this target
        assert (tmp_path / "report" / "report.md").exists()

        victim = sorted(files)[5]
        body = bytearray(files[victim])
        body[-3] ^= 0xFF
        server.files[victim] = bytes(body)
        rc, out, err = await run_cli(
            "epochs", *common, "--in-process", "--no-plots", "--out", str(tmp_path / "r2")
        )
        assert rc == 1
        assert "DataMismatch" in out and victim in out
        assert json.loads((tmp_path / "r2" / "report.json").read_text())["targets"][0]["error"]
    finally:
        await server.close()
        shutil.rmtree(tmp_path / "tree", ignore_errors=True)


def test_sizes() -> None:
    from loadgen.cli import _size

    assert [_size(t) for t in ("65536", "64K", "1M", "1.5m", "16MiB", "2kb")] == [
        65536,
        65536,
        1 << 20,
        3 << 19,
        16 << 20,
        2048,
    ]
    a = build_parser().parse_args(["make-dataset", "--mean-size", "100K", "--max-size", "4M"])
    assert (a.mean_size, a.max_size) == (102400, 4 << 20)
