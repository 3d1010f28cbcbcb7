"""The write path with the Linux kernel's NFSv3 client (``tests.e2e.guest``) over SeaweedFS,
phase by phase against local file-system behaviour: ``phases.sh`` (the typical operations of
a workload, each behind a marker LOOKUP), then ``posix_phases.sh``, which runs the same phases
(mkdir, create, write, append, setattr, rename, symlink, link, statfs, rm, rmdir) and checks
each against what a local file system does, one line per phase. From here: the bucket holds
what the guest wrote, the kernel used the write procedures, nothing stayed staged, and every
error status the gateway answered is one a local file system gives in the same place.

The mount is ``soft,timeo=100,retrans=3`` and the run has a timeout, so a broken server fails
the test instead of hanging it. Phases that differ from POSIX by design (``link``) are listed
in ``EXPECTED`` and in docs/posix.md.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from gateway.backend.s3 import S3Store
from gateway.exports import ExportConfig
from loadgen.seaweed import SeaweedServer
from tests.e2e.guest import SLIRP_INSECURE, Guest, GuestResult
from tests.harness.buckets import MakeBucket
from tests.harness.thread import GatewayThread

pytestmark = [pytest.mark.s3, pytest.mark.kclient]

HERE = Path(__file__).resolve().parent
RUN_TIMEOUT_S = 400.0
PATTERN = bytes(range(256)) * 16384  # /job/pattern.bin in the guest: 4 MiB

SCRIPT = r"""
nfs_mount /data /mnt/data || exit 9
cd /mnt/data
sh /job/phases.sh; echo PHASES_SH_RC=$?
sh /job/posix_phases.sh
"""

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

# Every error status the gateway may answer during the run: those a local file system gives
# in the same place.
ALLOWED_ERRORS = {
    ("NFS3.LOOKUP", "NFS3ERR_NOENT"),  # the phase markers, names about to be created
    ("NFS3.MKDIR", "NFS3ERR_EXIST"),  # the second mkdir
    ("NFS3.LINK", "NFS3ERR_NOTSUPP"),
    ("NFS3.RMDIR", "NFS3ERR_NOTEMPTY"),
    # after a RENAME the client still holds the handle of the old name (handles name keys); it
    # gets STALE once, looks the new name up again and carries on
    ("NFS3.GETATTR", "NFS3ERR_STALE"),
    ("NFS3.ACCESS", "NFS3ERR_STALE"),
}


@pytest.fixture
def bucket(make_bucket: MakeBucket) -> str:
    return make_bucket("kc")


async def _seed(seaweed: SeaweedServer, bucket: str) -> None:
    store = S3Store(bucket, **seaweed.store_kwargs())
    try:
        for i in range(3):
            await store.put(f"ds/class{i}/img{i}.jpg", bytes([i]) * (1000 + i))
        await store.put("ds/readme.txt", b"read me\n")
    finally:
        await store.close()


async def _bucket(seaweed: SeaweedServer, bucket: str) -> tuple[list[str], dict[str, bytes]]:
    """Every key under ds/, and the bodies of what posix_phases.sh keeps."""
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
        kept = {}
        for name in ("small.txt", "big.bin", "sym"):
            kept[name] = (await store.get(f"ds/keep/{name}")).data
        return keys, kept
    finally:
        await store.close()


def run_phases(guest: Guest, script: str, nfs_port: int) -> GuestResult:
    """``script`` in the guest with the two phase scripts and the pattern file."""
    return guest.run(
        script,
        nfs_port=nfs_port,
        timeout_s=RUN_TIMEOUT_S,
        timeo_ds=100,
        retrans=3,
        files={
            "phases.sh": (HERE / "phases.sh").read_bytes(),
            "posix_phases.sh": (HERE / "posix_phases.sh").read_bytes(),
            "pattern.bin": PATTERN,
        },
    )


def check_phases(run: GuestResult, seaweed: SeaweedServer, bucket: str) -> None:
    """Every phase as a local file system, and the bucket holds what the guest wrote."""
    out = run.output
    print(out)  # the phase lines, for the record (pytest -s)
    assert run.rc == 0 and not run.timed_out, run.describe()
    assert "PHASES_SH_RC=0" in out, run.describe()
    assert "PHASES DONE" in out, run.describe()
    got = dict(re.findall(r"^PHASE (\S+) (\S+)", out, re.M))
    assert got == EXPECTED, out
    keys, kept = asyncio.run(_bucket(seaweed, bucket))
    assert kept["small.txt"] == b"hello from the guest\nmore\n"
    assert kept["big.bin"] == PATTERN
    assert kept["sym"] == b"small.txt"
    assert not [k for k in keys if "/.kc_work/" in k or "/.kc_check/" in k], keys


def test_write_phases_behave_like_a_local_file_system(
    guest: Guest, seaweed: SeaweedServer, bucket: str, tmp_path: Path
) -> None:
    asyncio.run(_seed(seaweed, bucket))
    exports = [ExportConfig("/data", f"s3://{bucket}/ds/", squash="none", insecure=SLIRP_INSECURE)]
    with GatewayThread(exports, state_dir=tmp_path / "state", s3=seaweed.store_kwargs()) as gw:
        run = run_phases(guest, SCRIPT, gw.port)
        calls = gw.call_counts()
        statuses = gw.call(
            lambda: {k: h.count for k, h in gw.server.metrics.rpc.items() if k[1] != "ok"}
        )
        staged = gw.stats(lambda s: s.gateway.writes.stats)  # type: ignore[union-attr]
    check_phases(run, seaweed, bucket)
    # the kernel used the write path's procedures and nothing was left staged
    for proc in ("CREATE", "MKDIR", "WRITE", "SETATTR", "RENAME", "SYMLINK", "REMOVE", "RMDIR"):
        assert calls[f"NFS3.{proc}"] > 0, proc
    assert staged["staged_files"] == 0 and staged["spool_bytes"] == 0
    # every error the client saw is one a local file system gives in the same place
    print(sorted(statuses.items()))
    assert set(statuses) <= ALLOWED_ERRORS, statuses
    renames = calls["NFS3.RENAME"]
    assert sum(n for (_, st), n in statuses.items() if st == "NFS3ERR_STALE") <= 2 * renames
