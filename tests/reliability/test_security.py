"""Security over TCP against a gateway serving SeaweedFS: forged and foreign file handles,
AUTH_SYS credentials at and past their limits, clients outside an export's list, names and
mount paths that try to leave the export, and root squashing.

- A forged handle (any byte of a real one changed, truncated, random, empty, another
  version or form) is NFS3ERR_BADHANDLE on every procedure that takes one, with no
  attributes in the reply; a handle over 64 bytes is GARBAGE_ARGS.
- A handle from a gateway with another secret is BADHANDLE; a well-signed handle of an
  export this gateway does not serve is STALE.
- AUTH_SYS with 17 gids or a 256-byte machine name is AUTH_BADCRED; 16 gids and 255 bytes
  are served.
- A client outside an export's ``clients`` cannot mount it (MNT3ERR_ACCES) and gets
  NFS3ERR_ACCES with that export's handles.
- ``..``, names with ``/`` and mount paths with ``..`` never reach an object outside the
  export's prefix, even in the same bucket.
- AUTH_SYS root creating a file on a ``root_squash`` export makes a file owned by the
  anonymous uid/gid (the kernel-client version is in tests/e2e).
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.exports import ExportConfig
from loadgen.seaweed import SeaweedServer
from nfsproto import mount3, nfs3, rpc
from nfsproto.nfs3 import Diropargs3, Nfs3Proc, NfsStat3
from nfsproto.rpc import AcceptStat, AuthStat, RejectStat
from nfsproto.xdr import Writer
from tests.e2e.tree import LONG_NAME, Tree
from tests.harness.thread import GatewayThread
from tests.reliability.rpcfuzz import credential_cases
from tests.rpcclient import BlockingRpcClient

pytestmark = [pytest.mark.s3]

OK = NfsStat3.NFS3_OK
BADHANDLE, STALE, ACCES = NfsStat3.NFS3ERR_BADHANDLE, NfsStat3.NFS3ERR_STALE, NfsStat3.NFS3ERR_ACCES
FILE = "train/n00000002/n00000002_00007.JPEG"


class Env:
    def __init__(self, gw: GatewayThread, tree: Tree) -> None:
        self.gw = gw
        self.tree = tree
        self.rpc = BlockingRpcClient("127.0.0.1", gw.port)
        self.root = self.rpc.mnt(b"/data").fhandle

    def lookup(self, path: str, root: bytes | None = None) -> Any:
        fh = root or self.root
        res: Any = None
        for name in path.split("/"):
            res = self.rpc.nfs(Nfs3Proc.LOOKUP, nfs3.Lookup3Args(Diropargs3(fh, name.encode())))
            if res.status != OK:
                return res
            fh = res.object
        return res

    def fh(self, path: str) -> bytes:
        res = self.lookup(path)
        assert res.status == OK, (path, res.status)
        fh: bytes = res.object
        return fh


@pytest.fixture(scope="module")
def env(
    seaweed: SeaweedServer, tree: Tree, tree_bucket: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Env]:
    # an object of the same bucket outside the export's prefix: nothing may reach it
    seaweed.boto3_client().put_object(Bucket=tree_bucket, Key="secret/key.txt", Body=b"secret")
    tmp: Path = tmp_path_factory.mktemp("security")
    exports = [
        ExportConfig("/data", f"s3://{tree_bucket}/{tree.prefix}", read_only=True, insecure=True),
        ExportConfig(
            "/private",
            f"s3://{tree_bucket}/{tree.prefix}",
            read_only=True,
            clients=(ipaddress.ip_network("10.20.0.0/16"),),
            insecure=True,
        ),
        ExportConfig("/squash", f"s3://{tree_bucket}/squash/", dir_mode=0o777, insecure=True),
    ]
    with GatewayThread(exports, state_dir=tmp / "state", s3=seaweed.store_kwargs()) as gw:
        e = Env(gw, tree)
        try:
            yield e
        finally:
            e.rpc.close()


def _handle_calls(fh: bytes) -> list[tuple[Nfs3Proc, Any]]:
    return [
        (Nfs3Proc.GETATTR, nfs3.Getattr3Args(fh)),
        (Nfs3Proc.ACCESS, nfs3.Access3Args(fh, 0x3F)),
        (Nfs3Proc.READ, nfs3.Read3Args(fh, 0, 4096)),
        (Nfs3Proc.LOOKUP, nfs3.Lookup3Args(Diropargs3(fh, b"x"))),
        (Nfs3Proc.READDIRPLUS, nfs3.Readdirplus3Args(fh, 0, bytes(8), 1024, 8192)),
        (Nfs3Proc.FSSTAT, nfs3.Fsstat3Args(fh)),
        (Nfs3Proc.READLINK, nfs3.Readlink3Args(fh)),
    ]


def _attrs(res: Any) -> Any:
    for name in ("obj_attributes", "file_attributes", "dir_attributes", "symlink_attributes"):
        if getattr(res, name, None) is not None:
            return getattr(res, name)
    return None


def _forgeries(fh: bytes) -> dict[str, bytes]:
    out = {
        f"byte {i} flipped": fh[:i] + bytes([fh[i] ^ 0x01]) + fh[i + 1 :] for i in range(len(fh))
    }
    out.update(
        {
            "empty": b"",
            "truncated to 11": fh[:11],
            "one byte short": fh[:-1],
            "one byte more": fh + b"\0",
            "random 64": os.urandom(64),
            "random 12": os.urandom(12),
            "version 2": b"\x02" + fh[1:],
            "form 7": fh[:1] + b"\x07" + fh[2:],
        }
    )
    return out


def test_forged_handles_are_badhandle_everywhere(env: Env) -> None:
    real = env.fh(FILE)
    forged = _forgeries(real)
    assert len(forged) > 40
    for what, fh in forged.items():
        for proc, args in _handle_calls(fh):
            res = env.rpc.nfs(proc, args)
            assert res.status == BADHANDLE, (what, proc.name, res.status)
            assert _attrs(res) is None, (what, proc.name)  # nothing about any file leaks


def test_long_path_handles_are_signed_too(env: Env) -> None:
    real = env.fh(f"extras/{LONG_NAME}")
    assert len(real) == 12 + 10 + 16  # the hashed form: parent hash + name hash
    for what, fh in _forgeries(real).items():
        res = env.rpc.nfs(Nfs3Proc.GETATTR, nfs3.Getattr3Args(fh))
        assert res.status in (BADHANDLE, STALE), (what, res.status)
        assert res.obj_attributes is None


def test_oversized_handle_is_garbage_args(env: Env) -> None:
    w = Writer()
    w.u32(65)
    w.raw(b"\1" * 68)
    h, _ = env.rpc.call_raw(nfs3.PROGRAM, 3, Nfs3Proc.GETATTR, w.getvalue())
    assert h.accept_stat == AcceptStat.GARBAGE_ARGS


def test_foreign_handles(
    env: Env, seaweed: SeaweedServer, tree: Tree, tree_bucket: str, tmp_path: Path
) -> None:
    """Handles minted by a gateway with another secret: BADHANDLE here. Handles of an export
    path this gateway does not serve (same secret): STALE."""
    backend = f"s3://{tree_bucket}/{tree.prefix}"
    with (
        GatewayThread(
            [
                ExportConfig("/data", backend, read_only=True, insecure=True),
                ExportConfig("/elsewhere", backend, read_only=True, insecure=True),
            ],
            state_dir=tmp_path / "other",
            s3=seaweed.store_kwargs(),
        ) as other,
        BlockingRpcClient("127.0.0.1", other.port) as o,
    ):
        theirs = [o.mnt(b"/data").fhandle, o.mnt(b"/elsewhere").fhandle]
        d = o.nfs(Nfs3Proc.LOOKUP, nfs3.Lookup3Args(Diropargs3(theirs[0], b"extras"))).object
        theirs.append(o.nfs(Nfs3Proc.LOOKUP, nfs3.Lookup3Args(Diropargs3(d, b"big.bin"))).object)
    for fh in theirs:
        for proc, args in _handle_calls(fh):
            assert env.rpc.nfs(proc, args).status == BADHANDLE, proc.name
    # same secret (copied state directory), an export path this gateway does not have
    state = env.gw.config.server.state_dir
    with (
        GatewayThread(
            [ExportConfig("/elsewhere", backend, read_only=True, insecure=True)],
            state_dir=state,
            s3=seaweed.store_kwargs(),
        ) as same,
        BlockingRpcClient("127.0.0.1", same.port) as s,
    ):
        fh = s.mnt(b"/elsewhere").fhandle
    res = env.rpc.nfs(Nfs3Proc.GETATTR, nfs3.Getattr3Args(fh))
    assert res.status == STALE


def _mnt_with(env: Env, cred: rpc.OpaqueAuth) -> rpc.ReplyHeader:
    w = Writer()
    mount3.pack_mnt3args(w, mount3.Mnt3Args(b"/data"))
    h, _ = env.rpc.call_raw(mount3.PROGRAM, 3, mount3.MountProc.MNT, w.getvalue(), cred=cred)
    return h


def test_auth_sys_limits(env: Env) -> None:
    for name, cred, outcome in credential_cases():
        h = _mnt_with(env, cred)
        if outcome == "ok":
            assert h.accept_stat == AcceptStat.SUCCESS, name
        else:
            assert h.reject_stat == RejectStat.AUTH_ERROR, (name, h)
            assert h.auth_stat == AuthStat[outcome], (name, h)
    # and an NFS call with a real handle: 17 gids rejected, 16 served
    w = Writer()
    nfs3.pack_getattr3args(w, nfs3.Getattr3Args(env.fh(FILE)))
    sixteen = rpc.auth_sys(1000, 1000, list(range(16)), b"m" * 255)
    h, _ = env.rpc.call_raw(nfs3.PROGRAM, 3, Nfs3Proc.GETATTR, w.getvalue(), cred=sixteen)
    assert h.accept_stat == AcceptStat.SUCCESS
    bad = {n: c for n, c, o in credential_cases() if o == "AUTH_BADCRED"}
    for n in ("17 gids", "256-byte name"):
        h, _ = env.rpc.call_raw(nfs3.PROGRAM, 3, Nfs3Proc.GETATTR, w.getvalue(), cred=bad[n])
        assert h.auth_stat == AuthStat.AUTH_BADCRED, n


def test_client_outside_the_list_is_denied(env: Env) -> None:
    res = env.rpc.mnt(b"/private")
    assert res.status == mount3.MountStat3.MNT3ERR_ACCES
    # a well-signed handle of the private export (as if leaked): every call is refused
    fh = env.gw.call(lambda: env.gw.export("/private").root_handle)
    for proc, args in _handle_calls(fh):
        res = env.rpc.nfs(proc, args)
        assert res.status == ACCES, proc.name
        assert _attrs(res) is None, proc.name


@pytest.mark.parametrize(
    "name",
    [b"..", b"../secret", b"../../secret/key.txt", b"a/../../secret", b"secret/key.txt", b"..\0"],
)
def test_names_never_leave_the_export(env: Env, name: bytes) -> None:
    res = env.rpc.nfs(Nfs3Proc.LOOKUP, nfs3.Lookup3Args(Diropargs3(env.root, name)))
    if res.status == OK:
        # ".." of the root is the root itself, nothing else
        assert name == b".." and res.obj_attributes.fileid == 1, (name, res)
    else:
        assert res.status in (
            NfsStat3.NFS3ERR_NOENT,
            NfsStat3.NFS3ERR_ACCES,
            NfsStat3.NFS3ERR_INVAL,
            NfsStat3.NFS3ERR_NAMETOOLONG,
        ), (name, res.status)
    # a LOOKUP of "secret" from the root finds nothing either
    assert env.lookup("secret").status == NfsStat3.NFS3ERR_NOENT


@pytest.mark.parametrize("path", [b"/data/..", b"/data/../secret", b"/data/../../", b"/../secret"])
def test_mount_paths_never_leave_the_export(env: Env, path: bytes) -> None:
    res = env.rpc.mnt(path)
    if res.status == mount3.MountStat3.MNT3_OK:
        a = env.rpc.nfs(Nfs3Proc.GETATTR, nfs3.Getattr3Args(res.fhandle))
        # whatever was mounted is inside /data: its listing is the export's
        rd = env.rpc.nfs(
            Nfs3Proc.READDIRPLUS, nfs3.Readdirplus3Args(res.fhandle, 0, bytes(8), 1024, 65536)
        )
        names = {e.name for e in rd.entries} - {b".", b".."}
        assert a.status == OK and b"secret" not in names and b"key.txt" not in names, names


def test_root_is_squashed(env: Env, seaweed: SeaweedServer, tree_bucket: str) -> None:
    root = env.rpc.mnt(b"/squash").fhandle
    res = env.rpc.nfs(
        Nfs3Proc.CREATE,
        nfs3.Create3Args(
            Diropargs3(root, b"by-root"),
            nfs3.CreateHow3(nfs3.CreateMode3.UNCHECKED, nfs3.Sattr3(mode=0o644)),
        ),
    )
    assert res.status == OK, res.status
    assert (res.obj_attributes.uid, res.obj_attributes.gid) == (65534, 65534)
    # asking for uid 0 explicitly does not help
    res = env.rpc.nfs(Nfs3Proc.SETATTR, nfs3.Setattr3Args(res.obj, nfs3.Sattr3(uid=0, gid=0)))
    assert res.status in (NfsStat3.NFS3ERR_PERM, ACCES), res.status
    head = seaweed.boto3_client().head_object(Bucket=tree_bucket, Key="squash/by-root")
    assert head["Metadata"].get("uid") == "65534", head["Metadata"]
