"""nfs-ganesha side by side with nfsgw, without touching the host: private namespaces.

Owns: re-running a benchmark script inside private network, mount and PID namespaces
(``unshare``, as root) with its own loopback and its own ``/run`` (so ganesha's rpcbind never
meets the host's; when the script, their init, exits, the kernel ends every process left in
them), the check that ganesha can run here (installing it with apt-get when missing and root),
and ganesha itself (FSAL_VFS, NFSv3 over TCP only, its own ports, a private rpcbind).

Used by ``scale_index.py``, ``workers.py`` and ``pjdfstest_ganesha.py``. Must not: import
the gateway.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/: _common
from _common import wait_until

INSIDE_FLAG = "--inside-namespace"

GANESHA_CONF = """\
NFS_CORE_PARAM {{
  Protocols = 3;
  NFS_Port = {nfs_port};
  MNT_Port = {mnt_port};
  Enable_NLM = false;
  Enable_RQUOTA = false;
}}
NFSV4 {{ Graceless = true; }}
EXPORT {{
  Export_Id = 1;
  Path = {path};
  Pseudo = {path};
  Access_Type = {access};
  Squash = No_Root_Squash;
  Protocols = 3;
  Transports = TCP;
  SecType = sys;
  FSAL {{ Name = VFS; }}
}}
"""


def ganesha_prereqs() -> str:
    """'' when ganesha can run here, else why not (installs it when missing and root)."""
    if os.geteuid() != 0:
        return "skipped: needs root (its rpcbind runs in a private network namespace)"
    for tool in ("unshare", "ip", "mount"):
        if shutil.which(tool) is None:
            return f"skipped: {tool} not found"
    if shutil.which("ganesha.nfsd") is None or shutil.which("rpcbind") is None:
        if shutil.which("apt-get") is None:
            return "skipped: ganesha.nfsd not installed and no apt-get"
        print("installing nfs-ganesha nfs-ganesha-vfs rpcbind (apt-get)", flush=True)
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        r = subprocess.run(
            ["apt-get", "install", "-y", "nfs-ganesha", "nfs-ganesha-vfs", "rpcbind"],
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        if r.returncode != 0 or shutil.which("ganesha.nfsd") is None:
            return "skipped: apt-get install failed: " + r.stderr.strip()[-300:]
    return ""


def enter_namespace() -> None:
    """Inside ``unshare``: loopback up, a private /run for rpcbind's socket and lock."""
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True, timeout=30)
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", "/run"], check=True, timeout=30)


def reexec_inside(script: str, argv: Sequence[str] | None, timeout_s: float) -> int:
    """Run ``script`` again with ``argv`` (default: this process's) and ``INSIDE_FLAG`` in
    private network, mount and PID namespaces; its exit status."""
    cmd = ["unshare", "--net", "--mount", "--pid", "--fork", "--kill-child", "--mount-proc"]
    own = list(sys.argv[1:] if argv is None else argv)
    cmd += [sys.executable, str(Path(script).resolve()), *own, INSIDE_FLAG]
    with subprocess.Popen(cmd) as child:
        try:
            return child.wait(timeout_s)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
            return 1
        except KeyboardInterrupt:
            child.send_signal(2)
            child.wait(60)
            return 130


def start_ganesha(
    work: Path, path: Path, nfs_port: int, mnt_port: int, access: str = "RO"
) -> list[subprocess.Popen[bytes]]:
    """rpcbind and ganesha exporting ``path`` (only inside the namespaces): the processes,
    for ``stop``. The caller waits until ganesha serves (a mount that succeeds)."""
    work.mkdir(parents=True, exist_ok=True)
    Path("/run/rpcbind").mkdir(parents=True, exist_ok=True)
    rpcbind = subprocess.Popen(
        ["rpcbind", "-f"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL
    )
    try:
        wait_until(Path("/run/rpcbind.sock").exists, timeout_s=10.0, what="rpcbind")
    except RuntimeError:
        stop([rpcbind])
        raise
    conf = work / "ganesha.conf"
    conf.write_text(
        GANESHA_CONF.format(nfs_port=nfs_port, mnt_port=mnt_port, path=path, access=access)
    )
    argv = ["ganesha.nfsd", "-F", "-L", str(work / "ganesha.log"), "-f", str(conf)]
    argv += ["-p", str(work / "ganesha.pid")]
    ganesha = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    return [ganesha, rpcbind]


def stop(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(30)


def main_beside_ganesha(
    script: str,
    argv: Sequence[str] | None,
    args: argparse.Namespace,
    run: Callable[[argparse.Namespace, bool, str], int],
    timeout_s: float,
    log: Callable[[str], None],
) -> int:
    """The ``main`` of a benchmark that runs nfs-ganesha beside nfsgw: inside the namespaces,
    ``run(args, True, "")``; where ganesha cannot run (or ``args.no_ganesha``), ``run(args,
    False, why)`` here; else ``script`` again inside private namespaces (``reexec_inside``:
    the kernel ends every process left in them when the script, their init, exits)."""
    if args.inside_namespace:
        enter_namespace()
        return run(args, True, "")
    note = "skipped: --no-ganesha" if args.no_ganesha else ganesha_prereqs()
    if note:
        log(f"nfs-ganesha {note}")
        return run(args, False, note)
    return reexec_inside(script, argv, timeout_s)
