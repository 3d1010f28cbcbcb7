"""pjdfstest, the POSIX syscall conformance suite (github.com/pjd/pjdfstest), built for the e2e
guest: its source comes as an unmodified archive (``../shared/tools/pjdfstest/``, or
``$NFSGW_PJDFSTEST_TARBALL``), since CI reaches only the package registries.

Owns: finding the archive, building the suite's one C program as a static binary (the guest is
a busybox initramfs, no libc) with the ``config.h`` its ``configure`` would write for Linux and
glibc (no autotools needed), caching it by the archive's hash, and parsing the guest's summary
lines (``pjdfstest.sh``). Must not: boot guests or start gateways (the tests do).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from tests.e2e.guest import default_cache

REPO = Path(__file__).resolve().parents[2]
TARBALL_ENV = "NFSGW_PJDFSTEST_TARBALL"
SHARED = REPO.parent / "shared" / "tools" / "pjdfstest"

# What pjdfstest's configure.ac finds on Linux with glibc (its AC_CHECK_FUNC/HEADERS/MEMBERS).
CONFIG_H = """\
#define _GNU_SOURCE 1
#define HAVE_SYS_SYSMACROS_H 1
#define HAVE_FACCESSAT 1
#define HAVE_FCHMODAT 1
#define HAVE_FCHOWNAT 1
#define HAVE_FSTATAT 1
#define HAVE_LINKAT 1
#define HAVE_MKDIRAT 1
#define HAVE_MKFIFOAT 1
#define HAVE_MKNODAT 1
#define HAVE_OPENAT 1
#define HAVE_POSIX_FALLOCATE 1
#define HAVE_READLINKAT 1
#define HAVE_RENAMEAT 1
#define HAVE_SYMLINKAT 1
#define HAVE_UTIMENSAT 1
#define HAVE_STRUCT_STAT_ST_ATIM 1
#define HAVE_STRUCT_STAT_ST_CTIM 1
#define HAVE_STRUCT_STAT_ST_MTIM 1
"""

# The suite makes names with ``openssl md5``; the guest has busybox's md5sum.
OPENSSL_SHIM = b"#!/bin/sh\nmd5sum | cut -d' ' -f1\n"


class Unavailable(Exception):
    """No archive, or no C compiler able to link statically."""


def find_tarball() -> Path:
    env = os.environ.get(TARBALL_ENV)
    if env:
        return Path(env)
    found = sorted(SHARED.glob("pjdfstest-*.tar.gz"))
    if not found:
        raise Unavailable(f"no pjdfstest archive in {SHARED} (set ${TARBALL_ENV})")
    return found[-1]


def build(tarball: Path, cache: Path | None = None) -> Path:
    """The static ``pjdfstest`` binary of ``tarball`` (built once per archive)."""
    digest = hashlib.sha256(tarball.read_bytes()).hexdigest()[:16]
    out = (cache or default_cache()) / f"pjdfstest-{digest}" / "pjdfstest"
    if out.exists():
        return out
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise Unavailable("no C compiler (apt-get install gcc)")
    with tempfile.TemporaryDirectory(prefix="pjdfstest-") as tmp:
        with tarfile.open(tarball) as tf:
            member = tf.getmember("pjdfstest/pjdfstest.c")
            src = tf.extractfile(member)
            assert src is not None
            (Path(tmp) / "pjdfstest.c").write_bytes(src.read())
        (Path(tmp) / "config.h").write_text(CONFIG_H)
        binary = Path(tmp) / "pjdfstest"
        cmd = [cc, "-O2", "-static", "-w", "-o", str(binary), "pjdfstest.c"]
        done = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise Unavailable(f"building pjdfstest failed: {done.stderr[-2000:]}")
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp_out = out.with_suffix(".tmp")
        shutil.copyfile(binary, tmp_out)
        tmp_out.chmod(0o755)
        tmp_out.replace(out)
    return out


def job_files(tarball: Path, binary: Path, runner: Path) -> dict[str, bytes]:
    """The files ``pjdfstest.sh`` expects in the guest's /job."""
    return {
        "pjdfstest.tar.gz": tarball.read_bytes(),
        "pjdfstest": binary.read_bytes(),
        "openssl": OPENSSL_SHIM,
        "pjdfstest.sh": runner.read_bytes(),
    }


def suite_files(tarball: Path, groups: list[str]) -> list[str]:
    """Every ``tests/<group>/*.t`` of the archive, for the named groups, in order."""
    with tarfile.open(tarball) as tf:
        names = tf.getnames()
    pat = re.compile(r"^pjdfstest/tests/([a-z_]+/\d+\.t)$")
    out = [m.group(1) for n in names if (m := pat.match(n))]
    return sorted(t for t in out if t.split("/")[0] in groups)


@dataclass(slots=True)
class FileResult:
    plan: int
    ok: int
    notok: int
    failures: list[str] = field(default_factory=list)

    @property
    def failed(self) -> int:
        """Cases not passed: failed, or never reached (a crash mid-file)."""
        return max(self.notok, self.plan - self.ok)


_SUMMARY = re.compile(r"^PJD (\S+) plan=(\d+) ok=(\d+) notok=(\d+)$", re.M)
_FAIL = re.compile(r"^PJDFAIL (\S+) (.*)$", re.M)


def parse(out: str) -> dict[str, FileResult]:
    results = {
        m.group(1): FileResult(int(m.group(2)), int(m.group(3)), int(m.group(4)))
        for m in _SUMMARY.finditer(out)
    }
    for m in _FAIL.finditer(out):
        if m.group(1) in results:
            results[m.group(1)].failures.append(m.group(2))
    return results
