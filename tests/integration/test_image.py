"""The OCI image (``deploy/image/build.sh``, ``make image``) started and mounted by a real client.

``podman run`` does not work in this sandbox (podman 4.3 loads the archive, but crun's
``setrlimit(RLIMIT_NPROC)`` fails: the sandbox withholds CAP_SYS_RESOURCE), so the test runs
the image the way a container runtime would, without one: the image's root filesystem
unpacked by ``umoci unpack`` (its runtime ``config.json`` gives the environment and the user),
started in new mount and PID namespaces (``unshare --mount --pid --fork``) with ``chroot``,
under the constraints deploy/kubernetes/base/daemonset.yaml sets:

- the root filesystem read-only; the state directory and /tmp empty tmpfs (the emptyDirs);
  the cache directory a directory of the host (the hostPath); /dev a tmpfs holding only the
  usual device nodes and /dev/shm (a runtime's; multiprocessing's semaphores, which the
  file export's lister process uses, need it);
- uid 0 with every capability dropped but CAP_NET_BIND_SERVICE (bounding set too) and
  no_new_privs (``allowPrivilegeEscalation: false``), through the image's own ``setpriv``;
- the host's network (``hostNetwork: true``): the gateway listens on 127.0.0.1.

The gateway (``nfsgw serve``, the entrypoint on the image's PATH, two workers under the
supervisor as in the manifests) serves a ``file://`` export of a tree the test writes
(bind-mounted read-only at /srv/data); libnfs (tests/libnfs.py) mounts it and reads every
file byte-exact; ``/readyz`` answers 200; the process is checked from the host
(``/proc/PID``: uid, capabilities, root, read-only ``/``); SIGTERM stops it with status 0.

The image is built by the test with ``NFSGW_IMAGE_CACHE=~/.cache/nfsgw-image``: the root
filesystem is rebuilt (1-2 min: wheels, mmdebstrap) only when pyproject.toml, the wheel's
inputs or the build script change, else reused (~10 s to assemble the image). Skipped where
mmdebstrap, umoci or libnfs are missing (``make image`` installs the first two), when not
root (umoci unpack and chroot), or with ``NFSGW_IMAGE_TEST=0``.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.libnfs import LibNfs, libnfs_available

TOP = Path(__file__).resolve().parents[2]
BUILD = TOP / "deploy" / "image" / "build.sh"
VERSION = tomllib.loads((TOP / "pyproject.toml").read_text())["project"]["version"]

pytestmark = [
    pytest.mark.libnfs,
    pytest.mark.skipif(os.environ.get("NFSGW_IMAGE_TEST") == "0", reason="NFSGW_IMAGE_TEST=0"),
    pytest.mark.skipif(
        not (shutil.which("mmdebstrap") and shutil.which("umoci")),
        reason="mmdebstrap or umoci missing (`make image` installs them)",
    ),
    pytest.mark.skipif(os.geteuid() != 0, reason="umoci unpack and chroot need root"),
    pytest.mark.skipif(not libnfs_available(), reason="libnfs (libnfs.so.13) is not installed"),
]

KiB = 1024
MiB = 1024 * KiB
CAP_NET_BIND_SERVICE = 10


@dataclass(frozen=True)
class Image:
    layout: Path
    archive: Path

    @property
    def ref(self) -> str:
        return f"{self.layout}:{VERSION}"


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Image:
    out = tmp_path_factory.mktemp("image")
    env = dict(os.environ)
    env["NFSGW_IMAGE_OUT"] = str(out)
    env.setdefault("NFSGW_IMAGE_CACHE", str(Path.home() / ".cache" / "nfsgw-image"))
    t0 = time.monotonic()
    proc = subprocess.run(
        ["bash", str(BUILD)], env=env, capture_output=True, text=True, timeout=900, check=False
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    sys.stderr.write(f"image built in {time.monotonic() - t0:.0f} s\n")
    archive = Path(proc.stdout.strip().splitlines()[-1])
    assert archive == out / f"nfsgw-{VERSION}.oci.tar" and archive.stat().st_size > 0
    return Image(out / "oci", archive)


def blob(layout: Path, digest: str) -> bytes:
    algo, hexdigest = digest.split(":")
    data = (layout / "blobs" / algo / hexdigest).read_bytes()
    assert hashlib.new(algo, data).hexdigest() == hexdigest
    return data


def test_image_labels_tag_and_config(image: Image) -> None:
    index = json.loads((image.layout / "index.json").read_text())
    (desc,) = index["manifests"]
    assert desc["annotations"]["org.opencontainers.image.ref.name"] == VERSION
    assert desc["annotations"]["io.containerd.image.name"] == f"localhost/nfsgw:{VERSION}"
    manifest = json.loads(blob(image.layout, desc["digest"]))
    config = json.loads(blob(image.layout, manifest["config"]["digest"]))
    labels = config["config"]["Labels"]
    head = subprocess.run(
        ["git", "-C", str(TOP), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert labels["org.opencontainers.image.version"] == VERSION
    assert labels["org.opencontainers.image.revision"].split("-")[0] == head
    assert labels["org.opencontainers.image.title"] == "nfsgw"
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
    assert labels["org.opencontainers.image.source"]
    assert (
        manifest["annotations"]["org.opencontainers.image.revision"]
        == labels["org.opencontainers.image.revision"]
    )
    assert config["config"]["User"] == "0:0"
    assert config["config"]["Entrypoint"] == ["nfsgw"]
    assert config["architecture"] == "amd64" and config["os"] == "linux"
    (layer,) = manifest["layers"]
    assert layer["mediaType"] == "application/vnd.oci.image.layer.v1.tar+gzip"
    # The archive holds the same layout.
    names = subprocess.run(
        ["tar", "-tf", str(image.archive)], capture_output=True, text=True, check=True
    ).stdout.split()
    assert "index.json" in names and "oci-layout" in names
    assert f"blobs/sha256/{layer['digest'].split(':')[1]}" in names


def make_tree(root: Path, seed: int = 36) -> dict[str, bytes]:
    rng = random.Random(seed)
    files = {
        f"train/c{i % 5}/img_{i:03d}.jpg": rng.randbytes(rng.randrange(1, 96 * KiB))
        for i in range(60)
    }
    files["large/shard.bin"] = rng.randbytes(3 * MiB + 17)  # several READs of rtmax
    files["empty"] = b""
    for rel, data in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    return files


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def proc_status(pid: int) -> dict[str, str]:
    status = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        k, _, v = line.partition(":")
        status[k] = v.strip()
    return status


def root_mount_options(pid: int) -> list[str]:
    for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[4] == "/":
            return fields[5].split(",")
    raise AssertionError("no / in the gateway's mountinfo")


def readyz(admin: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{admin}/readyz", timeout=5) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


@pytest.fixture
def bundle(image: Image, tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "bundle"
    subprocess.run(["umoci", "unpack", "--image", image.ref, str(path)], check=True)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def gateway_pid(parent: int, timeout: float = 30.0) -> int:
    """The host PID of the namespace's PID 1 (the gateway, after its execs): unshare's
    child."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
        if children:
            pid = int(children[0])
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if any(b"nfsgw" in a for a in cmdline) and b"serve" in cmdline:
                return pid
        time.sleep(0.1)
    raise AssertionError("the gateway did not start")


def test_image_serves_a_file_export_byte_exact_to_libnfs(bundle: Path, tmp_path: Path) -> None:
    rootfs = bundle / "rootfs"
    runtime = json.loads((bundle / "config.json").read_text())["process"]
    assert runtime["user"]["uid"] == 0 and runtime["user"]["gid"] == 0
    assert runtime["args"][:2] == ["nfsgw", "serve"]
    # The wheel's C extensions are what the image's interpreter imports.
    native = subprocess.run(
        [
            "chroot",
            str(rootfs),
            "/opt/nfsgw/bin/python",
            "-c",
            "import gateway._fastwire as a, gateway._checksums as b, gateway._s3list as c;"
            "print(a.__file__, b.__file__, c.__file__)",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert len(native) == 3 and all(
        p.startswith("/opt/nfsgw/lib/python3.11/site-packages/gateway/") and p.endswith(".so")
        for p in native
    ), native

    tree = tmp_path / "tree"
    files = make_tree(tree)
    cache = tmp_path / "hostcache"  # the hostPath
    cache.mkdir()
    (rootfs / "srv" / "data").mkdir(parents=True, exist_ok=True)
    port, admin = free_port(), free_port()
    argv = [
        runtime["args"][0],  # the entrypoint, found on the image's PATH
        "serve",
        "--listen=127.0.0.1",
        f"--port={port}",
        f"--admin-listen=127.0.0.1:{admin}",
        "--state-dir=/var/lib/nfsgw",
        "--cache-dir=/var/cache/nfsgw",
        "--workers=2",
        "--export=/data=file:///srv/data",
        "--read-only",
        "--insecure",
        "--cache-memory=64M",
        "--log-format=json",
    ]
    r = str(rootfs)
    # A container runtime's mounts: the image read-only, then the volumes on top.
    setup = f"""
set -eu
R={r}
mount --bind "$R" "$R"
mount -o remount,bind,ro "$R"
mount -t proc proc "$R/proc"
mount -t tmpfs -o mode=755,nosuid dev "$R/dev"
for d in null zero full random urandom; do
  touch "$R/dev/$d"; mount --bind "/dev/$d" "$R/dev/$d"
done
mkdir "$R/dev/shm"  # every runtime's (the file export's lister process needs semaphores)
mount -t tmpfs -o mode=1777,size=64m shm "$R/dev/shm"
mount -t tmpfs -o mode=700 state "$R/var/lib/nfsgw"
mount -t tmpfs -o mode=1777 tmp "$R/tmp"
mount --bind {cache} "$R/var/cache/nfsgw"
mount --bind {tree} "$R/srv/data"
mount -o remount,bind,ro "$R/srv/data"
exec chroot "$R" /usr/bin/env -i "$@"
"""
    setpriv = [
        "/usr/bin/setpriv",
        "--no-new-privs",
        "--bounding-set=-all,+net_bind_service",
        "--inh-caps=-all",
        "--",
    ]
    cmd = [
        "unshare",
        "--mount",
        "--pid",
        "--fork",
        "sh",
        "-c",
        setup,
        "sh",
        *runtime["env"],
        *setpriv,
        *argv,
    ]
    log = tmp_path / "gateway.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True
        )
    try:
        pid = gateway_pid(proc.pid)
        deadline = time.monotonic() + 90
        while readyz(admin) != 200:
            assert proc.poll() is None, log.read_text()[-4000:]
            assert time.monotonic() < deadline, log.read_text()[-4000:]
            time.sleep(0.3)

        # The process the manifests describe: uid 0, only CAP_NET_BIND_SERVICE, no way to
        # gain more, the image's interpreter, a read-only root.
        status = proc_status(pid)
        assert status["Uid"].split() == ["0"] * 4 and status["Gid"].split() == ["0"] * 4
        for key in ("CapEff", "CapPrm", "CapBnd"):
            assert int(status[key], 16) == 1 << CAP_NET_BIND_SERVICE, (key, status[key])
        assert int(status["CapInh"], 16) == 0 and int(status["CapAmb"], 16) == 0
        assert status["NoNewPrivs"] == "1"
        assert os.readlink(f"/proc/{pid}/root") == r
        assert os.readlink(f"/proc/{pid}/exe").startswith(r + "/usr/bin/python3")
        assert "ro" in root_mount_options(pid)

        url = f"nfs://127.0.0.1/data?nfsport={port}&mountport={port}&version=3"
        with LibNfs(url + "&auto-traverse-mounts=0") as nfs:
            assert sorted(nfs.listdir("/train")) == [f"c{i}" for i in range(5)]
            for rel in sorted(files):
                got = nfs.read_file("/" + rel)
                assert got == files[rel], rel
            assert nfs.stat("/large/shard.bin").size == len(files["large/shard.bin"])
        assert readyz(admin) == 200

        os.kill(pid, signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, log.read_text()[-4000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    text = log.read_text()
    assert "Traceback" not in text, text[-4000:]
    assert "was not built" not in text
