"""The ``local:DIR`` target: the same workload, patterns, node processes and byte checks as
an NFS target, answered by system calls; the "vs local disk" column and the plot's reference
line."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from loadgen.bench import compare, parse_targets, run_target
from loadgen.dataset import DatasetSpec, make_dataset
from loadgen.localfs import LocalClient, drop_page_cache, local_dir
from loadgen.report import RunReport, TargetReport, build_epoch, to_markdown, vs_local
from loadgen.workload import EpochPart, WorkloadSpec
from nfsproto import nfs3

CLASSES, PER_CLASS = 3, 5
FILES = CLASSES * PER_CLASS


@pytest.fixture
async def tree(tmp_path: Path) -> tuple[Path, Path]:
    spec = DatasetSpec(
        classes=CLASSES,
        per_class_min=PER_CLASS,
        per_class_max=PER_CLASS,
        mean_size=20_000,
        sd_size=15_000,
        seed=5,
    )
    root = tmp_path / "train"
    await make_dataset(spec, out_dir=root, manifest_path=tmp_path / "m.tsv", progress=False)
    return root, tmp_path / "m.tsv"


@pytest.mark.parametrize("pattern", ["kernel", "cv2", "manifest"])
async def test_every_pattern_reads_every_byte_once_per_epoch(
    tree: tuple[Path, Path], pattern: str
) -> None:
    root, manifest = tree
    spec = WorkloadSpec(
        target="", manifest=str(manifest), pattern=pattern, workers=3, batch_size=4, cv2_read=4096
    )
    tr = await run_target(
        spec, "local", f"local:{root}", epochs=2, in_process=True, show_progress=False
    )
    assert tr.error is None and tr.kind == "local"
    total = sum(p.stat().st_size for p in root.rglob("*.JPEG"))
    assert [e.files for e in tr.epochs] == [FILES, FILES]
    assert [e.bytes for e in tr.epochs] == [total, total]
    assert tr.epochs[0].requests_per_image is None  # no backend behind a local disk
    cold, warm = (e.rpc for e in tr.epochs)
    if pattern == "kernel":
        # the scan: the root and each class folder; then stat + access (first open) + one read
        assert tr.setup is not None and tr.setup.rpc == {"scandir": 1 + CLASSES}
        assert cold == {"stat": FILES, "access": FILES, "pread": FILES}
        assert warm == {"stat": FILES, "pread": FILES}
    elif pattern == "manifest":
        # a stat per class folder (single-flight) and per file; no scan
        assert tr.setup is not None and tr.setup.rpc == {}
        assert cold["stat"] == FILES + CLASSES and cold["pread"] == FILES
        assert warm == {"stat": FILES, "pread": FILES}
    else:  # cv2: the two 4 KiB edges, then 4 KiB pieces
        assert cold["pread"] > 2 * FILES and cold["pread"] == warm["pread"]


async def test_node_processes_cover_every_file(tree: tuple[Path, Path]) -> None:
    root, manifest = tree
    spec = WorkloadSpec(target="", manifest=str(manifest), nodes=2, workers=2, batch_size=2)
    tr = await run_target(spec, "local", f"local:{root}", epochs=1, show_progress=False)
    assert tr.error is None
    (e,) = tr.epochs
    assert e.files == FILES and e.rpc["pread"] == FILES and len(e.au_per_node) == 2


async def test_a_changed_byte_fails_the_run(tree: tuple[Path, Path]) -> None:
    root, manifest = tree
    victim = root / "n00000001" / "n00000001_00003.JPEG"
    body = bytearray(victim.read_bytes())
    body[len(body) // 2] ^= 1
    victim.write_bytes(bytes(body))
    spec = WorkloadSpec(target="", manifest=str(manifest), workers=2, batch_size=2)
    tr = await run_target(
        spec, "local", f"local:{root}", epochs=1, in_process=True, show_progress=False
    )
    assert tr.error is not None and "DataMismatch" in tr.error and victim.name in tr.error
    assert tr.epochs == []


async def test_a_missing_file_fails_the_scan(tree: tuple[Path, Path]) -> None:
    root, manifest = tree
    (root / "n00000002" / "n00000002_00000.JPEG").unlink()
    spec = WorkloadSpec(target="", manifest=str(manifest), workers=2)
    tr = await run_target(
        spec, "local", f"local:{root}", epochs=1, in_process=True, show_progress=False
    )
    assert tr.error is not None and "not found on the server" in tr.error


async def test_client_refuses_names_that_leave_the_tree(tree: tuple[Path, Path]) -> None:
    root, _ = tree
    c = await LocalClient.open(f"local:{root}", threads=1)
    try:
        for bad in (b"..", b".", b"a/b", b""):
            with pytest.raises(OSError):
                await c.lookup(c.root, bad)
        fh, attrs = await c.lookup(c.root, b"n00000000")
        assert attrs is not None and attrs.type == nfs3.Ftype3.NF3DIR
        entries = await c.readdirplus(fh)
        assert len(entries) == PER_CLASS
        f = entries[0]
        assert f.name_handle is not None and f.name_attributes is not None
        data, eof = await c.read(f.name_handle, 0, 1 << 20)
        assert eof and len(data) == f.name_attributes.size
        part, eof = await c.read(f.name_handle, 0, 10)
        assert part == data[:10] and not eof
        assert c.counts == {"stat": 1, "scandir": 1, "pread": 2}
    finally:
        await c.close()


def test_local_urls_and_targets(tmp_path: Path) -> None:
    assert local_dir(f"local:{tmp_path}") == tmp_path.resolve()
    for bad in ("local:", f"local:{tmp_path / 'nope'}", "file:/x"):
        with pytest.raises(ValueError):
            local_dir(bad)
    assert parse_targets([f"local:{tmp_path}", f"ssd=local:{tmp_path}", "nfs://h:1/x"]) == [
        ("local", f"local:{tmp_path}"),
        ("ssd", f"local:{tmp_path}"),
        ("nfs-3", "nfs://h:1/x"),
    ]
    with pytest.raises(ValueError, match="not a directory"):
        parse_targets([f"local:{tmp_path / 'nope'}"])
    with pytest.raises(ValueError, match="expected"):
        parse_targets(["x=http://h/"])


def test_drop_page_cache_counts_the_tree_and_keeps_it(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    for i in range(3):
        (tmp_path / "a" / f"{i}").write_bytes(os.urandom(5000))
    before = {p: p.read_bytes() for p in (tmp_path / "a").iterdir()}
    assert drop_page_cache(tmp_path) == 3
    assert {p: p.read_bytes() for p in (tmp_path / "a").iterdir()} == before


def _epochs(seconds: tuple[float, float]) -> list:
    return [
        build_epoch(i + 1, [EpochPart(0, i + 1, 100, 10**6, s, [0.01] * 100, [s], {})], s)
        for i, s in enumerate(seconds)
    ]


def _run() -> RunReport:
    run = RunReport("c", {"pattern": "kernel"}, {"files": 100, "bytes": 10**6}, 0.1, 10.0, None)
    gw = TargetReport("nfsgw-both", "nfs://h/x", "nfsgw")
    gw.epochs = _epochs((4.0, 1.0))  # 25 and 100 images/s
    loc = TargetReport("local", "local:/d", "local")
    loc.epochs = _epochs((1.0, 0.5))  # 100 and 200 images/s
    run.targets = [gw, TargetReport("rclone", "nfs://h/", "peer", error="PeerError: x"), loc]
    return run


def test_vs_local_column() -> None:
    run = _run()
    gw = run.targets[0]
    assert [vs_local(run, e) for e in gw.epochs] == [0.25, 0.5]
    md = to_markdown(run)
    head = md.splitlines()[0]
    assert "| images/s | vs local disk | MB/s |" in head
    assert md.splitlines()[1].count("|") == head.count("|")
    rows = [r for r in md.splitlines() if r.startswith("| nfsgw-both")]
    assert "| 25 | 0.25x |" in rows[0] and "| 100 | 0.50x |" in rows[1]
    assert "| local | 1 | 100 | 1.00x |" in md
    assert "| rclone | failed: PeerError: x |" in md
    assert "vs local disk: images/s as a fraction" in md
    # without a local target, no column
    run.targets = run.targets[:1]
    assert "vs local" not in to_markdown(run) and vs_local(run, gw.epochs[0]) is None


def test_plot_has_the_local_reference_line(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from loadgen.plots import write_plots

    paths = write_plots(_run(), tmp_path)
    assert paths[0].name == "images_per_s.png" and paths[0].read_bytes()[:4] == b"\x89PNG"


async def test_compare_with_a_local_target(tree: tuple[Path, Path], tmp_path: Path) -> None:
    root, manifest = tree
    spec = WorkloadSpec(target="", manifest=str(manifest), workers=2, batch_size=4)
    run = await compare(
        spec,
        s3_url=None,
        s3_endpoint_url=None,
        configs=[],
        extra_targets=parse_targets([f"local:{root}"]),
        epochs=1,
        in_process=True,
        show_progress=False,
        command="test",
    )
    (t,) = run.targets
    assert t.kind == "local" and t.error is None and t.epochs[0].files == FILES
    assert "| local | 1 |" in to_markdown(run) and "1.00x" in to_markdown(run)
    run.write_json(tmp_path / "r.json")
    assert json.loads((tmp_path / "r.json").read_text())["targets"][0]["kind"] == "local"


def test_epochs_command_with_a_local_target(tree: tuple[Path, Path], tmp_path: Path) -> None:
    from loadgen.cli import main

    root, manifest = tree
    common = ["--manifest", str(manifest), "--epochs", "1", "--in-process", "--quiet"]
    out = tmp_path / "out"
    argv = ["epochs", "--target", f"local:{root}", "--name", "ssd", "--out", str(out)]
    assert main(argv + common + ["--no-plots"]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["targets"][0]["kind"] == "local"
    assert report["targets"][0]["epochs"][0]["files"] == FILES
    bad = ["epochs", "--target", f"local:{tmp_path / 'nope'}", "--out", str(out)]
    assert main(bad + common) == 2
