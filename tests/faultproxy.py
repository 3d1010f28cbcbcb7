"""A fault-injecting reverse proxy for S3, for reliability tests: it sits between the gateway
and SeaweedFS and breaks responses the way overloaded servers and bad networks do.

Owns: a small HTTP/1.1 front end written on asyncio streams (so a fault can break the framing
byte by byte, which a web framework will not let a handler do), forwarding to one upstream with
aiohttp (method, raw path and query and headers unchanged, ``Host`` included, so SigV4
signatures stay valid; path-style addressing only), fault rules, and counts. Must not: change
a response it does not fault.

Faults (``Rule.fault``):

============== ==================================================================================
``500``        ``500 InternalError`` (an S3 error body), nothing forwarded
``503``        ``503 SlowDown`` (S3's throttling answer), nothing forwarded
``reset``      the connection is reset (RST) before any byte of the response
``reset-body`` the upstream response's headers and half of its body, then a reset
``truncate``   headers and half of the body, then a clean close (FIN): a short body
``long-cl``    the whole body under a Content-Length 100 bytes larger, then a close
``short-cl``   a Content-Length of half the body and that half, connection kept: a server
               that says the object is shorter than it is
``stall``      nothing at all for ``stall_s`` seconds, then a close
``stall-body`` headers and half of the body, then nothing for ``stall_s``, then a close
``latency``    the response is delayed ``stall_s`` seconds, then sent whole
``flip-bit``   the whole response with one bit of its body inverted (a bit chosen by the seeded
               generator), Content-Length right: a corruption only a checksum can see. Not in
               ``FAULTS`` (the faults every read survives): a ranged read of part of an object
               has nothing to be checked against, so the gateway would serve it (see
               docs/reliability.md); it is in ``CORRUPTIONS``
============== ==================================================================================

A rule matches request kinds (``LIST`` for a bucket listing, else the method: ``GET``, ``HEAD``,
``PUT``, ``POST``, ``DELETE``), optionally only keys containing ``key``; it applies to the next
``times`` matching requests (None: until removed), each with ``probability`` (from a seeded
``random.Random``, so runs repeat). Request kinds are ``loadgen.proxy.request_kind``'s (the
one classification both proxies count by). Besides ``counts`` by (kind, fault), the proxy
counts GETs per object key (``gets``, without the bucket) and LISTs per ``prefix`` (``lists``),
faulted ones too. ``tests.harness.proxy.ThreadProxy`` runs it on a loop thread of its own.

    async with FaultProxy(seaweed.endpoint_url) as proxy:
        proxy.add(Rule("503", kinds={"GET"}, times=2))
        ...   # point the gateway's s3 endpoint at proxy.endpoint_url
        proxy.counts[("GET", "503")]
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import struct
from collections import Counter
from dataclasses import dataclass, field
from types import TracebackType
from urllib.parse import parse_qs, unquote, urlsplit

import aiohttp
from yarl import URL

from loadgen.proxy import request_kind

__all__ = ["CORRUPTIONS", "FAULTS", "FaultProxy", "Rule"]

FAULTS = (
    "500",
    "503",
    "reset",
    "reset-body",
    "truncate",
    "long-cl",
    "short-cl",
    "stall",
    "stall-body",
    "latency",
)
CORRUPTIONS = ("flip-bit",)
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
        "content-length",
    }
)
_MAX_HEADER_BYTES = 64 * 1024
_ERRORS = {
    "500": (500, "Internal Server Error", "InternalError", "We encountered an internal error."),
    "503": (503, "Slow Down", "SlowDown", "Please reduce your request rate."),
}


@dataclass(slots=True)
class Rule:
    fault: str
    kinds: frozenset[str] | set[str] = field(default_factory=lambda: {"GET"})
    times: int | None = None
    probability: float = 1.0
    key: str | None = None
    stall_s: float = 30.0

    def __post_init__(self) -> None:
        if self.fault not in FAULTS and self.fault not in CORRUPTIONS:
            known = ", ".join((*FAULTS, *CORRUPTIONS))
            raise ValueError(f"unknown fault {self.fault!r}; one of {known}")


@dataclass(slots=True)
class _Request:
    method: str
    target: str
    headers: list[tuple[str, str]]
    body: bytes
    close: bool


class _BadRequest(Exception):
    pass


async def _read_request(reader: asyncio.StreamReader) -> _Request | None:
    """One HTTP/1.1 request (None at a clean end of the connection)."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as e:
        if not e.partial:
            return None
        raise _BadRequest("connection closed inside a request head") from None
    except asyncio.LimitOverrunError:
        raise _BadRequest("request head too large") from None
    lines = head.decode("latin-1").split("\r\n")
    try:
        method, target, version = lines[0].split(" ", 2)
    except ValueError:
        raise _BadRequest(f"bad request line {lines[0]!r}") from None
    headers: list[tuple[str, str]] = []
    for line in lines[1:]:
        if line:
            k, _, v = line.partition(":")
            headers.append((k.strip(), v.strip()))
    h = {k.lower(): v for k, v in headers}
    if "chunked" in h.get("transfer-encoding", "").lower():
        body = bytearray()
        while True:
            size_line = await reader.readuntil(b"\r\n")
            n = int(size_line.split(b";")[0].strip() or b"0", 16)
            if n == 0:
                await reader.readuntil(b"\r\n")  # no trailers from our clients
                break
            body += await reader.readexactly(n)
            await reader.readexactly(2)
        data = bytes(body)
    else:
        data = await reader.readexactly(int(h.get("content-length", "0")))
    close = h.get("connection", "").lower() == "close" or version == "HTTP/1.0"
    return _Request(method, target, headers, data, close)


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP reset (SO_LINGER 0), not a FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class FaultProxy:
    def __init__(self, upstream: str, *, host: str = "127.0.0.1", seed: int = 0) -> None:
        parts = urlsplit(upstream)
        self.upstream = f"{parts.scheme}://{parts.netloc}"
        self.host = host
        self.port = 0
        self.rules: list[Rule] = []
        self.counts: Counter[tuple[str, str]] = Counter()
        self.gets: Counter[str] = Counter()  # GETs per key (without the bucket)
        self.lists: Counter[str] = Counter()  # LISTs per prefix
        self.rng = random.Random(seed)
        self._server: asyncio.Server | None = None
        self._session: aiohttp.ClientSession | None = None
        self._conns: set[asyncio.StreamWriter] = set()

    @property
    def endpoint_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    # ------------------------------------------------------------------ rules

    def add(self, *rules: Rule) -> None:
        self.rules.extend(rules)

    def clear(self) -> None:
        self.rules.clear()

    def faults(self) -> int:
        return sum(n for (_, f), n in self.counts.items() if f != "ok")

    def _pick(self, kind: str, target: str) -> Rule | None:
        for rule in self.rules:
            if kind not in rule.kinds or (rule.key is not None and rule.key not in target):
                continue
            if rule.times is not None and rule.times <= 0:
                continue
            if rule.probability < 1.0 and self.rng.random() >= rule.probability:
                continue
            if rule.times is not None:
                rule.times -= 1
            return rule
        return None

    # ------------------------------------------------------------------ life cycle

    async def start(self) -> FaultProxy:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=256),
            auto_decompress=False,
            skip_auto_headers=("Accept-Encoding", "User-Agent", "Content-Type"),
            timeout=aiohttp.ClientTimeout(total=120, sock_connect=10),
        )
        self._server = await asyncio.start_server(
            self._serve, self.host, 0, limit=_MAX_HEADER_BYTES
        )
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            for w in list(self._conns):
                w.transport.abort()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> FaultProxy:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # ------------------------------------------------------------------ serving

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._conns.add(writer)
        try:
            while True:
                try:
                    req = await _read_request(reader)
                except (_BadRequest, asyncio.IncompleteReadError, ConnectionError, ValueError):
                    return
                if req is None:
                    return
                keep = await self._one(req, writer)
                if not keep or req.close:
                    return
        except (ConnectionError, asyncio.CancelledError):
            return
        finally:
            self._conns.discard(writer)
            if not writer.transport.is_closing():
                writer.close()

    async def _one(self, req: _Request, writer: asyncio.StreamWriter) -> bool:
        """Answer one request; False when the connection must end."""
        path, _, query = req.target.partition("?")
        kind = request_kind(req.method, path, query)
        if kind == "GET":
            self.gets[unquote(path).lstrip("/").partition("/")[2]] += 1  # drop the bucket
        elif kind == "LIST":
            self.lists[parse_qs(query).get("prefix", [""])[0]] += 1
        rule = self._pick(kind, req.target)
        fault = rule.fault if rule else "ok"
        self.counts[(kind, fault)] += 1
        if rule is not None and fault in _ERRORS:
            status, reason, code, msg = _ERRORS[fault]
            body = (
                f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
                f"<Message>{msg}</Message></Error>"
            ).encode()
            head = [("Content-Type", "application/xml")]
            if fault == "503":
                head.append(("Retry-After", "1"))
            await self._write(writer, status, reason, head, body, len(body), req.method)
            return True
        if rule is not None and fault == "reset":
            _reset(writer)
            return False
        if rule is not None and fault == "stall":
            await asyncio.sleep(rule.stall_s)
            return False
        status, reason, headers, body = await self._forward(req)
        n = len(body)
        if rule is not None and fault == "flip-bit":
            if n:  # an empty body (or a HEAD) has no bit to flip: sent as it is
                bit = self.rng.randrange(n * 8)
                flipped = bytearray(body)
                flipped[bit // 8] ^= 1 << (bit % 8)
                body = bytes(flipped)
            await self._write(writer, status, reason, headers, body, n, req.method)
            return True
        if rule is None or fault == "latency":
            if rule is not None:
                await asyncio.sleep(rule.stall_s)
            await self._write(writer, status, reason, headers, body, n, req.method)
            return True
        if req.method == "HEAD" or n < 2:
            # nothing to cut: behave like a reset
            _reset(writer)
            return False
        half = body[: n // 2]
        if fault == "short-cl":
            await self._write(writer, status, reason, headers, half, len(half), req.method)
            return True
        if fault == "long-cl":
            await self._write(writer, status, reason, headers, body, n + 100, req.method)
            return False
        await self._write(writer, status, reason, headers, half, n, req.method)
        if fault == "reset-body":
            _reset(writer)
        elif fault == "stall-body":
            assert rule is not None
            await asyncio.sleep(rule.stall_s)
        return False

    async def _forward(self, req: _Request) -> tuple[int, str, list[tuple[str, str]], bytes]:
        assert self._session is not None
        headers = [(k, v) for k, v in req.headers if k.lower() not in _HOP_BY_HOP]
        url = URL(self.upstream + req.target, encoded=True)
        async with self._session.request(
            req.method,
            url,
            headers=headers,
            data=req.body if req.body or req.method in ("PUT", "POST") else None,
            allow_redirects=False,
        ) as up:
            body = await up.read() if req.method != "HEAD" else b""
            out = [(k, v) for k, v in up.headers.items() if k.lower() not in _HOP_BY_HOP]
            if req.method == "HEAD" and "Content-Length" in up.headers:
                out.append(("Content-Length", up.headers["Content-Length"]))
            return up.status, up.reason or "", out, body

    @staticmethod
    async def _write(
        writer: asyncio.StreamWriter,
        status: int,
        reason: str,
        headers: list[tuple[str, str]],
        body: bytes,
        content_length: int,
        method: str,
    ) -> None:
        lines = [f"HTTP/1.1 {status} {reason}"]
        lines += [f"{k}: {v}" for k, v in headers if k.lower() != "content-length"]
        if method == "HEAD":
            cl = next((v for k, v in headers if k.lower() == "content-length"), "0")
            lines.append(f"Content-Length: {cl}")
        else:
            lines.append(f"Content-Length: {content_length}")
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        if method != "HEAD":
            writer.write(body)
        await writer.drain()
