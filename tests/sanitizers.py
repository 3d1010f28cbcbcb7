"""Running a C extension of the gateway under AddressSanitizer and UndefinedBehaviorSanitizer:
the scaffolding the ``test_*_sanitizers.py`` tests share.

``run_under_sanitizers(source, module, script, tmp_path, ...)`` compiles ``source`` with
``-fsanitize=address,undefined -fno-sanitize-recover=all`` (and the build's warnings as
errors) into ``tmp_path``, then runs ``script`` (the test file itself, as a script) in a child
Python with ``libasan`` preloaded and ``PYTHONMALLOC=malloc``, passing it the built module's
path, the number of cases and the seconds it may take. The child's last line must be
``fuzz ran N``; any sanitizer report or difference it finds ends it with a non-zero status.
Skips when gcc or its libasan is missing, unless ``NFSGW_REQUIRE_NATIVE=1``.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]


def skip_or_fail(reason: str) -> None:
    if os.environ.get("NFSGW_REQUIRE_NATIVE") == "1":
        pytest.fail(f"NFSGW_REQUIRE_NATIVE=1 but {reason}")
    pytest.skip(reason)


def _runtime(gcc: str, name: str) -> str | None:
    out = subprocess.run([gcc, f"-print-file-name={name}"], capture_output=True, text=True)
    path = out.stdout.strip()
    return path if os.path.isabs(path) and os.path.exists(path) else None


def exact(data: bytes) -> Any:
    """``data`` in a buffer of exactly its size (its own malloc'd block: one byte read past
    the end is an ASan report)."""
    return (ctypes.c_ubyte * len(data)).from_buffer_copy(data)


def run_under_sanitizers(
    source: Path,
    module: str,
    script: str,
    tmp_path: Path,
    *,
    cases: int,
    seconds: float,
    env: Mapping[str, str | None] | None = None,
) -> list[str]:
    """Build ``source`` as ``module`` with the sanitizers and run ``script`` on it; the
    child's output lines (the last one checked to be ``fuzz ran N``). ``env``: variables to
    set, or to remove (None), in the child."""
    gcc = shutil.which("gcc")
    if gcc is None:
        skip_or_fail("gcc is not installed")
    assert gcc is not None
    asan = _runtime(gcc, "libasan.so")
    if asan is None:
        skip_or_fail("gcc's libasan is not installed")
    assert asan is not None
    so = tmp_path / f"{module}{sysconfig.get_config_var('EXT_SUFFIX')}"
    flags = "-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all"
    warnings = "-Wall -Wextra -Werror -std=c11 -O1 -g -fPIC -shared"
    cmd = [gcc, *flags.split(), *warnings.split(), f"-I{sysconfig.get_paths()['include']}"]
    build = subprocess.run([*cmd, str(source), "-o", str(so)], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    child = {
        **os.environ,
        "LD_PRELOAD": asan,
        "ASAN_OPTIONS": "detect_leaks=0",  # the interpreter keeps objects until exit
        "UBSAN_OPTIONS": "print_stacktrace=1",
        "PYTHONMALLOC": "malloc",
        "PYTHONPATH": str(ROOT),
    }
    for k, v in (env or {}).items():
        if v is None:
            child.pop(k, None)
        else:
            child[k] = v
    run = subprocess.run(
        [sys.executable, script, str(so), str(cases), str(seconds)],
        env=child,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=seconds * 4 + 60,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-6000:]
    lines = run.stdout.strip().splitlines()
    assert lines and lines[-1].startswith("fuzz ran "), run.stdout
    return lines


def cases_run(lines: list[str]) -> int:
    return int(lines[-1].split()[2])
