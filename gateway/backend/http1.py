"""A lean HTTP/1.1 client for the S3 store's GET, HEAD and LIST: one keep-alive connection pool
per endpoint on ``asyncio.BufferedProtocol``, the reply's body received straight into a buffer
of its ``Content-Length``.

Owns: ``ReplyReader`` (sans-I/O: the framing of one reply, RFC 9112 §2-§7, written into the
buffers it hands out), ``Reply``, ``Pool`` (connect, TLS, keep-alive, idle bound, timeouts,
cancellation) and the errors ``HttpError`` / ``ConnectionClosed`` / ``Unframed``, all
``ConnectionError``s, so the store retries them like aiohttp's. Must not: sign, retry, know
S3 or map statuses to errors (``s3.py`` does those); send request bodies (aiohttp carries
PUT, POST and DELETE).

Why: aiohttp's request and response machinery was ~60 % of the ~220-280 µs of CPU a 110 kB
GET cost (``benchmarks/s3_client_cpu.py``); a bare asyncio keep-alive GET costs ~35 µs. The
request goes out in one ``transport.write`` of bytes built by the caller; the status line
and headers are parsed from the first bytes received (at most ``max_header_bytes``); the
body is received into a buffer of its ``Content-Length`` through ``get_buffer`` /
``buffer_updated``: one ``recv_into`` per arrival, no chunk lists, no joins. Only the bytes
of the body that came with the headers (at most ``_HEAD_CHUNK``) are copied.

That buffer is the ``bytes`` the reply hands over (``Reply.body``), filled in place
(``gateway._fastwire.BodyBuffer``): not zeroed first, and not copied after, so a pack's 8 MiB
group costs one fresh buffer instead of a zeroed ``bytearray`` and a ``bytes`` copy of it
(two fresh buffers: ~4 ms of CPU each on a VM where new pages fault expensively; ~31 % of a
packed cold epoch's gateway CPU). The body is sealed (made visible) only once every byte
arrived; a short one is dropped. The Python twin (``NFSGW_PURE_PYTHON=1``, or not built)
receives into a ``bytearray`` and copies it to ``bytes`` at the end: the same bytes.

Framing rules (RFC 9112 §6.3): a reply to HEAD, a 1xx (skipped, except 101), 204 or 304 has
no body; ``Transfer-Encoding`` wins over ``Content-Length`` (and the connection closes after);
chunked bodies and bodies delimited by the close are read (bounded by ``max_unframed_body``)
for non-2xx replies, which S3 error documents may be, and for 2xx replies only where the
caller takes them (``unframed_ok``: LIST, whose pages Amazon S3 sends chunked); otherwise a
2xx body without a ``Content-Length`` raises ``Unframed`` (the store then falls back to
aiohttp). A chunked 2xx reply read to its end keeps the connection. A connection
is reused only after its reply was read to the end, and only if the reply allows it
(``Connection: close``, HTTP/1.0 without keep-alive, close-delimited bodies, bytes after the
reply: closed). A connection that failed, timed out or whose request was cancelled is
aborted, never pooled.

Bounds (issue 37: a 60-byte head claiming 1 GiB made a worker take ~1 GiB of RSS before any
body byte came). Every body is bounded before a byte of it is allocated: a 2xx body by
``max_body`` (what the caller asked for: a range's length, the object's size from its
listing, a pack group's size), a non-2xx one by ``max_error_body``; a head claiming more (or
a chunk that would take a body past it) raises ``BodyTooLarge``, naming the claimed and the
allowed length, and the connection is aborted. A caller that knows no bound (``max_body``
None) still gets one (``Pool.max_body``), and such a body is preallocated only up to
``_PREALLOC_UNSIZED``, received beyond that as it arrives (so memory follows the bytes that
came, not the bytes claimed). The head is bounded by ``max_header_bytes`` and
``max_header_lines`` ("endless headers"), the whole exchange (connect, head and body) by the
request's deadline (``timeout_s``: a body that trickles in fails at it, ``TimeoutError``).
"""

from __future__ import annotations

import asyncio
import collections
import functools
import importlib
import os
import ssl
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from typing import Final, cast

_HEAD_CHUNK: Final = 4096  # first read; grown by doubling up to max_header_bytes
_SCRATCH: Final = 16384  # read size for chunked and close-delimited (error) bodies
_DISCARD: Final = memoryview(bytearray(_SCRATCH))  # read into when no reply is expected
_MAX_LINE: Final = 4096  # a chunk-size or trailer line
_MAX_LENGTH_DIGITS: Final = 19  # a Content-Length past 10**19 is no length (and int() limits)
_PREALLOC_UNSIZED: Final = 16 << 20  # a body of no known bound: preallocated up to this
DEFAULT_MAX_HEADER_LINES: Final = 256

# ReplyReader states
_HEAD: Final = 0
_BODY: Final = 1  # Content-Length bytes into self._fill
_CHUNKED: Final = 2
_UNTIL_CLOSE: Final = 3
_DONE: Final = 4
_GROWN: Final = 5  # Content-Length bytes of no known bound, grown as they arrive

# chunked sub-states
_C_SIZE: Final = 0
_C_DATA: Final = 1
_C_CRLF: Final = 2
_C_TRAILER: Final = 3


class HttpError(ConnectionError):
    """A reply that breaks HTTP/1.1 framing (bad status line, bad header, oversized head,
    bad chunk): the connection is closed; worth retrying."""


class ConnectionClosed(HttpError):
    """The server closed the connection before the reply was complete."""


class BodyTooLarge(HttpError):
    """A reply whose body is (or, chunked, would become) longer than the caller allows:
    refused before the body is allocated; the connection is aborted. ``status`` is the
    reply's, ``headers`` its headers (as ``Reply.headers``), ``claimed`` the length its head
    (or its chunks so far) gave, ``allowed`` the bound."""

    def __init__(
        self, status: int, claimed: int, allowed: int, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(
            f"HTTP {status} reply claims a {claimed}-byte body, at most {allowed} allowed"
        )
        self.status = status
        self.claimed = claimed
        self.allowed = allowed
        self.headers = headers or {}


class Unframed(HttpError):
    """A 2xx reply whose body has no ``Content-Length`` (chunked or delimited by the close):
    the lean path does not receive those; the caller may send the request another way."""


@dataclass(eq=False, repr=False, slots=True)
class Reply:
    """One reply: ``status``, ``headers`` (names lowercase; repeated ones joined with
    ``", "``) and ``body``: ``bytes`` when the reply had a ``Content-Length`` (the buffer it
    was received into, handed over as it is), a ``bytearray`` when it was chunked or
    delimited by the close (grown as it arrived)."""

    version: str
    status: int
    reason: str
    headers: dict[str, str]
    body: bytes | bytearray


_EMPTY: Final = bytearray()
_NO_FILL: Final = memoryview(b"")


def _compiled_body() -> type | None:
    """``gateway._fastwire.BodyBuffer``, or None (``NFSGW_PURE_PYTHON=1``, or not built)."""
    if os.environ.get("NFSGW_PURE_PYTHON", "") not in ("", "0"):
        return None
    try:
        return cast(type, importlib.import_module("gateway._fastwire").BodyBuffer)
    except (ImportError, AttributeError):
        return None


_BODY_BUFFER: Final = _compiled_body()


def body_buffer(n: int) -> tuple[memoryview, Callable[[], bytes]]:
    """A writable buffer of ``n`` (> 0) bytes to receive a body into, and what turns it into
    the body's ``bytes`` once every byte was written (call it once, then write no more): the
    compiled ``BodyBuffer`` (uninitialised bytes, filled in place: no zeroing, no copy), or
    the twin's ``bytearray`` and a copy of it."""
    cls = _BODY_BUFFER
    if cls is None:
        ba = bytearray(n)
        return memoryview(ba), functools.partial(bytes, ba)
    b = cls(n)
    return memoryview(b), b.seal


def parse_head(
    text: str, max_lines: int = DEFAULT_MAX_HEADER_LINES
) -> tuple[str, int, str, dict[str, str]]:
    """(version, status, reason, headers) of a reply head without its final CRLF CRLF.
    Raises ``HttpError`` for anything RFC 9112 does not allow a server to send (bare LF or
    CR, obsolete line folding, whitespace before a colon, a bad status line) and for more
    than ``max_lines`` header lines."""
    lines = text.split("\r\n")
    if len(lines) - 1 > max_lines:
        raise HttpError(f"reply head of {len(lines) - 1} header lines, at most {max_lines}")
    if text.count("\n") != len(lines) - 1 or "\r" in text.replace("\r\n", ""):
        raise HttpError("bare CR or LF in a reply head")
    version, _, rest = lines[0].partition(" ")
    code, _, reason = rest.partition(" ")
    if version not in ("HTTP/1.1", "HTTP/1.0") or len(code) != 3 or not code.isdigit():
        raise HttpError(f"bad status line {lines[0][:100]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name[-1] in " \t" or name[0] in " \t":
            raise HttpError(f"bad header line {line[:100]!r}")
        name = name.lower()
        value = value.strip(" \t")
        if name in headers:
            headers[name] = f"{headers[name]}, {value}"
        else:
            headers[name] = value
    return version, int(code), reason, headers


def _content_length(value: str) -> int:
    """RFC 9110 §8.6: digits; a list of identical values is that value."""
    first = value
    if "," in value:
        values = {v.strip() for v in value.split(",")}
        if len(values) != 1:
            raise HttpError(f"conflicting Content-Length {value[:100]!r}")
        first = values.pop()
    if not first.isdigit() or not first.isascii() or len(first) > _MAX_LENGTH_DIGITS:
        raise HttpError(f"bad Content-Length {value[:100]!r}")
    return int(first)


class ReplyReader:
    """Sans-I/O framing of one reply. The transport writes into ``buffer()`` and reports
    how much with ``written(n)``, which returns True once the reply is complete (then
    ``reply``, ``keep_alive`` and ``extra`` are set); ``eof()`` when the peer closed.
    Errors raise ``HttpError``.

    ``head_request``: the request was HEAD (no body whatever the headers say).
    ``max_header_bytes`` and ``max_header_lines`` bound the status line and headers;
    ``max_body`` a 2xx body (None: no bound known, then at most ``max_unsized_body``, and
    preallocated only up to ``_PREALLOC_UNSIZED``); ``max_error_body`` a non-2xx one;
    ``max_unframed_body`` a chunked or close-delimited 2xx body when ``unframed_ok``. Past
    them: ``BodyTooLarge``, before the body is allocated."""

    __slots__ = (
        "_bpos",
        "_chunk_left",
        "_cstate",
        "_fill",
        "_head",
        "_hlen",
        "_line",
        "_max_body",
        "_max_error",
        "_max_head",
        "_max_lines",
        "_max_unframed",
        "_max_unsized",
        "_scratch",
        "_seal",
        "_state",
        "_unframed_ok",
        "body",
        "extra",
        "head_request",
        "keep_alive",
        "reply",
    )

    def __init__(
        self,
        head_request: bool = False,
        *,
        max_header_bytes: int = 64 * 1024,
        max_header_lines: int = DEFAULT_MAX_HEADER_LINES,
        max_body: int | None = None,
        max_error_body: int = 64 * 1024,
        max_unframed_body: int = 1 << 20,
        max_unsized_body: int = 1 << 30,
        unframed_ok: bool = False,
    ) -> None:
        self.head_request = head_request
        self._unframed_ok = unframed_ok
        self._max_head = max_header_bytes
        self._max_lines = max_header_lines
        self._max_body = max_body
        self._max_error = max_error_body
        self._max_unframed = max_unframed_body
        self._max_unsized = max_unsized_body
        self._head = bytearray(_HEAD_CHUNK)
        self._hlen = 0
        self._state = _HEAD
        self.body: bytes | bytearray = _EMPTY
        self._fill = _NO_FILL  # where a Content-Length body is being received
        self._seal: Callable[[], bytes] = bytes
        self._bpos = 0
        self._scratch: bytearray | None = None
        self._cstate = _C_SIZE
        self._chunk_left = 0
        self._line = bytearray()
        self.reply: Reply | None = None
        self.keep_alive = False
        self.extra = 0  # bytes received after the end of the reply (the connection is unusable)

    @property
    def done(self) -> bool:
        return self._state == _DONE

    @property
    def started(self) -> bool:
        """Whether any byte of the reply arrived."""
        return self._hlen > 0 or self._state != _HEAD

    def buffer(self) -> memoryview:
        """Where the next bytes go (never empty while the reply is incomplete)."""
        state = self._state
        if state == _BODY:
            return self._fill[self._bpos :]
        if state == _HEAD:
            head = self._head
            if self._hlen == len(head):
                if len(head) >= self._max_head + 4:
                    raise HttpError(f"reply head over {self._max_head} bytes")
                head.extend(bytes(min(len(head), self._max_head + 4 - len(head))))
            return memoryview(head)[self._hlen :]
        if state == _DONE:
            raise HttpError("bytes after the end of the reply")
        if self._scratch is None:
            self._scratch = bytearray(_SCRATCH)
        return memoryview(self._scratch)

    def written(self, n: int) -> bool:
        """``n`` bytes were written into the last ``buffer()``; True when the reply is
        complete."""
        state = self._state
        if state == _BODY:
            self._bpos += n
            if self._bpos == len(self._fill):
                self._sealed()
                return True
            return False
        if state == _HEAD:
            start = max(0, self._hlen - 3)
            self._hlen += n
            end = self._head.find(b"\r\n\r\n", start, self._hlen)
            if end < 0:
                if self._hlen > self._max_head:
                    raise HttpError(f"reply head over {self._max_head} bytes")
                return False
            return self._headed(end)
        if state == _DONE:
            self.extra += n
            return True
        assert self._scratch is not None
        if state == _GROWN:
            return self._grown(memoryview(self._scratch)[:n])
        return self._more(memoryview(self._scratch)[:n])

    def eof(self) -> bool:
        """The peer closed its side: True if that ends the reply (a close-delimited body),
        else raises ``ConnectionClosed``."""
        if self._state == _UNTIL_CLOSE:
            self._state = _DONE
            self.keep_alive = False
            return True
        if self._state == _DONE:
            return True
        if self._state == _BODY:
            raise ConnectionClosed(
                f"connection closed after {self._bpos} of {len(self._fill)} body bytes"
            )
        if self._state == _GROWN:
            raise ConnectionClosed(
                f"connection closed after {len(self.body)} of {self._bpos} body bytes"
            )
        if self._state == _HEAD and self._hlen == 0:
            raise ConnectionClosed("connection closed before a reply")
        raise ConnectionClosed("connection closed inside a reply")

    # -------------------------------------------------------------------- internals

    def _headed(self, end: int) -> bool:
        """The head ends at ``end`` (the CRLF CRLF): parse it, set up the body."""
        head = self._head
        if end > self._max_head:
            raise HttpError(f"reply head over {self._max_head} bytes")
        version, status, reason, headers = parse_head(head[:end].decode("latin-1"), self._max_lines)
        rest = memoryview(head)[end + 4 : self._hlen]
        if 100 <= status < 200:
            if status == 101:
                raise HttpError("unexpected 101 Switching Protocols")
            # An interim reply (100 Continue): the real one follows.
            left = bytes(rest)
            rest.release()
            self._head = bytearray(max(_HEAD_CHUNK, len(left)))
            self._head[: len(left)] = left
            self._hlen = 0
            return self.written(len(left)) if left else False
        conn = headers.get("connection", "").lower()
        self.reply = Reply(version, status, reason, headers, _EMPTY)
        self.keep_alive = "close" not in conn if version == "HTTP/1.1" else "keep-alive" in conn
        te = headers.get("transfer-encoding")
        if self.head_request or status in (204, 304):
            length = 0
        elif te is not None:
            if te.lower().rpartition(",")[2].strip() != "chunked":
                raise HttpError(f"unsupported Transfer-Encoding {te[:100]!r}")
            if 200 <= status < 300:
                if not self._unframed_ok:
                    raise Unframed(f"HTTP {status} with a chunked body")
            else:
                self.keep_alive = False  # rare (error documents); closing is the simple end
            self._state = _CHUNKED
            self._bpos = self._unframed_bound(status)
            return self._more(rest) if len(rest) else False
        elif (cl := headers.get("content-length")) is not None:
            length = _content_length(cl)
        else:
            if 200 <= status < 300 and not self._unframed_ok:
                raise Unframed(f"HTTP {status} without Content-Length")
            self.keep_alive = False
            self._state = _UNTIL_CLOSE
            self._bpos = self._unframed_bound(status)
            return self._more(rest) if len(rest) else False
        have = len(rest)
        if length == 0:
            self._state = _DONE
            self.extra = have
            return True
        # Bounded before anything is allocated for it.
        if not 200 <= status < 300:
            allowed = self._max_error
        elif self._max_body is not None:
            allowed = self._max_body
        else:
            allowed = self._max_unsized
        if length > allowed:
            raise BodyTooLarge(status, length, allowed, headers)
        if self._max_body is None and length > _PREALLOC_UNSIZED and 200 <= status < 300:
            # No bound known: grown as it arrives, so memory follows the bytes that came.
            self._state = _GROWN
            self._bpos = length  # the length to reach
            take = min(have, length)
            self.extra = have - take
            return self._grown(rest[:take]) if take else False
        fill, self._seal = body_buffer(length)
        take = min(have, length)
        fill[:take] = rest[:take]
        self._fill = fill
        self._bpos = take
        self.extra = have - take
        if take == length:
            self._sealed()
            return True
        self._state = _BODY
        return False

    def _sealed(self) -> None:
        """Every byte of a Content-Length body arrived: it becomes ``reply.body``."""
        assert self.reply is not None
        self._fill = _NO_FILL
        self.body = self.reply.body = self._seal()
        self._state = _DONE

    def _unframed_bound(self, status: int) -> int:
        """The bound of a chunked or close-delimited body of a reply with ``status``."""
        return self._max_unframed if 200 <= status < 300 else self._max_error

    def _grown(self, data: memoryview) -> bool:
        """Bytes of a Content-Length body of no known bound (``_GROWN``): appended; True once
        all ``_bpos`` arrived (then sealed as ``bytes``)."""
        body = self.body
        if body is _EMPTY:
            body = bytearray()
            self.body = body
        left = self._bpos - len(body)
        cast(bytearray, body).extend(data[:left])
        if len(data) > left:
            self.extra += len(data) - left
        if len(body) < self._bpos:
            return False
        assert self.reply is not None
        self.body = self.reply.body = bytes(body)
        self._state = _DONE
        return True

    def _grow(self, data: memoryview) -> None:
        if len(self.body) + len(data) > self._bpos:
            assert self.reply is not None
            r = self.reply
            raise BodyTooLarge(r.status, len(self.body) + len(data), self._bpos, r.headers)
        body = self.body
        if body is _EMPTY:
            body = bytearray()
            assert self.reply is not None
            self.body = self.reply.body = body
        cast(bytearray, body).extend(data)

    def _more(self, data: memoryview) -> bool:
        """Bytes of a chunked or close-delimited body."""
        if self._state == _UNTIL_CLOSE:
            self._grow(data)
            return False
        pos, n = 0, len(data)
        while pos < n:
            cstate = self._cstate
            if cstate == _C_DATA:
                take = min(self._chunk_left, n - pos)
                self._grow(data[pos : pos + take])
                pos += take
                self._chunk_left -= take
                if self._chunk_left == 0:
                    self._cstate = _C_CRLF
                continue
            # a line: a chunk size, the CRLF after a chunk, or a trailer line
            nl = bytes(data[pos:n]).find(b"\n")
            if nl < 0:
                self._line += data[pos:n]
                if len(self._line) > _MAX_LINE:
                    raise HttpError("chunk line too long")
                return False
            self._line += data[pos : pos + nl + 1]
            pos += nl + 1
            line = bytes(self._line)
            self._line.clear()
            if len(line) > _MAX_LINE:
                raise HttpError("chunk line too long")
            if not line.endswith(b"\r\n"):
                raise HttpError("bare LF in a chunked body")
            line = line[:-2]
            if cstate == _C_CRLF:
                if line:
                    raise HttpError("no CRLF after a chunk")
                self._cstate = _C_SIZE
            elif cstate == _C_SIZE:
                size = line.partition(b";")[0].strip(b" \t")
                if not size or size.strip(b"0123456789abcdefABCDEF"):
                    raise HttpError(f"bad chunk size {line[:40]!r}")
                if len(size) > 16:
                    raise HttpError(f"bad chunk size {line[:40]!r}")
                self._chunk_left = int(size, 16)
                if len(self.body) + self._chunk_left > self._bpos:
                    assert self.reply is not None
                    r = self.reply
                    raise BodyTooLarge(
                        r.status, len(self.body) + self._chunk_left, self._bpos, r.headers
                    )
                if self._chunk_left:
                    self._cstate = _C_DATA
                else:
                    self._cstate = _C_TRAILER
            elif not line:  # the empty line after the trailers: the end
                self._state = _DONE
                self.extra = n - pos
                return True
        return False


# ------------------------------------------------------------------------ connections


class _Conn(asyncio.BufferedProtocol):
    """One connection: at most one request in flight; bytes that arrive with none are a
    protocol error (the connection is then unusable)."""

    __slots__ = ("_expire", "_fut", "_loop", "broken", "reader", "transport")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.transport: asyncio.Transport | None = None
        self.reader: ReplyReader | None = None
        self._fut: asyncio.Future[ReplyReader] | None = None
        self.broken = False
        self._expire: asyncio.TimerHandle | None = None

    # protocol callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)

    def get_buffer(self, sizehint: int) -> memoryview:
        r = self.reader
        if r is None:
            # Not yet a sign of unsolicited bytes: uvloop (libuv) asks for a buffer before
            # each read it tries, and keeps trying after the reply's last bytes until the
            # socket has nothing more (marking the connection broken here made every request
            # under uvloop open a new one). Bytes that do arrive: buffer_updated drops it.
            return _DISCARD
        try:
            return r.buffer()
        except HttpError as e:
            self._fail(e)
            return memoryview(bytearray(_SCRATCH))

    def buffer_updated(self, nbytes: int) -> None:
        r = self.reader
        if r is None:
            self._abort()
            return
        try:
            done = r.written(nbytes)
        except HttpError as e:
            self._fail(e)
            return
        if done:
            self._finish()

    def eof_received(self) -> bool:
        r = self.reader
        self.broken = True
        if r is not None:
            try:
                if r.eof():
                    self._finish()
            except HttpError as e:
                self._fail(e)
        return False  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        self.broken = True
        if self.reader is not None:
            err = ConnectionClosed(f"connection lost: {exc}" if exc else "connection closed")
            self._fail(err)

    # the request side
    def exchange(
        self, request: bytes, reader: ReplyReader, deadline: float
    ) -> asyncio.Future[ReplyReader]:
        """Send ``request``; the future completes with ``reader`` done, or fails
        (``HttpError``, ``TimeoutError`` at ``deadline`` on the loop's clock)."""
        fut = self._loop.create_future()
        assert self.transport is not None and self.reader is None
        self.reader = reader
        self._fut = fut
        self._expire = self._loop.call_at(deadline, self._timed_out)
        self.transport.write(request)
        return fut

    def _timed_out(self) -> None:
        self._expire = None
        self._fail(TimeoutError("no complete reply before the deadline"))

    def _finish(self) -> None:
        r, fut = self.reader, self._fut
        self.reader = self._fut = None
        if self._expire is not None:
            self._expire.cancel()
            self._expire = None
        if r is not None and (not r.keep_alive or r.extra):
            self.broken = True
        if fut is not None and not fut.done():
            fut.set_result(r)  # type: ignore[arg-type]

    def _fail(self, exc: BaseException) -> None:
        fut = self._fut
        self.reader = self._fut = None
        if self._expire is not None:
            self._expire.cancel()
            self._expire = None
        self._abort()
        if fut is not None and not fut.done():
            fut.set_exception(exc)

    def _abort(self) -> None:
        self.broken = True
        t = self.transport
        if t is not None and not t.is_closing():
            t.abort()

    def close(self) -> None:
        """Drop the connection (whatever it was doing)."""
        self.reader = None
        fut, self._fut = self._fut, None
        if self._expire is not None:
            self._expire.cancel()
            self._expire = None
        if fut is not None and not fut.done():
            fut.cancel()
        self._abort()


@dataclass(eq=False, repr=False)
class Pool:
    """Keep-alive connections to one endpoint (``host``, ``port``, TLS with ``ssl_context``
    or plain). At most ``limit`` connections open; idle ones are reused newest first and
    closed after ``idle_s``. ``request`` is safe to cancel: the connection of a request
    that did not complete is aborted. Bounds of a reply (``ReplyReader``): its head
    (``max_header_bytes``, ``max_header_lines``), a non-2xx body (``max_error_body``), a 2xx
    body the request gives no bound for (``max_body``)."""

    host: str
    port: int
    _: KW_ONLY
    ssl_context: ssl.SSLContext | None = None
    server_hostname: str | None = None
    limit: int = 64
    idle_s: float = 15.0
    max_header_bytes: int = 64 * 1024
    max_header_lines: int = DEFAULT_MAX_HEADER_LINES
    max_error_body: int = 64 * 1024
    max_body: int = 1 << 30
    _idle: collections.deque[tuple[_Conn, float]] = field(
        init=False, default_factory=collections.deque
    )
    _busy: int = field(init=False, default=0)
    _sweep: asyncio.TimerHandle | None = field(init=False, default=None)
    _closed: bool = field(init=False, default=False)
    connects: int = field(init=False, default=0)  # connections opened (tests, metrics)

    @property
    def open_connections(self) -> int:
        return self._busy + len(self._idle)

    @property
    def idle_connections(self) -> int:
        return len(self._idle)

    async def request(
        self,
        request: bytes,
        *,
        head: bool,
        timeout_s: float,
        connect_timeout_s: float,
        unframed_body: int = 0,
        max_body: int | None = None,
    ) -> Reply:
        """Send ``request`` (a whole HTTP/1.1 request without a body) and read its reply.
        ``timeout_s`` bounds everything (connect, head and body: a body that trickles in
        fails at it), ``connect_timeout_s`` the connect. ``unframed_body`` > 0 takes a 2xx
        body without a Content-Length (chunked or up to the close) of at most that many
        bytes. ``max_body``: the longest 2xx body the caller asked for (None: not known,
        ``self.max_body``). Raises ``HttpError`` (``ConnectionClosed``, ``Unframed``,
        ``BodyTooLarge``), ``OSError``, ``TimeoutError``."""
        if self._closed:
            raise ConnectionClosed("pool closed")
        loop = asyncio.get_running_loop()
        now = loop.time()
        deadline = now + timeout_s
        conn = self._take_idle(now)
        self._busy += 1
        reusable = False
        try:
            if conn is None:
                conn = await self._connect(loop, min(connect_timeout_s, timeout_s))
            reader = ReplyReader(
                head,
                max_header_bytes=self.max_header_bytes,
                max_header_lines=self.max_header_lines,
                max_body=max_body,
                max_error_body=self.max_error_body,
                max_unframed_body=unframed_body,
                max_unsized_body=self.max_body,
                unframed_ok=unframed_body > 0,
            )
            await conn.exchange(request, reader, deadline)
            reusable = not conn.broken
            reply = reader.reply
            assert reply is not None
            return reply
        finally:
            self._busy -= 1
            if conn is not None:
                if reusable and not self._closed and self.open_connections < self.limit:
                    self._put_idle(conn, loop)
                else:
                    conn.close()

    def _take_idle(self, now: float) -> _Conn | None:
        idle = self._idle
        while idle:
            conn, since = idle.pop()
            if conn.broken or now - since > self.idle_s:
                conn.close()
                continue
            return conn
        return None

    def _put_idle(self, conn: _Conn, loop: asyncio.AbstractEventLoop) -> None:
        self._idle.append((conn, loop.time()))
        if self._sweep is None:
            self._sweep = loop.call_later(self.idle_s, self._sweep_idle, loop)

    def _sweep_idle(self, loop: asyncio.AbstractEventLoop) -> None:
        """Close connections idle longer than ``idle_s`` (oldest are on the left)."""
        self._sweep = None
        now = loop.time()
        idle = self._idle
        while idle and (idle[0][0].broken or now - idle[0][1] >= self.idle_s):
            idle.popleft()[0].close()
        if idle:
            wait = max(0.05, self.idle_s - (now - idle[0][1]))
            self._sweep = loop.call_later(wait, self._sweep_idle, loop)

    async def _connect(self, loop: asyncio.AbstractEventLoop, timeout_s: float) -> _Conn:
        self.connects += 1
        async with asyncio.timeout(timeout_s):
            _, proto = await loop.create_connection(
                lambda: _Conn(loop),
                self.host,
                self.port,
                ssl=self.ssl_context,
                server_hostname=self.server_hostname if self.ssl_context else None,
            )
        return proto

    def close(self) -> None:
        """Close idle connections; busy ones close when their request ends."""
        self._closed = True
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        while self._idle:
            self._idle.pop()[0].close()
