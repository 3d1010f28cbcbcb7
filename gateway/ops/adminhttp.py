"""The admin HTTP surface (aiohttp): routes, bearer token, listeners, request bodies — once.

Owns: the routes operators and probes use, their status codes and error replies, who may call
them, serving on a TCP address or a Unix socket (``unix:/PATH``, mode 0660). What each route
answers comes from an ``AdminBackend``: the process's own state
(``gateway.ops.admin.LocalAdmin``) or its workers' answers combined
(``gateway.ops.fanout.FleetAdmin``).

- ``GET /metrics``, ``GET /healthz``, ``GET /readyz``, ``GET /v1/stats``
- ``POST /v1/invalidate``, ``POST /v1/warmup``, ``GET /v1/warmup[/ID]``,
  ``DELETE /v1/warmup/ID``, ``POST /v1/reload``

Who may call what:

- A request that came in on a Unix socket is trusted (its file mode, 0660, decides who can
  connect): every route, no token.
- On TCP with a token (``admin.token_file``): every route but the probes (/healthz, /readyz)
  needs ``Authorization: Bearer TOKEN`` (401 otherwise).
- On TCP without a token: the GETs answer; a mutating request (any method but GET and HEAD:
  reload, invalidate, warm-up start and cancel) is refused, 403, naming the two ways to allow
  it. (A non-loopback TCP listen without a token does not start: ``gateway.ops.configfile``.)

A request body must be a JSON object sent as ``Content-Type: application/json`` (415 for any
other type, so a browser's cross-site ``text/plain`` or form POST is refused; 400 for a body
that is not a JSON object); without a body the query string is the object. An unknown or
malformed warm-up id is a 404.

Must not: know what a backend is made of (the server, the registry, the workers), or block the
loop.
"""

from __future__ import annotations

import hmac
import os
import socket
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple, Protocol

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from gateway.ops.config import UNIX_PREFIX, ServerConfig, split_listen

_OPEN = frozenset({"/healthz", "/readyz"})
_READS = frozenset({"GET", "HEAD"})
SOCKET_MODE = 0o660
MAX_BODY_BYTES = 64 << 10

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Reply(NamedTuple):
    """A route's answer: HTTP status and a JSON-able body."""

    status: int
    body: Any


class Process(Protocol):
    """What a backend reads of the process it answers for: a server (``gateway.ops.server``)
    or the workers' supervisor (``gateway.ops.workers``)."""

    @property
    def config(self) -> ServerConfig:
        """The running configuration (``admin.token`` is read per request: a reload applies)."""
        ...

    @property
    def port(self) -> int: ...

    @property
    def started(self) -> bool: ...

    @property
    def stopping(self) -> bool: ...

    @property
    def last_reload_error(self) -> list[str]: ...

    async def reload(self) -> bool: ...


class AdminBackend(Protocol):
    """What answers the admin routes (``LocalAdmin``: this process; ``FleetAdmin``: workers)."""

    @property
    def token(self) -> str | None:
        """The bearer token, read per request (a reload applies); None: no token."""
        ...

    async def exposition(self) -> bytes:
        """The Prometheus exposition."""
        ...

    async def ready(self) -> Reply: ...

    async def stats(self) -> dict[str, Any]: ...

    async def invalidate(self, body: dict[str, Any]) -> Reply: ...

    async def warmup(self, body: dict[str, Any]) -> Reply: ...

    async def warmup_list(self) -> list[dict[str, Any]]: ...

    async def warmup_get(self, job_id: int) -> Reply | None:
        """None: no such job."""
        ...

    async def warmup_cancel(self, job_id: int) -> Reply | None:
        """None: no such job."""
        ...

    async def reload(self) -> Reply: ...

    async def close(self) -> None:
        """Let go of what the backend holds (probes in flight, client sessions)."""
        ...


class AdminHttp:
    """The admin routes of ``backend`` on one aiohttp application."""

    def __init__(self, backend: AdminBackend) -> None:
        self.backend = backend
        self._runner: web.AppRunner | None = None
        self.app = web.Application(middlewares=[self._auth], client_max_size=MAX_BODY_BYTES)
        r = self.app.router
        r.add_get("/metrics", self._metrics)
        r.add_get("/healthz", self._healthz)
        r.add_get("/readyz", self._readyz)
        r.add_get("/v1/stats", self._stats)
        r.add_post("/v1/invalidate", self._invalidate)
        r.add_post("/v1/warmup", self._warmup)
        r.add_get("/v1/warmup", self._warmup_list)
        r.add_get("/v1/warmup/{id}", self._warmup_get)
        r.add_delete("/v1/warmup/{id}", self._warmup_cancel)
        r.add_post("/v1/reload", self._reload)

    async def start(self, listen: str) -> int:
        """Serve on ``host:port`` (returns the port bound: ``:0`` picks one) or on
        ``unix:/PATH`` (returns 0; the socket gets mode 0660)."""
        if listen.startswith(UNIX_PREFIX):
            await self.start_unix(listen[len(UNIX_PREFIX) :], mode=SOCKET_MODE)
            return 0
        host, port = split_listen(listen)
        runner = await self._setup()
        site = web.TCPSite(runner, host, port)
        await site.start()
        server = getattr(site, "_server", None)
        socks = getattr(server, "sockets", None) or []
        return int(socks[0].getsockname()[1]) if socks else port

    async def start_unix(self, path: str, *, mode: int | None = None) -> None:
        """Serve on a Unix socket (``admin.listen = "unix:/PATH"``, or a worker process's,
        whose supervisor is the only client); ``mode``: chmod the socket to it."""
        runner = await self._setup()
        await web.UnixSite(runner, path).start()
        if mode is not None:
            os.chmod(path, mode)

    async def _setup(self) -> web.AppRunner:
        runner = web.AppRunner(self.app, access_log=None, handle_signals=False)
        await runner.setup()
        self._runner = runner
        return runner

    async def stop(self) -> None:
        await self.backend.close()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @web.middleware
    async def _auth(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        refused = check_access(request, self.backend.token)
        return refused if refused is not None else await handler(request)

    # -- routes -------------------------------------------------------------------------------

    async def _metrics(self, request: web.Request) -> web.Response:
        body = await self.backend.exposition()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _readyz(self, request: web.Request) -> web.Response:
        return _json(await self.backend.ready())

    async def _stats(self, request: web.Request) -> web.Response:
        return web.json_response(await self.backend.stats())

    async def _invalidate(self, request: web.Request) -> web.Response:
        return _json(await self.backend.invalidate(await _body(request)))

    async def _warmup(self, request: web.Request) -> web.Response:
        return _json(await self.backend.warmup(await _body(request)))

    async def _warmup_list(self, request: web.Request) -> web.Response:
        return web.json_response(await self.backend.warmup_list())

    async def _warmup_get(self, request: web.Request) -> web.Response:
        return _found(await self.backend.warmup_get(_job_id(request)))

    async def _warmup_cancel(self, request: web.Request) -> web.Response:
        return _found(await self.backend.warmup_cancel(_job_id(request)))

    async def _reload(self, request: web.Request) -> web.Response:
        return _json(await self.backend.reload())


def _json(reply: Reply) -> web.Response:
    return web.json_response(reply.body, status=reply.status)


def _no_such_warmup() -> web.HTTPNotFound:
    return web.HTTPNotFound(text='{"error": "no such warm-up"}', content_type="application/json")


def _job_id(request: web.Request) -> int:
    try:
        return int(request.match_info["id"])
    except ValueError:
        raise _no_such_warmup() from None


def _found(reply: Reply | None) -> web.Response:
    if reply is None:
        raise _no_such_warmup()
    return _json(reply)


async def _body(request: web.Request) -> dict[str, Any]:
    """The request's JSON object; the query string when there is no body."""
    if not request.can_read_body:
        return dict(request.query)
    try:
        body = await request.json()
    except ValueError:
        raise web.HTTPBadRequest(text='{"error": "body is not JSON"}') from None
    if not isinstance(body, dict):
        raise web.HTTPBadRequest(text='{"error": "body must be a JSON object"}')
    return body


def _on_unix_socket(request: web.Request) -> bool:
    """Whether the request came in on a Unix socket (trusted by its file mode)."""
    transport = request.transport
    sock = transport.get_extra_info("socket") if transport is not None else None
    return sock is not None and sock.family == socket.AF_UNIX


def check_access(request: web.Request, token: str | None) -> web.Response | None:
    """None when the request may proceed, else the refusal (module docstring: Unix socket
    trusted; a token, when set, on everything but the probes; no token: reads only); then a
    body that is not ``application/json`` is 415."""
    if not _on_unix_socket(request):
        refused = check_token(request, token)
        if refused is not None:
            return refused
        if not token and request.method not in _READS:
            return web.json_response(
                {
                    "error": "a mutating admin call needs a bearer token (admin.token_file) or "
                    'the Unix-socket listen (admin.listen = "unix:/run/nfsgw/admin.sock")'
                },
                status=403,
            )
    if request.can_read_body and request.content_type != "application/json":
        return web.json_response(
            {"error": "a request body must be JSON sent as Content-Type: application/json"},
            status=415,
        )
    return None


def check_token(request: web.Request, token: str | None) -> web.Response | None:
    """401 unless the request carries the bearer ``token`` (when one is set); the probes
    (/healthz, /readyz) stay open."""
    if not token or request.path in _OPEN:
        return None
    scheme, _, value = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "bearer" and hmac.compare_digest(value.strip().encode(), token.encode()):
        return None
    return web.json_response(
        {"error": "a bearer token is required (admin.token_file)"},
        status=401,
        headers={"WWW-Authenticate": 'Bearer realm="nfsgw"'},
    )
