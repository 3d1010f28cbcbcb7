"""The Linux NFS client in a QEMU guest, for end-to-end tests: the guest image, built from
Debian packages, and one guest run at a time.

Owns: downloading the kernel and busybox packages (``apt-get download``, no root needed) into
a cache directory, turning them into a bootable kernel and a small initramfs, and running a
shell script in a guest that mounts gateways on this host. Must not: start gateways or know
about datasets (the tests do); leave a QEMU process behind (every run is bounded by a timeout
and killed at it).

The image
---------
``GuestImage.ensure()`` builds, under ``$NFSGW_E2E_CACHE`` (default ``~/.cache/nfsgw-e2e``):

- ``vmlinux``: the ELF kernel unpacked from the package's bzImage (QEMU boots it through its
  PVH entry point, which skips the real-mode set-up and the in-guest decompression: seconds
  under TCG), or the bzImage itself when it cannot be unpacked;
- ``initramfs.gz``: a newc cpio (written here) holding busybox, ``/init``
  (``guest_init.sh``), a ``/dev/console`` node, and the NFS client and virtio network modules
  with everything they depend on, decompressed, plus ``/modules/order``: the file names in an
  order where every module comes after its dependencies (read from each module's ELF
  ``.modinfo`` section), so ``/init`` can ``insmod`` them one by one without ``depmod``.

It is rebuilt when the kernel package ``linux-image-amd64`` resolves to changes.

A run
-----
``Guest(image).start(script, ...)`` appends a second, uncompressed cpio to the initramfs with
``/job/run.sh`` (the script), ``/job/env`` (``NFS_PORT`` and the mount options) and the run's
``files`` (more scripts, data known to the host) under ``/job/``, boots
QEMU with user networking (the guest's 10.0.2.2 is this host's 127.0.0.1, so gateways listen on
127.0.0.1 only), and returns a ``GuestRun``. The script's stdout and stderr go to the guest's
second serial port, a file here that can be read while the guest runs (``GuestRun.output``);
the first serial port is the kernel console. ``/init`` ends the output with
``@@E2E-RC <status>`` and powers off. ``GuestRun.wait()`` returns a ``GuestResult``; past the
timeout QEMU is killed and the result says so.

Inside the guest the script has busybox (``sh``, ``md5sum``, ``find``, ``stat``, ``shuf``,
``xargs -P``, ``dd``, ``cmp``, ...) and these helpers from ``/init``:

- ``nfs_mount EXPORT DIR [OPTIONS]``: mount ``10.0.2.2:EXPORT`` with NFSv3 over TCP, both
  NFS and MOUNT on ``$NFS_PORT`` (so no portmapper), ``nolock``, the run's ``soft`` timeouts,
  plus OPTIONS;
- ``drop_caches [N]``: ``sync`` and write N (default 3) to ``/proc/sys/vm/drop_caches``.

Mounts are ``soft`` with a timeout (``timeo``/``retrans``): a broken server makes the
guest's calls fail with EIO, the script reports it, and the test fails instead of hanging; the
run's own timeout is the last resort.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import lzma
import os
import re
import shutil
import struct
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

__all__ = [
    "GuestImage",
    "Guest",
    "GuestRun",
    "GuestResult",
    "ImageUnavailable",
    "qemu_binary",
]

HERE = Path(__file__).resolve().parent
INIT_SCRIPT = HERE / "guest_init.sh"
KERNEL_META = "linux-image-amd64"
BUSYBOX_PKG = "busybox-static"
# The NFSv3 client over TCP and the guest's network card; their dependencies are added.
WANTED_MODULES = ("nfsv3", "virtio_net", "virtio_pci")
RC_MARK = "@@E2E-RC"
# QEMU's user-mode network (libslirp) carries each guest TCP connection on a new host socket
# that it connect()s without bind() (tcp_fconnect: "we don't care what port we get"), so the
# gateway sees 127.0.0.1 and an ephemeral port (>= 32768), whatever reserved port the guest's
# kernel client bound. Every export a guest mounts therefore says insecure = true (the
# product default, secure, would refuse it: docs/operations.md "Security").
SLIRP_INSECURE = True
QEMU = "qemu-system-x86_64"


class ImageUnavailable(Exception):
    """The guest image cannot be built here (no apt, no network, no package)."""


def qemu_binary() -> str | None:
    return shutil.which(QEMU)


def default_cache() -> Path:
    env = os.environ.get("NFSGW_E2E_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "nfsgw-e2e"


# --------------------------------------------------------------------------- cpio (newc)


class Cpio:
    """Writes a newc ("070701") cpio archive, the format the kernel unpacks as initramfs."""

    def __init__(self) -> None:
        self._buf = io.BytesIO()
        self._ino = 0x1000

    def _entry(
        self, name: str, mode: int, data: bytes = b"", rdev: tuple[int, int] = (0, 0)
    ) -> None:
        self._ino += 1
        raw = name.encode() + b"\0"
        fields = (
            self._ino,
            mode,
            0,  # uid
            0,  # gid
            2 if mode & 0o170000 == 0o040000 else 1,
            0,  # mtime: fixed, so the archive is reproducible
            len(data),
            0,  # devmajor
            0,  # devminor
            rdev[0],
            rdev[1],
            len(raw),
            0,  # check
        )
        head = b"070701" + b"".join(b"%08X" % f for f in fields)
        self._buf.write(head + raw)
        self._pad()
        self._buf.write(data)
        self._pad()

    def _pad(self) -> None:
        self._buf.write(b"\0" * (-self._buf.tell() % 4))

    def directory(self, name: str) -> None:
        self._entry(name, 0o040755)

    def file(self, name: str, data: bytes, mode: int = 0o644) -> None:
        self._entry(name, 0o100000 | mode, data)

    def chardev(self, name: str, major: int, minor: int) -> None:
        self._entry(name, 0o020600, rdev=(major, minor))

    def finish(self) -> bytes:
        self._entry("TRAILER!!!", 0)
        self._buf.write(b"\0" * (-self._buf.tell() % 512))
        return self._buf.getvalue()


# --------------------------------------------------------------------------- kernel modules


def modinfo(elf: bytes) -> dict[str, str]:
    """The ``key=value`` strings of a module's ``.modinfo`` section (ELF64 little-endian)."""
    if elf[:4] != b"\x7fELF" or elf[4] != 2 or elf[5] != 1:
        raise ValueError("not an ELF64 little-endian object")
    (shoff,) = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)

    def section(i: int) -> tuple[int, int, int]:
        base = shoff + i * shentsize
        name, _type, _flags, _addr, off, size = struct.unpack_from("<IIQQQQ", elf, base)
        return name, off, size

    _, str_off, _ = section(shstrndx)
    for i in range(shnum):
        name_off, off, size = section(i)
        end = elf.index(b"\0", str_off + name_off)
        if elf[str_off + name_off : end] == b".modinfo":
            out: dict[str, str] = {}
            for item in elf[off : off + size].split(b"\0"):
                k, sep, v = item.decode("utf-8", "replace").partition("=")
                if sep and k not in out:
                    out[k] = v
            return out
    return {}


def _module_name(path: str) -> str:
    base = path.rsplit("/", 1)[-1]
    return base.split(".ko", 1)[0].replace("-", "_")


def load_order(modules: Mapping[str, bytes], wanted: Iterable[str], builtin: set[str]) -> list[str]:
    """Module names in an order where each comes after what it depends on (depth first from
    ``wanted``). ``modules`` maps names to decompressed ``.ko`` bytes; dependencies that are
    built into the kernel are skipped."""
    order: list[str] = []
    state: dict[str, int] = {}  # 1: visiting, 2: done

    def visit(name: str, chain: tuple[str, ...]) -> None:
        if state.get(name) == 2 or name in builtin:
            return
        if state.get(name) == 1:
            raise ImageUnavailable(f"module dependency cycle: {' -> '.join((*chain, name))}")
        if name not in modules:
            raise ImageUnavailable(f"module {name} (needed by {' -> '.join(chain)}) not found")
        state[name] = 1
        deps = modinfo(modules[name]).get("depends", "")
        for d in filter(None, deps.split(",")):
            visit(d.replace("-", "_"), (*chain, name))
        state[name] = 2
        order.append(name)

    for w in wanted:
        visit(w, ())
    return order


# --------------------------------------------------------------------------- packages


def _run(cmd: list[str], cwd: Path | None = None, timeout: float = 600) -> str:
    try:
        p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ImageUnavailable(f"{' '.join(cmd)}: {e}") from None
    if p.returncode != 0:
        raise ImageUnavailable(f"{' '.join(cmd)}: exit {p.returncode}: {p.stderr.strip()[-500:]}")
    return p.stdout


def resolve_kernel_package(meta: str = KERNEL_META) -> str:
    """``linux-image-amd64`` -> the versioned image package it depends on (package lists
    missing: refreshed once, as root)."""
    try:
        out = _run(["apt-cache", "depends", meta])
    except ImageUnavailable:
        if os.geteuid() != 0:
            raise
        _run(["apt-get", "update", "-q"])
        out = _run(["apt-cache", "depends", meta])
    m = re.search(r"Depends:\s*(linux-image-\d\S*)", out)
    if m is None:
        raise ImageUnavailable(f"apt-cache depends {meta}: no versioned linux-image dependency")
    return m.group(1)


def download(package: str, into: Path) -> Path:
    """The package's .deb in ``into``, downloaded with ``apt-get download`` unless there.
    Stale package lists are refreshed once (as root) when the download fails."""
    found = sorted(into.glob(f"{package}_*.deb"))
    if found:
        return found[-1]
    try:
        _run(["apt-get", "download", "-q", package], cwd=into)
    except ImageUnavailable:
        if os.geteuid() != 0:
            raise
        _run(["apt-get", "update", "-q"])
        _run(["apt-get", "download", "-q", package], cwd=into)
    found = sorted(into.glob(f"{package}_*.deb"))
    if not found:
        raise ImageUnavailable(f"apt-get download {package} left no .deb in {into}")
    return found[-1]


def deb_members(deb: Path, want: re.Pattern[str]) -> Iterator[tuple[str, bytes]]:
    """(path, bytes) of the regular files in a .deb whose path matches ``want``, streamed
    from ``dpkg-deb --fsys-tarfile`` (nothing else is written to disk)."""
    with subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(deb)], stdout=subprocess.PIPE) as p:
        assert p.stdout is not None
        with tarfile.open(fileobj=p.stdout, mode="r|") as tar:
            for m in tar:
                name = m.name.removeprefix("./")
                if m.isfile() and want.search(name):
                    f = tar.extractfile(m)
                    assert f is not None
                    yield name, f.read()
        p.stdout.close()
    if p.returncode not in (0, None):
        raise ImageUnavailable(f"dpkg-deb --fsys-tarfile {deb}: exit {p.returncode}")


def unpack_bzimage(bz: bytes) -> bytes | None:
    """The ELF vmlinux inside an xz-compressed bzImage, or None."""
    at = bz.find(b"\xfd7zXZ\x00")
    if at < 0:
        return None
    try:
        elf = lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(bz[at:])
    except lzma.LZMAError:
        return None
    return elf if elf[:4] == b"\x7fELF" else None


# Directories whose modules may be (transitive) dependencies of WANTED_MODULES.
_MODULE_DIRS = re.compile(
    r"^(?:usr/)?lib/modules/[^/]+/kernel/(?:fs|net|drivers/virtio|drivers/net|lib|crypto)/"
    r"[^ ]*\.ko(?:\.xz)?$"
)


@dataclass(frozen=True, slots=True)
class GuestImage:
    kernel: Path
    initramfs: Path
    version: str

    @classmethod
    def ensure(cls, cache: Path | None = None) -> GuestImage:
        """The image under ``cache``, built first if missing or for another kernel package."""
        cache = cache or default_cache()
        debs = cache / "debs"
        debs.mkdir(parents=True, exist_ok=True)
        if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
            raise ImageUnavailable("apt-get/dpkg-deb not found (the image needs Debian packages)")
        pkg = resolve_kernel_package()
        out = cache / pkg
        image = cls(out / "vmlinux", out / "initramfs.gz", pkg)
        if image.kernel.exists() and image.initramfs.exists():
            return image
        kdeb = download(pkg, debs)
        bdeb = download(BUSYBOX_PKG, debs)
        tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=cache))
        try:
            cls._build(kdeb, bdeb, tmp)
            with contextlib.suppress(FileNotFoundError):
                shutil.rmtree(out)
            tmp.rename(out)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        for old in debs.glob("linux-image-*.deb"):  # keep only the kernel in use
            if old != kdeb:
                old.unlink()
        return image

    @staticmethod
    def _build(kdeb: Path, bdeb: Path, out: Path) -> None:
        bz: bytes | None = None
        modules: dict[str, bytes] = {}
        builtin: set[str] = set()
        for name, data in deb_members(
            kdeb, re.compile(r"^boot/vmlinuz-|/modules\.builtin$|" + _MODULE_DIRS.pattern)
        ):
            if name.startswith("boot/vmlinuz-"):
                bz = data
            elif name.endswith("/modules.builtin"):
                builtin = {_module_name(x) for x in data.decode().split()}
            else:
                modules[_module_name(name)] = (
                    lzma.decompress(data) if name.endswith(".xz") else data
                )
        if bz is None:
            raise ImageUnavailable(f"{kdeb.name}: no boot/vmlinuz-*")
        busybox = dict(deb_members(bdeb, re.compile(r"^bin/busybox$"))).get("bin/busybox")
        if busybox is None:
            raise ImageUnavailable(f"{bdeb.name}: no bin/busybox")
        order = load_order(modules, WANTED_MODULES, builtin)

        (out / "vmlinux").write_bytes(unpack_bzimage(bz) or bz)
        c = Cpio()
        for d in ("bin", "dev", "proc", "sys", "mnt", "tmp", "job", "modules"):
            c.directory(d)
        c.chardev("dev/console", 5, 1)
        c.file("bin/busybox", busybox, 0o755)
        c.file("init", INIT_SCRIPT.read_bytes(), 0o755)
        for n in order:
            c.file(f"modules/{n}.ko", modules[n])
        c.file("modules/order", "".join(f"{n}.ko\n" for n in order).encode())
        (out / "initramfs.gz").write_bytes(gzip.compress(c.finish(), compresslevel=6))


# --------------------------------------------------------------------------- runs


@dataclass(slots=True)
class GuestResult:
    """``rc``: the script's exit status (None: no status, e.g. killed at the timeout);
    ``output``: what the script wrote (stdout and stderr; CRs removed)."""

    rc: int | None
    output: str
    console: str
    timed_out: bool
    seconds: float

    def lines(self) -> list[str]:
        return self.output.splitlines()

    def describe(self, tail: int = 60) -> str:
        con = "\n".join(self.console.splitlines()[-tail:])
        out = "\n".join(self.output.splitlines()[-tail:])
        return (
            f"guest rc={self.rc} timed_out={self.timed_out} after {self.seconds:.0f}s\n"
            f"--- output (tail) ---\n{out}\n--- console (tail) ---\n{con}"
        )


@dataclass(slots=True)
class GuestRun:
    """A guest that is running. ``output()`` is what the script wrote so far."""

    proc: subprocess.Popen[bytes]
    dir: Path
    timeout_s: float
    started: float = field(default_factory=time.monotonic)
    result: GuestResult | None = None

    def _read(self, name: str) -> str:
        try:
            raw = (self.dir / name).read_bytes()
        except FileNotFoundError:
            return ""
        return raw.decode("utf-8", "replace").replace("\r", "")

    def output(self) -> str:
        out = self._read("out.log")
        return out.split(RC_MARK, 1)[0]

    def wait_for(self, pattern: str, timeout_s: float) -> re.Match[str] | None:
        """The first match of ``pattern`` in the output, polled until the guest exits or
        ``timeout_s`` passes (None then)."""
        rx = re.compile(pattern, re.M)
        end = time.monotonic() + timeout_s
        while True:
            m = rx.search(self.output())
            if m is not None:
                return m
            if self.proc.poll() is not None or time.monotonic() >= end:
                return None
            time.sleep(0.1)

    def wait(self) -> GuestResult:
        if self.result is not None:
            return self.result
        left = self.timeout_s - (time.monotonic() - self.started)
        timed_out = False
        try:
            self.proc.wait(max(left, 0.1))
        except subprocess.TimeoutExpired:
            self.kill()
            timed_out = True
        raw = self._read("out.log")
        m = re.search(rf"{RC_MARK} (\d+)", raw)
        self.result = GuestResult(
            rc=int(m.group(1)) if m else None,
            output=raw.split(RC_MARK, 1)[0],
            console=self._read("console.log"),
            timed_out=timed_out,
            seconds=time.monotonic() - self.started,
        )
        shutil.rmtree(self.dir, ignore_errors=True)
        return self.result

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)

    def __enter__(self) -> GuestRun:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.kill()
        self.wait()


def _job_archive(script: str, env: Mapping[str, str], files: Mapping[str, bytes]) -> bytes:
    c = Cpio()
    c.file("job/run.sh", script.encode(), 0o755)
    lines = "".join(f"{k}='{v}'\nexport {k}\n" for k, v in env.items())
    c.file("job/env", lines.encode())
    for name, data in files.items():
        if "/" in name or name in ("run.sh", "env", "lib.sh"):
            raise ValueError(f"job file name {name!r}: a plain name other than run.sh/env/lib.sh")
        c.file(f"job/{name}", data, 0o755)
    return c.finish()


class Guest:
    """Runs scripts in guests booted from ``image``, one at a time (the caller's job: tests
    run sequentially). ``memory_mib`` of guest RAM, one vCPU under TCG."""

    def __init__(self, image: GuestImage, *, memory_mib: int = 512) -> None:
        self.image = image
        self.memory_mib = memory_mib
        binary = qemu_binary()
        if binary is None:
            raise ImageUnavailable(f"{QEMU} not found (apt-get install qemu-system-x86)")
        self.qemu = binary

    def start(
        self,
        script: str,
        *,
        nfs_port: int,
        timeout_s: float,
        timeo_ds: int = 50,
        retrans: int = 4,
        env: Mapping[str, str] | None = None,
        files: Mapping[str, bytes] | None = None,
    ) -> GuestRun:
        """Boot a guest running ``script`` (``sh``) against gateways on ``nfs_port``.
        ``timeo_ds``/``retrans``: the soft mounts' timeout (tenths of a second) and
        retransmissions before a call fails with EIO; ``files``: name -> bytes, put in
        ``/job/``."""
        work = Path(tempfile.mkdtemp(prefix="nfsgw-e2e-"))
        opts = (
            f"vers=3,proto=tcp,mountproto=tcp,nolock,port={nfs_port},mountport={nfs_port},"
            f"addr=10.0.2.2,soft,timeo={timeo_ds},retrans={retrans}"
        )
        job = _job_archive(
            script, {"NFS_PORT": str(nfs_port), "NFS_OPTS": opts, **(env or {})}, files or {}
        )
        initrd = work / "initrd"
        base = self.image.initramfs.read_bytes()
        with initrd.open("wb") as f:
            # The kernel unpacks concatenated archives; an uncompressed one must start on a
            # 4-byte boundary, and zeros between archives are skipped.
            f.write(base + b"\0" * (-len(base) % 512))
            f.write(job)
        cmd = [
            self.qemu,
            "-accel",
            "tcg",
            "-machine",
            "pc",
            "-m",
            str(self.memory_mib),
            "-smp",
            "1",
            "-nodefaults",
            "-no-user-config",
            "-display",
            "none",
            "-no-reboot",
            "-kernel",
            str(self.image.kernel),
            "-initrd",
            str(initrd),
            "-append",
            "console=ttyS0 quiet loglevel=3 panic=-1 nfsgw_e2e",
            "-serial",
            f"file:{work / 'console.log'}",
            "-serial",
            f"file:{work / 'out.log'}",
            "-netdev",
            "user,id=n0",
            "-device",
            "virtio-net-pci,netdev=n0,romfile=",
        ]
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        return GuestRun(proc, work, timeout_s)

    def run(
        self,
        script: str,
        *,
        nfs_port: int,
        timeout_s: float,
        timeo_ds: int = 50,
        retrans: int = 4,
        env: Mapping[str, str] | None = None,
        files: Mapping[str, bytes] | None = None,
    ) -> GuestResult:
        with self.start(
            script,
            nfs_port=nfs_port,
            timeout_s=timeout_s,
            timeo_ds=timeo_ds,
            retrans=retrans,
            env=env,
            files=files,
        ) as g:
            return g.wait()
