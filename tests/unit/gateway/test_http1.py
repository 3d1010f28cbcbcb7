"""The lean HTTP/1.1 wire (gateway/backend/http1.py) without a network: ``ReplyReader``
against hand-written replies, each fed whole, split at every byte boundary and byte by
byte; and ``Pool`` against an in-process asyncio server (keep-alive, Connection: close,
early close, unsolicited bytes, timeouts, cancellation)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from gateway.backend import http1
from gateway.backend.http1 import (
    BodyTooLarge,
    ConnectionClosed,
    HttpError,
    Pool,
    ReplyReader,
    Unframed,
)


def feed(reader: ReplyReader, data: bytes, cuts: list[int] | None = None) -> bool:
    """Write ``data`` through ``buffer()``/``written()`` in pieces ending at ``cuts``
    (and wherever a buffer is full); True when the reader says the reply is complete."""
    bounds = [*(cuts or []), len(data)]
    pos = 0
    done = False
    for end in bounds:
        while pos < end:
            buf = reader.buffer()
            n = min(len(buf), end - pos)
            buf[:n] = data[pos : pos + n]
            del buf
            done = reader.written(n)
            pos += n
            if done:
                return True
    return done


def read_all_ways(data: bytes, *, head: bool = False, eof: bool = False) -> list[ReplyReader]:
    """The reply read whole, split at each boundary, and byte by byte."""
    splits: list[list[int] | None] = [None, list(range(1, len(data)))]
    splits += [[i] for i in range(1, len(data))]
    readers = []
    for cuts in splits:
        r = ReplyReader(head)
        done = feed(r, data, cuts)
        if eof and not done:
            done = r.eof()
        assert done, cuts
        readers.append(r)
    return readers


OK = (
    b"HTTP/1.1 200 OK\r\n"
    b'ETag: "abc"\r\n'
    b"Content-Length: 11\r\n"
    b"x-amz-meta-Mode: 644\r\n"
    b"X-Dup: a\r\n"
    b"x-dup: b\r\n"
    b"\r\n"
    b"hello world"
)


def test_content_length_reply_at_every_split() -> None:
    for r in read_all_ways(OK):
        assert r.reply is not None
        assert (r.reply.status, r.reply.reason, r.reply.version) == (200, "OK", "HTTP/1.1")
        assert r.reply.headers == {
            "etag": '"abc"',
            "content-length": "11",
            "x-amz-meta-mode": "644",
            "x-dup": "a, b",
        }
        assert bytes(r.reply.body) == b"hello world" and r.keep_alive and not r.extra


@pytest.fixture(params=["compiled", "twin"])
def body_twin(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test with the compiled ``BodyBuffer`` (skipped where it is not built) and with the
    Python twin (a bytearray and a copy)."""
    if request.param == "twin":
        monkeypatch.setattr(http1, "_BODY_BUFFER", None)
    elif http1._BODY_BUFFER is None:
        pytest.skip("gateway._fastwire.BodyBuffer not built (or NFSGW_PURE_PYTHON=1)")
    return str(request.param)


def test_body_lands_in_one_preallocated_buffer(body_twin: str) -> None:
    body = bytes(range(256)) * 400
    data = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    r = ReplyReader()
    first = r.buffer()
    assert len(first) == 4096  # the head read; the rest goes straight into the body
    del first
    assert feed(r, data, [4096])
    assert r.reply is not None and r.reply.body == body
    assert type(r.reply.body) is bytes and len(r.reply.body) == len(body)


def test_body_is_the_buffer_received_into(body_twin: str) -> None:
    """Compiled: the bytes handed over is the buffer the body was received into (no copy),
    which refuses to be written once handed over; either twin: the same bytes."""
    body = bytes(range(256)) * 4000
    data = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    r = ReplyReader()
    assert not feed(r, data[:200])  # the head and the first bytes of the body
    view = r.buffer()
    owner = view.obj
    assert not view.readonly and len(view) == len(data) - 200
    del view
    assert feed(r, data[200:])
    assert r.reply is not None and r.reply.body == body and type(r.reply.body) is bytes
    if body_twin == "compiled":
        assert type(owner) is http1._BODY_BUFFER and len(owner) == len(body)
        with pytest.raises(BufferError):
            memoryview(owner)  # sealed: nothing writes into the bytes handed out
        assert owner.seal() is r.reply.body
    else:
        assert type(owner) is bytearray and owner == body


def test_short_body_is_never_handed_out(body_twin: str) -> None:
    data = b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + b"x" * 5000
    r = ReplyReader()
    assert not feed(r, data)
    with pytest.raises(ConnectionClosed, match="after 5000 of 100000"):
        r.eof()
    assert r.reply is not None and r.reply.body == b"" and r.body == b""


def test_head_and_no_body_statuses() -> None:
    head = b'HTTP/1.1 200 OK\r\nContent-Length: 123456\r\nETag: "e"\r\n\r\n'
    for r in read_all_ways(head, head=True):
        assert r.reply is not None and r.reply.body == b"" and r.keep_alive
        assert r.reply.headers["content-length"] == "123456"
    for status in (204, 304):
        for r in read_all_ways(b"HTTP/1.1 %d X\r\nContent-Length: 5\r\n\r\n" % status):
            assert r.reply is not None and r.reply.status == status and r.reply.body == b""


def test_zero_length_and_empty_reason() -> None:
    for r in read_all_ways(b"HTTP/1.1 200 \r\nContent-Length: 0\r\n\r\n"):
        assert r.reply is not None and r.reply.reason == "" and r.reply.body == b""


def test_interim_100_is_skipped() -> None:
    data = b"HTTP/1.1 100 Continue\r\n\r\n" + OK
    for r in read_all_ways(data):
        assert r.reply is not None and r.reply.status == 200
        assert bytes(r.reply.body) == b"hello world"


ERROR_DOC = b"<Error><Code>NoSuchKey</Code><Message>no</Message></Error>"
CHUNKED_ERROR = (
    b"HTTP/1.1 404 Not Found\r\n"
    b"Content-Type: application/xml\r\n"
    b"Transfer-Encoding: chunked\r\n"
    b"\r\n"
    + b"%x;ext=1\r\n%s\r\n" % (27, ERROR_DOC[:27])
    + b"%X\r\n%s\r\n" % (14, ERROR_DOC[27:41])
    + b"%x\r\n%s\r\n" % (len(ERROR_DOC) - 41, ERROR_DOC[41:])
    + b"0\r\n"
    b"X-Trailer: t\r\n"
    b"\r\n"
)


def test_chunked_error_reply_at_every_split() -> None:
    for r in read_all_ways(CHUNKED_ERROR):
        assert r.reply is not None and r.reply.status == 404
        assert bytes(r.reply.body) == ERROR_DOC
        assert not r.keep_alive and not r.extra


def test_close_delimited_error_reply() -> None:
    data = b"HTTP/1.1 503 Slow Down\r\n\r\n<Error><Code>SlowDown</Code></Error>"
    for r in read_all_ways(data, eof=True):
        assert r.reply is not None and r.reply.status == 503 and not r.keep_alive
        assert bytes(r.reply.body) == b"<Error><Code>SlowDown</Code></Error>"


@pytest.mark.parametrize(
    "head",
    [
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"HTTP/1.1 206 Partial\r\n\r\n",
    ],
)
def test_2xx_without_length_is_unframed(head: bytes) -> None:
    with pytest.raises(Unframed):
        feed(ReplyReader(), head + b"5\r\nhello\r\n0\r\n\r\n")


@pytest.mark.parametrize(
    "data",
    [
        b"HTTP/2 200 OK\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 2000 OK\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 abc OK\r\nContent-Length: 0\r\n\r\n",
        b"ICY 200 OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nBad Header\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nName : v\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n folded: v\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nA: b\nC: d\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nA: b\rC: d\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 1, 2\r\n\r\nx",
        b"HTTP/1.1 200 OK\r\nContent-Length: 0x10\r\n\r\n",
        b"HTTP/1.1 404 NF\r\nTransfer-Encoding: gzip\r\n\r\n",
        b"HTTP/1.1 404 NF\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 404 NF\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabX\r\n",
        b"HTTP/1.1 101 Switching\r\n\r\n",
    ],
)
def test_bad_replies(data: bytes) -> None:
    for cuts in (None, list(range(1, len(data)))):
        with pytest.raises(HttpError):
            feed(ReplyReader(), data, cuts)


def test_same_content_length_twice_is_one() -> None:
    r = ReplyReader()
    assert feed(r, b"HTTP/1.1 200 OK\r\nContent-Length: 2, 2\r\n\r\nhi")
    assert r.reply is not None and bytes(r.reply.body) == b"hi"


def test_oversized_head() -> None:
    big = b"HTTP/1.1 200 OK\r\n" + b"x-big: " + b"a" * 70_000 + b"\r\n\r\n"
    with pytest.raises(HttpError, match="over"):
        feed(ReplyReader(), big)
    small = ReplyReader(max_header_bytes=100)
    with pytest.raises(HttpError, match="over 100"):
        feed(small, b"HTTP/1.1 200 OK\r\nx: " + b"a" * 200 + b"\r\n\r\n")
    # just under the bound is fine
    line = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nx: "
    fits = line + b"a" * (100 - len(line) - 2) + b"\r\n"
    ok = ReplyReader(max_header_bytes=100)
    assert feed(ok, fits + b"\r\n")


def test_error_body_is_bounded() -> None:
    r = ReplyReader(max_error_body=10)
    with pytest.raises(BodyTooLarge, match="at most 10 allowed"):
        feed(r, b"HTTP/1.1 500 X\r\n\r\n" + b"a" * 11)


@pytest.mark.parametrize("at", [0, 5, 39, 40, 58])
def test_early_close_is_retryable(at: int) -> None:
    data = b"HTTP/1.1 200 OK\r\nContent-Length: 20\r\n\r\n0123456789abcdefghij"
    r = ReplyReader()
    assert not feed(r, data[:at])
    with pytest.raises(ConnectionClosed):
        r.eof()
    assert isinstance(ConnectionClosed("x"), ConnectionError)  # the store retries OSErrors


def test_extra_bytes_after_the_body_are_counted() -> None:
    for r in read_all_ways(OK + b"HTTP/1.1 200 OK\r\n"):
        assert r.reply is not None and bytes(r.reply.body) == b"hello world"
    r = ReplyReader()
    assert feed(r, OK + b"junk")  # arrived in the head read with the body
    assert r.extra == 4
    r = ReplyReader()
    assert feed(r, b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\nX")
    assert r.extra == 1


@pytest.mark.parametrize(
    ("head", "keep"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", True),
        (b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n", False),
        (b"HTTP/1.1 200 OK\r\nConnection: Close\r\nContent-Length: 0\r\n\r\n", False),
        (b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n", False),
        (b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n", True),
    ],
)
def test_keep_alive(head: bytes, keep: bool) -> None:
    r = ReplyReader()
    assert feed(r, head)
    assert r.keep_alive is keep


# ------------------------------------------------------------------ Pool over a socket

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@contextlib.asynccontextmanager
async def server(handler: Handler) -> AsyncIterator[tuple[Pool, list[int]]]:
    """A local server running ``handler`` per connection; a Pool to it; the list of
    connections accepted."""
    accepted: list[int] = []

    async def conn(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        accepted.append(1)
        try:
            await handler(r, w)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            w.close()

    srv = await asyncio.start_server(conn, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    pool = Pool("127.0.0.1", port, limit=4, idle_s=0.5)
    try:
        yield pool, accepted
    finally:
        pool.close()
        srv.close()
        await srv.wait_closed()


REQ = b"GET /b/k HTTP/1.1\r\nhost: x\r\n\r\n"


def answering(*replies: bytes, then_close: bool = False) -> Handler:
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        for reply in replies:
            await r.readuntil(b"\r\n\r\n")
            w.write(reply)
            await w.drain()
        if not then_close:
            await r.read()

    return handler


async def request(pool: Pool, timeout_s: float = 2.0, head: bool = False) -> bytes:
    reply = await pool.request(REQ, head=head, timeout_s=timeout_s, connect_timeout_s=1.0)
    return bytes(reply.body)


async def test_keep_alive_reuses_one_connection() -> None:
    async with server(answering(OK, OK, OK)) as (pool, accepted):
        for _ in range(3):
            assert await request(pool) == b"hello world"
        assert len(accepted) == 1 and pool.connects == 1 and pool.idle_connections == 1


async def test_connection_close_is_honoured() -> None:
    closing = OK.replace(b"ETag", b"Connection: close\r\nETag")
    async with server(answering(closing, then_close=True)) as (pool, accepted):
        assert await request(pool) == b"hello world"
        assert pool.idle_connections == 0
        assert await request(pool) == b"hello world"
        assert len(accepted) == 2


async def test_early_close_mid_body_raises_and_discards() -> None:
    cut = b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b"x" * 40
    async with server(answering(cut, then_close=True)) as (pool, _):
        with pytest.raises(ConnectionClosed):
            await request(pool)
        assert pool.open_connections == 0


async def test_extra_bytes_after_reply_discard_the_connection() -> None:
    async with server(answering(OK + b"garbage", OK)) as (pool, accepted):
        assert await request(pool) == b"hello world"
        assert await request(pool) == b"hello world"
        assert len(accepted) == 2


async def test_first_byte_timeout_discards_the_connection() -> None:
    async def stall(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await r.readuntil(b"\r\n\r\n")
        w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhal")  # then nothing
        await asyncio.sleep(5)

    async with server(stall) as (pool, _):
        with pytest.raises(TimeoutError):
            await request(pool, timeout_s=0.2)
        assert pool.open_connections == 0


async def test_cancellation_leaves_nothing_half_read() -> None:
    async def slow_then_ok(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await r.readuntil(b"\r\n\r\n")
        await asyncio.sleep(0.3)
        w.write(OK)
        await w.drain()
        await r.read()

    async with server(slow_then_ok) as (pool, accepted):
        task = asyncio.create_task(request(pool))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert pool.open_connections == 0
        assert await request(pool) == b"hello world"  # a fresh connection, a whole reply
        assert len(accepted) == 2


async def test_server_closing_idle_connection_is_not_reused() -> None:
    async with server(answering(OK, then_close=True)) as (pool, accepted):
        assert await request(pool) == b"hello world"
        await asyncio.sleep(0.1)  # the server's FIN arrives while idle
        assert await request(pool) == b"hello world"
        assert len(accepted) == 2


async def test_idle_connections_are_closed_after_idle_s() -> None:
    async with server(answering(OK)) as (pool, _):
        assert await request(pool) == b"hello world"
        assert pool.idle_connections == 1
        await asyncio.sleep(0.8)  # idle_s = 0.5
        assert pool.idle_connections == 0


async def test_unsolicited_bytes_break_an_idle_connection() -> None:
    async def chatty(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await r.readuntil(b"\r\n\r\n")
        w.write(OK)
        await w.drain()
        await asyncio.sleep(0.05)
        w.write(b"HTTP/1.1 200 OK\r\n")
        await r.read()

    async with server(chatty) as (pool, accepted):
        assert await request(pool) == b"hello world"
        await asyncio.sleep(0.15)
        assert pool.idle_connections in (0, 1)
        with contextlib.suppress(ConnectionError):
            await request(pool)
        assert len(accepted) == 2


async def test_connect_refused_is_oserror() -> None:
    srv = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    srv.close()
    await srv.wait_closed()
    pool = Pool("127.0.0.1", port)
    with pytest.raises(OSError):
        await pool.request(REQ, head=False, timeout_s=1.0, connect_timeout_s=0.5)
    assert pool.open_connections == 0


async def test_store_falls_back_to_aiohttp_on_a_2xx_without_length() -> None:
    """A store that sends GET bodies chunked: the lean wire refuses the reply (Unframed), the
    store retries over aiohttp, which reads it, and stays on aiohttp."""
    from gateway.backend.config import RetryPolicy
    from gateway.backend.s3 import S3Store

    chunked = (
        b'HTTP/1.1 200 OK\r\nETag: "e"\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n'
    )

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while True:
            await r.readuntil(b"\r\n\r\n")
            w.write(chunked)
            await w.drain()

    async with server(handler) as (pool, _):
        calls: list[tuple[str, str]] = []
        store = S3Store(
            "bucket",
            endpoint_url=f"http://127.0.0.1:{pool.port}",
            region="us-east-1",
            access_key="AK",
            secret_key="SK",
            retry=RetryPolicy(base_delay_s=0.001, max_delay_s=0.002),
            observer=lambda op, outcome, s: calls.append((op, outcome)),
            lean_http=True,
        )
        try:
            assert (await store.get("k")).data == b"hello"
            assert store._pool is None  # aiohttp from now on
            assert (await store.get("k")).data == b"hello"
        finally:
            await store.close()
        assert calls == [("get", "retry"), ("get", "ok"), ("get", "ok")]


def test_the_pool_under_uvloop() -> None:
    """The gateway's default loop: uvloop's transports are not asyncio.Transport subclasses
    (a type check there crashed every lean GET of the gateway)."""
    uvloop = pytest.importorskip("uvloop")

    body = bytes(range(256)) * 800  # 200 kB: the last read fills the body's buffer exactly
    big = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)

    async def run() -> None:
        async with server(answering(OK, OK)) as (pool, accepted):
            assert await request(pool) == b"hello world"
            assert await request(pool) == b"hello world"
            assert len(accepted) == 1
        # libuv asks for a buffer again after a read that filled the one it had, before it
        # knows whether more bytes came: that is no reason to drop the connection.
        async with server(answering(big, big, big)) as (pool, accepted):
            for _ in range(3):
                assert await request(pool) == body
            assert len(accepted) == 1 and pool.connects == 1

    uvloop.run(run())


# ------------------------------------------------------------- chunked 2xx bodies (LIST)

LIST_XML = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<ListBucketResult xmlns="http://s3.amazonaws.com/'
    b'doc/2006-03-01/"><Name>bucket</Name><Prefix>d%2F</Prefix><KeyCount>2</KeyCount>'
    b"<MaxKeys>1000</MaxKeys><Delimiter>%2F</Delimiter><EncodingType>url</EncodingType>"
    b"<IsTruncated>false</IsTruncated><Contents><Key>d%2Fa.jpg</Key><LastModified>"
    b"2026-11-27T01:00:00.000Z</LastModified><ETag>&quot;0123&quot;</ETag><Size>5</Size>"
    b"</Contents><CommonPrefixes><Prefix>d%2Fsub%2F</Prefix></CommonPrefixes>"
    b"</ListBucketResult>"
)


def chunked(status: bytes, body: bytes, sizes: tuple[int, ...] = (100, 7, 1000)) -> bytes:
    """A reply with ``body`` in chunks of ``sizes`` (cycled), a trailer and the last chunk."""
    out = [b"HTTP/1.1 " + status + b"\r\nContent-Type: application/xml\r\n"]
    out.append(b"Transfer-Encoding: chunked\r\n\r\n")
    pos = i = 0
    while pos < len(body):
        n = sizes[i % len(sizes)]
        piece = body[pos : pos + n]
        out.append(b"%x;x=y\r\n%s\r\n" % (len(piece), piece))
        pos += n
        i += 1
    out.append(b"0\r\nX-Trailer: t\r\n\r\n")
    return b"".join(out)


def test_chunked_2xx_is_read_when_asked_at_every_split() -> None:
    data = chunked(b"200 OK", LIST_XML[:300], (37, 1, 100))
    splits: list[list[int] | None] = [None, list(range(1, len(data)))]
    splits += [[i] for i in range(1, len(data))]
    for cuts in splits:
        r = ReplyReader(unframed_ok=True)
        assert feed(r, data, cuts), cuts
        assert r.reply is not None and r.reply.status == 200
        assert bytes(r.reply.body) == LIST_XML[:300]
        assert r.keep_alive and not r.extra  # read to its end: the connection is reusable
    with pytest.raises(Unframed):  # not asked: refused, as before
        feed(ReplyReader(), data)


def test_chunked_2xx_is_bounded() -> None:
    r = ReplyReader(unframed_ok=True, max_unframed_body=100)
    with pytest.raises(BodyTooLarge, match="at most 100 allowed"):
        feed(r, chunked(b"200 OK", b"a" * 101))


def test_close_delimited_2xx_when_asked() -> None:
    r = ReplyReader(unframed_ok=True)
    assert not feed(r, b"HTTP/1.1 200 OK\r\n\r\n" + LIST_XML)
    assert r.eof() and r.reply is not None and bytes(r.reply.body) == LIST_XML
    assert not r.keep_alive


async def test_store_lists_chunked_pages_over_the_lean_wire() -> None:
    """Amazon S3 sends LIST pages chunked: the lean wire reads them (and keeps the connection),
    the store does not fall back to aiohttp, and GETs stay lean."""
    from gateway.backend.s3 import S3Store

    get_reply = b'HTTP/1.1 200 OK\r\nETag: "e"\r\nContent-Length: 5\r\n\r\nhello'
    seen: list[bytes] = []

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while True:
            head = await r.readuntil(b"\r\n\r\n")
            seen.append(head.split(b" ", 2)[1])
            w.write(chunked(b"200 OK", LIST_XML) if b"list-type=2" in head else get_reply)
            await w.drain()

    async with server(handler) as (pool, accepted):
        store = S3Store(
            "bucket",
            endpoint_url=f"http://127.0.0.1:{pool.port}",
            region="us-east-1",
            access_key="AK",
            secret_key="SK",
            lean_http=True,
        )
        try:
            for _ in range(2):
                page = await store.list_page("d/")
                assert [o.key for o in page.objects] == ["d/a.jpg"]
                assert page.prefixes == ["d/sub/"] and page.next_token is None
                assert page.digest  # what a re-list compares
            assert (await store.get("k")).data == b"hello"
            assert store._pool is not None and store._pool.connects == 1
        finally:
            await store.close()
        assert len(accepted) == 1  # the lean wire, one kept-alive connection for all three
        assert seen[0].startswith(b"/bucket?") and seen[2] == b"/bucket/k"


# -------------------------------------------- bounds (issue 37: a head claiming 1 GiB)


def test_a_head_claiming_more_than_asked_is_refused_before_allocation(
    body_twin: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The claim is checked against ``max_body`` when the head is parsed: no body buffer is
    ever asked for (``body_buffer`` would raise), the error names both lengths."""

    def no_buffer(n: int) -> Any:
        raise AssertionError(f"a {n}-byte body buffer was allocated")

    monkeypatch.setattr(http1, "body_buffer", no_buffer)
    r = ReplyReader(max_body=1000)
    with pytest.raises(BodyTooLarge, match="claims a 1073741824-byte body, at most 1000") as e:
        feed(r, b"HTTP/1.1 206 Partial Content\r\nContent-Length: 1073741824\r\n\r\nabc")
    assert (e.value.status, e.value.claimed, e.value.allowed) == (206, 1 << 30, 1000)
    monkeypatch.undo()
    ok = ReplyReader(max_body=11)  # exactly the bound is fine
    assert feed(ok, OK) and ok.reply is not None and ok.reply.body == b"hello world"


def test_error_replies_are_bounded_by_max_error_body() -> None:
    r = ReplyReader(max_body=1 << 30, max_error_body=100)
    with pytest.raises(BodyTooLarge, match="HTTP 503 reply claims a 101-byte body, at most 100"):
        feed(r, b"HTTP/1.1 503 Slow Down\r\nContent-Length: 101\r\n\r\n")
    # chunked: refused at the chunk size that passes the bound, before its data came
    r = ReplyReader(max_error_body=100)
    head = b"HTTP/1.1 500 X\r\nTransfer-Encoding: chunked\r\n\r\n"
    with pytest.raises(BodyTooLarge, match="claims a 1048586-byte body"):
        feed(r, head + b"a\r\n0123456789\r\n100000\r\n")


def test_a_chunked_2xx_is_refused_at_the_chunk_size() -> None:
    r = ReplyReader(unframed_ok=True, max_unframed_body=1 << 20)
    with pytest.raises(BodyTooLarge, match="claims a 1073741824-byte body"):
        feed(r, b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n40000000\r\n")
    r = ReplyReader(unframed_ok=True)
    with pytest.raises(HttpError, match="bad chunk size"):
        feed(r, b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"f" * 40 + b"\r\n")


def test_an_absurd_content_length_is_a_framing_error() -> None:
    """Past 19 digits (and past int()'s 4,300-digit limit, which raised ValueError out of
    the protocol callback): a bad length, not a crash."""
    for digits in (20, 5000):
        r = ReplyReader()
        with pytest.raises(HttpError, match="bad Content-Length"):
            feed(r, b"HTTP/1.1 200 OK\r\nContent-Length: " + b"9" * digits + b"\r\n\r\n")


def test_a_body_of_no_known_bound_grows_as_it_arrives(monkeypatch: pytest.MonkeyPatch) -> None:
    """``max_body`` None: bounded by ``max_unsized_body``; past ``_PREALLOC_UNSIZED`` the
    body is received into a growing buffer (memory follows the bytes that came), the same
    bytes in the end."""
    monkeypatch.setattr(http1, "_PREALLOC_UNSIZED", 1000)
    body = bytes(range(256)) * 40
    data = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    for cuts in (None, [50, 100, 5000], list(range(1, len(data), 997))):
        r = ReplyReader()
        assert not feed(r, data[:-1], cuts)
        assert len(r.body) < len(body)  # what came so far, not what was claimed
        assert feed(r, data[-1:]) and r.reply is not None
        assert r.reply.body == body and type(r.reply.body) is bytes and not r.extra
    r = ReplyReader()
    assert not feed(r, data[:5000])
    with pytest.raises(ConnectionClosed, match="after 4958 of 10240 body bytes"):
        r.eof()
    with pytest.raises(BodyTooLarge, match="at most 5000"):
        feed(ReplyReader(max_unsized_body=5000), data)


def test_endless_header_lines_are_refused() -> None:
    many = b"HTTP/1.1 200 OK\r\n" + b"x: y\r\n" * 300 + b"Content-Length: 0\r\n\r\n"
    with pytest.raises(HttpError, match="301 header lines, at most 256"):
        feed(ReplyReader(), many)
    assert feed(ReplyReader(max_header_lines=400), many)


async def test_pool_refuses_a_huge_claim_and_drops_the_connection() -> None:
    huge = b"HTTP/1.1 200 OK\r\nContent-Length: 1073741824\r\n\r\nab"
    first, then = answering(huge), answering(OK)
    conns: list[int] = []

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        conns.append(1)
        await (first if len(conns) == 1 else then)(r, w)

    async with server(handler) as (pool, accepted):
        with pytest.raises(BodyTooLarge):
            await pool.request(
                REQ, head=False, timeout_s=2.0, connect_timeout_s=1.0, max_body=1 << 20
            )
        assert pool.open_connections == 0
        assert await request(pool) == b"hello world"
        assert len(accepted) == 2


async def test_a_slow_body_fails_at_the_request_deadline() -> None:
    """A body that keeps coming, one byte at a time, well inside any "no progress" timeout:
    the request's deadline covers the whole body."""

    async def drip(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await r.readuntil(b"\r\n\r\n")
        w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
        for _ in range(1000):
            w.write(b"x")
            await w.drain()
            await asyncio.sleep(0.02)

    async with server(drip) as (pool, _):
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(TimeoutError):
            await request(pool, timeout_s=0.5)
        assert loop.time() - t0 < 1.5 and pool.open_connections == 0
