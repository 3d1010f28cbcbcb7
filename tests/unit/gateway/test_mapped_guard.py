"""Reading a file mapping whose file was truncated under it: ``fastwire.copy_mapped`` and
``fastwire.mapped_readable`` (C: a SIGBUS guard and ``MADV_POPULATE_READ``; Python: ``pread``
and ``fstat``) answer "broken" where a plain touch raises SIGBUS and kills the process.

Each case runs in a child interpreter (this file as a script), so a regression shows as a
child killed by SIGBUS, not as a dead pytest. A control case checks the child really dies of
SIGBUS when it touches the truncated pages itself, after the guard was used (the guard's
handler is gone, or passes a fault outside its range on to the default action).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
TWINS = {"c": {}, "python": {"NFSGW_PURE_PYTHON": "1"}}


def run_child(tmp_path: Path, twin: str, case: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("NFSGW_PURE_PYTHON", None)
    env.update(TWINS[twin])
    return subprocess.run(
        [sys.executable, __file__, case, str(tmp_path / "mapped.bin")],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("twin", sorted(TWINS))
def test_a_truncated_mapping_is_reported_not_fatal(tmp_path: Path, twin: str) -> None:
    if twin == "c":
        from gateway import fastwire

        if fastwire.compiled() is None:
            pytest.skip("gateway._fastwire is not built")
    out = run_child(tmp_path, twin, "guarded")
    assert out.returncode == 0, (out.returncode, out.stderr[-2000:])
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["twin"] == twin
    assert got["before"] == {"readable": True, "copy_ok": True}
    # After the truncation to 50,000 bytes: the pages past the end are broken, the ones
    # before are not (the C twin looks at the range asked; the Python twin at the file's size
    # against the whole mapping's end, so it calls the whole mapping broken).
    assert got["after"]["readable_all"] is False
    assert got["after"]["copy_all"] is None
    assert got["after"]["copy_tail"] is None
    assert got["after"]["copy_head_ok"] is True
    assert got["removed"] == {"readable_all": False, "copy_all": None}


@pytest.mark.parametrize("twin", sorted(TWINS))
def test_an_unguarded_touch_of_the_truncated_pages_still_dies_of_sigbus(
    tmp_path: Path, twin: str
) -> None:
    out = run_child(tmp_path, twin, "unguarded")
    assert out.returncode == -signal.SIGBUS, (out.returncode, out.stdout, out.stderr[-2000:])
    assert "guard used" in out.stdout


# --------------------------------------------------------------------------- the child

SIZE = 200_000
OFFSET = 8192  # the mapping starts at a page offset in the file, as a bundle's bodies do


def _child(case: str, path: str) -> None:
    from gateway import fastwire

    data = os.urandom(SIZE)
    with open(path, "wb") as f:
        f.write(data)
    fd = os.open(path, os.O_RDONLY)
    view = memoryview(fastwire.map_file(fd, SIZE - OFFSET, OFFSET))[100:]
    os.close(fd)
    n = len(view)
    body = data[OFFSET + 100 :]
    result: dict[str, object] = {"twin": "c" if fastwire.compiled() else "python"}
    result["before"] = {
        "readable": fastwire.mapped_readable(view, 0, n),
        "copy_ok": fastwire.copy_mapped(view, 0, n) == body,
    }
    os.truncate(path, 50_000)
    head = fastwire.copy_mapped(view, 0, 1000)
    result["after"] = {
        "readable_all": fastwire.mapped_readable(view, 0, n),
        "copy_all": fastwire.copy_mapped(view, 0, n),
        "copy_tail": fastwire.copy_mapped(view, n - 10, n),
        "copy_head_ok": head == body[:1000],
    }
    if case == "unguarded":
        print("guard used", flush=True)
        bytes(view)  # SIGBUS: the child dies here
        print("survived an unguarded touch", flush=True)
        return
    os.unlink(path)
    result["removed"] = {
        "readable_all": fastwire.mapped_readable(view, 0, n),
        "copy_all": fastwire.copy_mapped(view, 0, n),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    _child(sys.argv[1], sys.argv[2])
