"""The write path end to end with an independent client: SeaweedFS <- gateway
(``tests.harness.thread`` on its own thread, or ``loadgen.gwprocess`` for the crash test) <-
libnfs (``tests.libnfs`` plus the write calls below, blocking, on the test's thread).

Each test gets a fresh bucket and a read-write export ``/data`` of it. What is checked is
what S3 ends up holding (read back with our S3 store), what libnfs reads back, and request
counts from the gateway's own counters, never timings.

What libnfs 4.0 sends for writes (seen in these tests): ``nfs_pwrite`` splits into WRITEs of
at most the server's ``wtmax`` and sends them UNSTABLE unless the file was opened with
O_SYNC (then FILE_SYNC); ``nfs_fsync`` is a COMMIT; ``nfs_close`` sends nothing.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import hashlib
import os
from collections.abc import Iterator
from ctypes import POINTER, byref, c_char_p, c_int, c_uint64, c_void_p
from pathlib import Path
from typing import Any

import pytest

from gateway.backend.base import ObjectNotFound
from gateway.backend.s3 import S3Store
from gateway.exports import ExportConfig
from loadgen.gwprocess import GatewayProcess
from loadgen.seaweed import SeaweedServer
from nfsproto import nfs3
from nfsproto.nfs3 import (
    CreateHow3,
    CreateMode3,
    Diropargs3,
    Nfs3Proc,
    NfsStat3,
    Sattr3,
    StableHow,
)
from tests.harness.buckets import MakeBucket
from tests.harness.thread import GatewayThread, delta
from tests.libnfs import NF3DIR, NF3LNK, NF3REG, LibNfs, libnfs_available, load_libnfs
from tests.rpcclient import BlockingRpcClient

pytestmark = [
    pytest.mark.s3,
    pytest.mark.libnfs,
    pytest.mark.skipif(not libnfs_available(), reason="libnfs (libnfs.so.13) is not installed"),
]

MiB = 1 << 20
PART = 5 * MiB


class _Timeval(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_usec", ctypes.c_long)]


def _declare_write_calls() -> ctypes.CDLL:
    lib = load_libnfs()
    ctx = fh = c_void_p

    def proto(fn: str, restype: Any, *argtypes: Any) -> None:
        f = getattr(lib, fn)
        f.restype = restype
        f.argtypes = list(argtypes)

    # libnfs.h, 4.0 (the argument order of nfs_pwrite changed in 5.0)
    proto("nfs_create", c_int, ctx, c_char_p, c_int, c_int, POINTER(fh))
    proto("nfs_pwrite", c_int, ctx, fh, c_uint64, c_uint64, c_void_p)
    proto("nfs_fsync", c_int, ctx, fh)
    proto("nfs_ftruncate", c_int, ctx, fh, c_uint64)
    proto("nfs_truncate", c_int, ctx, c_char_p, c_uint64)
    proto("nfs_unlink", c_int, ctx, c_char_p)
    proto("nfs_mkdir", c_int, ctx, c_char_p)
    proto("nfs_rmdir", c_int, ctx, c_char_p)
    proto("nfs_rename", c_int, ctx, c_char_p, c_char_p)
    proto("nfs_symlink", c_int, ctx, c_char_p, c_char_p)
    proto("nfs_readlink", c_int, ctx, c_char_p, c_char_p, c_int)
    proto("nfs_chmod", c_int, ctx, c_char_p, c_int)
    proto("nfs_utimes", c_int, ctx, c_char_p, POINTER(_Timeval))
    proto("nfs_link", c_int, ctx, c_char_p, c_char_p)
    return lib


class WNfs(LibNfs):
    """``LibNfs`` plus the write calls (libnfs 4.0 signatures)."""

    def __init__(self, url: str, **kw: Any) -> None:
        self._w = _declare_write_calls()
        super().__init__(url, **kw)

    def __enter__(self) -> WNfs:
        return self

    def create(self, path: str, flags: int = os.O_WRONLY | os.O_TRUNC, mode: int = 0o644) -> int:
        fh = c_void_p()
        rc = self._w.nfs_create(self.ctx, path.encode(), flags | os.O_CREAT, mode, byref(fh))
        self._check(rc, f"create {path}")
        assert fh.value is not None
        return fh.value

    def pwrite(self, fh: int, offset: int, data: bytes) -> int:
        buf = ctypes.create_string_buffer(data, len(data))
        return self._check(
            self._w.nfs_pwrite(self.ctx, c_void_p(fh), offset, len(data), buf), "pwrite"
        )

    def fsync(self, fh: int) -> None:
        self._check(self._w.nfs_fsync(self.ctx, c_void_p(fh)), "fsync")

    def ftruncate(self, fh: int, size: int) -> None:
        self._check(self._w.nfs_ftruncate(self.ctx, c_void_p(fh), size), "ftruncate")

    def truncate(self, path: str, size: int) -> None:
        self._check(self._w.nfs_truncate(self.ctx, path.encode(), size), f"truncate {path}")

    def unlink(self, path: str) -> None:
        self._check(self._w.nfs_unlink(self.ctx, path.encode()), f"unlink {path}")

    def mkdir(self, path: str) -> None:
        self._check(self._w.nfs_mkdir(self.ctx, path.encode()), f"mkdir {path}")

    def rmdir(self, path: str) -> None:
        self._check(self._w.nfs_rmdir(self.ctx, path.encode()), f"rmdir {path}")

    def rename(self, old: str, new: str) -> None:
        self._check(self._w.nfs_rename(self.ctx, old.encode(), new.encode()), f"rename {old}")

    def symlink(self, target: str, link: str) -> None:
        self._check(self._w.nfs_symlink(self.ctx, target.encode(), link.encode()), "symlink")

    def readlink(self, path: str) -> str:
        buf = ctypes.create_string_buffer(4096)
        self._check(self._w.nfs_readlink(self.ctx, path.encode(), buf, 4096), "readlink")
        return buf.value.decode()

    def chmod(self, path: str, mode: int) -> None:
        self._check(self._w.nfs_chmod(self.ctx, path.encode(), mode), f"chmod {path}")

    def utimes(self, path: str, atime: int, mtime: int) -> None:
        tv = (_Timeval * 2)(_Timeval(atime, 0), _Timeval(mtime, 0))
        self._check(self._w.nfs_utimes(self.ctx, path.encode(), tv), f"utimes {path}")

    def link(self, old: str, new: str) -> None:
        self._check(self._w.nfs_link(self.ctx, old.encode(), new.encode()), f"link {old}")

    def write_file(self, path: str, data: bytes, chunk: int = 4 * MiB, sync: bool = True) -> None:
        fh = self.create(path)
        try:
            for off in range(0, len(data), chunk):
                self.pwrite(fh, off, data[off : off + chunk])
            if sync:
                self.fsync(fh)
        finally:
            self.close_file(fh)


# --------------------------------------------------------------------------- fixtures


@pytest.fixture
def bucket(make_bucket: MakeBucket) -> str:
    return make_bucket("wp")


@pytest.fixture
def gw(seaweed: SeaweedServer, bucket: str, tmp_path: Path) -> Iterator[GatewayThread]:
    exports = [ExportConfig("/data", f"s3://{bucket}/ds/", squash="none", insecure=True)]
    with GatewayThread(
        exports,
        state_dir=tmp_path / "state",
        s3=seaweed.store_kwargs(),
        writes_part_size=PART,
        writes_flush_idle_s=0.0,
    ) as g:
        yield g


@pytest.fixture
def nfs(gw: GatewayThread) -> Iterator[WNfs]:
    with WNfs(gw.libnfs_url("/data"), timeout_ms=120_000) as c:
        yield c


class S3:
    """Blocking reads of the bucket, on the gateway's loop (S3Store needs a loop)."""

    def __init__(self, gw: GatewayThread, seaweed: SeaweedServer, bucket: str) -> None:
        self.gw = gw
        self.kw = seaweed.store_kwargs()
        self.bucket = bucket

    def get(self, key: str) -> bytes | None:
        async def go() -> bytes | None:
            store = S3Store(self.bucket, **self.kw)
            try:
                return (await store.get("ds/" + key)).data
            except ObjectNotFound:
                return None
            finally:
                await store.close()

        return self.gw.run(go())

    def head_meta(self, key: str) -> dict[str, str]:
        async def go() -> dict[str, str]:
            store = S3Store(self.bucket, **self.kw)
            try:
                return dict((await store.head("ds/" + key)).metadata)
            finally:
                await store.close()

        return self.gw.run(go())


@pytest.fixture
def s3(gw: GatewayThread, seaweed: SeaweedServer, bucket: str) -> S3:
    return S3(gw, seaweed, bucket)


def md5(b: bytes) -> str:
    return hashlib.md5(b, usedforsecurity=False).hexdigest()


# --------------------------------------------------------------------------- tests


SIZES = [0, 1, 4095, 4096, 4097, MiB - 1, MiB, PART - 1, PART, PART + 1, 3 * PART + 12345]


def test_create_write_read_back_byte_exact(gw: GatewayThread, nfs: WNfs, s3: S3) -> None:
    rnd = os.urandom(3 * PART + 12345)
    for size in SIZES:
        data = rnd[:size]
        before = gw.backend_counts()
        nfs.write_file(f"f{size}", data, chunk=MiB)
        d = delta(gw.backend_counts(), before)
        assert md5(nfs.read_file(f"f{size}")) == md5(data), size
        assert s3.get(f"f{size}") == data, size
        assert nfs.stat(f"/f{size}").size == size
        if size > PART:  # full parts streamed while written, the rest at COMMIT
            parts = -(-size // PART)
            assert d["create_multipart"] == 1 and d["upload_part"] == parts, (size, d)
            assert d["complete_multipart"] == 1 and d["put"] == 1, (size, d)  # the CREATE
        else:  # CREATE, and the COMMIT's PUT when there is data
            assert d["put"] == 1 + (size > 0) and "upload_part" not in d, (size, d)
    listed = {e.name: e.size for e in nfs.scandir("/")}
    assert listed == {f"f{s}": s for s in SIZES}


def test_64_mib_file(gw: GatewayThread, nfs: WNfs, s3: S3) -> None:
    data = os.urandom(64 * MiB)
    nfs.write_file("big.bin", data, chunk=8 * MiB)
    assert md5(nfs.read_file("big.bin")) == md5(data)
    assert md5(s3.get("big.bin") or b"") == md5(data)
    st = gw.stats(lambda s: s.gateway.writes.stats)  # type: ignore[union-attr]
    assert st["parts_streamed"] >= 10 and st["spool_bytes"] == 0


def test_overwrite_append_truncate(gw: GatewayThread, nfs: WNfs, s3: S3) -> None:
    base = os.urandom(PART + 1000)
    nfs.write_file("f", base)
    fh = nfs.open("/f", os.O_WRONLY)
    try:
        nfs.pwrite(fh, 10, b"overwritten")
        nfs.pwrite(fh, len(base), b"appended")
        nfs.fsync(fh)
    finally:
        nfs.close_file(fh)
    want = bytearray(base)
    want[10:21] = b"overwritten"
    want += b"appended"
    assert s3.get("f") == bytes(want) and nfs.read_file("f") == bytes(want)
    nfs.truncate("/f", 100)
    assert s3.get("f") == bytes(want[:100]) and nfs.stat("/f").size == 100
    nfs.truncate("/f", 200)
    assert s3.get("f") == bytes(want[:100]) + b"\0" * 100
    # O_TRUNC then a shorter write
    nfs.write_file("f", b"short")
    assert s3.get("f") == b"short" and nfs.read_file("f") == b"short"


def test_rename_over_an_existing_file(gw: GatewayThread, nfs: WNfs, s3: S3) -> None:
    nfs.write_file("a", b"AAAA")
    nfs.write_file("b", b"BB")
    nfs.chmod("/a", 0o600)
    nfs.rename("/a", "/b")
    assert s3.get("b") == b"AAAA" and s3.get("a") is None
    assert nfs.read_file("b") == b"AAAA"
    assert nfs.stat("/b").mode & 0o7777 == 0o600
    with pytest.raises(OSError) as ei:
        nfs.stat("/a")
    assert ei.value.errno == errno.ENOENT
    assert sorted(nfs.listdir("/")) == ["b"]
    # a directory
    nfs.mkdir("/d")
    nfs.write_file("d/x", b"x")
    nfs.rename("/d", "/e")
    assert s3.get("e/x") == b"x" and s3.get("d/x") is None
    assert sorted(nfs.listdir("/")) == ["b", "e"] and nfs.listdir("/e") == ["x"]


def test_mkdir_rmdir_non_empty(gw: GatewayThread, nfs: WNfs, s3: S3) -> None:
    nfs.mkdir("/d")
    assert s3.get("d/") == b""
    nfs.write_file("d/f", b"data")
    with pytest.raises(OSError) as ei:
        nfs.rmdir("/d")
    assert ei.value.errno == errno.ENOTEMPTY
    with pytest.raises(OSError) as ei:
        nfs.mkdir("/d")
    assert ei.value.errno == errno.EEXIST
    nfs.unlink("/d/f")
    assert nfs.listdir("/d") == []
    nfs.rmdir("/d")
    assert nfs.listdir("/") == [] and s3.get("d/") is None


def test_symlink_chmod_utimes_link(gw: GatewayThread, nfs: WNfs, s3: S3) -> None:
    nfs.write_file("target", b"t")
    nfs.symlink("target", "/ln")
    assert nfs.readlink("/ln") == "target"
    types = {e.name: e.type for e in nfs.scandir("/")}
    assert types == {"target": NF3REG, "ln": NF3LNK}
    assert s3.head_meta("ln")["symlink-target"] == "target"
    nfs.chmod("/target", 0o640)
    nfs.utimes("/target", 1_600_000_000, 1_700_000_000)
    st = nfs.stat("/target")
    assert st.mode & 0o7777 == 0o640 and st.mtime == 1_700_000_000
    meta = s3.head_meta("target")
    assert meta["mode"] == "640" and meta["mtime"] == str(1_700_000_000 * 10**9)
    assert s3.get("target") == b"t"
    # a re-list (TTL expiry) keeps what the gateway knows of objects it wrote
    gw.call(lambda: gw.export("/data").ns.invalidate("", subtree=True))
    types = {e.name: e.type for e in nfs.scandir("/")}
    assert types == {"target": NF3REG, "ln": NF3LNK}
    assert nfs.stat("/target").mode & 0o7777 == 0o640
    with pytest.raises(OSError) as ei:
        nfs.link("/target", "/hard")
    assert "NFS3ERR_NOTSUPP" in str(ei.value)  # libnfs maps it to EINVAL
    nfs.mkdir("/d")
    types = {e.name: e.type for e in nfs.scandir("/")}
    assert types["d"] == NF3DIR


# --------------------------------------------------------------------------- crash


def test_unstable_write_lost_by_kill9_is_resent_after_restart(
    seaweed: SeaweedServer, bucket: str, tmp_path: Path
) -> None:
    data = os.urandom(PART + 4096)  # one full part streams before the crash
    g = GatewayProcess(
        tmp_path,
        [{"path": "/data", "backend": f"s3://{bucket}/ds/", "squash": "none", "insecure": True}],
        s3=seaweed,
        sections={
            "server": {"uvloop": False},
            "writes": {"part_size": PART, "flush_idle_s": 3600},  # no upload before the kill
        },
    )
    spool = g.state_dir / "spool"
    try:
        g.start()
        rpc = BlockingRpcClient("127.0.0.1", g.port)
        root = rpc.mnt(b"/data").fhandle
        cr = rpc.nfs(
            Nfs3Proc.CREATE,
            nfs3.Create3Args(
                Diropargs3(root, b"ckpt"), CreateHow3(CreateMode3.UNCHECKED, Sattr3(mode=0o644))
            ),
        )
        assert cr.status == NfsStat3.NFS3_OK
        fh = cr.obj
        chunks = [(off, data[off : off + MiB]) for off in range(0, len(data), MiB)]
        verfs = set()
        for off, chunk in chunks:
            w = rpc.nfs(
                Nfs3Proc.WRITE,
                nfs3.Write3Args(fh, off, len(chunk), StableHow.UNSTABLE, chunk),
            )
            assert w.status == NfsStat3.NFS3_OK and w.committed == StableHow.UNSTABLE
            verfs.add(w.verf)
        assert len(verfs) == 1
        rpc.close()
        g.kill()  # before any COMMIT
        assert list(spool.iterdir())  # the spool (and an upload journal) left behind

        g.start()  # same port, same state directory
        rpc = BlockingRpcClient("127.0.0.1", g.port)
        root = rpc.mnt(b"/data").fhandle
        # the handle still works; the object is still the empty one CREATE stored
        ga = rpc.nfs(Nfs3Proc.GETATTR, nfs3.Getattr3Args(fh))
        assert ga.status == NfsStat3.NFS3_OK and ga.obj_attributes.size == 0
        # the client's COMMIT sees a new verifier, so it resends everything unstable
        cm = rpc.nfs(Nfs3Proc.COMMIT, nfs3.Commit3Args(fh, 0, 0))
        assert cm.status == NfsStat3.NFS3_OK and cm.verf not in verfs
        for off, chunk in chunks:
            w = rpc.nfs(
                Nfs3Proc.WRITE,
                nfs3.Write3Args(fh, off, len(chunk), StableHow.UNSTABLE, chunk),
            )
            assert w.status == NfsStat3.NFS3_OK and w.verf == cm.verf
        cm2 = rpc.nfs(Nfs3Proc.COMMIT, nfs3.Commit3Args(fh, 0, 0))
        assert cm2.status == NfsStat3.NFS3_OK and cm2.verf == cm.verf
        rpc.close()
        with LibNfs(g.libnfs_url("/data")) as c:
            assert md5(c.read_file("ckpt")) == md5(data)
        # the previous run's spool files are gone (only this run's journal-free state)
        assert not list(spool.iterdir())
    finally:
        g.kill()
    kw = seaweed.store_kwargs()

    async def check() -> bytes:
        store = S3Store(bucket, **kw)
        try:
            return (await store.get("ds/ckpt")).data
        finally:
            await store.close()

    assert md5(asyncio.run(check())) == md5(data)
