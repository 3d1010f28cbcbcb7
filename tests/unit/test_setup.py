"""The install on a machine without a C compiler (setup.py): it succeeds, builds no module,
and says for each one what the gateway then loses -- for ``gateway._checksums``, that stored
CRC64NVME and CRC32C checksums are no longer verified. The build runs for real, with the
compiler swapped for ``false`` (``CC=false``), into a temporary directory.
"""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest
from setuptools import Distribution, Extension

ROOT = Path(__file__).resolve().parents[2]


def test_without_a_compiler_the_install_says_what_is_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    ns = runpy.run_path(str(ROOT / "setup.py"), run_name="nfsgw_setup")  # setup() not run
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("CC", "false")
    names = ("gateway._fastwire", "gateway._checksums", "gateway._s3list")
    exts = [
        Extension(
            n, [f"gateway/{n.split('.')[1]}.c"], extra_compile_args=ns["FLAGS"], optional=True
        )
        for n in names
    ]
    dist = Distribution({"name": "nfsgw", "ext_modules": exts})
    cmd = ns["BuildExt"](dist)
    cmd.build_lib = str(tmp_path / "lib")
    cmd.build_temp = str(tmp_path / "tmp")
    cmd.ensure_finalized()
    cmd.run()  # optional modules: a failed one does not fail the install
    assert not list(tmp_path.rglob("*.so")), "a module was built without a compiler"
    err = capfd.readouterr().err
    for n in names:
        assert f"WARNING: nfsgw: {n} was not built" in err, err
    line = next(x for x in err.splitlines() if "gateway._checksums was not built" in x)
    assert "stored CRC64NVME and CRC32C checksums will NOT be verified" in line, line
    assert "verify_crc32c" in line, line
