"""Restarts: the gateway (``nfsgw serve``, a child process) is killed with SIGKILL in the
middle of a loadgen epoch and started again on the same port and state directory.

- The epoch, run again by the same loadgen node with the file handles it got before the kill
  (no new LOOKUP, no new READDIR), completes with every byte checked against the manifest and
  no ESTALE; a long path's handle (the hashed form, resolved from listings) resolves too.
  ``RESTARTS`` kills in a row.
- A restart with a different state directory (a new handle secret) answers every old handle
  with NFS3ERR_BADHANDLE or NFS3ERR_STALE, never with another file's attributes or bytes; a
  new mount works.

The kernel client's version (kill -9 in the middle of its read loop) is in tests/e2e.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from loadgen.dataset import Manifest, ManifestEntry
from loadgen.gwprocess import GatewayProcess
from loadgen.nfsclient import NfsClient
from loadgen.seaweed import SeaweedServer
from loadgen.workload import Node, WorkloadSpec
from nfsproto import nfs3
from nfsproto.nfs3 import Diropargs3, Nfs3Proc, NfsStat3
from tests.e2e.tree import LONG_NAME, Tree, md5
from tests.rpcclient import BlockingRpcClient

pytestmark = [pytest.mark.s3]

RESTARTS = 5
OK = NfsStat3.NFS3_OK


def _manifest(tree: Tree) -> Manifest:
    entries = [
        ManifestEntry(
            p.removeprefix("train/"), len(tree.files[p]), hashlib.sha256(tree.files[p]).hexdigest()
        )
        for p in tree.train_files()
    ]
    return Manifest(entries)


@pytest.fixture
def gw(
    seaweed: SeaweedServer, tree: Tree, tree_bucket: str, tmp_path: Path
) -> Iterator[GatewayProcess]:
    g = GatewayProcess(
        tmp_path,
        [
            {
                "path": "/train",
                "backend": f"s3://{tree_bucket}/{tree.prefix}train/",
                "read_only": True,
                "insecure": True,
            },
            {
                "path": "/data",
                "backend": f"s3://{tree_bucket}/{tree.prefix}",
                "read_only": True,
                "insecure": True,
            },
        ],
        s3=seaweed,
    )
    try:
        yield g.start()
    finally:
        g.stop()


def _lookup(rpc: BlockingRpcClient, root: bytes, path: str) -> bytes:
    fh = root
    for name in path.split("/"):
        res = rpc.nfs(Nfs3Proc.LOOKUP, nfs3.Lookup3Args(Diropargs3(fh, name.encode())))
        assert res.status == OK, (path, res.status)
        fh = res.object
    return fh


def test_kill9_mid_epoch_then_the_epoch_completes(gw: GatewayProcess, tree: Tree) -> None:
    manifest = _manifest(tree)
    n = len(manifest.entries)
    spec = WorkloadSpec(
        target=f"nfs://127.0.0.1:{gw.port}/train",
        manifest="",
        workers=8,
        batch_size=8,
        timeout_s=30.0,
        seed=3,
    )
    # a long path's handle, taken before the first kill, used after the last
    with BlockingRpcClient("127.0.0.1", gw.port) as r:
        long_fh = _lookup(r, r.mnt(b"/data").fhandle, f"extras/{LONG_NAME}")
    assert len(long_fh) == 38  # the hashed form: resolved from listings, nothing stored

    async def run() -> list[int]:
        node = Node(spec, 0, manifest)
        await node.setup()  # READDIRPLUS scan: the handles kept across every restart
        handles = [s.fh for s in node.samples]
        read_before_kill = []

        class Killer:
            """Kills the gateway from inside the epoch once a third of it is read."""

            def __init__(self) -> None:
                self.done = 0
                self.killed = False

            def progress(self, files: int, nbytes: int) -> None:
                self.done += files
                if self.done == n // 3 and not self.killed:
                    self.killed = True
                    gw.kill()  # SIGKILL (blocks the loop only for the wait)

        try:
            for epoch in range(RESTARTS):
                k = Killer()
                with pytest.raises((ConnectionError, OSError, TimeoutError, ExceptionGroup)):
                    await node.epoch(epoch, k.progress)
                assert k.killed, "the epoch ended before the kill"
                read_before_kill.append(k.done)
                await asyncio.to_thread(gw.start)  # same port, same state directory
                assert node.client is not None
                await node.client.close()
                node.client = await NfsClient.connect(spec.target, timeout_s=spec.timeout_s)
                part = await node.epoch(epoch)  # the same handles, every byte checked
                assert part.files == n
                assert "LOOKUP" not in part.rpc and "READDIRPLUS" not in part.rpc, part.rpc
                assert [s.fh for s in node.samples] == handles
        finally:
            await node.close()
        return read_before_kill

    before = asyncio.run(run())
    assert all(0 < b < n for b in before), before
    assert gw.starts == RESTARTS + 1
    bad = {k: v for k, v in gw.metrics().items() if ("STALE" in k or "BADHANDLE" in k) and v}
    assert not bad, bad
    with BlockingRpcClient("127.0.0.1", gw.port) as r:
        res = r.nfs(Nfs3Proc.READ, nfs3.Read3Args(long_fh, 0, 1 << 20))
        assert res.status == OK and md5(bytes(res.data)) == md5(tree.files[f"extras/{LONG_NAME}"])


def test_a_new_secret_makes_old_handles_stale_not_wrong(
    gw: GatewayProcess, tree: Tree, tmp_path: Path
) -> None:
    paths = [*tree.train_files()[:20], f"extras/{LONG_NAME}", "extras/big.bin", "extras"]
    with BlockingRpcClient("127.0.0.1", gw.port) as r:
        root = r.mnt(b"/data").fhandle
        old = {p: _lookup(r, root, p) for p in paths}
    gw.kill()
    gw.sections["server"]["state_dir"] = str(tmp_path / "new-state")  # a new handle secret
    gw.start()
    with BlockingRpcClient("127.0.0.1", gw.port) as r:
        for p, fh in [*old.items(), ("/", root)]:
            for proc, args in (
                (Nfs3Proc.GETATTR, nfs3.Getattr3Args(fh)),
                (Nfs3Proc.READ, nfs3.Read3Args(fh, 0, 4096)),
                (Nfs3Proc.ACCESS, nfs3.Access3Args(fh, 1)),
                (Nfs3Proc.LOOKUP, nfs3.Lookup3Args(Diropargs3(fh, b"x"))),
            ):
                res = r.nfs(proc, args)
                assert res.status in (NfsStat3.NFS3ERR_BADHANDLE, NfsStat3.NFS3ERR_STALE), (
                    p,
                    proc.name,
                    res.status,
                )
        # a new mount works and reads right
        new_root = r.mnt(b"/data").fhandle
        assert new_root != root
        fh = _lookup(r, new_root, paths[0])
        res = r.nfs(Nfs3Proc.READ, nfs3.Read3Args(fh, 0, 1 << 20))
        assert res.status == OK and bytes(res.data) == tree.files[paths[0]]
