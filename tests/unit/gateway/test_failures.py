"""Failure replies (STYLE §3): dispatch is the one mapping site; handlers attach the body a
failure answers (wcc_data, post_op_attr) whatever layer failed; every failure is logged once,
at the level its error type carries, and counted by the status of the reply.

Calls go straight into the server's dispatcher (``tests.harness.memory``: no socket) over
an in-memory store whose failure hook injects backend errors.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from gateway.backend.base import BackendError, BackendUnavailable
from gateway.errors import IoError, NotFound
from gateway.exports import ExportConfig
from gateway.handlers.common import on_failure
from nfsproto import mount3, nfs3
from nfsproto.nfs3 import (
    CreateHow3,
    CreateMode3,
    Diropargs3,
    Ftype3,
    Nfs3Proc,
    NfsStat3,
    Remove3Res,
    Sattr3,
)
from tests.harness.memory import PEER, MemoryGateway

HANDLERS = Path(__file__).parents[3] / "gateway" / "handlers"


@pytest.fixture
async def gw(tmp_path: Path) -> AsyncIterator[MemoryGateway]:
    files = {"rw/dir/f.txt": b"hello", "rw/dir/g.txt": b"bye"}
    exports = [ExportConfig("/rw", "s3://b/rw/", squash="none")]
    async with MemoryGateway.of(tmp_path, exports, files=files) as gw:
        yield gw


async def fh(gw: MemoryGateway, path: str) -> bytes:
    return await gw.walk(await gw.mount(b"/rw"), path)


def fail_on(op: str, key: str, exc: BaseException) -> Any:
    def hook(o: str, k: str) -> BaseException | None:
        return exc if (o, k) == (op, key) else None

    return hook


async def test_backend_error_mid_mutation_still_answers_the_wcc_body(gw: MemoryGateway) -> None:
    d = await fh(gw, "dir")
    gw.store.fail = fail_on("put", "rw/dir/new", BackendError("put failed"))
    how = CreateHow3(CreateMode3.UNCHECKED, Sattr3(mode=0o644), b"\0" * 8)
    res = await gw.nfs(Nfs3Proc.CREATE, nfs3.Create3Args(Diropargs3(d, b"new"), how))
    assert res.status == NfsStat3.NFS3ERR_IO
    assert res.dir_wcc.before is not None and res.dir_wcc.after is not None
    assert res.dir_wcc.after.type == Ftype3.NF3DIR

    gw.store.fail = fail_on("delete", "rw/dir/g.txt", BackendError("delete failed"))
    res = await gw.nfs(Nfs3Proc.REMOVE, nfs3.Remove3Args(Diropargs3(d, b"g.txt")))
    assert res.status == NfsStat3.NFS3ERR_IO
    assert res.dir_wcc.before is not None and res.dir_wcc.after is not None

    f = await fh(gw, "dir/f.txt")
    gw.store.fail = fail_on("put", "rw/dir/f.txt", BackendError("put failed"))
    w = nfs3.Write3Args(f, 0, 3, nfs3.StableHow.FILE_SYNC, b"abc")
    res = await gw.nfs(Nfs3Proc.WRITE, w)
    assert res.status == NfsStat3.NFS3ERR_IO
    assert res.file_wcc.before is not None and res.file_wcc.after is not None
    assert res.file_wcc.after.size == 5  # the committed version, unchanged
    assert gw.statuses()[("NFS3.CREATE", "NFS3ERR_IO")] == 1
    assert gw.statuses()[("NFS3.REMOVE", "NFS3ERR_IO")] == 1
    assert gw.statuses()[("NFS3.WRITE", "NFS3ERR_IO")] == 1


async def test_failures_are_logged_once_at_their_level(gw: MemoryGateway) -> None:
    f = await fh(gw, "dir/f.txt")
    d = await fh(gw, "dir")
    read = nfs3.Read3Args(f, 0, 100)
    cases = [
        (BackendError("disk on fire"), NfsStat3.NFS3ERR_IO, "warning"),
        (BackendUnavailable("slow down"), NfsStat3.NFS3ERR_JUKEBOX, "info"),
    ]
    for exc, status, level in cases:
        gw.store.fail = fail_on("get", "rw/dir/f.txt", exc)
        with capture_logs() as logs:
            res = await gw.nfs(Nfs3Proc.READ, read)
        assert res.status == status
        failed = [x for x in logs if x["event"] == "call_failed"]
        assert len(failed) == 1, logs
        (line,) = failed
        assert line["log_level"] == level and line["status"] == status.name
        assert line["proc"] == "NFS3.READ" and line["xid"] == gw.xid
        assert line["client"] == PEER.host and "error" in line
        assert gw.statuses()[("NFS3.READ", status.name)] == 1
    gw.store.fail = None

    # an everyday answer: debug
    with capture_logs() as logs:
        res = await gw.nfs(Nfs3Proc.LOOKUP, nfs3.Lookup3Args(Diropargs3(d, b"nope")))
    assert res.status == NfsStat3.NFS3ERR_NOENT and res.dir_attributes is not None
    assert [(x["event"], x["log_level"]) for x in logs] == [("call_failed", "debug")]


async def test_a_crash_is_serverfault_logged_with_its_traceback(gw: MemoryGateway) -> None:
    f = await fh(gw, "dir/f.txt")
    gw.store.fail = fail_on("get", "rw/dir/f.txt", RuntimeError("a bug"))
    with capture_logs() as logs:
        res = await gw.nfs(Nfs3Proc.READ, nfs3.Read3Args(f, 0, 100))
    assert res.status == NfsStat3.NFS3ERR_SERVERFAULT
    (line,) = logs
    assert line["event"] == "call_crashed" and line["log_level"] == "error"
    assert line["exc_info"] is True and line["proc"] == "NFS3.READ"
    assert gw.statuses()[("NFS3.READ", "NFS3ERR_SERVERFAULT")] == 1


async def test_failure_bodies_of_checks(gw: MemoryGateway) -> None:
    d = await fh(gw, "dir")
    res = await gw.nfs(Nfs3Proc.READ, nfs3.Read3Args(d, 0, 100))
    assert res.status == NfsStat3.NFS3ERR_ISDIR
    assert res.file_attributes is not None and res.file_attributes.type == Ftype3.NF3DIR
    f = await fh(gw, "dir/f.txt")
    res = await gw.nfs(Nfs3Proc.LOOKUP, nfs3.Lookup3Args(Diropargs3(f, b"x")))
    assert res.status == NfsStat3.NFS3ERR_NOTDIR and res.dir_attributes is not None
    res = await gw.nfs(Nfs3Proc.READLINK, nfs3.Readlink3Args(f))
    assert res.status == NfsStat3.NFS3ERR_INVAL and res.symlink_attributes is not None
    res = await gw.nfs(
        Nfs3Proc.MKNOD,
        nfs3.Mknod3Args(Diropargs3(d, b"reg"), nfs3.Mknoddata3(Ftype3.NF3REG)),
    )
    assert res.status == NfsStat3.NFS3ERR_NOTSUPP and res.dir_wcc.after is not None
    # MOUNT answers the mountstat3 of the same number
    assert (await gw.mnt(b"/rw/dir/nope")).status == mount3.MountStat3.MNT3ERR_NOENT
    assert gw.statuses()[("MOUNT3.MNT", "MNT3ERR_NOENT")] == 1


async def test_a_shared_error_gets_a_body_per_call() -> None:
    shared = IoError("one failed listing, many waiters")
    got = []
    for wcc in (1, 2):
        with pytest.raises(IoError) as ei:
            async with on_failure(lambda s, wcc=wcc: Remove3Res(s, wcc)):  # type: ignore[misc]
                raise shared
        got.append(ei.value)
    assert [e.body.dir_wcc for e in got] == [1, 2]  # type: ignore[attr-defined]
    assert shared.body is None and all(e.__cause__ is shared for e in got)
    # a body attached in the block is kept
    with pytest.raises(NotFound) as ei2:
        async with on_failure(lambda s: Remove3Res(s)):
            raise NotFound("x").with_body("mine")
    assert ei2.value.body == "mine"


def test_no_handler_builds_failure_bodies_from_caught_errors() -> None:
    for path in sorted(HANDLERS.glob("*.py")):
        code = path.read_text()
        assert not re.search(r"^def \w+_fail\(", code, re.M), path.name
        assert "NfsStat3.NFS3ERR_" not in code, path.name  # raise an error instead
        assert "gateway.backend" not in code, path.name  # errors are translated below
        if path.name != "common.py":  # resolve_opt: LINK's optional attributes
            assert not re.search(r"(except|suppress)\W[^\n]*GatewayError", code), path.name
