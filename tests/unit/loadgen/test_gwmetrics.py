"""``loadgen/gwmetrics.py`` reads only names the gateway exports today (declared in
``gateway/ops/metricdefs.py``): no aliases for older gateways."""

from __future__ import annotations

import re
from pathlib import Path

from gateway.ops.metrics import METRICS
from loadgen import gwmetrics


def test_every_name_read_is_declared() -> None:
    source = Path(gwmetrics.__file__).read_text()
    read = set(re.findall(r'"(nfsgw_[a-z0-9_]+)', source))
    assert read, "gwmetrics reads no nfsgw_ series?"
    assert read <= {m.name for m in METRICS}, read - {m.name for m in METRICS}
