"""The write path with the real Linux NFS client (kernel 6.1 in QEMU, ``../shared/tools/kclient``)
over SeaweedFS: the kclient tool's ``phases.sh``, then ``kclient_write_phases.sh``, which runs
the same phases (mkdir, create, write, append, setattr, rename, symlink, link, statfs, rm,
rmdir) and checks each against local file-system behaviour, one line per phase.

The mount is ``soft,timeo=..,retrans=..`` and the run has a timeout, so a broken server fails
the test instead of hanging it. One QEMU guest per test (the machines are small). Phases that
differ from POSIX by design (``link``) are listed in ``EXPECTED`` and in docs/posix.md.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.backend.s3 import S3Store
from gateway.ops.config import ExportConfig
from tests.gwharness import GatewayThread
from tests.seaweed import SeaweedServer

KCLIENT = Path(__file__).resolve().parents[3] / "shared" / "tools" / "kclient"
LAB = Path(os.environ.get("KCLIENT_LAB", Path.home() / ".cache" / "kclient"))
CHECK = Path(__file__).with_name("kclient_write_phases.sh")
MOUNT_OPTS = "soft,timeo=100,retrans=3"
RUN_TIMEOUT_S = 400

# phase -> expected outcome (every phase "ok", except where object storage forbids it)
EXPECTED = {
    "mkdir": "ok",
    "create": "ok",
    "write": "ok",
    "append": "ok",
    "setattr": "ok",
    "rename": "ok",
    "symlink": "ok",
    "link": "notsupp",  # no hard links in an object store: NFS3ERR_NOTSUPP
    "statfs": "ok",
    "rm": "ok",
    "rmdir": "ok",
}


def _kclient_ready() -> str | None:
    if not (KCLIENT / "kclient-run").exists():
        return f"{KCLIENT}/kclient-run not found"
    if shutil.which("qemu-system-x86_64") is None:
        return "qemu-system-x86_64 not installed (run kclient-build)"
    if not ((LAB / "vmlinux").exists() or (LAB / "vmlinuz").exists()):
        return f"no guest kernel under {LAB} (run kclient-build)"
    return None


pytestmark = [
    pytest.mark.s3,
    pytest.mark.kclient,
    pytest.mark.skipif(_kclient_ready() is not None, reason=str(_kclient_ready())),
]


@pytest.fixture
def bucket(seaweed: SeaweedServer) -> Iterator[str]:
    name = f"kc-{uuid.uuid4().hex[:12]}"
    seaweed.create_bucket(name)
    try:
        yield name
    finally:
        seaweed.delete_bucket(name)


def _seed(seaweed: SeaweedServer, bucket: str) -> None:
    async def go() -> None:
        store = S3Store(bucket, **seaweed.store_kwargs())
        try:
            for i in range(3):
                await store.put(f"ds/class{i}/img{i}.jpg", bytes([i]) * (1000 + i))
            await store.put("ds/readme.txt", b"read me\n")
        finally:
            await store.close()

    asyncio.run(go())


def _kclient(port: int, script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            str(KCLIENT / "kclient-run"),
            "--opts",
            MOUNT_OPTS,
            "--timeout",
            str(RUN_TIMEOUT_S),
            "-q",
            str(port),
            "/data",
            "--",
            script,
        ],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S + 60,
    )


@pytest.fixture
def guest_scripts() -> Iterator[Path]:
    """The guest runs in the host's root over 9p, but its /tmp and /run are its own: a
    checkout (and ../shared) under /tmp is invisible there, so the scripts go to /var/tmp."""
    d = Path(tempfile.mkdtemp(prefix="nfsgw-kc-", dir="/var/tmp"))
    try:
        shutil.copy(KCLIENT / "phases.sh", d / "phases.sh")
        shutil.copy(CHECK, d / CHECK.name)
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_kernel_client_phases(
    seaweed: SeaweedServer, bucket: str, tmp_path: Path, guest_scripts: Path
) -> None:
    _seed(seaweed, bucket)
    exports = [ExportConfig("/data", f"s3://{bucket}/ds/", squash="none")]
    with GatewayThread(exports, state_dir=tmp_path / "state", s3=seaweed.store_kwargs()) as gw:
        script = (
            f"sh {guest_scripts / 'phases.sh'}; echo PHASES_SH_RC=$?; "
            f"sh {guest_scripts / CHECK.name}"
        )
        run = _kclient(gw.port, script)
        calls = gw.call_counts()
        statuses = gw.call(
            lambda: {k: h.count for k, h in gw.server.metrics.rpc.items() if k[1] != "ok"}
        )
        staged = gw.stats(lambda s: s.gateway.writes.stats)  # type: ignore[union-attr]

        async def read(key: str) -> bytes:
            store = S3Store(bucket, **seaweed.store_kwargs())
            try:
                return (await store.get("ds/" + key)).data
            finally:
                await store.close()

        assert run.returncode == 0, (run.returncode, run.stdout[-3000:], run.stderr[-3000:])
        small = gw.run(read("keep/small.txt"))
        big = gw.run(read("keep/big.bin"))
        sym = gw.run(read("keep/sym"))
        keys = gw.run(_list(seaweed, bucket))
    out = run.stdout
    print(out)  # the phase lines, for the record (pytest -s)
    assert run.returncode == 0, (run.returncode, out[-3000:], run.stderr[-3000:])
    assert "PHASES_SH_RC=0" in out, out
    assert "PHASES DONE" in out, (out, run.stderr[-3000:])
    got = dict(re.findall(r"^PHASE (\S+) (\S+)", out, re.M))
    assert got == EXPECTED, out
    # what the bucket holds is what the guest wrote
    assert small == b"hello from the guest\nmore\n"
    assert big == bytes(range(256)) * 16384
    assert sym == b"small.txt"
    assert not [k for k in keys if "/.kc_work/" in k or "/.kc_check/" in k], keys
    # the kernel used the write path's procedures and nothing was left staged
    for proc in ("CREATE", "MKDIR", "WRITE", "SETATTR", "RENAME", "SYMLINK", "REMOVE", "RMDIR"):
        assert calls[f"NFS3.{proc}"] > 0, proc
    assert staged["staged_files"] == 0 and staged["spool_bytes"] == 0
    # every error the client saw is one a local file system gives in the same place
    print(sorted(statuses.items()))
    allowed = {
        ("NFS3.LOOKUP", "NFS3ERR_NOENT"),  # the phase markers, names about to be created
        ("NFS3.MKDIR", "NFS3ERR_EXIST"),  # the second mkdir
        ("NFS3.LINK", "NFS3ERR_NOTSUPP"),
        ("NFS3.RMDIR", "NFS3ERR_NOTEMPTY"),
        # after a RENAME the client still holds the handle of the old name (handles name
        # keys); it gets STALE once, looks the new name up again and carries on
        ("NFS3.GETATTR", "NFS3ERR_STALE"),
        ("NFS3.ACCESS", "NFS3ERR_STALE"),
    }
    assert set(statuses) <= allowed, statuses
    renames = calls["NFS3.RENAME"]
    assert sum(n for (_, st), n in statuses.items() if st == "NFS3ERR_STALE") <= 2 * renames


async def _list(seaweed: SeaweedServer, bucket: str) -> list[str]:
    store = S3Store(bucket, **seaweed.store_kwargs())
    try:
        keys: list[str] = []
        token: str | None = None
        for _ in range(100):
            page = await store.list_page("ds/", delimiter=None, token=token)
            keys += [o.key for o in page.objects]
            token = page.next_token
            if token is None:
                break
        return keys
    finally:
        await store.close()
