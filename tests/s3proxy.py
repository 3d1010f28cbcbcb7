"""A small counting reverse proxy for S3 (aiohttp), for tests, load generation and fault
experiments.

It forwards every request unchanged (method, raw path and query, headers including ``Host``,
so SigV4 signatures stay valid; path-style addressing only) to one upstream, streams bodies
both ways, keeps connections alive, and counts requests by kind: ``LIST`` (GET with
``list-type=2``), ``HEAD``, ``GET``, ``PUT``, ``POST``, ``DELETE``. ``latency_s`` adds a fixed
delay before each request is forwarded (a crude model of a remote store).

    async with CountingProxy(sw.endpoint_url) as proxy:
        store = S3Store(bucket, endpoint_url=proxy.endpoint_url, ...)
        ...
        assert proxy.counts["GET"] == 1
"""

from __future__ import annotations

import asyncio
from collections import Counter
from types import TracebackType

import aiohttp
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

# RFC 9110 §7.6.1 connection-specific fields, plus framing that aiohttp recomputes.
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)


def request_kind(method: str, query: str) -> str:
    """LIST for ListObjects(V2), else the HTTP method."""
    if method == "GET" and "list-type=" in query:
        return "LIST"
    return method


class CountingProxy:
    def __init__(self, upstream: str, *, latency_s: float = 0.0, host: str = "127.0.0.1") -> None:
        self.upstream = upstream.rstrip("/")
        self.latency_s = latency_s
        self.host = host
        self.port = 0
        self.counts: Counter[str] = Counter()
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    @property
    def endpoint_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def reset(self) -> None:
        self.counts.clear()

    async def start(self) -> CountingProxy:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=256),
            auto_decompress=False,
            skip_auto_headers=("Accept-Encoding", "User-Agent", "Content-Type"),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
        )
        app = web.Application(client_max_size=1 << 40)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, 0)
        await site.start()
        self.port = int(self._runner.addresses[0][1])
        return self

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> CountingProxy:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        self.counts[request_kind(request.method, request.query_string)] += 1
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        headers = CIMultiDict(
            (k, v) for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP
        )
        data = request.content if request.body_exists else None
        url = URL(self.upstream + request.raw_path, encoded=True)
        async with self._session.request(
            request.method, url, headers=headers, data=data, allow_redirects=False
        ) as up:
            resp = web.StreamResponse(status=up.status, reason=up.reason)
            for k, v in up.headers.items():
                if k.lower() not in _HOP_BY_HOP:
                    resp.headers.add(k, v)
            await resp.prepare(request)
            if request.method != "HEAD":
                async for chunk in up.content.iter_any():
                    await resp.write(chunk)
            await resp.write_eof()
            return resp
