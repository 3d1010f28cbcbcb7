"""The POSIX rules pjdfstest checks (docs/posix.md "Conformance"), one test per rule,
over real TCP: SeaweedFS <- gateway (``tests.harness.thread``) <- our blocking RPC client
(``tests.rpcclient``), which lets each call carry the AUTH_SYS identity the rule is about.

What is checked: the status of each call, the attributes GETATTR reads back, and what the
bucket holds (read with our S3 store), never timings.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.backend.base import ObjectNotFound
from gateway.backend.s3 import S3Store
from gateway.exports import ExportConfig
from loadgen.seaweed import SeaweedServer
from nfsproto import nfs3, rpc
from nfsproto.nfs3 import (
    CreateHow3,
    CreateMode3,
    Diropargs3,
    Fattr3,
    Ftype3,
    Mknoddata3,
    Nfs3Proc,
    NfsStat3,
    NfsTime3,
    Sattr3,
    SetTime,
    Specdata3,
    StableHow,
    TimeHow,
)
from tests.harness.thread import GatewayThread
from tests.rpcclient import BlockingRpcClient

pytestmark = [pytest.mark.s3]

PREFIX = "px/"


def ts(t: NfsTime3) -> tuple[int, int]:
    return (t.seconds, t.nseconds)


def who(uid: int, gid: int, gids: tuple[int, ...] = ()) -> rpc.OpaqueAuth:
    return rpc.auth_sys(uid, gid, list(gids), b"posix-rules")


ROOT = who(0, 0, (0,))


class Client:
    """One connection; ``as_`` picks the identity of the next calls."""

    def __init__(self, port: int) -> None:
        self.c = BlockingRpcClient("127.0.0.1", port, cred=ROOT)
        self.root = self.c.mnt(b"/data").fhandle

    def as_(self, cred: rpc.OpaqueAuth) -> Client:
        self.c.cred = cred
        return self

    def nfs(self, proc: Nfs3Proc, args: Any) -> Any:
        return self.c.nfs(proc, args)

    def lookup(self, d: bytes, name: bytes) -> Any:
        return self.nfs(Nfs3Proc.LOOKUP, nfs3.Lookup3Args(Diropargs3(d, name)))

    def create(self, d: bytes, name: bytes, mode: int = 0o644) -> Any:
        how = CreateHow3(CreateMode3.GUARDED, Sattr3(mode=mode))
        return self.nfs(Nfs3Proc.CREATE, nfs3.Create3Args(Diropargs3(d, name), how))

    def mkdir(self, d: bytes, name: bytes, mode: int = 0o755) -> Any:
        return self.nfs(Nfs3Proc.MKDIR, nfs3.Mkdir3Args(Diropargs3(d, name), Sattr3(mode=mode)))

    def setattr(self, fh: bytes, s: Sattr3) -> NfsStat3:
        res = self.nfs(Nfs3Proc.SETATTR, nfs3.Setattr3Args(fh, s))
        return NfsStat3(res.status)

    def attrs(self, fh: bytes) -> Fattr3:
        res = self.nfs(Nfs3Proc.GETATTR, nfs3.Getattr3Args(fh))
        assert res.status == NfsStat3.NFS3_OK, res.status
        a: Fattr3 = res.obj_attributes
        return a

    def write(self, fh: bytes, data: bytes) -> NfsStat3:
        args = nfs3.Write3Args(fh, 0, len(data), StableHow.FILE_SYNC, data)
        return NfsStat3(self.nfs(Nfs3Proc.WRITE, args).status)

    def remove(self, d: bytes, name: bytes) -> NfsStat3:
        return NfsStat3(self.nfs(Nfs3Proc.REMOVE, nfs3.Remove3Args(Diropargs3(d, name))).status)

    def rename(self, d: bytes, a: bytes, b: bytes, to: bytes | None = None) -> NfsStat3:
        args = nfs3.Rename3Args(Diropargs3(d, a), Diropargs3(d if to is None else to, b))
        return NfsStat3(self.nfs(Nfs3Proc.RENAME, args).status)

    def mknod(self, d: bytes, name: bytes, what: Mknoddata3) -> Any:
        return self.nfs(Nfs3Proc.MKNOD, nfs3.Mknod3Args(Diropargs3(d, name), what))

    def close(self) -> None:
        self.c.close()


@pytest.fixture
def gw(seaweed: SeaweedServer, s3_bucket: str, tmp_path: Path) -> Iterator[GatewayThread]:
    exports = [ExportConfig("/data", f"s3://{s3_bucket}/{PREFIX}", squash="none", insecure=True)]
    with GatewayThread(exports, state_dir=tmp_path / "state", s3=seaweed.store_kwargs()) as g:
        yield g


@pytest.fixture
def nfs(gw: GatewayThread) -> Iterator[Client]:
    c = Client(gw.port)
    try:
        yield c
    finally:
        c.close()


def bucket_call(seaweed: SeaweedServer, bucket: str, fn: Any) -> Any:
    async def run() -> Any:
        store = S3Store(bucket, **seaweed.store_kwargs())
        try:
            return await fn(store)
        finally:
            await store.close()

    return asyncio.run(run())


def head_meta(seaweed: SeaweedServer, bucket: str, key: str) -> dict[str, str] | None:
    async def head(store: S3Store) -> dict[str, str] | None:
        try:
            return dict((await store.head(PREFIX + key)).metadata)
        except ObjectNotFound:
            return None

    result: dict[str, str] | None = bucket_call(seaweed, bucket, head)
    return result


def keys(seaweed: SeaweedServer, bucket: str) -> list[str]:
    async def listing(store: S3Store) -> list[str]:
        page = await store.list_page(PREFIX, delimiter=None, max_keys=1000)
        return [o.key[len(PREFIX) :] for o in page.objects]

    result: list[str] = bucket_call(seaweed, bucket, listing)
    return result


# -- (a) special files -----------------------------------------------------------------------


def test_mknod_makes_fifos_sockets_and_devices(
    nfs: Client, seaweed: SeaweedServer, s3_bucket: str
) -> None:
    made = {
        b"fifo": Mknoddata3(Ftype3.NF3FIFO, Sattr3(mode=0o640)),
        b"sock": Mknoddata3(Ftype3.NF3SOCK, Sattr3(mode=0o600)),
        b"chr": Mknoddata3(Ftype3.NF3CHR, Sattr3(mode=0o620), Specdata3(1, 3)),
        b"blk": Mknoddata3(Ftype3.NF3BLK, Sattr3(mode=0o660), Specdata3(8, 17)),
    }
    for name, what in made.items():
        res = nfs.mknod(nfs.root, name, what)
        assert res.status == NfsStat3.NFS3_OK, name
        a = nfs.attrs(nfs.lookup(nfs.root, name).object)
        assert a.type == what.type and a.size == 0, name
        assert what.attributes is not None and a.mode == what.attributes.mode
        assert (a.rdev.specdata1, a.rdev.specdata2) == (
            (what.spec.specdata1, what.spec.specdata2) if what.spec else (0, 0)
        )
    assert head_meta(seaweed, s3_bucket, "chr") == {
        "uid": "0",
        "gid": "0",
        "mode": "620",
        "type": "chr",
        "rdev": "1,3",
    }
    # chmod and chown work on them as on files; a second MKNOD of the name is EXIST
    fifo = nfs.lookup(nfs.root, b"fifo").object
    assert nfs.setattr(fifo, Sattr3(mode=0o600, uid=7)) == NfsStat3.NFS3_OK
    a = nfs.attrs(fifo)
    assert (a.type, a.mode, a.uid) == (Ftype3.NF3FIFO, 0o600, 7)
    assert nfs.mknod(nfs.root, b"fifo", made[b"fifo"]).status == NfsStat3.NFS3ERR_EXIST
    assert nfs.create(nfs.root, b"fifo").status == NfsStat3.NFS3ERR_EXIST
    # a regular file comes by CREATE, a directory by MKDIR; hard links stay unsupported
    assert nfs.mknod(nfs.root, b"reg", Mknoddata3(Ftype3.NF3REG)).status == (
        NfsStat3.NFS3ERR_NOTSUPP
    )
    link = nfs3.Link3Args(fifo, Diropargs3(nfs.root, b"hard"))
    assert nfs.nfs(Nfs3Proc.LINK, link).status == NfsStat3.NFS3ERR_NOTSUPP
    # renamed and removed like files
    assert nfs.rename(nfs.root, b"sock", b"sock2") == NfsStat3.NFS3_OK
    assert nfs.attrs(nfs.lookup(nfs.root, b"sock2").object).type == Ftype3.NF3SOCK
    for name in (b"fifo", b"sock2", b"chr", b"blk"):
        assert nfs.remove(nfs.root, name) == NfsStat3.NFS3_OK
    assert keys(seaweed, s3_bucket) == []


# -- (b) directories have their own attributes --------------------------------------------------


def test_directories_keep_mode_owner_and_times_on_their_marker(
    nfs: Client, seaweed: SeaweedServer, s3_bucket: str
) -> None:
    bucket_call(seaweed, s3_bucket, lambda s: s.put(PREFIX + "imp/x", b"x"))  # no marker
    mk = nfs.mkdir(nfs.root, b"d", 0o151)
    assert mk.status == NfsStat3.NFS3_OK and mk.obj_attributes.mode == 0o151
    d = mk.obj
    assert nfs.attrs(d).mode == 0o151
    assert nfs.setattr(d, Sattr3(mode=0o111)) == NfsStat3.NFS3_OK
    assert nfs.attrs(d).mode == 0o111
    assert nfs.setattr(d, Sattr3(mode=0o1777, uid=65534, gid=65533)) == NfsStat3.NFS3_OK
    a = nfs.attrs(d)
    assert (a.mode, a.uid, a.gid) == (0o1777, 65534, 65533)  # the sticky bit is kept
    t = NfsTime3(1_600_000_000, 0)
    setm = SetTime(TimeHow.SET_TO_CLIENT_TIME, t)
    assert nfs.setattr(d, Sattr3(atime=setm, mtime=setm)) == NfsStat3.NFS3_OK
    a = nfs.attrs(d)
    assert (a.atime, a.mtime) == (t, t)
    # (SeaweedFS drops the user metadata of "dir/" objects: the gateway's own view holds
    # them there; S3 keeps them on the marker, tests/unit/gateway/test_posix_attrs.py)
    # link count: 2 + subdirectories
    assert nfs.attrs(d).nlink == 2
    for sub in (b"s1", b"s2"):
        assert nfs.mkdir(d, sub).status == NfsStat3.NFS3_OK
    assert nfs.create(d, b"f").status == NfsStat3.NFS3_OK
    assert nfs.attrs(d).nlink == 4
    # an implicit directory (a prefix, no marker) gets a marker when its attributes are set
    imp = nfs.lookup(nfs.root, b"imp").object
    assert nfs.setattr(imp, Sattr3(mode=0o700, gid=5)) == NfsStat3.NFS3_OK
    a = nfs.attrs(imp)
    assert (a.mode, a.gid) == (0o700, 5)
    assert "imp/" in keys(seaweed, s3_bucket)
    # the mode is enforced: a directory without w for others refuses their CREATE
    nfs.as_(who(1000, 1000))
    assert nfs.create(imp, b"no").status == NfsStat3.NFS3ERR_ACCES
    # removing the last file keeps the directory and its attributes
    nfs.as_(ROOT)
    assert nfs.remove(imp, b"x") == NfsStat3.NFS3_OK
    assert nfs.attrs(imp).mode == 0o700 and "imp/" in keys(seaweed, s3_bucket)


def test_sticky_directory_lets_only_owners_remove_or_rename(nfs: Client) -> None:
    d = nfs.mkdir(nfs.root, b"tmp", 0o1777).obj
    nfs.as_(who(1000, 1000))
    assert nfs.create(d, b"mine").status == NfsStat3.NFS3_OK
    nfs.as_(who(2000, 2000))
    assert nfs.remove(d, b"mine") == NfsStat3.NFS3ERR_PERM
    assert nfs.rename(d, b"mine", b"taken") == NfsStat3.NFS3ERR_PERM
    nfs.as_(who(1000, 1000))
    assert nfs.rename(d, b"mine", b"still-mine") == NfsStat3.NFS3_OK
    assert nfs.remove(d, b"still-mine") == NfsStat3.NFS3_OK


def test_moving_a_directory_to_another_parent_needs_write_on_it(nfs: Client) -> None:
    a, b = nfs.mkdir(nfs.root, b"a", 0o777).obj, nfs.mkdir(nfs.root, b"b", 0o777).obj
    assert nfs.mkdir(a, b"x", 0o755).status == NfsStat3.NFS3_OK  # root's, not writable
    nfs.as_(who(65534, 65534))
    assert nfs.rename(a, b"x", b"x", to=b) == NfsStat3.NFS3ERR_ACCES  # its ".." would change
    assert nfs.rename(a, b"x", b"y") == NfsStat3.NFS3_OK  # same parent: w on a is enough
    assert nfs.lookup(a, b"y").status == NfsStat3.NFS3_OK


# -- (c) chown rules ------------------------------------------------------------------------------


def test_chown_rules_are_posix(nfs: Client) -> None:
    fh = nfs.create(nfs.root, b"f").obj
    assert nfs.setattr(fh, Sattr3(uid=1000, gid=100)) == NfsStat3.NFS3_OK
    other = who(2000, 2000, (2000, 100))
    owner = who(1000, 100, (100, 200))
    # anyone but root and the owner: EPERM, even for the owner and group it already has
    nfs.as_(other)
    assert nfs.setattr(fh, Sattr3(uid=1000)) == NfsStat3.NFS3ERR_PERM
    assert nfs.setattr(fh, Sattr3(gid=100)) == NfsStat3.NFS3ERR_PERM
    assert nfs.setattr(fh, Sattr3(uid=2000)) == NfsStat3.NFS3ERR_PERM
    # the owner: may name itself, may not give the file away
    nfs.as_(owner)
    assert nfs.setattr(fh, Sattr3(uid=1000)) == NfsStat3.NFS3_OK
    assert nfs.setattr(fh, Sattr3(uid=2000)) == NfsStat3.NFS3ERR_PERM
    # the group: one of the owner's (AUTH_SYS gids) or the one it has
    assert nfs.setattr(fh, Sattr3(gid=200)) == NfsStat3.NFS3_OK
    assert nfs.setattr(fh, Sattr3(gid=300)) == NfsStat3.NFS3ERR_PERM
    assert nfs.setattr(fh, Sattr3(uid=1000, gid=200)) == NfsStat3.NFS3_OK
    a = nfs.attrs(fh)
    assert (a.uid, a.gid) == (1000, 200)
    nfs.as_(ROOT)
    assert nfs.setattr(fh, Sattr3(uid=3000, gid=300)) == NfsStat3.NFS3_OK
    a = nfs.attrs(fh)
    assert (a.uid, a.gid) == (3000, 300)


# -- (d) set-user-ID and set-group-ID --------------------------------------------------------------


def test_setid_bits_are_cleared_by_writes_chown_and_foreign_groups(nfs: Client) -> None:
    writer = who(65534, 65534)
    for name, mode in ((b"u", 0o4777), (b"g", 0o2777), (b"ug", 0o6777)):
        fh = nfs.as_(ROOT).create(nfs.root, name, mode).obj
        assert nfs.attrs(fh).mode == mode
        assert nfs.as_(writer).write(fh, b"x") == NfsStat3.NFS3_OK
        assert nfs.attrs(fh).mode == 0o777, name
    # set-group-ID without group execute stays (a mandatory-locking file)
    fh = nfs.as_(ROOT).create(nfs.root, b"lock", 0o2666).obj
    assert nfs.as_(writer).write(fh, b"x") == NfsStat3.NFS3_OK
    assert nfs.attrs(fh).mode == 0o2666
    # a root writer keeps them
    fh = nfs.as_(ROOT).create(nfs.root, b"r", 0o4755).obj
    assert nfs.write(fh, b"x") == NfsStat3.NFS3_OK and nfs.attrs(fh).mode == 0o4755
    # chown clears them on files, not on directories
    assert nfs.setattr(fh, Sattr3(mode=0o6555)) == NfsStat3.NFS3_OK
    assert nfs.setattr(fh, Sattr3(uid=65534, gid=65533)) == NfsStat3.NFS3_OK
    assert nfs.attrs(fh).mode == 0o555
    d = nfs.mkdir(nfs.root, b"sd", 0o6555).obj
    assert nfs.setattr(d, Sattr3(uid=65534, gid=65533)) == NfsStat3.NFS3_OK
    assert nfs.attrs(d).mode == 0o6555
    # the owner setting set-group-ID for a group it is not in: the bit is dropped
    fh = nfs.create(nfs.root, b"owned").obj
    assert nfs.setattr(fh, Sattr3(uid=1000, gid=500)) == NfsStat3.NFS3_OK
    nfs.as_(who(1000, 100, (100,)))
    assert nfs.setattr(fh, Sattr3(mode=0o2755)) == NfsStat3.NFS3_OK
    assert nfs.attrs(fh).mode == 0o755
    assert nfs.setattr(fh, Sattr3(mode=0o1755)) == NfsStat3.NFS3_OK  # sticky: kept (Linux)
    assert nfs.attrs(fh).mode == 0o1755
    # a non-owner may not chmod at all
    nfs.as_(who(2000, 500, (500,)))
    assert nfs.setattr(fh, Sattr3(mode=0o777)) == NfsStat3.NFS3ERR_PERM


# -- (e) atime, (h) ctime --------------------------------------------------------------------------


def test_atime_is_its_own_attribute(nfs: Client, seaweed: SeaweedServer, s3_bucket: str) -> None:
    fh = nfs.create(nfs.root, b"t").obj
    at, mt = NfsTime3(1_900_000_000, 0), NfsTime3(1_950_000_000, 0)
    s = Sattr3(
        atime=SetTime(TimeHow.SET_TO_CLIENT_TIME, at),
        mtime=SetTime(TimeHow.SET_TO_CLIENT_TIME, mt),
    )
    assert nfs.setattr(fh, s) == NfsStat3.NFS3_OK
    a = nfs.attrs(fh)
    assert (a.atime, a.mtime) == (at, mt)
    s = Sattr3(atime=SetTime(TimeHow.SET_TO_CLIENT_TIME, NfsTime3(1_000_000_000, 1)))
    assert nfs.setattr(fh, s) == NfsStat3.NFS3_OK
    a = nfs.attrs(fh)
    assert (a.atime, a.mtime) == (NfsTime3(1_000_000_000, 1), mt)
    meta = head_meta(seaweed, s3_bucket, "t")
    assert meta is not None and meta["atime"] == "1000000000000000001"  # ns


def test_ctime_moves_on_chmod_and_chown(nfs: Client) -> None:
    fh = nfs.create(nfs.root, b"c").obj
    old = NfsTime3(1_000_000_000, 0)
    past = SetTime(TimeHow.SET_TO_CLIENT_TIME, old)
    assert nfs.setattr(fh, Sattr3(mtime=past)) == NfsStat3.NFS3_OK
    a0 = nfs.attrs(fh)
    assert a0.mtime == old and ts(a0.ctime) > ts(old)  # utimes moves ctime to now
    assert nfs.setattr(fh, Sattr3(mode=0o600)) == NfsStat3.NFS3_OK
    a1 = nfs.attrs(fh)
    assert ts(a1.ctime) > ts(a0.ctime) and a1.mtime == old  # chmod: ctime moves, mtime stays
    assert nfs.setattr(fh, Sattr3(uid=12)) == NfsStat3.NFS3_OK
    a2 = nfs.attrs(fh)
    assert ts(a2.ctime) > ts(a1.ctime) and a2.mtime == old
    assert nfs.write(fh, b"data") == NfsStat3.NFS3_OK
    a3 = nfs.attrs(fh)
    assert ts(a3.mtime) > ts(old) and a3.ctime == a3.mtime  # a write moves both


# -- (f) owner override ----------------------------------------------------------------------------


def test_owner_writes_and_truncates_a_file_it_created_read_only(nfs: Client) -> None:
    d = nfs.mkdir(nfs.root, b"o", 0o777).obj
    owner, other = who(1000, 1000), who(2000, 2000)
    fh = nfs.as_(owner).create(d, b"ro", 0).obj
    assert nfs.attrs(fh).mode == 0
    assert nfs.write(fh, b"written") == NfsStat3.NFS3_OK
    assert nfs.setattr(fh, Sattr3(size=3)) == NfsStat3.NFS3_OK
    assert nfs.attrs(fh).size == 3
    nfs.as_(other)
    assert nfs.write(fh, b"no") == NfsStat3.NFS3ERR_ACCES
    assert nfs.setattr(fh, Sattr3(size=0)) == NfsStat3.NFS3ERR_ACCES
    assert nfs.as_(owner).attrs(fh).size == 3


# -- (g) key length -------------------------------------------------------------------------------


def test_paths_past_the_key_limit_are_nametoolong(nfs: Client) -> None:
    name = b"n" * 255
    d = nfs.root
    for _ in range(3):  # "px/" + 3 x 256 bytes: within 1,024
        d = nfs.mkdir(d, name).obj
    # the fourth level would be past S3's 1,024 bytes: lookups and creates say so
    assert nfs.lookup(d, name).status == NfsStat3.NFS3ERR_NAMETOOLONG
    assert nfs.create(d, name).status == NfsStat3.NFS3ERR_NAMETOOLONG
    assert nfs.mkdir(d, name).status == NfsStat3.NFS3ERR_NAMETOOLONG
    assert nfs.lookup(d, b"short").status == NfsStat3.NFS3ERR_NOENT


# -- (i) open-then-deleted files (the Linux client's silly rename) -------------------------------


def test_silly_renamed_file_stays_reachable_and_leaves_nothing(
    nfs: Client, seaweed: SeaweedServer, s3_bucket: str
) -> None:
    d = nfs.mkdir(nfs.root, b"s").obj
    fh = nfs.create(d, b"open").obj
    assert nfs.write(fh, b"payload") == NfsStat3.NFS3_OK
    before = nfs.attrs(fh)
    # what the client does when an open file is removed: RENAME to .nfsXXXX ...
    assert nfs.rename(d, b"open", b".nfs0000000000abcdef00000001") == NfsStat3.NFS3_OK
    # ... keeps using the file's handle (GETATTR, WRITE): same file, same fileid
    a = nfs.attrs(fh)
    assert (a.fileid, a.size, a.mtime) == (before.fileid, before.size, before.mtime)
    assert nfs.write(fh, b"PAYLOAD") == NfsStat3.NFS3_OK
    new = nfs.lookup(d, b".nfs0000000000abcdef00000001")
    assert new.obj_attributes.fileid == before.fileid
    read = nfs.nfs(Nfs3Proc.READ, nfs3.Read3Args(fh, 0, 100))
    assert read.status == NfsStat3.NFS3_OK and bytes(read.data) == b"PAYLOAD"
    # ... and REMOVEs the silly name at the last close: nothing is left behind
    assert nfs.remove(d, b".nfs0000000000abcdef00000001") == NfsStat3.NFS3_OK
    res = nfs.nfs(Nfs3Proc.GETATTR, nfs3.Getattr3Args(fh))
    assert res.status == NfsStat3.NFS3ERR_STALE
    assert nfs.nfs(Nfs3Proc.RMDIR, nfs3.Rmdir3Args(Diropargs3(nfs.root, b"s"))).status == (
        NfsStat3.NFS3_OK
    )
    assert keys(seaweed, s3_bucket) == []
