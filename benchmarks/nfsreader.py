"""The lean C reader (``benchmarks/nfsread.c``) from Python: build it once, drive it.

The benchmarks' Python client (``tests/libnfs.py``: ctypes, threads sharing a GIL, a fresh
1 MiB buffer per READ) costs about as much CPU per file as the server it measures; on this
2-core machine that is a core no server gets. ``NfsReader`` makes the same libnfs calls from C
threads, one connection each, and checks every byte against the local tree.

    with NfsReader(url, tree_root, 8) as r:
        r.open_all()                     # or r.open(i) / r.stat(i, "/c000") to place them
        print(r.epoch(["/c000/img000000.jpg", ...]))   # files, errors, seconds, p99_ms, ...

Building needs gcc and libnfs-dev (Debian); as root they are installed when missing, as the
ganesha benchmarks install nfs-ganesha. The binary is cached under /var/tmp by the source's
hash. Must not: import the gateway.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

SOURCE = Path(__file__).with_name("nfsread.c")
CACHE = Path("/var/tmp/nfsgw-nfsread")
HEADER = Path("/usr/include/nfsc/libnfs.h")


def build() -> Path:
    """The compiled reader (built on first use, per source version)."""
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    exe = CACHE / digest / "nfsread"
    if exe.exists():
        return exe
    needs = (("gcc", shutil.which("gcc") is not None), ("libnfs-dev", HEADER.exists()))
    missing = [p for p, ok in needs if not ok]
    if missing:
        if os.geteuid() != 0:
            raise RuntimeError(f"the C reader needs {' and '.join(missing)} (apt-get install)")
        subprocess.run(
            ["apt-get", "install", "-y", "-q", *missing],
            check=True,
            env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"),
            stdout=subprocess.DEVNULL,
        )
    exe.parent.mkdir(parents=True, exist_ok=True)
    tmp = exe.with_suffix(".tmp")
    subprocess.run(
        ["gcc", "-O2", "-Wall", "-Wextra", "-o", str(tmp), str(SOURCE), "-lnfs", "-lpthread"],
        check=True,
    )
    tmp.rename(exe)
    return exe


class NfsReader:
    """One ``nfsread`` process with ``n`` connections to ``url``; ``root`` is the local copy
    of the export the bytes are checked against."""

    def __init__(self, url: str, root: Path, n: int) -> None:
        self.n = n
        self.proc = subprocess.Popen(
            [str(build()), url, str(root), str(n)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def _ask(self, line: str) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline().strip()
        if not answer or answer.startswith("error"):
            raise RuntimeError(f"nfsread {line!r}: {answer or 'exited'}")
        return answer

    def open(self, i: int) -> None:
        """(Re)connect connection ``i``."""
        self._ask(f"open {i}")

    def open_all(self) -> None:
        for i in range(self.n):
            self.open(i)

    def stat(self, i: int, path: str) -> None:
        self._ask(f"stat {i} {path}")

    def epoch(self, paths: Sequence[str]) -> dict[str, Any]:
        """Read every path whole (path k on connection k mod n), all connections at once."""
        with tempfile.NamedTemporaryFile("w", suffix=".list") as f:
            f.write("\n".join(paths) + "\n")
            f.flush()
            result: dict[str, Any] = json.loads(self._ask(f"epoch {f.name}"))
        return result

    def cpu_seconds(self) -> float:
        """The reader's CPU time so far (user + system)."""
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write("quit\n")
                self.proc.stdin.close()
            except (BrokenPipeError, OSError):
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> NfsReader:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
