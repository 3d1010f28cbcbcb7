"""Object stores for tests that must hold, watch or doctor the backend.

- ``GatedStore``: a ``MemoryStore`` whose chosen operations wait at gates (``hold``): a
  request in flight the test can see arrive (``Gate.entered``, ``Gate.waiting``) and let go
  (``Gate.open``), and how many run at once (``inflight``, ``peak``). Latency, failures and
  the request log are ``MemoryStore``'s own (``latency_s``, ``fail``, ``log``).
- ``SpyStore``: wraps any store: records every GET range and injects keys S3 can list but
  SeaweedFS cannot store into listings (``tests.datasets``).

    store = GatedStore()
    gate = store.hold("delete", lambda key: key.endswith("slow"))
    ...   # a DELETE of ".../slow" starts
    await gate.entered.wait()
    gate.open()

Must not: change what an operation returns (a gate only delays it).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from typing import Any

from gateway.backend.base import GetResult, ListPage, ObjectInfo, ObjectStore, StoreWrapper
from gateway.backend.memory import MemoryStore

__all__ = ["Gate", "GatedStore", "SpyStore"]


class Gate:
    """Closed until ``open()``: the operations whose key (or prefix) ``match`` accepts wait
    here. ``entered`` is set when the first arrives; ``waiting`` counts those waiting now."""

    def __init__(self, match: Callable[[str], bool] | None = None) -> None:
        self.match = match
        self.opened = asyncio.Event()
        self.entered = asyncio.Event()
        self.waiting = 0

    def open(self) -> None:
        self.opened.set()

    async def passage(self, key: str) -> None:
        if self.opened.is_set() or (self.match is not None and not self.match(key)):
            return
        self.entered.set()
        self.waiting += 1
        try:
            await self.opened.wait()
        finally:
            self.waiting -= 1


class GatedStore(MemoryStore):
    """A ``MemoryStore`` (same arguments) whose ``list``, ``head``, ``get``, ``put`` and
    ``delete`` first pass their operation's gates. ``inflight`` counts those operations under
    way (waiting at a gate included), ``peak`` the most at once."""

    def __init__(self, name: str = "memory", **kw: Any) -> None:
        super().__init__(name, **kw)
        self.gates: dict[str, list[Gate]] = {}
        self.inflight = 0
        self.peak = 0

    def hold(self, ops: str | Iterable[str], match: Callable[[str], bool] | None = None) -> Gate:
        """A new closed gate for ``ops`` (one or several of "list", "head", "get", "put",
        "delete")."""
        gate = Gate(match)
        for op in (ops,) if isinstance(ops, str) else ops:
            self.gates.setdefault(op, []).append(gate)
        return gate

    def release(self) -> None:
        """Open every gate."""
        for gates in self.gates.values():
            for g in gates:
                g.open()

    @contextlib.asynccontextmanager
    async def _op(self, op: str, key: str) -> AsyncIterator[None]:
        self.inflight += 1
        self.peak = max(self.peak, self.inflight)
        try:
            for g in self.gates.get(op, ()):
                await g.passage(key)
            yield
        finally:
            self.inflight -= 1

    async def list_page(self, prefix: str, **kw: Any) -> ListPage:
        async with self._op("list", prefix):
            return await super().list_page(prefix, **kw)

    async def head(self, key: str) -> ObjectInfo:
        async with self._op("head", key):
            return await super().head(key)

    async def get(self, key: str, start: int = 0, end: int | None = None, **kw: Any) -> GetResult:
        async with self._op("get", key):
            return await super().get(key, start, end, **kw)

    async def put(
        self, key: str, data: bytes, metadata: Mapping[str, str] | None = None
    ) -> ObjectInfo:
        async with self._op("put", key):
            return await super().put(key, data, metadata)

    async def delete(self, key: str) -> None:
        async with self._op("delete", key):
            await super().delete(key)


class SpyStore(StoreWrapper):
    """Wraps an ``ObjectStore``: records every GET range and injects ``extra_keys`` (full
    keys) into listings as S3 would list them (an object, or a common prefix when the key has
    the delimiter after the listed prefix). Injected entries go on the last page of a
    listing. Everything else is delegated unchanged (so request counting stays with the
    wrapped store's observer)."""

    def __init__(self, inner: ObjectStore, extra_keys: Iterable[str] = ()) -> None:
        super().__init__(inner)
        self.extra_keys = sorted(extra_keys)
        self.gets: list[tuple[str, int, int | None]] = []

    def _inject(self, page: ListPage, prefix: str, delimiter: str | None) -> ListPage:
        objs = {o.key: o for o in page.objects}
        prefixes = set(page.prefixes)
        for k in self.extra_keys:
            if not k.startswith(prefix):
                continue
            rest = k[len(prefix) :]
            i = rest.find(delimiter) if delimiter else -1
            if i >= 0:
                prefixes.add(prefix + rest[: i + len(delimiter or "")])
            elif k not in objs:
                objs[k] = ObjectInfo(k, 0, "d41d8cd98f00b204e9800998ecf8427e", 0)
        return ListPage(
            [objs[k] for k in sorted(objs)], sorted(prefixes), page.next_token, page.skipped
        )

    async def _list_page(
        self, prefix: str, delimiter: str | None, token: str | None, after: str | None, limit: int
    ) -> ListPage:
        page = await super()._list_page(prefix, delimiter, token, after, limit)
        if self.extra_keys and page.next_token is None:
            page = self._inject(page, prefix, delimiter)
        return page

    async def _get(self, key: str, start: int, end: int | None, if_match: str | None) -> GetResult:
        self.gets.append((key, start, end))
        return await super()._get(key, start, end, if_match)
