"""``FakeS3``: an S3 endpoint in memory, in the test's event loop, for tests of what the gateway
does over a real ``S3Store`` (signing, both wires, retries) where a SeaweedFS would add nothing:
what the gateway logs, how it meets a hostile server. Enough of the API for reads, listings and
single-request uploads (ListObjectsV2 without pages, HEAD, GET with ranges, PUT, copy,
DELETE); no signature is checked. ``hostile[key]``: how a GET of ``key`` is answered instead
(the connection is closed after). ``S3Gateway``: ``MemoryGateway`` whose exports' store is an
``S3Store`` to it, with the keys and retry policy the test gives.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import Awaitable, Callable
from urllib.parse import parse_qs, unquote
from xml.sax.saxutils import escape

from gateway.backend.base import ObjectStore, RequestObserver
from gateway.backend.config import RetryPolicy
from gateway.backend.s3 import S3Store
from gateway.exports import ExportConfig
from tests.harness.memory import MemoryGateway

LAST_MODIFIED = "Mon, 30 Nov 2026 10:00:00 GMT"
Hostile = Callable[[asyncio.StreamWriter], Awaitable[None]]


class FakeS3:
    """An S3 endpoint for one bucket, in memory: enough of the API for a gateway's reads,
    listings and single-request uploads."""

    def __init__(self, bucket: str, objects: dict[str, bytes]) -> None:
        self.bucket = bucket
        self.objects = dict(objects)
        self.port = 0
        self.hostile: dict[str, Hostile] = {}
        self._srv: asyncio.Server | None = None
        self._conns: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._srv = await asyncio.start_server(self._conn, "127.0.0.1", 0)
        self.port = self._srv.sockets[0].getsockname()[1]

    async def close(self) -> None:
        for t in list(self._conns):  # hostile answers may still be holding theirs
            t.cancel()
        await asyncio.gather(*self._conns, return_exceptions=True)
        if self._srv is not None:
            self._srv.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._srv.wait_closed(), 2)

    async def _conn(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        try:
            while True:
                head = (await r.readuntil(b"\r\n\r\n")).decode("latin-1")
                lines = head.split("\r\n")
                method, target, _ = lines[0].split(" ", 2)
                hdrs = {}
                for line in lines[1:]:
                    if line:
                        k, _, v = line.partition(":")
                        hdrs[k.strip().lower()] = v.strip()
                n = int(hdrs.get("content-length", "0"))
                body = await r.readexactly(n) if n else b""
                key = unquote(target.partition("?")[0]).lstrip("/").partition("/")[2]
                if method == "GET" and key in self.hostile:
                    await self.hostile[key](w)
                    return
                status, rh, rb = self.answer(method, target, hdrs, body)
                rh.setdefault("Content-Length", str(len(rb)))
                out = f"HTTP/1.1 {status}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in rh.items())
                w.write(out.encode() + b"\r\n" + (b"" if method == "HEAD" else rb))
                await w.drain()
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            self._conns.discard(task)
            w.close()

    def answer(
        self, method: str, target: str, hdrs: dict[str, str], body: bytes
    ) -> tuple[str, dict[str, str], bytes]:
        path, _, query = target.partition("?")
        parts = unquote(path).lstrip("/").split("/", 1)
        key = parts[1] if len(parts) > 1 else ""
        if not key:
            if method == "GET" and "list-type" in query:
                return self._list(parse_qs(query, keep_blank_values=True))
            return "200 OK", {}, b""
        if method == "PUT":
            src = hdrs.get("x-amz-copy-source")
            if src is not None:
                data = self.objects.get(unquote(src).lstrip("/").split("/", 1)[1])
                if data is None:
                    return self._missing()
                self.objects[key] = data
                etag = hashlib.md5(data).hexdigest()
                xml = f'<CopyObjectResult><ETag>"{etag}"</ETag></CopyObjectResult>'
                return "200 OK", {}, xml.encode()
            self.objects[key] = body
            return "200 OK", {"ETag": f'"{hashlib.md5(body).hexdigest()}"'}, b""
        if method == "DELETE":
            self.objects.pop(key, None)
            return "204 No Content", {}, b""
        data = self.objects.get(key)
        if data is None:
            return self._missing()
        h = {"ETag": f'"{hashlib.md5(data).hexdigest()}"', "Last-Modified": LAST_MODIFIED}
        rng = hdrs.get("range")
        if method == "GET" and rng:
            first, _, last = rng.partition("=")[2].partition("-")
            lo = int(first)
            hi = min(len(data), int(last) + 1) if last else len(data)
            if lo >= len(data):
                return "416 Range Not Satisfiable", {"Content-Range": f"bytes */{len(data)}"}, b""
            h["Content-Range"] = f"bytes {lo}-{hi - 1}/{len(data)}"
            return "206 Partial Content", h, data[lo:hi]
        if method == "HEAD":
            h["Content-Length"] = str(len(data))
            return "200 OK", h, b""
        return "200 OK", h, data

    def _missing(self) -> tuple[str, dict[str, str], bytes]:
        return "404 Not Found", {}, b"<Error><Code>NoSuchKey</Code><Message>no</Message></Error>"

    def _list(self, q: dict[str, list[str]]) -> tuple[str, dict[str, str], bytes]:
        prefix = q.get("prefix", [""])[0]
        delim = q.get("delimiter", [""])[0]
        after = q.get("start-after", [""])[0]
        contents, prefixes = [], set()
        for k in sorted(self.objects):
            if not k.startswith(prefix) or k <= after:
                continue
            rest = k[len(prefix) :]
            if delim and delim in rest:
                prefixes.add(prefix + rest.split(delim, 1)[0] + delim)
                continue
            data = self.objects[k]
            contents.append(
                f"<Contents><Key>{escape(k)}</Key><LastModified>2026-11-30T10:00:00.000Z"
                f"</LastModified><ETag>&quot;{hashlib.md5(data).hexdigest()}&quot;</ETag>"
                f"<Size>{len(data)}</Size></Contents>"
            )
        xml = (
            f"<ListBucketResult><Name>{self.bucket}</Name><Prefix>{escape(prefix)}</Prefix>"
            f"<KeyCount>{len(contents) + len(prefixes)}</KeyCount><MaxKeys>1000</MaxKeys>"
            "<IsTruncated>false</IsTruncated>"
            + "".join(contents)
            + "".join(
                f"<CommonPrefixes><Prefix>{escape(p)}</Prefix></CommonPrefixes>"
                for p in sorted(prefixes)
            )
            + "</ListBucketResult>"
        )
        return "200 OK", {"Content-Type": "application/xml"}, xml.encode()


class S3Gateway(MemoryGateway):
    """The in-process gateway over an ``S3Store`` to ``FakeS3`` with the known keys."""

    s3: FakeS3
    access_key = "AKIAFAKES3GATEWAY000"
    secret_key = "fake-s3-gateway-secret-key-000000000000"
    retry = RetryPolicy(max_attempts=2, deadline_s=3, base_delay_s=0.01, max_delay_s=0.02)

    def _store_for(self, ec: ExportConfig, observer: RequestObserver) -> ObjectStore:
        return S3Store(
            "bucket",
            endpoint_url=f"http://127.0.0.1:{self.s3.port}",
            region="us-east-1",
            access_key=self.access_key,
            secret_key=self.secret_key,
            retry=self.retry,
            observer=observer,
            name=ec.backend,
        )
