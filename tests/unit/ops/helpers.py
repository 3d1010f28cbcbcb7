"""What the operations tests share besides the gateway harness (``tests.harness.memory``):
the admin API's configuration and a small HTTP client for it."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from gateway.ops.config import AdminConfig

TOKEN = "nfsgw-test-token"  # the admin token of the tests' gateways: mutating calls need one


def admin_config(token: str | None = TOKEN) -> AdminConfig:
    """The admin API on a free port of 127.0.0.1, with a bearer token (``TOKEN``) unless
    ``token=None``: on TCP, reload, invalidate and warm-up need one."""
    return AdminConfig(listen="127.0.0.1:0", token=token)


class Http:
    """The admin API over real HTTP, with ``token`` (``TOKEN`` by default; None: none)."""

    def __init__(self, port: int, token: str | None = TOKEN) -> None:
        self.base = f"http://127.0.0.1:{port}"
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.session = aiohttp.ClientSession()

    async def get(self, path: str, **kw: Any) -> tuple[int, str]:
        async with self.session.get(self.base + path, headers=self.headers, **kw) as r:
            return r.status, await r.text()

    async def json(self, method: str, path: str, body: object = None) -> tuple[int, Any]:
        async with self.session.request(
            method, self.base + path, json=body, headers=self.headers
        ) as r:
            text = await r.text()
            return r.status, json.loads(text) if text else None

    async def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """Sample name + sorted labels -> value."""
        status, text = await self.get("/metrics")
        assert status == 200
        out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
        return out

    async def close(self) -> None:
        await self.session.close()


def sample(
    m: Mapping[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float:
    return m.get((name, tuple(sorted(labels.items()))), 0.0)
