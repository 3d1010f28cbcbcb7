"""An asyncio delay proxy between a gateway and its S3 server: injected latency, an optional
bandwidth cap, and request counts by type.

Owns: a model of a remote object store on one machine (this kernel has no ``netem``). Every
request waits ``latency_s`` before it is forwarded (time to first byte of a remote store);
response bodies are paced through one shared token bucket when ``bandwidth_bps`` is set (the
link between the gateway and the store); requests are counted as ``LIST`` (a GET with
``list-type=``), ``HEAD``, ``GET``, ``PUT``, ``POST``, ``DELETE``, plus the body bytes returned.
Requests are forwarded unchanged (method, raw path and query, headers including ``Host``, so
SigV4 signatures stay valid; path-style addressing only).

``GET /__loadgen__/counts`` answers the counts as JSON without forwarding (no S3 bucket can be
named ``__loadgen__``), so a proxy started with ``nfsgw-loadgen proxy`` can be read by
``nfsgw-loadgen epochs --proxy-url``. Must not: change what it forwards.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from types import TracebackType

import aiohttp
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

__all__ = ["DelayProxy", "request_kind", "COUNTS_PATH"]

COUNTS_PATH = "/__loadgen__/counts"

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


def request_kind(method: str, path: str, query: str) -> str:
    """``LIST`` for ListObjects(V2) (a GET of the bucket itself, path-style), else the HTTP
    method. The one classification of S3 requests: ``tests.faultproxy`` counts by it too."""
    if method == "GET" and ("list-type=" in query or not path.lstrip("/").partition("/")[2]):
        return "LIST"
    return method


class _Pacer:
    """One token bucket for all responses: ``take(n)`` returns when ``n`` more bytes may go."""

    def __init__(self, rate_bps: float, burst: int = 64 * 1024) -> None:
        self.rate = rate_bps
        self.burst_s = burst / rate_bps
        self._free_at = 0.0

    async def take(self, n: int) -> None:
        now = time.monotonic()
        start = max(now - self.burst_s, self._free_at)
        self._free_at = start + n / self.rate
        wait = self._free_at - now
        if wait > 0:
            await asyncio.sleep(wait)


class DelayProxy:
    """``async with DelayProxy(upstream, latency_s=0.010) as p:`` then point the gateway's
    S3 endpoint at ``p.endpoint_url``; ``p.counts`` by kind, ``p.snapshot()``."""

    def __init__(
        self,
        upstream: str,
        *,
        latency_s: float = 0.0,
        bandwidth_bps: float | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        max_connections: int = 512,
    ) -> None:
        if latency_s < 0:
            raise ValueError("latency must be >= 0")
        if bandwidth_bps is not None and bandwidth_bps <= 0:
            raise ValueError("bandwidth must be > 0")
        self.upstream = upstream.rstrip("/")
        self.latency_s = latency_s
        self.bandwidth_bps = bandwidth_bps
        self.host = host
        self.port = port
        self.max_connections = max_connections
        self.counts: Counter[str] = Counter()
        self.bytes_out = 0
        self.errors = 0
        self._pacer = _Pacer(bandwidth_bps) if bandwidth_bps else None
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    @property
    def endpoint_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def snapshot(self) -> dict[str, int]:
        """Requests by kind, plus ``bytes`` (response bodies) and ``errors``."""
        out = dict(self.counts)
        out["bytes"] = self.bytes_out
        out["errors"] = self.errors
        return out

    def reset(self) -> None:
        self.counts.clear()
        self.bytes_out = 0
        self.errors = 0

    async def start(self) -> DelayProxy:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=self.max_connections),
            auto_decompress=False,
            skip_auto_headers=("Accept-Encoding", "User-Agent", "Content-Type"),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
        )
        app = web.Application(client_max_size=1 << 40)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, backlog=1024)
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

    async def __aenter__(self) -> DelayProxy:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if request.method == "GET" and request.path == COUNTS_PATH:
            return web.Response(
                text=json.dumps(self.snapshot(), sort_keys=True), content_type="application/json"
            )
        assert self._session is not None
        self.counts[request_kind(request.method, request.path, request.query_string)] += 1
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        headers = CIMultiDict(
            (k, v) for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP
        )
        data = request.content if request.body_exists else None
        url = URL(self.upstream + request.raw_path, encoded=True)
        try:
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
                        if self._pacer is not None:
                            await self._pacer.take(len(chunk))
                        self.bytes_out += len(chunk)
                        await resp.write(chunk)
                await resp.write_eof()
                return resp
        except (aiohttp.ClientError, OSError):
            self.errors += 1
            raise
