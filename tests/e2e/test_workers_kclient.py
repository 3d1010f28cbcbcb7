"""The kernel client's write phases (``test_posix_phases``) with ``nconnect=4`` against
``nfsgw serve --workers 2``: the client spreads its calls (WRITEs of one file and their COMMIT
included) over four connections, the kernel spreads the connections over the two workers, and
the results are those of one process — every phase as a local file system, the bucket holding
what the guest wrote, nothing left staged, and only the errors a local file system gives.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from loadgen.gwprocess import GatewayProcess
from loadgen.seaweed import SeaweedServer
from tests.e2e.guest import SLIRP_INSECURE, Guest
from tests.e2e.test_posix_phases import ALLOWED_ERRORS, _seed, check_phases, run_phases
from tests.harness.buckets import MakeBucket

pytestmark = [pytest.mark.s3, pytest.mark.kclient]

HERE = Path(__file__).resolve().parent

SCRIPT = r"""
nfs_mount /data /mnt/data nconnect=4 || exit 9
cd /mnt/data
sh /job/phases.sh; echo PHASES_SH_RC=$?
sh /job/posix_phases.sh
"""


@pytest.fixture
def bucket(make_bucket: MakeBucket) -> str:
    return make_bucket("kw")


def _series(samples: dict[str, float], name: str) -> dict[str, float]:
    return {k: v for k, v in samples.items() if k.startswith(name + "{")}


def test_write_phases_with_two_workers_and_nconnect(
    guest: Guest, seaweed: SeaweedServer, bucket: str, tmp_path: Path
) -> None:
    asyncio.run(_seed(seaweed, bucket))
    gw = GatewayProcess(
        tmp_path,
        [
            {
                "path": "/data",
                "backend": f"s3://{bucket}/ds/",
                "squash": "none",
                "insecure": SLIRP_INSECURE,
            }
        ],
        s3=seaweed,
        workers=2,
    )
    with gw:
        run = run_phases(guest, SCRIPT, gw.port)
        m = gw.metrics()
    check_phases(run, seaweed, bucket)
    # Both workers took connections; those landing on worker 1 had their calls routed.
    per_worker = _series(m, "nfsgw_worker_rpc_requests_total")
    assert len(per_worker) == 2, per_worker
    assert m["nfsgw_routed_link_down_total"] == 0
    assert m["nfsgw_writes_staged_files"] == 0 and m["nfsgw_writes_spool_bytes"] == 0
    errors = {
        tuple(re.findall(r"=([^,}]+)", k)): v
        for k, v in _series(m, "nfsgw_rpc_requests_total").items()
        if "status=ok" not in k and v
    }
    print(sorted(errors.items()), per_worker, m["nfsgw_routed_calls_total"])
    assert set(errors) <= ALLOWED_ERRORS, errors
