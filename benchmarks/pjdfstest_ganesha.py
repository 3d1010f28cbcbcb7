"""pjdfstest through the Linux kernel client against nfs-ganesha (FSAL_VFS over a local ext4
folder): the reference column of docs/posix.md "Conformance" (issue 14). The nfsgw column
comes from ``tests/e2e/test_pjdfstest.py::test_pjdfstest_full``; both use the same guest
(``tests.e2e.guest``), runner (``tests/e2e/pjdfstest.sh``) and build of the suite.

    flock /tmp/nfsgw-heavy.lock .venv/bin/python benchmarks/pjdfstest_ganesha.py \\
        [--groups chmod,chown,...] [--json OUT]

nfs-ganesha needs rpcbind; so nothing reaches the host's, the script re-runs itself in private
network, mount and PID namespaces (``unshare``, as root; QEMU runs in there too, its user
networking reaching the namespace's loopback), as ``benchmarks/scale_index.py`` does. Prints
one line per test file and the totals; ``--json`` writes them.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import netns  # noqa: E402

from tests.e2e import pjdfstest  # noqa: E402
from tests.e2e.guest import Guest, GuestImage  # noqa: E402
from tests.e2e.test_pjdfstest import GROUPS  # noqa: E402

NFS_PORT, MNT_PORT = 20490, 20048


def inside(args: argparse.Namespace) -> int:
    netns.enter_namespace()
    work = Path(tempfile.mkdtemp(prefix="pjd-ganesha-", dir="/var/tmp"))
    export = work / "export"
    export.mkdir()
    export.chmod(0o777)
    procs = netns.start_ganesha(work, export, NFS_PORT, MNT_PORT, access="RW")
    try:
        time.sleep(8)  # ganesha's start-up (grace period off)
        tarball = pjdfstest.find_tarball()
        files = pjdfstest.job_files(
            tarball, pjdfstest.build(tarball), REPO / "tests" / "e2e" / "pjdfstest.sh"
        )
        tests = pjdfstest.suite_files(tarball, args.groups.split(","))
        opts = (
            f"vers=3,proto=tcp,mountproto=tcp,nolock,port={NFS_PORT},mountport={MNT_PORT},"
            "addr=10.0.2.2,soft,timeo=100,retrans=3"
        )
        run = Guest(GuestImage.ensure()).run(
            ". /job/pjdfstest.sh",
            nfs_port=NFS_PORT,
            timeout_s=args.timeout,
            env={"PJD_TESTS": " ".join(tests), "NFS_OPTS": opts, "PJD_EXPORT": str(export)},
            files=files,
        )
        results = pjdfstest.parse(run.output)
        if "PJD_DONE" not in run.output:
            print(run.describe())
        for name, r in sorted(results.items()):
            print(f"{name} cases={r.plan} passed={r.plan - r.failed} failed={r.failed}")
            for f in r.failures:
                print(f"  {f}")
        cases = sum(r.plan for r in results.values())
        passed = sum(r.plan - r.failed for r in results.values())
        done = "PJD_DONE" in run.output
        print(f"TOTAL files={len(results)} cases={cases} passed={passed} done={done}")
        if args.json:
            out = {
                n: {"plan": r.plan, "failed": r.failed, "failures": r.failures}
                for n, r in results.items()
            }
            Path(args.json).write_text(json.dumps(out, indent=1, sort_keys=True))
        return 0 if "PJD_DONE" in run.output else 1
    finally:
        netns.stop(procs)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--groups", default=",".join(GROUPS))
    p.add_argument("--json", default=None)
    p.add_argument("--timeout", type=float, default=4 * 3600.0)
    p.add_argument("--inside-namespace", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.inside_namespace:
        return inside(args)
    return netns.reexec_inside(__file__, None, args.timeout + 300)


if __name__ == "__main__":
    sys.exit(main())
