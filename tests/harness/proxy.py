"""``FaultProxy`` on a loop thread of its own, for tests whose gateway and blocking client run
on other threads (``GatewayThread``, ``GatewayProcess``, libnfs, the kernel client).

Owns: the loop thread and the proxy's life cycle; thread-safe copies of its counts. Must not:
share a loop with the gateway (a stalled fault would stall the gateway too).

    with ThreadProxy(seaweed.endpoint_url, seed=5) as proxy:
        s3 = {**seaweed.store_kwargs(), "endpoint_url": proxy.endpoint_url}
        proxy.add(Rule("503", {"GET"}, times=2))
        ...
        assert proxy.kinds()["GET"] == 3 and proxy.gets()["ds/a.jpg"] == 3

With no rule the proxy forwards everything unchanged: a request counter by kind (``kinds``),
per key (``gets``) and per prefix (``lists``).
"""

from __future__ import annotations

from collections import Counter
from types import TracebackType

from tests.faultproxy import FaultProxy, Rule
from tests.harness.thread import LoopThread

__all__ = ["ThreadProxy"]


class ThreadProxy:
    """A started ``FaultProxy`` (seeded with ``seed``) in front of ``upstream``."""

    def __init__(self, upstream: str, *, seed: int = 0, name: str = "s3proxy") -> None:
        self.loop = LoopThread(name).start()
        self.proxy = FaultProxy(upstream, seed=seed)
        try:
            self.loop.run(self.proxy.start())
        except BaseException:
            self.loop.close()
            raise

    @property
    def endpoint_url(self) -> str:
        return self.proxy.endpoint_url

    def add(self, *rules: Rule) -> None:
        self.loop.call(self.proxy.add, *rules)

    def clear(self) -> None:
        self.loop.call(self.proxy.clear)

    def counts(self) -> Counter[tuple[str, str]]:
        """(kind, fault) -> requests so far ("ok": not faulted)."""
        return self.loop.call(lambda: Counter(self.proxy.counts))

    def kinds(self) -> Counter[str]:
        """Requests by kind (LIST, GET, HEAD, PUT, ...) so far, faulted or not."""
        out: Counter[str] = Counter()
        for (kind, _), n in self.counts().items():
            out[kind] += n
        return out

    def gets(self, under: str = "") -> Counter[str]:
        """GETs per key so far (keys in the bucket; with ``under``, only the keys under that
        prefix, relative to it)."""
        keys = self.loop.call(lambda: Counter(self.proxy.gets))
        if not under:
            return keys
        return Counter({k[len(under) :]: n for k, n in keys.items() if k.startswith(under)})

    def lists(self) -> Counter[str]:
        """LISTs per ``prefix`` so far."""
        return self.loop.call(lambda: Counter(self.proxy.lists))

    def close(self) -> None:
        try:
            self.loop.run(self.proxy.close())
        finally:
            self.loop.close()

    def __enter__(self) -> ThreadProxy:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
