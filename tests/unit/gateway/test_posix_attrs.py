"""Directory attributes on marker objects, special files, renamed files' old handles and the
attribute rules of docs/posix.md "Conformance", over the memory store (which, like S3, keeps
the metadata of ``dir/`` objects; SeaweedFS does not: tests/integration/test_posix_rules.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gateway.backend.memory import MemoryStore
from gateway.namespace.dirattrs import DirAttrs
from gateway.namespace.moved import Moved
from nfsproto import nfs3
from nfsproto.nfs3 import Diropargs3, Ftype3, Mknoddata3, Nfs3Proc, NfsStat3, Sattr3, Specdata3
from tests.unit.gateway.test_writes import Env, keys, make_env


def obj(res: Any) -> bytes:
    fh: bytes | None = res.obj
    assert fh is not None, res.status
    return fh


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    store = MemoryStore("mem")
    store.seed("rw/imp/x", b"x")  # an implicit directory: no marker
    async with make_env(tmp_path, store) as e:
        yield e


async def test_mkdir_and_setattr_store_directory_attributes_on_the_marker(env: Env) -> None:
    mk = await env.nfs(
        Nfs3Proc.MKDIR, nfs3.Mkdir3Args(Diropargs3(env.root, b"d"), Sattr3(mode=0o151))
    )
    assert mk.status == NfsStat3.NFS3_OK and mk.obj_attributes.mode == 0o151
    meta = env.meta("rw/d/")
    assert int(meta.pop("mtime")) == env.export("/rw").ns.clock.time_ns()  # created now
    assert meta == {"uid": "0", "gid": "0", "mode": "151"}
    d = mk.obj
    env.reset_requests()
    assert (await env.setattr(d, Sattr3(mode=0o1777, uid=7))).status == NfsStat3.NFS3_OK
    assert env.requests() == {"put": 1}  # the index knows the marker: no HEAD
    meta = env.meta("rw/d/")
    assert (meta["mode"], meta["uid"], meta["gid"]) == ("1777", "7", "0") and "ctime" in meta
    a = await env.attrs(d)
    assert (a.mode, a.uid) == (0o1777, 7)
    # an implicit directory: one HEAD (no marker), then the marker is written
    imp = await env.fh("imp")
    env.reset_requests()
    assert (await env.setattr(imp, Sattr3(mode=0o700))).status == NfsStat3.NFS3_OK
    assert env.requests() == {"head": 1, "put": 1}
    assert env.meta("rw/imp/")["mode"] == "700"
    # removing its last file rewrites the marker with the attributes it has
    assert (await env.remove(b"x", imp)).status == NfsStat3.NFS3_OK
    assert env.meta("rw/imp/")["mode"] == "700" and (await env.attrs(imp)).mode == 0o700


async def test_a_fresh_index_reads_directory_attributes_back_from_the_marker(
    env: Env,
) -> None:
    mk = await env.nfs(
        Nfs3Proc.MKDIR, nfs3.Mkdir3Args(Diropargs3(env.root, b"d"), Sattr3(mode=0o711))
    )
    d = mk.obj
    assert (await env.setattr(d, Sattr3(mode=0o750, gid=9))).status == NfsStat3.NFS3_OK
    ns = env.export("/rw").ns
    ns.dir_attrs.forget("d")  # as after a restart: the marker's metadata is unknown
    assert (await env.attrs(d)).mode == 0o755  # the export's default until a SETATTR
    assert (await env.setattr(d, Sattr3(uid=3))).status == NfsStat3.NFS3_OK
    a = await env.attrs(d)
    assert (a.mode, a.uid, a.gid) == (0o750, 3, 9)  # what the marker had was kept (HEAD)


async def test_directory_rename_carries_marker_attributes(env: Env) -> None:
    d = (
        await env.nfs(
            Nfs3Proc.MKDIR, nfs3.Mkdir3Args(Diropargs3(env.root, b"a"), Sattr3(mode=0o700))
        )
    ).obj
    sub = await env.nfs(Nfs3Proc.MKDIR, nfs3.Mkdir3Args(Diropargs3(d, b"s"), Sattr3(mode=0o711)))
    assert sub.status == NfsStat3.NFS3_OK
    f = obj(await env.create(b"f", sub.obj))
    dir_id = (await env.attrs(d)).fileid
    assert (await env.rename(env.root, b"a", env.root, b"b")).status == NfsStat3.NFS3_OK
    # the old handles follow the directory, which keeps its fileid (POSIX rename keeps
    # st_ino); files under it are copied with their metadata, their fileids are new
    assert (await env.attrs(d)).fileid == dir_id
    assert (await env.attrs(f)).size == 0
    assert env.meta("rw/b/")["mode"] == "700" and env.meta("rw/b/s/")["mode"] == "711"
    b = await env.fh("b")
    assert (await env.attrs(b)).mode == 0o700
    assert (await env.attrs(await env.fh("b/s"))).mode == 0o711
    assert not [k for k in keys(env.store) if k.startswith("rw/a/")]


async def test_directory_link_count_counts_subdirectories(env: Env) -> None:
    d = obj(await env.mkdir(b"p"))
    assert (await env.attrs(d)).nlink == 2
    for name in (b"s1", b"s2", b"s3"):
        assert (await env.mkdir(name, d)).status == NfsStat3.NFS3_OK
    assert (await env.create(b"f", d)).status == NfsStat3.NFS3_OK
    assert (await env.attrs(d)).nlink == 5
    assert (await env.rmdir(b"s2", d)).status == NfsStat3.NFS3_OK
    assert (await env.attrs(d)).nlink == 4


async def test_special_files_are_objects_with_type_and_device_metadata(env: Env) -> None:
    what = Mknoddata3(Ftype3.NF3BLK, Sattr3(mode=0o600), Specdata3(8, 1))
    mk = await env.nfs(Nfs3Proc.MKNOD, nfs3.Mknod3Args(Diropargs3(env.root, b"sda1"), what))
    assert mk.status == NfsStat3.NFS3_OK
    a = mk.obj_attributes
    assert (a.type, a.mode, a.rdev, a.size) == (Ftype3.NF3BLK, 0o600, Specdata3(8, 1), 0)
    assert env.meta("rw/sda1") == {
        "uid": "0",
        "gid": "0",
        "mode": "600",
        "type": "blk",
        "rdev": "8,1",
    }
    # a HEAD of a listed object reveals it, as for symlinks
    ns = env.export("/rw").ns
    assert (await ns.refresh("sda1")).special == "blk"


async def test_renamed_file_keeps_its_fileid_and_its_old_handle(env: Env) -> None:
    fh = obj(await env.create(b"f"))
    before = await env.attrs(fh)
    assert (await env.rename(env.root, b"f", env.root, b".nfs01")).status == NfsStat3.NFS3_OK
    after = await env.attrs(fh)  # the old handle still reaches the file
    assert after.fileid == before.fileid and after.mtime == before.mtime
    assert int(env.meta("rw/.nfs01")["ino"]) == before.fileid
    assert (await env.remove(b".nfs01")).status == NfsStat3.NFS3_OK
    res = await env.nfs(Nfs3Proc.GETATTR, nfs3.Getattr3Args(fh))
    assert res.status == NfsStat3.NFS3ERR_STALE
    # a new file at the old name is its own file, not the renamed one
    fh2 = obj(await env.create(b"f"))
    assert (await env.attrs(fh2)).fileid == before.fileid  # same path, same hash


def test_moved_follows_chains_and_is_bounded() -> None:
    m = Moved(3)
    m.add("a", "b")
    m.add("b", "c")
    assert m.target("a") == "c" and m.target("b") == "c" and m.target("x") is None
    m.add("d", "e")
    m.add("f", "g")
    assert len(m) == 3 and m.target("a") is None  # the oldest went
    assert m.target("f/x/y") == "g/x/y" and m.target("fx") is None  # under a moved dir
    m.add("e", "d")  # a cycle ends within MAX_HOPS
    assert m.target("d") in (None, "d", "e")


def test_dir_attrs_are_bounded_and_forget_subtrees() -> None:
    attrs = DirAttrs(2)
    assert attrs.record("a", {"mode": "700", "mtime": "1700000000"}) == 1_700_000_000 * 10**9
    attrs.record("a/b", {"uid": "5"})
    attrs.record("c", {})
    assert len(attrs) == 2 and attrs.get("a") is None
    attrs.record("a", {})
    attrs.forget("a")
    assert attrs.get("a/b") is None and attrs.get("a") is None
