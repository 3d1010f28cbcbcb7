"""The bucket changes underneath a mounted export: another S3 client adds, deletes and
overwrites objects while a client reads through the gateway.

The gateway runs with an ``OffsetClock`` (``attr_ttl_s`` = 30 s) that the test moves forward, so
the TTL passes without sleeping. What must hold:

- within the TTL the client may see the old state (that is what the TTL allows);
- once the TTL has passed (and the one background re-list the next call starts is done),
  added objects are visible, deleted ones are gone: their old handles answer NFS3ERR_STALE
  (or a lookup NOENT), never their old bytes; overwritten ones show their new size and bytes;
- no READ ever returns bytes of two versions of one object, even while the object is
  overwritten again and again and READs span two cache blocks.

docs/reliability.md records where this is weaker than "nothing old past the TTL": the first
call after the TTL is answered from the old view while it starts the re-list.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.exports import ExportConfig
from loadgen.seaweed import SeaweedServer
from nfsproto import nfs3
from nfsproto.nfs3 import Diropargs3, Nfs3Proc, NfsStat3
from tests.harness.thread import GatewayThread, OffsetClock
from tests.rpcclient import BlockingRpcClient

pytestmark = [pytest.mark.s3]

OK, STALE, NOENT = NfsStat3.NFS3_OK, NfsStat3.NFS3ERR_STALE, NfsStat3.NFS3ERR_NOENT
TTL_S = 30.0
MiB = 1 << 20


class Env:
    def __init__(self, gw: GatewayThread, clock: OffsetClock, s3: Any, bucket: str) -> None:
        self.gw = gw
        self.clock = clock
        self.s3 = s3
        self.bucket = bucket
        self.rpc = BlockingRpcClient("127.0.0.1", gw.port)
        self.root = self.rpc.mnt(b"/data").fhandle

    def put(self, key: str, body: bytes) -> None:
        self.s3.put_object(Bucket=self.bucket, Key="ds/" + key, Body=body)

    def delete(self, key: str) -> None:
        self.s3.delete_object(Bucket=self.bucket, Key="ds/" + key)

    def lookup(self, path: str, rpc: BlockingRpcClient | None = None) -> tuple[NfsStat3, bytes]:
        c = rpc or self.rpc
        fh = self.root
        for name in path.split("/"):
            res = c.nfs(Nfs3Proc.LOOKUP, nfs3.Lookup3Args(Diropargs3(fh, name.encode())))
            if res.status != OK:
                return res.status, b""
            fh = res.object
        return OK, fh

    def read(
        self, fh: bytes, offset: int = 0, count: int = 4 * MiB, rpc: BlockingRpcClient | None = None
    ) -> tuple[NfsStat3, bytes]:
        res = (rpc or self.rpc).nfs(Nfs3Proc.READ, nfs3.Read3Args(fh, offset, count))
        return res.status, bytes(res.data) if res.status == OK else b""

    def names(self, path: str) -> set[str]:
        status, fh = self.lookup(path)
        assert status == OK
        res = self.rpc.nfs(
            Nfs3Proc.READDIRPLUS, nfs3.Readdirplus3Args(fh, 0, bytes(8), 4096, 65536)
        )
        assert res.status == OK and res.eof
        return {e.name.decode() for e in res.entries} - {".", ".."}

    def past_ttl(self) -> None:
        self.clock.advance(TTL_S + 1)

    def settle(self, check: Any, what: str) -> None:
        """``check()`` becomes true once the background re-list the TTL started is done
        (bounded: 100 tries, 20 ms apart)."""
        for _ in range(100):
            if check():
                return
            time.sleep(0.02)
        raise AssertionError(f"{what}: not visible after the re-list")


@pytest.fixture
def env(seaweed: SeaweedServer, tmp_path: Path) -> Iterator[Env]:
    bucket = f"chg-{uuid.uuid4().hex[:12]}"
    seaweed.create_bucket(bucket)
    clock = OffsetClock()
    try:
        with GatewayThread(
            [
                ExportConfig(
                    "/data", f"s3://{bucket}/ds/", read_only=True, attr_ttl_s=TTL_S, insecure=True
                )
            ],
            state_dir=tmp_path / "state",
            s3=seaweed.store_kwargs(),
            clock=clock,
            cache_small_file_max=MiB,  # 4 MiB objects are read in 1 MiB blocks
        ) as gw:
            e = Env(gw, clock, seaweed.boto3_client(), bucket)
            try:
                yield e
            finally:
                e.rpc.close()
    finally:
        seaweed.delete_bucket(bucket)


def test_added_deleted_overwritten_after_the_ttl(env: Env) -> None:
    env.put("d/keep.bin", b"k" * 1000)
    env.put("d/gone.bin", b"g" * 2000)
    env.put("d/changed.bin", b"1" * 3000)
    assert env.names("d") == {"keep.bin", "gone.bin", "changed.bin"}
    _, gone = env.lookup("d/gone.bin")
    _, changed = env.lookup("d/changed.bin")
    assert env.read(gone) == (OK, b"g" * 2000)  # cached by the gateway now
    assert env.read(changed) == (OK, b"1" * 3000)

    env.put("d/new.bin", b"n" * 500)
    env.delete("d/gone.bin")
    env.put("d/changed.bin", b"2" * 4500)
    # within the TTL the old state may be served, but never a mixture
    status, data = env.read(changed)
    assert status == OK and data in (b"1" * 3000, b"2" * 4500)

    env.past_ttl()
    env.names("d")  # the first call past the TTL starts the re-list
    env.settle(lambda: env.names("d") == {"keep.bin", "new.bin", "changed.bin"}, "listing")
    assert env.lookup("d/new.bin")[0] == OK
    assert env.lookup("d/gone.bin")[0] == NOENT
    # the deleted file's handle: STALE, never its old (cached) bytes
    for proc, args in (
        (Nfs3Proc.READ, nfs3.Read3Args(gone, 0, 4096)),
        (Nfs3Proc.GETATTR, nfs3.Getattr3Args(gone)),
        (Nfs3Proc.ACCESS, nfs3.Access3Args(gone, 1)),
    ):
        res = env.rpc.nfs(proc, args)
        assert res.status == STALE, (proc.name, res.status)
    # the overwritten file: its new size and bytes through the old handle
    ga = env.rpc.nfs(Nfs3Proc.GETATTR, nfs3.Getattr3Args(changed))
    assert ga.status == OK and ga.obj_attributes.size == 4500
    assert env.read(changed) == (OK, b"2" * 4500)


def test_a_deleted_file_is_stale_once_its_directory_is_relisted(env: Env) -> None:
    """Past the TTL a READ does not wait for the parent's re-list (docs/operations.md,
    "Directory caching and staleness"): the first READ starts it and may still get the old
    bytes from the data cache; once the re-list has passed the name, the file is STALE, and
    old bytes never come back after a STALE."""
    env.put("e/f.bin", b"f" * 100_000)
    _, fh = env.lookup("e/f.bin")
    assert env.read(fh)[0] == OK
    env.delete("e/f.bin")
    env.past_ttl()
    seen: Counter[str] = Counter()
    t0 = time.monotonic()
    last_old = 0.0
    for _ in range(200):
        status, data = env.read(fh)
        if status == OK:
            assert data == b"f" * 100_000
            assert seen["STALE"] == 0, "old bytes after STALE"
            seen["old bytes"] += 1
            last_old = time.monotonic() - t0
        else:
            assert status == STALE, status
            seen["STALE"] += 1
            if seen["STALE"] >= 3:
                break
        time.sleep(0.01)
    assert seen["STALE"] >= 3, seen
    # Old bytes only while one re-list of a one-file directory runs.
    assert last_old < 2.0, (seen, last_old)
    print(f"\nREADs of a deleted file past the TTL: {dict(seen)}, old bytes until {last_old:.3f} s")


def test_reads_never_mix_versions(env: Env) -> None:
    """A 4 MiB object (four 1 MiB cache blocks) overwritten 20 times with versions whose every
    byte is the version number; READs of 1 MiB (rsize) that span two blocks, from two clients, all
    the while. Every READ that succeeds is one version; versions never go backwards for a
    client once the TTL has passed."""
    size = 4 * MiB
    env.put("v/obj.bin", bytes([1]) * size)
    _, fh = env.lookup("v/obj.bin")
    stop = threading.Event()
    bad: list[str] = []
    counts: Counter[str] = Counter()

    def reader(offset: int) -> None:
        with BlockingRpcClient("127.0.0.1", env.gw.port) as c:
            for _ in range(5000):
                if stop.is_set():
                    return
                status, data = env.read(fh, offset, MiB, rpc=c)
                if status != OK:
                    counts[status.name] += 1
                    continue
                counts["ok"] += 1
                if data and data.count(data[0]) != len(data):
                    bad.append(f"offset {offset}: bytes of versions {sorted(set(data))}")
                    return

    threads = [threading.Thread(target=reader, args=(off,)) for off in (MiB // 2, 3 * MiB // 2)]
    for t in threads:
        t.start()
    try:
        for v in range(2, 22):
            env.put("v/obj.bin", bytes([v]) * size)
            if v % 3 == 0:
                env.past_ttl()  # let the gateway notice through its listing too
            time.sleep(0.05)
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert not bad, bad
    assert counts["ok"] > 20, counts
    # the last version, whole
    env.past_ttl()

    def whole() -> bytes:
        return b"".join(env.read(fh, off, MiB)[1] for off in range(0, size, MiB))

    env.settle(lambda: whole() == bytes([21]) * size, "last version")
    print(f"\nREADs during 20 overwrites: {dict(counts)}")
