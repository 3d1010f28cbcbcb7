"""The write path with the in-memory backend, called straight into the dispatcher
(``tests.harness.memory``): every mutating
procedure's semantics, wcc_data, what readers see before and after a commit, request counts
per operation, streaming multipart parts, the spool budget, and the index staying true."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import pytest

from gateway.backend.memory import MemoryStore
from gateway.clock import FakeClock
from gateway.exports import ExportConfig
from nfsproto import nfs3, rpc
from nfsproto.nfs3 import (
    CreateHow3,
    CreateMode3,
    Diropargs3,
    Ftype3,
    Nfs3Proc,
    NfsStat3,
    NfsTime3,
    Sattr3,
    SetTime,
    StableHow,
    TimeHow,
)
from tests.harness.memory import MemoryGateway

MiB = 1 << 20
PART = 5 * MiB  # S3's minimum part size
UNSTABLE, FILE_SYNC = StableHow.UNSTABLE, StableHow.FILE_SYNC


def keys(store: MemoryStore) -> list[str]:
    return list(store.keys())


class Env(MemoryGateway):
    """A gateway with exports /rw (s3://bucket/rw/) and /ro (read-only) of one bucket, calling
    as root; ``root`` is /rw's root handle. The write procedures by name, and the whole-file
    helpers their checks use."""

    root = b""

    async def __aenter__(self) -> Self:
        await super().__aenter__()
        self.root = await self.mount(b"/rw")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.gateway.writes.close()
        await super().__aexit__(exc_type, exc, tb)

    def data(self, key: str) -> bytes:
        data: bytes = self.store._objects[key.encode()].data
        return data

    def meta(self, key: str) -> dict[str, str]:
        return dict(self.store._objects[key.encode()].metadata)

    async def fh(self, path: str, d: bytes | None = None) -> bytes:
        return await self.walk(self.root if d is None else d, path)

    async def attrs(self, fh: bytes) -> nfs3.Fattr3:
        res = await self.nfs(Nfs3Proc.GETATTR, nfs3.Getattr3Args(fh))
        assert res.status == NfsStat3.NFS3_OK, res.status
        a: nfs3.Fattr3 = res.obj_attributes
        return a

    async def create(
        self,
        name: bytes,
        d: bytes | None = None,
        mode: CreateMode3 = CreateMode3.UNCHECKED,
        sattr: Sattr3 | None = None,
        verf: bytes = b"\0" * 8,
    ) -> nfs3.Create3Res:
        how = CreateHow3(mode, sattr if mode is not CreateMode3.EXCLUSIVE else None, verf)
        if mode is not CreateMode3.EXCLUSIVE and sattr is None:
            how.obj_attributes = Sattr3(mode=0o644)
        res: nfs3.Create3Res = await self.nfs(
            Nfs3Proc.CREATE, nfs3.Create3Args(Diropargs3(d or self.root, name), how)
        )
        return res

    async def write(
        self, fh: bytes, offset: int, data: bytes, stable: StableHow = UNSTABLE
    ) -> nfs3.Write3Res:
        res: nfs3.Write3Res = await self.nfs(
            Nfs3Proc.WRITE, nfs3.Write3Args(fh, offset, len(data), stable, data)
        )
        return res

    async def commit(self, fh: bytes) -> nfs3.Commit3Res:
        res: nfs3.Commit3Res = await self.nfs(Nfs3Proc.COMMIT, nfs3.Commit3Args(fh, 0, 0))
        return res

    async def read_bytes(self, fh: bytes, offset: int = 0, count: int = 1 << 20) -> bytes:
        res = await self.nfs(Nfs3Proc.READ, nfs3.Read3Args(fh, offset, count))
        assert res.status == NfsStat3.NFS3_OK, res.status
        return bytes(res.data)

    async def read_all(self, fh: bytes) -> bytes:
        out = b""
        while True:
            chunk = await self.read_bytes(fh, len(out))
            if not chunk:
                return out
            out += chunk

    async def setattr(
        self, fh: bytes, sattr: Sattr3, guard: NfsTime3 | None = None
    ) -> nfs3.Setattr3Res:
        res: nfs3.Setattr3Res = await self.nfs(
            Nfs3Proc.SETATTR, nfs3.Setattr3Args(fh, sattr, guard)
        )
        return res

    async def mkdir(self, name: bytes, d: bytes | None = None) -> nfs3.Mkdir3Res:
        res: nfs3.Mkdir3Res = await self.nfs(
            Nfs3Proc.MKDIR, nfs3.Mkdir3Args(Diropargs3(d or self.root, name), Sattr3(mode=0o755))
        )
        return res

    async def remove(self, name: bytes, d: bytes | None = None) -> nfs3.Remove3Res:
        res: nfs3.Remove3Res = await self.nfs(
            Nfs3Proc.REMOVE, nfs3.Remove3Args(Diropargs3(d or self.root, name))
        )
        return res

    async def rmdir(self, name: bytes, d: bytes | None = None) -> nfs3.Rmdir3Res:
        res: nfs3.Rmdir3Res = await self.nfs(
            Nfs3Proc.RMDIR, nfs3.Rmdir3Args(Diropargs3(d or self.root, name))
        )
        return res

    async def rename(self, fd: bytes, fname: bytes, td: bytes, tname: bytes) -> nfs3.Rename3Res:
        res: nfs3.Rename3Res = await self.nfs(
            Nfs3Proc.RENAME, nfs3.Rename3Args(Diropargs3(fd, fname), Diropargs3(td, tname))
        )
        return res

    async def symlink(self, name: bytes, target: bytes, d: bytes | None = None) -> Any:
        return await self.nfs(
            Nfs3Proc.SYMLINK,
            nfs3.Symlink3Args(
                Diropargs3(d or self.root, name), nfs3.Symlinkdata3(Sattr3(), target)
            ),
        )

    async def readdir(self, d: bytes | None = None) -> tuple[bytes, dict[str, nfs3.Fattr3]]:
        """(cookie verifier, name -> attributes) of a whole directory (READDIRPLUS)."""
        out: dict[str, nfs3.Fattr3] = {}
        cookie, verf = 0, b"\0" * 8
        for _ in range(1000):
            res = await self.nfs(
                Nfs3Proc.READDIRPLUS,
                nfs3.Readdirplus3Args(d or self.root, cookie, verf, 8192, 65536),
            )
            assert res.status == NfsStat3.NFS3_OK, res.status
            for e in res.entries:
                if e.name not in (b".", b".."):
                    out[e.name.decode()] = e.name_attributes
                cookie = e.cookie
            verf = res.cookieverf
            if res.eof:
                return verf, out
        raise AssertionError("READDIRPLUS did not end")


def make_env(tmp_path: Path, store: MemoryStore, **settings: Any) -> Env:
    settings.setdefault("writes_part_size", PART)
    settings.setdefault("writes_flush_idle_s", 0.0)  # no background flusher: tests call flush_idle
    exports = (
        ExportConfig("/rw", "s3://bucket/rw/", squash="none"),
        ExportConfig("/ro", "s3://bucket/rw/", read_only=True),
    )
    return Env.of(tmp_path, exports, store=store, **settings)


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    store = MemoryStore("mem")
    store.seed("rw/dir/a.txt", b"0123456789" * 3)
    store.seed("rw/dir/b.txt", b"bbb")
    store.seed("rw/top.bin", bytes(range(256)) * 40)
    async with make_env(tmp_path, store) as e:
        yield e


# -- CREATE, WRITE, COMMIT ---------------------------------------------------------------------


async def test_create_unstable_write_commit(env: Env) -> None:
    v0, before = await env.readdir()
    env.reset_requests()
    cr = await env.create(b"new.txt", sattr=Sattr3(mode=0o600))
    assert cr.status == NfsStat3.NFS3_OK and cr.obj is not None and cr.obj_attributes is not None
    assert cr.obj_attributes.type == Ftype3.NF3REG and cr.obj_attributes.size == 0
    assert cr.obj_attributes.mode == 0o600 and cr.obj_attributes.uid == 0
    assert env.requests() == {"put": 1}  # the empty object, so a restart finds the file
    assert env.meta("rw/new.txt") == {"uid": "0", "gid": "0", "mode": "600"}
    # the parent changed: wcc before != after, a new mtime and cookie verifier
    assert cr.dir_wcc.before is not None and cr.dir_wcc.after is not None
    assert cr.dir_wcc.after.mtime != cr.dir_wcc.before.mtime
    v1, after = await env.readdir()
    assert v1 != v0 and set(after) == set(before) | {"new.txt"}

    env.reset_requests()
    w1 = await env.write(cr.obj, 0, b"hello ")
    w2 = await env.write(cr.obj, 6, b"world")
    for w in (w1, w2):
        assert w.status == NfsStat3.NFS3_OK and w.committed == UNSTABLE
        assert w.verf == env.gateway.write_verf and w.count in (5, 6)
    assert env.requests() == {}  # staged only
    # readers see the committed (empty) object until the COMMIT
    assert (await env.attrs(cr.obj)).size == 0
    assert await env.read_bytes(cr.obj) == b""
    cm = await env.commit(cr.obj)
    assert cm.status == NfsStat3.NFS3_OK and cm.verf == env.gateway.write_verf
    assert cm.file_wcc.before is not None and cm.file_wcc.before.size == 0
    assert cm.file_wcc.after is not None and cm.file_wcc.after.size == 11
    assert env.requests() == {"put": 1}  # metadata known: no HEAD
    assert env.data("rw/new.txt") == b"hello world"
    assert env.meta("rw/new.txt")["mode"] == "600"
    assert await env.read_bytes(cr.obj) == b"hello world"
    a = await env.attrs(cr.obj)
    assert a.size == 11 and a.mode == 0o600
    # a second COMMIT has nothing to do
    env.reset_requests()
    assert (await env.commit(cr.obj)).status == NfsStat3.NFS3_OK
    assert env.requests() == {}


async def test_file_sync_write_is_stored_before_the_reply(env: Env) -> None:
    cr = await env.create(b"sync.txt")
    assert cr.obj is not None
    env.reset_requests()
    w = await env.write(cr.obj, 0, b"durable", FILE_SYNC)
    assert w.status == NfsStat3.NFS3_OK and w.committed == FILE_SYNC
    assert w.file_wcc.after is not None and w.file_wcc.after.size == 7
    assert env.data("rw/sync.txt") == b"durable"
    assert env.requests() == {"put": 1}
    w = await env.write(cr.obj, 7, b"!", StableHow.DATA_SYNC)
    assert w.committed == FILE_SYNC and env.data("rw/sync.txt") == b"durable!"


async def test_overwrite_and_append_keep_the_rest_of_the_object(env: Env) -> None:
    fh = await env.fh("dir/a.txt")
    env.reset_requests()
    await env.write(fh, 5, b"XY")
    await env.write(fh, 30, b"+tail")
    await env.commit(fh)
    assert env.data("rw/dir/a.txt") == b"01234XY789" + b"0123456789" * 2 + b"+tail"
    # one HEAD (the seeded object's metadata is unknown), one GET of the base, one PUT
    assert env.requests() == {"head": 1, "get": 1, "put": 1}
    # bytes in the middle, the size unchanged: base around them
    b = await env.fh("dir/b.txt")
    await env.write(b, 1, b"X")
    await env.commit(b)
    assert env.data("rw/dir/b.txt") == b"bXb"
    # the whole file overwritten: no GET of the base; metadata now known
    env.reset_requests()
    await env.write(fh, 0, b"z" * 35)
    await env.commit(fh)
    assert env.requests() == {"put": 1} and env.data("rw/dir/a.txt") == b"z" * 35


async def test_sparse_write_past_the_end_reads_zeros(env: Env) -> None:
    cr = await env.create(b"sparse")
    assert cr.obj is not None
    await env.write(cr.obj, 100, b"end")
    await env.commit(cr.obj)
    assert env.data("rw/sparse") == b"\0" * 100 + b"end"


async def test_out_of_order_concurrent_writes(env: Env) -> None:
    cr = await env.create(b"ooo.bin")
    assert cr.obj is not None
    blob = os.urandom(64 * 1024)
    chunks = [(off, blob[off : off + 4096]) for off in range(0, len(blob), 4096)]
    chunks.reverse()
    res = await asyncio.gather(*(env.write(cr.obj, off, d) for off, d in chunks))
    assert all(r.status == NfsStat3.NFS3_OK for r in res)
    await env.commit(cr.obj)
    assert env.data("rw/ooo.bin") == blob
    assert await env.read_all(cr.obj) == blob


async def test_large_file_streams_full_parts_before_the_commit(env: Env) -> None:
    cr = await env.create(b"big.bin")
    assert cr.obj is not None
    blob = os.urandom(2 * PART + MiB + 123)
    env.reset_requests()
    for off in range(0, len(blob), MiB):
        w = await env.write(cr.obj, off, blob[off : off + MiB])
        assert w.status == NfsStat3.NFS3_OK
    # the two full parts were uploaded while the data arrived, before any COMMIT
    for _ in range(100):
        if env.requests().get("upload_part", 0) == 2:
            break
        await asyncio.sleep(0.01)
    assert env.requests() == {"create_multipart": 1, "upload_part": 2}
    assert env.gateway.writes.stats.parts_streamed == 2
    await env.commit(cr.obj)
    assert env.requests() == {"create_multipart": 1, "upload_part": 3, "complete_multipart": 1}
    assert env.data("rw/big.bin") == blob
    assert (await env.attrs(cr.obj)).size == len(blob)
    assert env.gateway.writes.spool.used_bytes == 0 and not list(
        env.gateway.writes.spool.dir.iterdir()
    )


async def test_rewrite_of_an_uploaded_part_uploads_it_again(env: Env) -> None:
    cr = await env.create(b"rw.bin")
    assert cr.obj is not None
    blob = bytearray(os.urandom(2 * PART + 100))
    for off in range(0, len(blob), MiB):
        await env.write(cr.obj, off, bytes(blob[off : off + MiB]))
    for _ in range(100):
        if env.gateway.writes.stats.parts_streamed == 2:
            break
        await asyncio.sleep(0.01)
    env.reset_requests()
    await env.write(cr.obj, 10, b"HEADER")  # e.g. a zip writer fixing its first header
    blob[10:16] = b"HEADER"
    await env.commit(cr.obj)
    # part 1 again, and the last (short) part: never streamed, a file may still grow
    assert env.requests() == {"upload_part": 2, "complete_multipart": 1}
    assert env.gateway.writes.stats.parts_reuploaded == 1
    assert env.data("rw/rw.bin") == bytes(blob)


async def test_readers_never_see_a_mix(env: Env) -> None:
    fh = await env.fh("top.bin")
    old = env.data("rw/top.bin")
    await env.write(fh, 0, b"N" * len(old))
    assert await env.read_bytes(fh) == old
    await env.commit(fh)
    assert await env.read_bytes(fh) == b"N" * len(old)


async def test_zero_length_and_empty_files(env: Env) -> None:
    cr = await env.create(b"empty")
    assert cr.obj is not None
    env.reset_requests()
    w = await env.write(cr.obj, 0, b"", FILE_SYNC)
    assert w.status == NfsStat3.NFS3_OK and w.count == 0
    assert env.requests() == {} and env.data("rw/empty") == b""


# -- CREATE modes --------------------------------------------------------------------------------


async def test_create_modes(env: Env) -> None:
    g = await env.create(b"top.bin", mode=CreateMode3.GUARDED)
    assert g.status == NfsStat3.NFS3ERR_EXIST and g.dir_wcc.after is not None
    d = await env.create(b"dir", mode=CreateMode3.UNCHECKED)
    assert d.status == NfsStat3.NFS3ERR_EXIST
    # UNCHECKED on an existing file: only a size applies (O_TRUNC), not the new-file mode
    u = await env.create(b"top.bin", sattr=Sattr3(mode=0o600))
    assert u.status == NfsStat3.NFS3_OK and u.obj_attributes is not None
    assert u.obj_attributes.mode == 0o644 and u.obj_attributes.size == 10240
    u = await env.create(b"top.bin", sattr=Sattr3(size=0))
    assert u.status == NfsStat3.NFS3_OK and u.obj_attributes is not None
    assert u.obj_attributes.size == 0 and env.data("rw/top.bin") == b""
    # EXCLUSIVE: the verifier is stored; a retransmission with it succeeds
    verf = b"\x01\x02\x03\x04\x05\x06\x07\x08"
    e1 = await env.create(b"excl", mode=CreateMode3.EXCLUSIVE, verf=verf)
    assert e1.status == NfsStat3.NFS3_OK
    assert env.meta("rw/excl")["createverf"] == verf.hex()
    env.reset_requests()
    e2 = await env.create(b"excl", mode=CreateMode3.EXCLUSIVE, verf=verf)
    assert e2.status == NfsStat3.NFS3_OK and e2.obj == e1.obj
    assert env.requests() == {}
    e3 = await env.create(b"excl", mode=CreateMode3.EXCLUSIVE, verf=b"\xff" * 8)
    assert e3.status == NfsStat3.NFS3ERR_EXIST
    # a file written after an exclusive create loses the verifier (a data write drops it)
    await env.write(e1.obj or b"", 0, b"x", FILE_SYNC)
    assert "createverf" not in env.meta("rw/excl")


async def test_bad_names(env: Env) -> None:
    for name, status in (
        (b".", NfsStat3.NFS3ERR_INVAL),
        (b"..", NfsStat3.NFS3ERR_INVAL),
        (b"a/b", NfsStat3.NFS3ERR_INVAL),
    ):
        res = await env.create(name)
        assert res.status == status, name
        assert res.dir_wcc.before is not None  # failures carry the directory's wcc_data
    # a key longer than S3's 1,024 bytes
    d = env.root
    for _ in range(5):
        assert (await env.mkdir(b"d" * 200, d)).status == NfsStat3.NFS3_OK
        d = await env.fh("d" * 200, d)
    assert (await env.create(b"y" * 200, d)).status == NfsStat3.NFS3ERR_NAMETOOLONG


# -- SETATTR -----------------------------------------------------------------------------------


async def test_setattr_mode_owner_times_by_copy_in_place(env: Env) -> None:
    fh = await env.fh("dir/b.txt")
    env.reset_requests()
    mtime = (await env.attrs(fh)).mtime
    env.store.clock = FakeClock(wall_ns=2_000_000_000 * 10**9)  # the copy happens later
    r = await env.setattr(fh, Sattr3(mode=0o600))
    assert r.status == NfsStat3.NFS3_OK and r.obj_wcc.after is not None
    assert r.obj_wcc.after.mode == 0o600
    assert r.obj_wcc.after.mtime == mtime  # chmod does not move mtime
    assert env.requests() == {"head": 1, "copy": 1}  # metadata unknown: one HEAD first
    env.reset_requests()
    t = NfsTime3(1_700_000_000, 5)
    r = await env.setattr(
        fh, Sattr3(uid=1000, gid=100, mtime=SetTime(TimeHow.SET_TO_CLIENT_TIME, t))
    )
    assert r.status == NfsStat3.NFS3_OK and env.requests() == {"copy": 1}
    a = await env.attrs(fh)
    assert (a.mode, a.uid, a.gid, a.mtime) == (0o600, 1000, 100, t)
    meta = env.meta("rw/dir/b.txt")
    assert int(meta.pop("ctime")) > 1_700_000_000 * 10**9  # chown and utimes move ctime
    assert meta == {
        "mode": "600",
        "uid": "1000",
        "gid": "100",
        "mtime": str(1_700_000_000 * 10**9 + 5),
    }
    assert env.data("rw/dir/b.txt") == b"bbb"
    # atime is an attribute of its own: stored, mtime kept
    env.reset_requests()
    at = NfsTime3(1_900_000_000, 7)
    r = await env.setattr(fh, Sattr3(atime=SetTime(TimeHow.SET_TO_CLIENT_TIME, at)))
    assert r.status == NfsStat3.NFS3_OK and env.requests() == {"copy": 1}
    a = await env.attrs(fh)
    assert (a.atime, a.mtime) == (at, t)
    # a re-list keeps the attributes the copy gave (listings carry no metadata)
    env.export("/rw").ns.invalidate("dir")
    _, listing = await env.readdir(await env.fh("dir"))
    assert listing["b.txt"].mode == 0o600 and listing["b.txt"].mtime == t


async def test_setattr_guard(env: Env) -> None:
    fh = await env.fh("dir/b.txt")
    a = await env.attrs(fh)
    bad = NfsTime3(a.ctime.seconds + 1, 0)
    r = await env.setattr(fh, Sattr3(mode=0o600), guard=bad)
    assert r.status == NfsStat3.NFS3ERR_NOT_SYNC and r.obj_wcc.after is not None
    assert (await env.attrs(fh)).mode == 0o644
    r = await env.setattr(fh, Sattr3(mode=0o600), guard=a.ctime)
    assert r.status == NfsStat3.NFS3_OK


async def test_truncate_and_extend(env: Env) -> None:
    fh = await env.fh("dir/a.txt")
    r = await env.setattr(fh, Sattr3(size=4))
    assert r.status == NfsStat3.NFS3_OK and r.obj_wcc.after is not None
    assert r.obj_wcc.after.size == 4 and env.data("rw/dir/a.txt") == b"0123"
    r = await env.setattr(fh, Sattr3(size=8))
    assert env.data("rw/dir/a.txt") == b"0123\0\0\0\0"
    # a truncate with staged writes: one upload carries both
    await env.write(fh, 8, b"abcdef")
    env.reset_requests()
    r = await env.setattr(fh, Sattr3(size=10, mode=0o640))
    assert env.data("rw/dir/a.txt") == b"0123\0\0\0\0ab"
    assert env.meta("rw/dir/a.txt")["mode"] == "640"
    assert env.requests() == {"get": 1, "put": 1}
    # same size, nothing staged: no request
    env.reset_requests()
    assert (await env.setattr(fh, Sattr3(size=10))).status == NfsStat3.NFS3_OK
    assert env.requests() == {}


async def test_setattr_directory_and_symlink(env: Env) -> None:
    d = await env.fh("dir")
    r = await env.setattr(d, Sattr3(mode=0o700))
    assert r.status == NfsStat3.NFS3_OK  # accepted and ignored (docs/posix.md)
    assert (await env.setattr(d, Sattr3(size=0))).status == NfsStat3.NFS3ERR_ISDIR


async def test_setattr_permissions(tmp_path: Path) -> None:
    store = MemoryStore("mem")
    store.seed("rw/mine", b"m", metadata={"uid": "1000", "gid": "100", "mode": "644"})
    store.seed("rw/theirs", b"t", metadata={"uid": "2000", "gid": "200", "mode": "644"})
    async with make_env(tmp_path, store) as env:
        mine, theirs = await env.fh("mine"), await env.fh("theirs")
        # listings carry no metadata: let the index see the owners (as a READ's GET would)
        await env.export("/rw").ns.refresh("mine")
        await env.export("/rw").ns.refresh("theirs")
        env.cred = rpc.auth_sys(1000, 100, [100], b"t")
        assert (await env.setattr(mine, Sattr3(mode=0o600))).status == NfsStat3.NFS3_OK
        assert (await env.setattr(theirs, Sattr3(mode=0o600))).status == NfsStat3.NFS3ERR_PERM
        assert (await env.setattr(mine, Sattr3(uid=0))).status == NfsStat3.NFS3ERR_PERM
        assert (await env.setattr(theirs, Sattr3(size=0))).status == NfsStat3.NFS3ERR_ACCES
        w = await env.write(theirs, 0, b"x")
        assert w.status == NfsStat3.NFS3ERR_ACCES
        cr = await env.create(b"new")  # the export root is 0755 root: no write permission
        assert cr.status == NfsStat3.NFS3ERR_ACCES


# -- MKDIR, SYMLINK, REMOVE, RMDIR -----------------------------------------------------------


async def test_mkdir_rmdir(env: Env) -> None:
    await env.readdir()
    env.reset_requests()
    m = await env.mkdir(b"sub")
    assert m.status == NfsStat3.NFS3_OK and m.obj_attributes is not None
    assert m.obj_attributes.type == Ftype3.NF3DIR
    assert env.requests() == {"put": 1} and "rw/sub/" in keys(env.store)
    assert (await env.mkdir(b"sub")).status == NfsStat3.NFS3ERR_EXIST
    assert (await env.mkdir(b"top.bin")).status == NfsStat3.NFS3ERR_EXIST
    sub = await env.fh("sub")
    assert (await env.readdir(sub))[1] == {}
    cr = await env.create(b"f", sub)
    assert cr.status == NfsStat3.NFS3_OK
    assert (await env.rmdir(b"sub")).status == NfsStat3.NFS3ERR_NOTEMPTY
    assert (await env.rmdir(b"top.bin")).status == NfsStat3.NFS3ERR_NOTDIR
    assert (await env.remove(b"sub")).status == NfsStat3.NFS3ERR_ISDIR
    assert (await env.remove(b"f", sub)).status == NfsStat3.NFS3_OK
    rm = await env.rmdir(b"sub")
    assert rm.status == NfsStat3.NFS3_OK and rm.dir_wcc.after is not None
    assert "rw/sub/" not in keys(env.store)
    assert (await env.lookup(env.root, b"sub")).status == NfsStat3.NFS3ERR_NOENT
    assert "sub" not in (await env.readdir())[1]
    ga = await env.nfs(Nfs3Proc.GETATTR, nfs3.Getattr3Args(sub))
    assert ga.status == NfsStat3.NFS3ERR_STALE


async def test_rmdir_sees_keys_the_index_hides(env: Env) -> None:
    env.store.seed("rw/odd/", b"")
    env.store.seed("rw/odd/..", b"not a path")  # a name no file can have: not listed
    assert (await env.readdir(await env.fh("odd")))[1] == {}
    assert (await env.rmdir(b"odd")).status == NfsStat3.NFS3ERR_NOTEMPTY


async def test_remove_last_file_keeps_an_implicit_directory(env: Env) -> None:
    d = await env.fh("dir")
    assert (await env.remove(b"a.txt", d)).status == NfsStat3.NFS3_OK
    env.reset_requests()
    rm = await env.remove(b"b.txt", d)
    assert rm.status == NfsStat3.NFS3_OK
    # is there a marker (with the directory's attributes)? none: write it, then the delete
    assert env.requests() == {"head": 1, "put": 1, "delete": 1}
    assert keys(env.store).count("rw/dir/") == 1
    assert (await env.lookup(d, b"b.txt")).status == NfsStat3.NFS3ERR_NOENT
    env.export("/rw").ns.invalidate("", subtree=True)
    _, top = await env.readdir()
    assert top["dir"].type == Ftype3.NF3DIR
    assert (await env.readdir(d))[1] == {}
    assert (await env.remove(b"nothing", d)).status == NfsStat3.NFS3ERR_NOENT


async def test_remove_drops_staged_writes(env: Env) -> None:
    cr = await env.create(b"doomed")
    assert cr.obj is not None
    blob = os.urandom(PART + MiB)
    for off in range(0, len(blob), MiB):
        await env.write(cr.obj, off, blob[off : off + MiB])
    for _ in range(100):
        if env.gateway.writes.stats.parts_streamed:
            break
        await asyncio.sleep(0.01)
    rw = env.export("/rw")
    staged = env.gateway.writes.staged(rw, "doomed")
    assert staged is not None and env.gateway.writes.staged_id(rw.id, "doomed") is staged
    assert (await env.remove(b"doomed")).status == NfsStat3.NFS3_OK
    assert env.gateway.writes.staged(env.export("/rw"), "doomed") is None
    assert env.gateway.writes.spool.used_bytes == 0
    for _ in range(100):  # the abort runs in the background
        if env.store.requests["abort_multipart"]:
            break
        await asyncio.sleep(0.01)
    assert env.store.requests["abort_multipart"] == 1 and "rw/doomed" not in keys(env.store)


async def test_symlink_readlink_listing(env: Env) -> None:
    await env.readdir()
    env.reset_requests()
    s = await env.symlink(b"ln", b"dir/a.txt")
    assert s.status == NfsStat3.NFS3_OK and s.obj_attributes.type == Ftype3.NF3LNK
    assert s.obj_attributes.size == len(b"dir/a.txt")
    assert env.requests() == {"put": 1}
    assert env.meta("rw/ln")["symlink-target"] == "dir/a.txt"
    rl = await env.nfs(Nfs3Proc.READLINK, nfs3.Readlink3Args(s.obj))
    assert rl.status == NfsStat3.NFS3_OK and rl.data == b"dir/a.txt"
    assert (await env.readdir())[1]["ln"].type == Ftype3.NF3LNK
    # a re-list of the same object version keeps it a symlink
    env.export("/rw").ns.invalidate("")
    assert (await env.readdir())[1]["ln"].type == Ftype3.NF3LNK
    assert (await env.symlink(b"ln", b"x")).status == NfsStat3.NFS3ERR_EXIST
    assert (await env.symlink(b"bad", "é".encode())).status == NfsStat3.NFS3ERR_INVAL
    w = await env.write(s.obj, 0, b"x")
    assert w.status == NfsStat3.NFS3ERR_INVAL


# -- RENAME ------------------------------------------------------------------------------------


async def test_rename_file_over_existing(env: Env) -> None:
    d = await env.fh("dir")
    await env.setattr(await env.fh("dir/a.txt"), Sattr3(mode=0o600))
    v0, _ = await env.readdir(d)
    env.reset_requests()
    r = await env.rename(d, b"a.txt", d, b"b.txt")
    assert r.status == NfsStat3.NFS3_OK
    assert r.fromdir_wcc.after is not None and r.todir_wcc.after is not None
    assert env.requests() == {"copy": 1, "delete": 1}
    assert env.data("rw/dir/b.txt") == b"0123456789" * 3
    assert env.meta("rw/dir/b.txt")["mode"] == "600"  # metadata travels with the copy
    assert "rw/dir/a.txt" not in keys(env.store)
    assert (await env.lookup(d, b"a.txt")).status == NfsStat3.NFS3ERR_NOENT
    b = await env.fh("b.txt", d)
    assert await env.read_bytes(b) == b"0123456789" * 3 and (await env.attrs(b)).mode == 0o600
    v1, names = await env.readdir(d)
    assert v1 != v0 and set(names) == {"b.txt"}


async def test_rename_staged_file_commits_it_first(env: Env) -> None:
    cr = await env.create(b"s1")
    assert cr.obj is not None
    await env.write(cr.obj, 0, b"staged")
    assert (await env.rename(env.root, b"s1", env.root, b"s2")).status == NfsStat3.NFS3_OK
    assert env.data("rw/s2") == b"staged" and "rw/s1" not in keys(env.store)


async def test_rename_rules(env: Env) -> None:
    d = await env.fh("dir")
    assert (await env.rename(d, b"zz", d, b"yy")).status == NfsStat3.NFS3ERR_NOENT
    assert (await env.rename(d, b"a.txt", d, b"a.txt")).status == NfsStat3.NFS3_OK
    assert (
        await env.rename(env.root, b"top.bin", env.root, b"dir")
    ).status == NfsStat3.NFS3ERR_ISDIR
    assert (
        await env.rename(env.root, b"dir", env.root, b"top.bin")
    ).status == NfsStat3.NFS3ERR_NOTDIR
    assert (await env.rename(env.root, b"dir", d, b"inner")).status == NfsStat3.NFS3ERR_INVAL
    await env.mkdir(b"full")
    await env.create(b"x", await env.fh("full"))
    assert (
        await env.rename(env.root, b"dir", env.root, b"full")
    ).status == NfsStat3.NFS3ERR_NOTEMPTY
    ro = await env.mnt(b"/ro")
    r = await env.rename(ro.fhandle, b"top.bin", env.root, b"t2")
    assert r.status == NfsStat3.NFS3ERR_XDEV


async def test_rename_directory(env: Env) -> None:
    await env.mkdir(b"empty")
    await env.create(b"c.txt", await env.fh("dir"))
    env.reset_requests()
    r = await env.rename(env.root, b"dir", env.root, b"empty")  # onto an empty directory
    assert r.status == NfsStat3.NFS3_OK
    assert sorted(k for k in keys(env.store) if k.startswith("rw/empty/")) == [
        "rw/empty/",
        "rw/empty/a.txt",
        "rw/empty/b.txt",
        "rw/empty/c.txt",
    ]
    assert not [k for k in keys(env.store) if k.startswith("rw/dir/")]
    assert env.requests()["copy"] == 3 and env.requests()["delete"] == 3
    assert (await env.lookup(env.root, b"dir")).status == NfsStat3.NFS3ERR_NOENT
    assert set((await env.readdir(await env.fh("empty")))[1]) == {"a.txt", "b.txt", "c.txt"}
    assert await env.read_bytes(await env.fh("empty/a.txt")) == b"0123456789" * 3


async def test_rename_directory_over_the_limit_is_not_supported(tmp_path: Path) -> None:
    store = MemoryStore("mem")
    for i in range(6):
        store.seed(f"rw/many/f{i}", b"x")
    async with make_env(tmp_path, store, writes_rename_max_entries=5) as env:
        r = await env.rename(env.root, b"many", env.root, b"other")
        assert r.status == NfsStat3.NFS3ERR_NOTSUPP
        assert len([k for k in keys(store) if k.startswith("rw/many/")]) == 6


# -- LINK, MKNOD, read-only -----------------------------------------------------------------


async def test_link_not_supported_mknod_and_read_only(env: Env) -> None:
    fh = await env.fh("top.bin")
    lk = await env.nfs(Nfs3Proc.LINK, nfs3.Link3Args(fh, Diropargs3(env.root, b"hard")))
    assert lk.status == NfsStat3.NFS3ERR_NOTSUPP and lk.file_attributes is not None
    mk = await env.nfs(
        Nfs3Proc.MKNOD,
        nfs3.Mknod3Args(Diropargs3(env.root, b"fifo"), nfs3.Mknoddata3(Ftype3.NF3FIFO, Sattr3())),
    )
    assert mk.status == NfsStat3.NFS3_OK and mk.obj_attributes is not None
    assert mk.obj_attributes.type == Ftype3.NF3FIFO and mk.dir_wcc.after is not None
    ro = await env.mnt(b"/ro")
    root = ro.fhandle
    rofh = await env.fh("top.bin", root)
    env.reset_requests()
    for res in (
        await env.create(b"n", root),
        await env.mkdir(b"n", root),
        await env.symlink(b"n", b"t", root),
        await env.remove(b"top.bin", root),
        await env.rmdir(b"dir", root),
    ):
        assert res.status == NfsStat3.NFS3ERR_ROFS and res.dir_wcc.after is not None
    for res in (
        await env.write(rofh, 0, b"x", FILE_SYNC),
        await env.commit(rofh),
    ):
        assert res.status == NfsStat3.NFS3ERR_ROFS and res.file_wcc.after is not None
    sa = await env.setattr(rofh, Sattr3(mode=0))
    assert sa.status == NfsStat3.NFS3ERR_ROFS and sa.obj_wcc.after is not None
    rn = await env.rename(root, b"top.bin", root, b"x")
    assert rn.status == NfsStat3.NFS3ERR_ROFS and rn.todir_wcc.after is not None
    assert env.requests() == {}


# -- budget, write-back, verifier --------------------------------------------------------------


async def test_spool_budget_answers_jukebox_then_makes_room(tmp_path: Path) -> None:
    async with make_env(tmp_path, MemoryStore("mem"), writes_spool_bytes=2 * MiB) as env:
        a = (await env.create(b"a")).obj
        b = (await env.create(b"b")).obj
        assert a is not None and b is not None
        blob = os.urandom(MiB)
        assert (await env.write(a, 0, blob)).status == NfsStat3.NFS3_OK
        assert (await env.write(a, MiB, blob)).status == NfsStat3.NFS3_OK
        # rewriting staged bytes needs no new budget
        assert (await env.write(a, 0, blob)).status == NfsStat3.NFS3_OK
        w = await env.write(b, 0, b"x")
        assert w.status == NfsStat3.NFS3ERR_JUKEBOX
        # the largest staged file is committed in the background; the retry then fits
        for _ in range(200):
            if env.gateway.writes.spool.used_bytes == 0:
                break
            await asyncio.sleep(0.01)
        assert env.data("rw/a") == blob * 2
        assert (await env.write(b, 0, b"x")).status == NfsStat3.NFS3_OK
        assert env.gateway.writes.stats.jukebox == 1


async def test_idle_files_are_committed_without_commit(env: Env) -> None:
    cr = await env.create(b"lazy")
    assert cr.obj is not None
    await env.write(cr.obj, 0, b"never committed by the client")
    assert await env.gateway.writes.flush_idle(now=0.0) == 0  # not idle yet... (clock before write)
    assert await env.gateway.writes.flush_idle(now=1e12) == 1
    assert env.data("rw/lazy") == b"never committed by the client"


async def test_idle_files_are_found_by_the_write_path_clock(env: Env) -> None:
    """Staging reads its clock (``WriteManager(clock=)``), not the system's, for idle files."""
    clock = FakeClock(start=1e9)  # far from any system monotonic time
    env.gateway.writes._staging.clock = clock
    cr = await env.create(b"lazy")
    assert cr.obj is not None
    await env.write(cr.obj, 0, b"staged at the fake clock's time")
    assert await env.gateway.writes.flush_idle(now=1e9 - 1) == 0  # written after that
    assert await env.gateway.writes.flush_idle() == 1  # flush_idle_s is 0 here: idle now


async def test_base_replaced_under_staged_writes_is_rebased(env: Env) -> None:
    fh = await env.fh("dir/b.txt")
    await env.write(fh, 1, b"X")
    env.store.seed("rw/dir/b.txt", b"other writer")  # replaced behind our back
    cm = await env.commit(fh)
    assert cm.status == NfsStat3.NFS3_OK
    assert env.data("rw/dir/b.txt") == b"oXher writer"
    assert env.gateway.writes.stats.rebases == 1


async def test_base_replaced_after_our_own_commit_is_rebased(env: Env) -> None:
    # The base's metadata is cached (our own commit remembered it), so the first sign of
    # the replacement is the data reader's pinned GET failing: VersionChanged -> rebase.
    fh = await env.fh("dir/b.txt")
    await env.write(fh, 0, b"b")
    assert (await env.commit(fh)).status == NfsStat3.NFS3_OK
    await env.write(fh, 1, b"X")
    env.store.seed("rw/dir/b.txt", b"other writer")  # replaced behind our back
    cm = await env.commit(fh)
    assert cm.status == NfsStat3.NFS3_OK
    assert env.data("rw/dir/b.txt") == b"oXher writer"
    assert env.gateway.writes.stats.rebases == 1


async def test_write_verifier_differs_between_starts(tmp_path: Path) -> None:
    store = MemoryStore("mem")
    verfs = []
    for _ in range(2):
        async with make_env(tmp_path, store) as env:
            cr = await env.create(b"f")
            assert cr.obj is not None
            w = await env.write(cr.obj, 0, b"x")
            verfs.append(w.verf)
            assert (await env.commit(cr.obj)).verf == w.verf
    assert verfs[0] != verfs[1]


# -- the index keeps metadata across re-lists -----------------------------------------------------


async def test_relist_keeps_metadata_only_for_the_same_object_version() -> None:
    from gateway.backend.base import ObjectInfo
    from gateway.clock import FakeClock
    from gateway.namespace import EntryKind, Namespace

    clock = FakeClock()
    store = MemoryStore(clock=clock)
    ns = Namespace(store, "p/", clock=clock)
    a = store.seed("p/a", b"aaa", metadata={"mode": "600", "symlink-target": "x"})
    b = store.seed("p/b", b"bbb", metadata={"mode": "600"})
    assert (await ns.getattr("a")).kind is EntryKind.FILE  # a listing carries no metadata
    ns.upsert(ObjectInfo(a.key, a.size, a.etag, a.mtime_ns, a.metadata))
    ns.upsert(ObjectInfo(b.key, b.size, b.etag, b.mtime_ns, b.metadata))
    store.seed("p/b", b"new content")  # b replaced by another writer
    ns.invalidate("a")
    e = await ns.getattr("a")
    assert e.kind is EntryKind.SYMLINK and e.mode == 0o600
    e = await ns.getattr("b")
    assert e.kind is EntryKind.FILE and e.mode is None and e.size == 11


async def test_write_path_never_blocks_the_loop(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """asyncio debug mode reports any callback that holds the loop past the threshold; spool
    I/O runs in the spool's threads, so staging and committing 16 MiB reports none."""
    loop = asyncio.get_running_loop()
    loop.set_debug(True)
    loop.slow_callback_duration = 0.1
    caplog.set_level("WARNING", logger="asyncio")
    try:
        async with make_env(tmp_path, MemoryStore("mem")) as env:
            cr = await env.create(b"f")
            assert cr.obj is not None
            blob = os.urandom(MiB)
            for i in range(16):
                assert (await env.write(cr.obj, i * MiB, blob)).status == NfsStat3.NFS3_OK
            assert (await env.commit(cr.obj)).status == NfsStat3.NFS3_OK
            assert (await env.setattr(cr.obj, Sattr3(size=3 * MiB))).status == NfsStat3.NFS3_OK
            assert env.data("rw/f") == blob * 3
    finally:
        loop.set_debug(False)
    slow = [r.getMessage() for r in caplog.records if "took" in r.getMessage()]
    assert not slow, slow


async def test_restart_wipes_the_spool_and_aborts_orphaned_uploads(tmp_path: Path) -> None:
    import json

    store = MemoryStore("mem")
    upload_id = await store.create_multipart("rw/half")  # as a crashed run left it
    spool = tmp_path / "state" / "spool"
    spool.mkdir(parents=True)
    (spool / "abc.spool").write_bytes(b"stale data")
    (spool / "abc.upload").write_text(
        json.dumps({"export": "/rw", "key": "rw/half", "upload_id": upload_id})
    )
    async with make_env(tmp_path, store) as env:
        assert (await env.create(b"f")).status == NfsStat3.NFS3_OK  # first use
        for _ in range(100):
            if not store._uploads:
                break
            await asyncio.sleep(0.01)
        assert not store._uploads and env.gateway.writes.stats.orphan_uploads_aborted == 1
        assert not list(spool.iterdir())


def test_an_unreadable_upload_journal_is_logged_and_removed(tmp_path: Path) -> None:
    """A journal the restart cannot read leaves its upload in the bucket: it says so."""
    from structlog.testing import capture_logs

    from gateway.writes.spool import Spool

    (tmp_path / "abc.upload").write_text("{not json")
    spool = Spool(tmp_path, 1 << 20, 1)
    with capture_logs() as logs:
        spool.start()
    assert spool.orphan_uploads == [] and not list(tmp_path.iterdir())
    (event,) = [e for e in logs if e["event"] == "spool_journal_read_failed"]
    assert event["log_level"] == "warning" and "JSONDecodeError" in event["error"]


# -- a model check: random writes, truncations and commits --------------------------------------


@pytest.mark.parametrize("seed", range(12))
async def test_random_writes_match_a_bytearray_model(tmp_path: Path, seed: int) -> None:
    """Random WRITEs (in and out of order, overlapping, sparse), truncations, extensions and
    COMMITs on one file, checked against a bytearray after every commit: the object is
    byte-exact, whether its parts were streamed, re-uploaded or built from the base."""
    import random

    rnd = random.Random(seed)
    store = MemoryStore("mem")
    async with make_env(tmp_path, store) as env:
        cr = await env.create(b"m")
        assert cr.obj is not None
        model = bytearray()
        for _ in range(40):
            op = rnd.random()
            if op < 0.15:  # a sequential run over whole parts: they stream while it goes
                start = rnd.choice([0, PART, len(model)])
                blob = rnd.randbytes(2 * PART + rnd.randrange(MiB))
                for o in range(0, len(blob), MiB):
                    w = await env.write(cr.obj, start + o, blob[o : o + MiB])
                    assert w.status == NfsStat3.NFS3_OK
                if start > len(model):
                    model += bytes(start - len(model))
                model[start : start + len(blob)] = blob
                await asyncio.sleep(0.01)
            elif op < 0.7:
                off = rnd.choice([0, len(model), rnd.randrange(0, 3 * PART)])
                n = rnd.choice([1, 4096, 65536, MiB, rnd.randrange(1, 2 * MiB)])
                data = rnd.randbytes(n)
                stable = FILE_SYNC if rnd.random() < 0.05 else UNSTABLE
                w = await env.write(cr.obj, off, data, stable)
                assert w.status == NfsStat3.NFS3_OK
                if off > len(model):
                    model += bytes(off - len(model))
                model[off : off + n] = data
                if stable is FILE_SYNC:
                    assert env.data("rw/m") == bytes(model)
            elif op < 0.8:
                size = rnd.choice([0, len(model) // 2, len(model) + 1000, rnd.randrange(3 * PART)])
                r = await env.setattr(cr.obj, Sattr3(size=size))
                assert r.status == NfsStat3.NFS3_OK
                model = model[:size] + bytes(max(0, size - len(model)))
                assert env.data("rw/m") == bytes(model)
            else:
                assert (await env.commit(cr.obj)).status == NfsStat3.NFS3_OK
                assert env.data("rw/m") == bytes(model), seed
                assert (await env.attrs(cr.obj)).size == len(model)
        assert (await env.commit(cr.obj)).status == NfsStat3.NFS3_OK
        assert env.data("rw/m") == bytes(model)
        assert await env.read_all(cr.obj) == bytes(model)
        assert env.gateway.writes.spool.used_bytes == 0


async def test_write_racing_a_remove_never_recreates_the_file(env: Env) -> None:
    cr = await env.create(b"gone")
    assert cr.obj is not None
    # the WRITE resolves its handle, then waits for the path's lock the REMOVE holds
    writes = env.gateway.writes
    async with writes.lock(env.export("/rw"), "gone"):
        w = asyncio.create_task(env.write(cr.obj, 0, b"late", FILE_SYNC))
        key = (env.export("/rw").id, "gone")
        for _ in range(200):  # until the WRITE waits for the lock
            if writes._locks._locks[key][1] == 2:
                break
            await asyncio.sleep(0.005)
        assert writes._locks._locks[key][1] == 2
        await writes.delete_object(env.export("/rw"), "gone", is_dir=False)
    res = await w
    assert res.status == NfsStat3.NFS3ERR_STALE
    assert "rw/gone" not in keys(env.store) and writes.staged(env.export("/rw"), "gone") is None


async def test_backend_failures_leave_the_write_path_as_gateway_errors(env: Env) -> None:
    """The write path translates backend failures at its boundary: no handler sees a
    ``BackendError``, and a missing object there is one a handle pointed at (STALE)."""
    import dataclasses

    from gateway.backend.base import BackendError, BackendUnavailable, ObjectNotFound
    from gateway.errors import Busy, IoError, StaleHandle

    writes, export = env.gateway.writes, env.export("/rw")
    assert (await env.create(b"f")).status == NfsStat3.NFS3_OK
    e = await export.ns.getattr("f")
    env.store.fail = lambda op, key: BackendUnavailable("slow down") if op == "put" else None
    with pytest.raises(Busy):
        await writes.write(export, e, 0, b"x", True)
    env.store.fail = lambda op, key: BackendError("io") if op == "copy" else None
    with pytest.raises(IoError):
        await writes.rename_object(export, await export.ns.getattr("f"), "g")
    env.store.fail = lambda op, key: ObjectNotFound(key) if op == "head" else None
    with pytest.raises(StaleHandle):
        await writes.metadata(export, dataclasses.replace(e, etag="another version"))
    env.store.fail = None
