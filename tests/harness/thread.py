"""The gateway on a thread of its own: the server ``tests.harness.memory`` builds
(``gateway_config`` + ``Server``), over real stores, on a background event loop, so the
test's thread can make blocking calls (libnfs, ``tests.rpcclient.BlockingRpcClient``) while
it still reads the server's counters in-process.

Owns: the loop thread (``LoopThread``, also used alone to run a proxy or a fake server), the
stores of each export (S3 credentials passed explicitly through ``Server(store_factory=...)``
so nothing touches ``os.environ``; ``wrap_store`` may wrap them for spies and faults), a clock
tests move forward (``OffsetClock``) and snapshots of the server's counters. Must not: share
an event loop with a blocking client.

    with GatewayThread([ExportConfig("/data", "s3://bkt/ds/", read_only=True)],
                       state_dir=tmp, s3=seaweed.store_kwargs()) as gw:
        with LibNfs(gw.libnfs_url("/data")) as nfs:
            nfs.stat("/a.jpg")
        assert gw.backend_counts()["head"] == 0
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from gateway.backend import open_store
from gateway.backend.base import ObjectStore, RequestObserver
from gateway.clock import Clock
from gateway.exports import Export, ExportConfig
from gateway.ops.server import Server
from tests.harness.memory import gateway_config

__all__ = ["GatewayThread", "LoopThread", "OffsetClock", "StoreWrapper", "delta"]

T = TypeVar("T")

StoreWrapper = Callable[[ExportConfig, ObjectStore], ObjectStore]

DEFAULT_TIMEOUT_S = 120.0


class OffsetClock:
    """The system clock plus an offset tests move forward (TTL expiry without sleeping). Safe
    to advance from the test thread while the gateway's loop reads it."""

    def __init__(self) -> None:
        self.offset_s = 0.0

    def monotonic(self) -> float:
        return time.monotonic() + self.offset_s

    def time_ns(self) -> int:
        return time.time_ns() + int(self.offset_s * 1e9)

    def advance(self, seconds: float) -> None:
        self.offset_s += seconds


class LoopThread:
    """An asyncio event loop running forever on a daemon thread."""

    def __init__(self, name: str = "gw-loop") -> None:
        self.name = name
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._started = False

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def start(self) -> LoopThread:
        if not self._started:
            self._thread.start()
            self._started = True
        return self

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = DEFAULT_TIMEOUT_S) -> T:
        """Run ``coro`` on the loop and wait for its result (from any other thread)."""
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("LoopThread.run called from its own loop: it would deadlock")
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return fut.result(timeout)

    def call(self, fn: Callable[..., T], *args: Any, timeout: float | None = 30.0) -> T:
        """Run a plain function on the loop thread (e.g. to read state the loop mutates)."""
        out: Future[T] = Future()

        def thunk() -> None:
            try:
                out.set_result(fn(*args))
            except BaseException as e:
                out.set_exception(e)

        self.loop.call_soon_threadsafe(thunk)
        return out.result(timeout)

    def close(self) -> None:
        if self._started and self._thread.is_alive():

            async def _drain() -> None:
                tasks = [t for t in asyncio.all_tasks(self.loop) if t is not asyncio.current_task()]
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                await self.loop.shutdown_asyncgens()

            try:
                self.run(_drain(), timeout=30.0)
            finally:
                self.loop.call_soon_threadsafe(self.loop.stop)
                self._thread.join(30.0)
        if not self.loop.is_running():
            self.loop.close()


class GatewayThread:
    """A ``Server`` on its own loop thread. ``s3`` holds the endpoint and credentials
    (``SeaweedServer.store_kwargs()``: endpoint_url, region, access_key, secret_key) for
    ``s3://`` exports; other keyword arguments are ``gateway_config`` settings (a 256 MiB
    data cache unless given)."""

    def __init__(
        self,
        exports: Sequence[ExportConfig],
        *,
        state_dir: Path,
        s3: Mapping[str, object] | None = None,
        clock: Clock | None = None,
        wrap_store: StoreWrapper | None = None,
        **settings: Any,
    ) -> None:
        settings.setdefault("cache_memory", 256 << 20)
        self.config = gateway_config(state_dir, exports, **settings)
        self.s3 = {k: str(v) for k, v in (s3 or {}).items() if v is not None}
        self.clock = clock
        self.wrap_store = wrap_store
        self.stores: dict[str, ObjectStore] = {}
        self._loop: LoopThread | None = None
        self._server: Server | None = None

    # ----------------------------------------------------------------------------- life cycle

    def _store_factory(self, ec: ExportConfig, observer: RequestObserver) -> ObjectStore:
        kw: dict[str, Any] = {}
        if ec.backend.startswith("s3://"):
            kw = {
                "endpoint_url": self.s3.get("endpoint_url"),
                "region": self.s3.get("region"),
                "access_key": self.s3.get("access_key"),
                "secret_key": self.s3.get("secret_key"),
                "addressing_style": "path",
                "max_connections": self.config.s3.max_connections,
                "retry": self.config.s3.retry,
                "checksums": self.config.s3.checksums,
            }
        store = open_store(ec.backend, observer=observer, **kw)
        if self.wrap_store is not None:
            store = self.wrap_store(ec, store)
        self.stores[ec.path] = store
        return store

    def start(self) -> GatewayThread:
        if self._server is not None:
            return self
        lt = LoopThread(f"gateway-{id(self):x}").start()
        self._loop = lt

        async def _start() -> Server:
            server = Server(self.config, clock=self.clock, store_factory=self._store_factory)
            await server.start()
            return server

        try:
            self._server = lt.run(_start())
        except BaseException:
            lt.close()
            self._loop = None
            raise
        return self

    def stop(self) -> None:
        lt, server = self._loop, self._server
        self._loop = self._server = None
        if lt is None:
            return
        try:
            if server is not None:
                lt.run(server.stop(drain_timeout_s=5.0))
        finally:
            lt.close()

    def __enter__(self) -> GatewayThread:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # ----------------------------------------------------------------------------- access

    @property
    def server(self) -> Server:
        if self._server is None:
            raise RuntimeError("gateway not started")
        return self._server

    @property
    def loop(self) -> LoopThread:
        if self._loop is None:
            raise RuntimeError("gateway not started")
        return self._loop

    @property
    def port(self) -> int:
        return self.server.port

    def libnfs_url(self, export_path: str = "/data", **params: str | int) -> str:
        """The libnfs URL of an export: NFS and MOUNT on our port (no portmapper), NFSv3, and
        no MOUNT EXPORT call."""
        q = {
            "nfsport": self.port,
            "mountport": self.port,
            "version": 3,
            "auto-traverse-mounts": 0,
            **params,
        }
        query = "&".join(f"{k}={v}" for k, v in q.items())
        return f"nfs://127.0.0.1{export_path}?{query}"

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = DEFAULT_TIMEOUT_S) -> T:
        return self.loop.run(coro, timeout)

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        return self.loop.call(fn, *args)

    def export(self, path: str = "/data") -> Export:
        gw = self.server.gateway
        assert gw is not None
        return gw.by_path[path]

    def backend_counts(self) -> Counter[str]:
        """Backend requests by operation ("list", "head", "get", ...) so far (a copy)."""
        return self.call(lambda: Counter(self.server.metrics.backend))

    def call_counts(self) -> Counter[str]:
        """RPC calls by "PROG.PROC" ("NFS3.LOOKUP", "MOUNT3.MNT", ...) so far (a copy)."""
        return self.call(lambda: Counter(self.server.metrics.calls))

    def stats(self, obj: Callable[[Server], Any]) -> dict[str, int]:
        """A snapshot of a stats dataclass picked by ``obj`` (e.g. a namespace's stats)."""

        def snap() -> dict[str, int]:
            s = obj(self.server)
            return {k: getattr(s, k) for k in s.__slots__}

        return self.call(snap)

    def namespace_stats(self, path: str = "/data") -> dict[str, int]:
        return self.stats(lambda _s: self.export(path).ns.stats)

    def data_stats(self) -> dict[str, int]:
        def reader_stats(s: Server) -> Any:
            assert s.gateway is not None
            return s.gateway.reader.stats

        return self.stats(reader_stats)


def delta(after: Mapping[str, int], before: Mapping[str, int]) -> Counter[str]:
    """``after - before`` per key, keeping zeros out (Counter subtraction drops negatives)."""
    out: Counter[str] = Counter()
    for k in set(after) | set(before):
        d = after.get(k, 0) - before.get(k, 0)
        if d:
            out[k] = d
    return out
