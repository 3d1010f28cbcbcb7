"""The golden bytes still describe the kernel: a fresh capture (``capture_golden.capture``,
the script that wrote ``tests/data/``) decodes with the same checks as the committed one
(``tests/unit/nfsproto/test_golden.py``). When this fails and that passes, the guest's
kernel now sends something else: recapture and review the difference.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.capture_golden import STEMS, capture
from tests.e2e.guest import Guest
from tests.unit.nfsproto.test_golden import CHECKS, load

pytestmark = [pytest.mark.kclient]


def test_a_fresh_capture_decodes_like_the_golden_bytes(guest: Guest, tmp_path: Path) -> None:
    info = capture(tmp_path, guest)
    golden = load(tmp_path)
    assert sorted(golden) == sorted(STEMS) == sorted(CHECKS)
    for check in CHECKS.values():
        check(golden)
    assert info["kernel"] in (tmp_path / "README.md").read_text()
