"""Fail-over between two gateways that share the handle secret and the bucket, nothing else:
a libnfs reader goes through a TCP forwarder that moves from gateway A to gateway B in the
middle of an epoch (a virtual IP moving to another node), and keeps reading through the file
handles A gave it. Keys of ~30 and ~200 bytes (every handle form), nested directories.

SeaweedFS <- gateway A (state dir a/) and gateway B (state dir b/, a copy of A's secret only)
<- ``SwitchProxy`` <- libnfs (``tests.libnfs``) on the test's thread.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import random
from ctypes import c_int, c_void_p
from pathlib import Path

import pytest

from gateway.exports import ExportConfig
from gateway.namespace.handles import (
    FORM_HASHED,
    FORM_INLINE,
    FORM_NAMED,
    SECRET_FILE,
    HandleCodec,
)
from gateway.namespace.resolve import HandleStats
from loadgen.seaweed import SeaweedServer
from nfsproto import nfs3
from nfsproto.nfs3 import Nfs3Proc, NfsStat3
from tests.harness.buckets import MakeBucket
from tests.harness.thread import GatewayThread, LoopThread
from tests.libnfs import LibNfs, libnfs_available
from tests.rpcclient import BlockingRpcClient

pytestmark = [
    pytest.mark.s3,
    pytest.mark.libnfs,
    pytest.mark.skipif(not libnfs_available(), reason="libnfs (libnfs.so.13) is not installed"),
]

PREFIX = "fo/"
CAT = "category-" + "-".join(["long-class-name"] * 8)  # 136 bytes
UUID = "0f8fad5b-d9cb-469f-a165-70867728950e"


class SwitchProxy:
    """A TCP forwarder on 127.0.0.1 to one upstream port at a time. ``switch`` points it at
    another port and resets every open connection, as a moved virtual IP does: the client
    reconnects (to the same address) and reaches the other gateway."""

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self.port = 0
        self.connections: dict[int, int] = {}  # upstream port -> connections forwarded
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.StreamWriter] = set()

    async def start(self) -> SwitchProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def switch(self, upstream: int) -> None:
        self.upstream = upstream
        for w in list(self._open):
            w.transport.abort()

    async def close(self) -> None:
        self.switch(0)
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        port = self.upstream
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            writer.transport.abort()
            return
        self.connections[port] = self.connections.get(port, 0) + 1
        self._open |= {writer, up_w}

        async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            try:
                while data := await r.read(1 << 16):
                    w.write(data)
                    await w.drain()
            except OSError:
                pass
            finally:
                w.transport.abort()

        try:
            await asyncio.gather(pipe(reader, up_w), pipe(up_r, writer))
        finally:
            self._open -= {writer, up_w}


def dataset() -> dict[str, bytes]:
    """~30-byte keys, ~200-byte keys whose name is short (a UUID) or long, nested dirs."""
    rng = random.Random(14)
    paths: list[str] = []
    for c in range(3):
        paths += [f"train/c{c}/img-{i:07d}.jpg" for i in range(4)]  # 24 bytes
        paths += [f"train/{CAT}-{c}/{UUID[:-2]}{i:02d}.jpg" for i in range(4)]  # ~190
        paths += [f"train/{CAT}-{c}/{'n' * 50}-{i}.jpg" for i in range(2)]  # ~200
    deep = "/".join(f"level{d}-{'d' * 16}" for d in range(7))
    paths += [f"nested/{deep}/leaf-{i}.bin" for i in range(2)]
    paths += [f"nested/{deep}/{'x' * 60}"]
    return {p: rng.randbytes(rng.choice([1, 3000, 70_000, 300_000])) for p in paths}


@pytest.fixture
def bucket(seaweed: SeaweedServer, make_bucket: MakeBucket) -> tuple[str, dict[str, bytes]]:
    name = make_bucket("fo")
    files = dataset()
    s3 = seaweed.boto3_client()  # boto3's PUTs (no S3Store)
    for path, body in files.items():
        s3.put_object(Bucket=name, Key=PREFIX + path, Body=body)
    return name, files


def read_all(nfs: LibNfs, fh: int, size: int) -> bytes:
    parts: list[bytes] = []
    off = 0
    while True:
        data = nfs.pread(fh, off, 1 << 20)
        if not data:
            return b"".join(parts)
        parts.append(data)
        off += len(data)
        assert off <= size


def handle_stats(gw: GatewayThread) -> HandleStats:
    def snap() -> HandleStats:
        gateway = gw.server.gateway
        assert gateway is not None
        s = gateway.handles.stats
        return HandleStats(**{k: getattr(s, k) for k in s.__slots__})

    return gw.call(snap)


def test_reader_moves_to_another_gateway_mid_epoch(
    seaweed: SeaweedServer, bucket: tuple[str, dict[str, bytes]], tmp_path: Path
) -> None:
    name, files = bucket
    secret = os.urandom(32)
    forms = {HandleCodec(secret).encode(1, p)[1] for p in files}
    assert forms == {FORM_INLINE, FORM_NAMED, FORM_HASHED}
    assert max(len(p) for p in files) >= 200 and min(len(p) for p in files) <= 30
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
        (tmp_path / d / SECRET_FILE).write_bytes(secret)
        (tmp_path / d / SECRET_FILE).chmod(0o600)
    export = [ExportConfig("/data", f"s3://{name}/{PREFIX}", read_only=True, insecure=True)]
    s3 = seaweed.store_kwargs()
    lt = LoopThread("switch-proxy").start()
    with (
        GatewayThread(export, state_dir=tmp_path / "a", s3=s3) as ga,
        GatewayThread(export, state_dir=tmp_path / "b", s3=s3) as gb,
    ):
        proxy = lt.run(SwitchProxy(ga.port).start())
        try:
            url = (
                f"nfs://127.0.0.1/data?nfsport={proxy.port}&mountport={proxy.port}"
                "&version=3&auto-traverse-mounts=0"
            )
            with LibNfs(url) as nfs:
                lib = nfs._lib
                lib.nfs_set_autoreconnect.argtypes = [c_void_p, c_int]
                lib.nfs_set_autoreconnect(nfs.ctx, -1)  # reconnect (to the moved address)
                order = list(files)
                random.Random(1).shuffle(order)
                # The epoch starts on A: every file opened (LOOKUPs: A's handles), half read.
                opened = {p: nfs.open("/" + p) for p in order}
                half = len(order) // 2
                for p in order[:half]:
                    assert read_all(nfs, opened[p], len(files[p])) == files[p], p
                # The address moves to B; the reader goes on with the handles A gave it.
                lt.call(proxy.switch, gb.port)
                for p in order[half:] + order[:half]:
                    assert read_all(nfs, opened[p], len(files[p])) == files[p], p
                for p in order:
                    nfs.close_file(opened[p])
                on_b = gb.call_counts()  # B resolved A's handles itself: no LOOKUP
                assert on_b["NFS3.LOOKUP"] == 0 and on_b["NFS3.READ"] >= len(order)
                # And by path, through B's own LOOKUPs.
                for p in order[:4]:
                    assert nfs.read_file("/" + p) == files[p]
                    assert nfs.stat("/" + p).size == len(files[p])
        finally:
            lt.run(proxy.close())
            lt.close()
        assert proxy.connections.get(gb.port, 0) >= 1
        assert ga.call_counts()["NFS3.READ"] >= half
        st = handle_stats(gb)
        # B resolved A's hashed handles from listings: one walk found every directory
        # (root, train, nested and its chain), long names hashed once per directory.
        assert st.walks >= 1 and st.walk_misses == 0 and st.collisions == 0
        assert st.dir_scans >= 1
        assert not (tmp_path / "b" / "handles.sqlite3").exists()
        assert sorted(p.name for p in (tmp_path / "b").iterdir() if p.is_file()) == [SECRET_FILE]


def test_refused_client_never_starts_a_walk(
    seaweed: SeaweedServer, bucket: tuple[str, dict[str, bytes]], tmp_path: Path
) -> None:
    """A client outside an export's list, holding a correctly signed long handle this gateway
    has never seen: NFS3ERR_ACCES, and the gateway lists nothing for it."""
    name, files = bucket
    secret = os.urandom(32)
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / SECRET_FILE).write_bytes(secret)
    export = ExportConfig(
        "/data",
        f"s3://{name}/{PREFIX}",
        read_only=True,
        clients=(ipaddress.ip_network("10.20.0.0/16"),),
        insecure=True,
    )
    long_paths = [p for p in files if len(p) > 52]
    with GatewayThread([export], state_dir=tmp_path / "s", s3=seaweed.store_kwargs()) as gw:
        export_id = gw.export("/data").id
        codec = HandleCodec(secret)
        rpc = BlockingRpcClient("127.0.0.1", gw.port)
        try:
            for p in long_paths:
                res = rpc.nfs(Nfs3Proc.GETATTR, nfs3.Getattr3Args(codec.encode(export_id, p)))
                assert res.status == NfsStat3.NFS3ERR_ACCES, (p, res.status)
        finally:
            rpc.close()
        st = handle_stats(gw)
        assert (st.walks, st.dir_scans, st.walk_dirs) == (0, 0, 0)
        assert gw.backend_counts()["list"] == 0
