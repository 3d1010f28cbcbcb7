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
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.e2e import pjdfstest  # noqa: E402
from tests.e2e.guest import Guest, GuestImage  # noqa: E402
from tests.e2e.test_pjdfstest import GROUPS  # noqa: E402

NFS_PORT, MNT_PORT = 20490, 20048
CONF = """\
NFS_CORE_PARAM {{
  Protocols = 3;
  NFS_Port = {nfs};
  MNT_Port = {mnt};
  Enable_NLM = false;
  Enable_RQUOTA = false;
}}
NFSV4 {{ Graceless = true; }}
EXPORT {{
  Export_Id = 1;
  Path = {path};
  Pseudo = {path};
  Access_Type = RW;
  Squash = No_Root_Squash;
  Protocols = 3;
  Transports = TCP;
  SecType = sys;
  FSAL {{ Name = VFS; }}
}}
"""


def inside(args: argparse.Namespace) -> int:
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True, timeout=30)
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", "/run"], check=True, timeout=30)
    work = Path(tempfile.mkdtemp(prefix="pjd-ganesha-", dir="/var/tmp"))
    export = work / "export"
    export.mkdir()
    export.chmod(0o777)
    Path("/run/rpcbind").mkdir(parents=True, exist_ok=True)
    rpcbind = subprocess.Popen(["rpcbind", "-f"], stdin=subprocess.DEVNULL)
    conf = work / "ganesha.conf"
    conf.write_text(CONF.format(nfs=NFS_PORT, mnt=MNT_PORT, path=export))
    pid = str(work / "ganesha.pid")
    ganesha = subprocess.Popen(
        ["ganesha.nfsd", "-F", "-L", str(work / "ganesha.log"), "-f", str(conf), "-p", pid],
        stdin=subprocess.DEVNULL,
    )
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
        for p in (ganesha, rpcbind):
            p.terminate()
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--groups", default=",".join(GROUPS))
    p.add_argument("--json", default=None)
    p.add_argument("--timeout", type=float, default=4 * 3600.0)
    p.add_argument("--inside-namespace", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.inside_namespace:
        return inside(args)
    cmd = ["unshare", "--net", "--mount", "--pid", "--fork", "--kill-child", "--mount-proc"]
    cmd += [sys.executable, str(Path(__file__).resolve()), *sys.argv[1:], "--inside-namespace"]
    return subprocess.run(cmd, timeout=args.timeout + 300).returncode


if __name__ == "__main__":
    sys.exit(main())
