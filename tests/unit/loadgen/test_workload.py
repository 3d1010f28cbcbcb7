"""The epoch workload against a fake NFSv3 server: the sampler, the RPCs each pattern sends,
byte checks (a wrong byte fails the run), short reads, READDIRPLUS paging, node processes."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from loadgen.dataset import Manifest, ManifestEntry
from loadgen.nfsclient import NfsClient, NfsError, NfsUrl
from loadgen.workload import (
    DataMismatch,
    Node,
    NodeGroup,
    WorkloadSpec,
    epoch_order,
    make_batches,
    node_share,
)
from tests.unit.loadgen.fakenfs import FakeNfsServer


def tree(classes: int = 3, per_class: int = 5) -> dict[str, bytes]:
    files = {}
    for c in range(classes):
        for i in range(per_class):
            path = f"c{c}/f{i:02d}.JPEG"
            files[path] = hashlib.sha256(path.encode()).digest() * (10 + 37 * i + c)
    return files


def write_manifest(tmp_path: Path, files: dict[str, bytes]) -> str:
    entries = [
        ManifestEntry(p, len(b), hashlib.sha256(b).hexdigest()) for p, b in sorted(files.items())
    ]
    path = tmp_path / "manifest.tsv"
    Manifest(entries, {"test": 1}).write(path)
    return str(path)


@pytest.fixture
async def server() -> AsyncIterator[FakeNfsServer]:
    s = await FakeNfsServer(tree()).start()
    try:
        yield s
    finally:
        await s.close()


# -- sampler ---------------------------------------------------------------------------------


def test_epoch_order_is_a_fresh_permutation_per_epoch() -> None:
    a, b = epoch_order(1000, 0, 1), epoch_order(1000, 0, 2)
    assert sorted(a) == list(range(1000)) and sorted(b) == list(range(1000))
    assert a != b and a == epoch_order(1000, 0, 1) and a != epoch_order(1000, 1, 1)


def test_node_shares_partition_the_epoch() -> None:
    order = epoch_order(1003, 7, 1)
    shares = [node_share(order, r, 4) for r in range(4)]
    assert sorted(x for s in shares for x in s) == list(range(1003))
    assert {len(s) for s in shares} == {250, 251}
    batches = make_batches(shares[0], 64)
    assert [len(b) for b in batches] == [64, 64, 64, 59]
    assert [x for b in batches for x in b] == shares[0]


# -- patterns --------------------------------------------------------------------------------


def spec(server: FakeNfsServer, manifest: str, **kw: object) -> WorkloadSpec:
    return WorkloadSpec(target=server.url, manifest=manifest, **kw)  # type: ignore[arg-type]


async def test_kernel_pattern_rpcs_and_bytes(server: FakeNfsServer, tmp_path: Path) -> None:
    manifest = write_manifest(tmp_path, server.files)
    node = Node(spec(server, manifest, workers=3, batch_size=4), 0)
    setup = await node.setup()
    try:
        assert setup.files == 15
        # Root (3 class dirs + nothing else: one page) and each class (5 files: two pages).
        assert setup.rpc == {"FSINFO": 1, "READDIRPLUS": 1 + 3 * 2}
        e1 = await node.epoch(1)
        assert e1.files == 15 and e1.bytes == sum(len(b) for b in server.files.values())
        assert e1.rpc == {"GETATTR": 15, "ACCESS": 15, "READ": 15}
        assert len(e1.latencies) == 15 and len(e1.batch_ready) == 4
        e2 = await node.epoch(2)
        assert e2.rpc == {"GETATTR": 15, "READ": 15}  # the access cache
    finally:
        await node.close()
    assert server.counts["LOOKUP"] == 0


async def test_cv2_pattern_reads_in_small_pieces(server: FakeNfsServer, tmp_path: Path) -> None:
    manifest = write_manifest(tmp_path, server.files)
    node = Node(spec(server, manifest, pattern="cv2", cv2_read=1024), 0)
    await node.setup()
    try:
        e1 = await node.epoch(1)
    finally:
        await node.close()
    # Per file: the first and last 4 KiB (or the whole file twice when it is smaller), then
    # the middle in 1 KiB pieces.
    expected = 0
    for body in server.files.values():
        edge = min(4096, len(body))
        expected += 2 + len(range(edge, len(body) - edge, 1024))
    assert e1.rpc["READ"] == expected and e1.rpc["GETATTR"] == 15


async def test_manifest_pattern_lookups_with_dentry_cache(
    server: FakeNfsServer, tmp_path: Path
) -> None:
    manifest = write_manifest(tmp_path, server.files)
    node = Node(spec(server, manifest, pattern="manifest", workers=8, batch_size=2), 0)
    setup = await node.setup()
    try:
        assert setup.rpc == {"FSINFO": 1}
        e1 = await node.epoch(1)
        # 3 class folders (once each, single-flight) + 15 files; ACCESS for each of both;
        # the LOOKUP attributes stand in for GETATTR.
        assert e1.rpc == {"LOOKUP": 18, "ACCESS": 18, "READ": 15}
        e2 = await node.epoch(2)
        assert e2.rpc == {"GETATTR": 15, "READ": 15}
    finally:
        await node.close()
    assert server.counts["READDIRPLUS"] == 0


async def test_short_reads_and_missing_handles(tmp_path: Path) -> None:
    files = tree(2, 3)
    s = await FakeNfsServer(files, max_read=100, handles_in_readdir=False).start()
    try:
        manifest = write_manifest(tmp_path, files)
        node = Node(spec(s, manifest), 0)
        await node.setup()
        try:
            e1 = await node.epoch(1)
        finally:
            await node.close()
        assert e1.files == 6
        assert e1.rpc["READ"] == sum(-(-len(b) // 100) for b in files.values())
        assert e1.rpc["LOOKUP"] == 6  # READDIRPLUS without handles: LOOKUP each file once
    finally:
        await s.close()


async def test_a_wrong_byte_fails_the_run(server: FakeNfsServer, tmp_path: Path) -> None:
    manifest = write_manifest(tmp_path, server.files)
    body = bytearray(server.files["c1/f03.JPEG"])
    body[len(body) // 2] ^= 0x01
    server.files["c1/f03.JPEG"] = bytes(body)
    node = Node(spec(server, manifest), 0)
    await node.setup()
    try:
        with pytest.raises(DataMismatch, match=r"c1/f03\.JPEG"):
            await node.epoch(1)
    finally:
        await node.close()


async def test_scan_must_match_the_manifest(server: FakeNfsServer, tmp_path: Path) -> None:
    files = dict(server.files)
    files["c9/extra.JPEG"] = b"x"
    manifest = write_manifest(tmp_path, files)
    node = Node(spec(server, manifest), 0)
    try:
        with pytest.raises(DataMismatch, match="not found on the server"):
            await node.setup()
    finally:
        await node.close()
    server.files["c7/x.JPEG"] = b"z"
    manifest = write_manifest(tmp_path, tree())
    node = Node(spec(server, manifest), 0)
    try:
        with pytest.raises(DataMismatch, match="c7/"):
            await node.setup()
    finally:
        await node.close()
    del server.files["c7/x.JPEG"]
    server.files["c0/new.JPEG"] = b"y"
    node = Node(spec(server, manifest), 0)
    try:
        with pytest.raises(DataMismatch, match="not in the manifest"):
            await node.setup()
    finally:
        await node.close()


async def test_size_change_is_caught_before_reading(server: FakeNfsServer, tmp_path: Path) -> None:
    manifest = write_manifest(tmp_path, server.files)
    node = Node(spec(server, manifest, pattern="manifest"), 0)
    await node.setup()
    server.files["c2/f00.JPEG"] += b"!"
    try:
        with pytest.raises(DataMismatch, match=r"c2/f00\.JPEG"):
            await node.epoch(1)
    finally:
        await node.close()


async def test_node_group_in_processes_covers_every_file_once(
    server: FakeNfsServer, tmp_path: Path
) -> None:
    manifest = write_manifest(tmp_path, server.files)
    async with NodeGroup(spec(server, manifest, nodes=2, workers=2, batch_size=3)) as g:
        setups = await g.setup()
        assert [s.files for s in setups] == [15, 15]
        progress: list[tuple[int, int]] = []
        parts = await g.epoch(1, lambda n, b: progress.append((n, b)))
    assert sorted(p.rank for p in parts) == [0, 1]
    assert sum(p.files for p in parts) == 15
    assert sum(n for n, _ in progress) == 15
    assert sum(b for _, b in progress) == sum(len(b) for b in server.files.values())


async def test_node_group_reports_a_mismatch_from_a_process(
    server: FakeNfsServer, tmp_path: Path
) -> None:
    manifest = write_manifest(tmp_path, server.files)
    server.files["c0/f00.JPEG"] = bytes(len(server.files["c0/f00.JPEG"]))
    g = NodeGroup(spec(server, manifest, nodes=2))
    try:
        await g.start()
        await g.setup()
        with pytest.raises(DataMismatch, match=r"c0/f00\.JPEG"):
            await g.epoch(1)
    finally:
        await g.close(abort=True)


# -- client ----------------------------------------------------------------------------------


def test_nfs_url() -> None:
    u = NfsUrl.parse("nfs://127.0.0.1:2049/data")
    assert (u.host, u.port, u.export, u.mount_port) == ("127.0.0.1", 2049, "/data", None)
    u = NfsUrl.parse("nfs://server/exports/imagenet?mountport=20048")
    assert (u.port, u.export, u.mount_port) == (None, "/exports/imagenet", 20048)
    assert str(u) == "nfs://server/exports/imagenet?mountport=20048"
    for bad in ("http://x/y", "nfs:///data", "nfs://h/data?bogus=1"):
        with pytest.raises(ValueError):
            NfsUrl.parse(bad)


async def test_client_errors_carry_the_status(server: FakeNfsServer) -> None:
    c = await NfsClient.connect(server.url)
    try:
        assert c.fsinfo.rtmax == 1 << 20
        with pytest.raises(NfsError, match="NFS3ERR_NOENT"):
            await c.lookup(c.root, b"nope")
        assert c.counts == {"FSINFO": 1, "LOOKUP": 1}
    finally:
        await c.close()
    with pytest.raises(NfsError, match="MNT"):
        await NfsClient.connect(f"nfs://127.0.0.1:{server.port}/other")
