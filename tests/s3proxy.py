"""The tests' counting S3 proxy: loadgen's ``DelayProxy`` (forwards every request unchanged,
counts them by kind: LIST, HEAD, GET, PUT, POST, DELETE), with a ``total``.

    async with CountingProxy(sw.endpoint_url) as proxy:
        store = S3Store(bucket, endpoint_url=proxy.endpoint_url, ...)
        ...
        assert proxy.counts["GET"] == 1
"""

from __future__ import annotations

from loadgen.proxy import DelayProxy


class CountingProxy(DelayProxy):
    @property
    def total(self) -> int:
        return sum(self.counts.values())
