"""libnfs and the secure default (``secure_port``, knfsd's ``secure``): libnfs binds a reserved
source port (< 1024) when it can, i.e. as root, and an ephemeral one otherwise, so

- as root, libnfs mounts and reads an export with every default (secure);
- the same client as an unprivileged user (``nfs-cat`` under ``setpriv``, when this test runs
  as root; libnfs in-process otherwise) is refused at MNT, and reads an ``insecure = true``
  export.

Other tests whose clients are ours (ephemeral ports) say ``insecure = True`` in their own
configuration; this one holds what the default does to a real client.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from gateway.exports import ExportConfig
from tests.harness.thread import GatewayThread
from tests.libnfs import LibNfs, libnfs_available

pytestmark = [
    pytest.mark.libnfs,
    pytest.mark.skipif(not libnfs_available(), reason="libnfs (libnfs.so.13) is not installed"),
]

BODY = b"served only to privileged ports\n"
NOBODY = "65534"


def _nfs_cat_as_nobody(url: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "nfs-cat", url],
        capture_output=True,
        timeout=60,
        check=False,
    )


def test_libnfs_and_the_secure_default(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "f.txt").write_bytes(BODY)
    tree.chmod(0o755)
    exports = [
        ExportConfig("/data", f"file://{tree}", read_only=True),  # every default: secure
        ExportConfig("/open", f"file://{tree}", read_only=True, insecure=True),
    ]
    with GatewayThread(exports, state_dir=tmp_path / "state") as gw:
        if os.geteuid() == 0:
            with LibNfs(gw.libnfs_url("/data")) as nfs:  # a reserved port: admitted
                assert nfs.read_file("/f.txt") == BODY
            if shutil.which("setpriv") is None or shutil.which("nfs-cat") is None:
                pytest.skip("setpriv or nfs-cat missing: cannot run libnfs unprivileged")
            r = _nfs_cat_as_nobody(gw.libnfs_url("/data").replace("/data?", "/data/f.txt?"))
            assert r.returncode != 0 and BODY not in r.stdout
            r = _nfs_cat_as_nobody(gw.libnfs_url("/open").replace("/open?", "/open/f.txt?"))
            assert r.returncode == 0 and r.stdout == BODY, r.stderr
        else:
            with pytest.raises(OSError):
                LibNfs(gw.libnfs_url("/data"))
            with LibNfs(gw.libnfs_url("/open")) as nfs:
                assert nfs.read_file("/f.txt") == BODY
        denied = gw.server.gateway.stats.mounts_denied if gw.server.gateway else 0
        assert denied >= 1
