"""S3Store against a real S3 server (SeaweedFS, marker ``s3``) and against a tiny scripted
HTTP server for retries, timeouts and short bodies (no marker: it needs no SeaweedFS)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from gateway.backend import open_store, parse_store_url
from gateway.backend.base import (
    AccessDeniedError,
    BackendError,
    BackendUnavailable,
    ObjectNotFound,
    ObjectStore,
    PreconditionFailed,
)
from gateway.backend.config import RetryPolicy
from gateway.backend.credentials import CredentialCache
from gateway.backend.s3 import S3Store
from loadgen.proxy import DelayProxy
from loadgen.seaweed import SeaweedServer

# Keys whose encoding has bitten S3 clients: spaces, '+', '%', unicode, reserved characters.
ODD_KEYS = [
    "plain.txt",
    "with space.txt",
    "plus+sign",
    "percent%20literal",
    "ünïcödé/ファイル.jpg",
    "emoji😀.bin",
    "q?x=1&y#frag",
    "tilde~(paren)!*'",
    "semi;colon,comma@at$dollar",
]


class Recorder:
    """An observer that records every (op, outcome)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def __call__(self, op: str, outcome: str, seconds: float) -> None:
        assert seconds >= 0
        self.calls.append((op, outcome))

    def ops(self) -> Counter[str]:
        return Counter(op for op, _ in self.calls)


async def list_all(
    store: ObjectStore, prefix: str, delimiter: str | None = "/", max_keys: int = 1000
) -> tuple[list[str], list[str], int]:
    keys: list[str] = []
    prefixes: list[str] = []
    token: str | None = None
    pages = 0
    while True:
        page = await store.list_page(prefix, delimiter=delimiter, token=token, max_keys=max_keys)
        pages += 1
        keys += [o.key for o in page.objects]
        prefixes += page.prefixes
        assert page.skipped == 0
        token = page.next_token
        if token is None:
            return keys, prefixes, pages


async def put_many(store: ObjectStore, keys: list[str], data: bytes = b"") -> None:
    sem = asyncio.Semaphore(32)

    async def one(k: str) -> None:
        async with sem:
            await store.put(k, data)

    await asyncio.gather(*(one(k) for k in keys))


# ------------------------------------------------------------------- against SeaweedFS


@pytest.mark.s3
async def test_list_pagination_2500_keys(s3_store: S3Store) -> None:
    keys = [f"train/n{i % 3:02d}/img_{i:05d}.jpg" for i in range(2500)]
    await put_many(s3_store, keys)
    got, prefixes, pages = await list_all(s3_store, "train/", delimiter=None, max_keys=1000)
    assert pages == 3 and got == sorted(keys) and prefixes == []
    got, prefixes, pages = await list_all(s3_store, "train/")
    assert got == [] and prefixes == ["train/n00/", "train/n01/", "train/n02/"] and pages == 1
    page = await s3_store.list_page("train/n01/", max_keys=1000)
    assert len(page.objects) == 833 and page.next_token is None
    o = page.objects[0]
    assert o.size == 0 and o.etag and '"' not in o.etag and o.mtime_ns > 1_600_000_000 * 10**9
    page = await s3_store.list_page("train/n01/", start_after="train/n01/img_02485.jpg")
    assert [o.key for o in page.objects] == [
        "train/n01/img_02488.jpg",
        "train/n01/img_02491.jpg",
        "train/n01/img_02494.jpg",
        "train/n01/img_02497.jpg",
    ]


@pytest.mark.s3
async def test_odd_keys_and_markers(s3_store: S3Store) -> None:
    keys = [f"odd/{k}" for k in ODD_KEYS] + ["odd/dir/", "odd/dir/inside", "odd/empty dir/"]
    for k in keys:
        await s3_store.put(k, b"" if k.endswith("/") else k.encode())
    got, prefixes, _ = await list_all(s3_store, "odd/")
    flat = sorted(k for k in keys if "/" not in k[len("odd/") :])
    assert got == flat
    assert prefixes == sorted(["odd/dir/", "odd/empty dir/", "odd/ünïcödé/"])
    got, _, _ = await list_all(s3_store, "odd/", delimiter=None, max_keys=3)
    assert got == sorted(keys, key=lambda k: k.encode())
    got, prefixes, _ = await list_all(s3_store, "odd/dir/")
    assert got == ["odd/dir/", "odd/dir/inside"] and prefixes == []
    for k in keys:
        if not k.endswith("/"):
            assert (await s3_store.get(k)).data == k.encode()
            assert (await s3_store.head(k)).size == len(k.encode())
    # a prefix with spaces and '+' is encoded in the query string correctly
    got, _, _ = await list_all(s3_store, "odd/plus+")
    assert got == ["odd/plus+sign"]
    got, _, _ = await list_all(s3_store, "odd/with sp")
    assert got == ["odd/with space.txt"]


@pytest.mark.s3
async def test_head_get_ranges_and_if_match(s3_store: S3Store) -> None:
    body = bytes(range(256)) * 40  # 10,240 bytes
    info = await s3_store.put("obj", body, {"mtime": "1700000000", "Mode": "0644"})
    assert info.size == len(body) and info.etag and '"' not in info.etag
    head = await s3_store.head("obj")
    assert (head.size, head.etag) == (len(body), info.etag)
    assert head.metadata == {"mtime": "1700000000", "mode": "0644"}
    listed = (await s3_store.list_page("")).objects[0]
    assert (listed.size, listed.etag, listed.mtime_ns) == (head.size, head.etag, head.mtime_ns)

    whole = await s3_store.get("obj")
    assert whole.data == body and whole.size == len(body) and whole.etag == info.etag
    assert whole.metadata == head.metadata and whole.mtime_ns == head.mtime_ns
    part = await s3_store.get("obj", 100, 4196, if_match=info.etag)
    assert part.data == body[100:4196] and part.size == len(body)
    assert part.metadata == head.metadata
    assert (await s3_store.get("obj", 10_000)).data == body[10_000:]
    assert (await s3_store.get("obj", 10_000, 99_999)).data == body[10_000:]
    tail = await s3_store.get("obj", len(body))
    assert tail.data == b"" and tail.size == len(body)
    empty = await s3_store.get("obj", 5, 5)
    assert empty.data == b"" and empty.size == len(body)

    await s3_store.put("obj", b"new version")
    with pytest.raises(PreconditionFailed):
        await s3_store.get("obj", 0, 4, if_match=info.etag)
    with pytest.raises(PreconditionFailed):
        await s3_store.get("obj", if_match=info.etag)
    assert (await s3_store.head("obj")).metadata == {}


@pytest.mark.s3
async def test_not_found(s3_store: S3Store) -> None:
    rec = Recorder()
    s3_store._observer = rec
    with pytest.raises(ObjectNotFound):
        await s3_store.head("missing")
    with pytest.raises(ObjectNotFound):
        await s3_store.get("missing")
    with pytest.raises(ObjectNotFound):
        await s3_store.get("missing", 5, 10)
    with pytest.raises(ObjectNotFound):
        await s3_store.copy("missing", "dst")
    await s3_store.delete("missing")
    page = await s3_store.list_page("missing/")
    assert page.objects == [] and page.prefixes == [] and page.next_token is None
    assert [o for _, o in rec.calls[:4]] == ["not_found"] * 4


@pytest.mark.s3
async def test_put_multipart_copy_delete(s3_store: S3Store) -> None:
    part1 = b"a" * (5 << 20)  # S3's minimum size for all but the last part
    part2 = b"tail"
    uid = await s3_store.create_multipart("mp/big", {"mtime": "42"})
    e2 = await s3_store.upload_part("mp/big", uid, 2, part2)
    e1 = await s3_store.upload_part("mp/big", uid, 1, part1)
    info = await s3_store.complete_multipart("mp/big", uid, [(1, e1), (2, e2)])
    assert info.size == len(part1) + len(part2) and info.etag
    head = await s3_store.head("mp/big")
    assert head.size == info.size and head.etag == info.etag
    assert head.metadata == {"mtime": "42"}
    got = await s3_store.get("mp/big", len(part1) - 2)
    assert got.data == b"aatail"

    uid = await s3_store.create_multipart("mp/aborted")
    await s3_store.upload_part("mp/aborted", uid, 1, b"x")
    await s3_store.abort_multipart("mp/aborted", uid)
    with pytest.raises(ObjectNotFound):
        await s3_store.head("mp/aborted")

    await s3_store.put("c/src name+1", b"copy me", {"mode": "0600"})
    copied = await s3_store.copy("c/src name+1", "c/dst ü")
    assert copied.size == 7 and copied.metadata == {"mode": "0600"}
    replaced = await s3_store.copy("c/src name+1", "c/dst2", {"mode": "0644", "uid": "1000"})
    assert replaced.metadata == {"mode": "0644", "uid": "1000"}
    assert (await s3_store.get("c/dst2")).data == b"copy me"

    await s3_store.delete("c/src name+1")
    with pytest.raises(ObjectNotFound):
        await s3_store.head("c/src name+1")
    keys, _, _ = await list_all(s3_store, "c/")
    assert keys == ["c/dst ü", "c/dst2"]


@pytest.mark.s3
async def test_unsigned_payload_and_open_store(seaweed: SeaweedServer, s3_bucket: str) -> None:
    ep = seaweed.store_kwargs()
    store = S3Store(s3_bucket, payload_signing="never", **ep)
    try:
        await store.put("u/one", b"unsigned body")
        assert (await store.get("u/one")).data == b"unsigned body"
    finally:
        await store.close()
    url = f"s3://{s3_bucket}/u?endpoint={ep['endpoint_url']}&region={ep['region']}"
    assert parse_store_url(url).prefix == "u/"
    opened = open_store(url, access_key=ep["access_key"], secret_key=ep["secret_key"])
    try:
        assert isinstance(opened, S3Store)
        page = await opened.list_page("u/")
        assert [o.key for o in page.objects] == ["u/one"]
    finally:
        await opened.close()


@pytest.mark.s3
async def test_credentials_from_environment(
    seaweed: SeaweedServer, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", seaweed.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", seaweed.secret_key)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    store = S3Store(s3_bucket, endpoint_url=seaweed.endpoint_url)
    try:
        await store.put("env", b"ok")
        assert store.region == "us-east-1"
    finally:
        await store.close()
    bad = S3Store(
        s3_bucket, endpoint_url=seaweed.endpoint_url, access_key="nope", secret_key="nope"
    )
    try:
        with pytest.raises(AccessDeniedError):
            await bad.head("env")
    finally:
        await bad.close()


@pytest.mark.s3
async def test_request_counts_observer_equals_proxy(
    seaweed: SeaweedServer, s3_bucket: str, counting_proxy: DelayProxy
) -> None:
    rec = Recorder()
    ep = seaweed.store_kwargs()
    ep["endpoint_url"] = counting_proxy.endpoint_url
    store = S3Store(s3_bucket, observer=rec, **ep)
    try:
        await put_many(store, [f"d/f{i:04d}" for i in range(1500)], b"0123456789")
        for i in range(10):
            assert (await store.head(f"d/f{i:04d}")).size == 10
            assert (await store.get(f"d/f{i:04d}", 2, 6)).data == b"2345"
        with pytest.raises(ObjectNotFound):
            await store.get("d/none")
        keys, _, pages = await list_all(store, "d/")
        assert len(keys) == 1500 and pages == 2
        await store.copy("d/f0000", "e/copy")
        uid = await store.create_multipart("e/mp")
        etag = await store.upload_part("e/mp", uid, 1, b"xyz")
        await store.complete_multipart("e/mp", uid, [(1, etag)])
        await store.delete("e/copy")
    finally:
        await store.close()
    assert len(rec.calls) == counting_proxy.counts.total()
    ops = rec.ops()
    kinds = {
        "LIST": ops["list"],
        "HEAD": ops["head"],
        "GET": ops["get"],
        "PUT": ops["put"] + ops["upload_part"] + ops["copy"],
        "POST": ops["create_multipart"] + ops["complete_multipart"],
        "DELETE": ops["delete"] + ops["abort_multipart"],
    }
    assert {k: v for k, v in kinds.items() if v} == dict(counting_proxy.counts)
    # copy = PUT + HEAD (for the size); one GET per get(), one LIST per page
    assert counting_proxy.counts["GET"] == 11 and counting_proxy.counts["LIST"] == 2
    assert counting_proxy.counts["HEAD"] == 11 and counting_proxy.counts["PUT"] == 1502


# ---------------------------------------------------------- against a scripted server


@dataclass
class Reply:
    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    send_bytes: int | None = None  # send only this many body bytes, then close (truncation)
    delay_s: float = 0.0


@dataclass
class FaultServer:
    """A minimal HTTP/1.1 server (keep-alive) answering from a script of ``Reply``s; the
    last reply repeats. Records (method, target, headers) per request."""

    script: list[Reply]
    requests: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)
    port: int = 0
    server: asyncio.Server | None = None

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._conn, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()

    async def _conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, target, _ = lines[0].split(" ", 2)
                headers = {}
                for line in lines[1:]:
                    if ":" in line:
                        k, v = line.split(":", 1)
                        headers[k.strip().lower()] = v.strip()
                if n := int(headers.get("content-length", "0")):
                    await reader.readexactly(n)
                self.requests.append((method, target, headers))
                r = self.script[min(len(self.requests), len(self.script)) - 1]
                if r.delay_s:
                    await asyncio.sleep(r.delay_s)
                hdrs = {"Content-Length": str(len(r.body)), **r.headers}
                out = f"HTTP/1.1 {r.status} X\r\n" + "".join(
                    f"{k}: {v}\r\n" for k, v in hdrs.items()
                )
                writer.write(out.encode() + b"\r\n")
                if method != "HEAD":
                    writer.write(r.body[: r.send_bytes] if r.send_bytes is not None else r.body)
                await writer.drain()
                if r.send_bytes is not None:
                    return
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


@contextlib.asynccontextmanager
async def scripted(
    *replies: Reply, policy: RetryPolicy | None = None, **kw: Any
) -> AsyncIterator[tuple[S3Store, FaultServer, Recorder]]:
    srv = FaultServer(list(replies))
    await srv.start()
    rec = Recorder()
    store = S3Store(
        "bucket",
        endpoint_url=srv.endpoint_url,
        region="us-east-1",
        access_key="AK",
        secret_key="SK",
        observer=rec,
        retry=policy or RetryPolicy(max_attempts=4, base_delay_s=0.01, max_delay_s=0.05),
        **kw,
    )
    try:
        yield store, srv, rec
    finally:
        await store.close()
        await srv.close()


OBJ_HEADERS = {"ETag": '"abc"', "Last-Modified": "Wed, 12 Oct 2009 17:50:00 GMT"}


async def test_retry_500_twice_then_ok() -> None:
    ok = Reply(200, b"hello", OBJ_HEADERS)
    async with scripted(Reply(500), Reply(500), ok) as (store, srv, rec):
        got = await store.get("k")
    assert got.data == b"hello" and got.etag == "abc" and got.mtime_ns == 1255369800 * 10**9
    assert len(srv.requests) == 3
    assert rec.calls == [("get", "retry"), ("get", "retry"), ("get", "ok")]
    method, target, headers = srv.requests[0]
    assert (method, target) == ("GET", "/bucket/k")
    assert headers["authorization"].startswith("AWS4-HMAC-SHA256 Credential=AK/")
    assert headers["host"] == f"127.0.0.1:{srv.port}"
    assert "accept-encoding" not in headers


async def test_always_503_gives_up_bounded() -> None:
    slow_down = Reply(503, b"<Error><Code>SlowDown</Code><Message>slow</Message></Error>")
    async with scripted(slow_down) as (store, srv, rec):
        t0 = time.monotonic()
        with pytest.raises(BackendUnavailable, match="SlowDown"):
            await store.get("k")
        assert time.monotonic() - t0 < 2.0
    assert len(srv.requests) == 4
    assert rec.calls == [("get", "retry")] * 3 + [("get", "error")]


async def test_truncated_body_is_retried() -> None:
    body = b"x" * 1000
    async with scripted(
        Reply(200, body, OBJ_HEADERS, send_bytes=400), Reply(200, body, OBJ_HEADERS)
    ) as (store, srv, rec):
        got = await store.get("k")
    assert got.data == body and len(srv.requests) == 2
    assert rec.calls == [("get", "retry"), ("get", "ok")]


async def test_short_range_is_retried() -> None:
    bad = Reply(206, b"abc", {**OBJ_HEADERS, "Content-Range": "bytes 10-19/100"})
    good = Reply(206, b"0123456789", {**OBJ_HEADERS, "Content-Range": "bytes 10-19/100"})
    async with scripted(bad, good) as (store, srv, rec):
        got = await store.get("k", 10, 20)
    assert got.data == b"0123456789" and got.size == 100
    assert srv.requests[0][2]["range"] == "bytes=10-19"
    assert rec.calls == [("get", "retry"), ("get", "ok")]


async def test_timeout_respects_deadline() -> None:
    policy = RetryPolicy(max_attempts=10, deadline_s=0.6, request_timeout_s=0.2, base_delay_s=0.01)
    async with scripted(Reply(200, b"late", OBJ_HEADERS, delay_s=5), policy=policy) as (
        store,
        _,
        rec,
    ):
        t0 = time.monotonic()
        with pytest.raises(BackendUnavailable):
            await store.get("k")
        assert time.monotonic() - t0 < 1.5
    assert rec.calls[-1] == ("get", "error") and 2 <= len(rec.calls) <= 4


async def test_connection_refused_is_unavailable() -> None:
    async with scripted(Reply(200)) as (store, srv, rec):
        await srv.close()
        with pytest.raises(BackendUnavailable):
            await store.head("k")
    assert [o for _, o in rec.calls] == ["retry"] * 3 + ["error"]


@pytest.mark.parametrize(
    ("status", "exc", "outcome"),
    [
        (404, ObjectNotFound, "not_found"),
        (403, AccessDeniedError, "error"),
        (412, PreconditionFailed, "precondition"),
        (400, BackendError, "error"),
        (501, BackendError, "error"),
    ],
)
async def test_final_errors_are_not_retried(
    status: int, exc: type[BackendError], outcome: str
) -> None:
    async with scripted(Reply(status, b"<Error><Code>C</Code></Error>")) as (store, srv, rec):
        with pytest.raises(exc) as info:
            await store.get("k", if_match="abc")
    assert not isinstance(info.value, BackendUnavailable)
    assert len(srv.requests) == 1 and rec.calls == [("get", outcome)]
    assert srv.requests[0][2]["if-match"] == '"abc"'


async def test_list_parsing_url_encoding_and_skips() -> None:
    xml = (
        b'<?xml version="1.0" encoding="UTF-8"?>'
        b'<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
        b"<Name>bucket</Name><Prefix>p%2F</Prefix><KeyCount>4</KeyCount>"
        b"<MaxKeys>3</MaxKeys><EncodingType>url</EncodingType><IsTruncated>true</IsTruncated>"
        b"<NextContinuationToken>tok/+=</NextContinuationToken>"
        b"<Contents><Key>p/a+b%2Bc%25.jpg</Key><LastModified>2009-10-12T17:50:30.000Z"
        b"</LastModified><ETag>&quot;e1&quot;</ETag><Size>42</Size>"
        b"<StorageClass>STANDARD</StorageClass></Contents>"
        b"<Contents><Key>p/%FF%FE</Key><LastModified>2009-10-12T17:50:30.000Z</LastModified>"
        b"<ETag>&quot;e2&quot;</ETag><Size>1</Size></Contents>"
        b"<Contents><Key>p/%E6%97%A5</Key><LastModified>2009-10-12T17:50:30.123Z</LastModified>"
        b"<ETag>&quot;e3-2&quot;</ETag><Size>7</Size></Contents>"
        b"<CommonPrefixes><Prefix>p/sub%20dir/</Prefix></CommonPrefixes>"
        b"</ListBucketResult>"
    )
    async with scripted(Reply(200, xml)) as (store, srv, _):
        page = await store.list_page("p/", token="tok/+=", start_after="p/a", max_keys=3)
    assert [(o.key, o.size, o.etag) for o in page.objects] == [
        ("p/a b+c%.jpg", 42, "e1"),
        ("p/日", 7, "e3-2"),
    ]
    assert page.objects[0].mtime_ns == page.objects[1].mtime_ns == 1255369830 * 10**9
    assert page.prefixes == ["p/sub dir/"] and page.skipped == 1
    assert page.next_token == "tok/+="
    _, target, _ = srv.requests[0]
    assert target == (
        "/bucket?continuation-token=tok%2F%2B%3D&delimiter=%2F&encoding-type=url"
        "&list-type=2&max-keys=3&prefix=p%2F&start-after=p%2Fa"
    )


async def test_server_ignoring_range_is_sliced() -> None:
    async with scripted(Reply(200, b"0123456789", OBJ_HEADERS)) as (store, _, _):
        got = await store.get("k", 3, 6)
    assert got.data == b"345" and got.size == 10


async def test_complete_multipart_error_in_200_body() -> None:
    err = Reply(200, b"<Error><Code>InternalError</Code><Message>m</Message></Error>")
    ok = Reply(
        200,
        b"<CompleteMultipartUploadResult><ETag>&quot;e-1&quot;</ETag>"
        b"</CompleteMultipartUploadResult>",
    )
    part = Reply(200, b"", {"ETag": '"p1"'})
    async with scripted(part, err, ok) as (store, srv, rec):
        store._part_sizes["up1"] = {}  # as if create_multipart had run in this process
        assert await store.upload_part("k", "up1", 1, b"12345") == "p1"
        info = await store.complete_multipart("k", "up1", [(1, "p1")])
    assert (info.etag, info.size) == ("e-1", 5) and len(srv.requests) == 3
    assert rec.calls[1:] == [("complete_multipart", "retry"), ("complete_multipart", "ok")]
    assert srv.requests[0][1] == "/bucket/k?partNumber=1&uploadId=up1"


async def test_concurrency_is_bounded() -> None:
    async with scripted(Reply(200, b"x", OBJ_HEADERS, delay_s=0.05), max_connections=4) as (
        store,
        srv,
        _,
    ):
        peak = 0
        active = 0
        orig: Callable[..., Any] = srv._conn

        async def counting(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            nonlocal peak, active
            active += 1
            peak = max(peak, active)
            try:
                await orig(r, w)
            finally:
                active -= 1

        srv.server.close()  # type: ignore[union-attr]
        srv.server = await asyncio.start_server(counting, "127.0.0.1", srv.port)
        await asyncio.gather(*(store.get(f"k{i}") for i in range(20)))
    assert peak <= 4 and len(srv.requests) == 20


def test_virtual_and_path_addressing() -> None:
    async def hosts(**kw: Any) -> tuple[str, str]:
        s = S3Store("my-bucket", access_key="a", secret_key="b", **kw)
        await s._setup()
        try:
            return s._host, s._root
        finally:
            await s.close()

    assert asyncio.run(hosts(region="eu-west-1")) == ("my-bucket.s3.eu-west-1.amazonaws.com", "")
    assert asyncio.run(hosts(region="eu-west-1", addressing_style="path")) == (
        "s3.eu-west-1.amazonaws.com",
        "/my-bucket",
    )
    assert asyncio.run(hosts(region="x", endpoint_url="http://h:9000/base")) == (
        "h:9000",
        "/base/my-bucket",
    )
    assert asyncio.run(
        hosts(region="x", endpoint_url="https://minio.local", addressing_style="virtual")
    ) == ("my-bucket.minio.local", "")


async def test_credential_refresh_runs_off_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """Temporary credentials close to expiry are refreshed in a worker thread, once."""
    import datetime
    import threading

    loop_thread = threading.get_ident()
    calls: list[int] = []

    class FakeProvider:  # botocore's public RefreshableCredentials methods the cache uses
        def __init__(self) -> None:
            self.expiry = datetime.datetime.now(datetime.UTC) + datetime.timedelta(minutes=1)

        def refresh_needed(self, refresh_in: int) -> bool:
            left = self.expiry - datetime.datetime.now(datetime.UTC)
            return left.total_seconds() < refresh_in

        def get_frozen_credentials(self) -> Any:
            calls.append(threading.get_ident())
            time.sleep(0.05)  # blocking, like an STS/IMDS call
            self.expiry = datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1)

            @dataclass
            class Frozen:
                access_key: str = "AK"
                secret_key: str = "SK"
                token: str = f"T{len(calls)}"

            return Frozen()

    cache = CredentialCache()
    cache._provider = FakeProvider()
    results = await asyncio.gather(*(cache.get() for _ in range(10)))
    assert all(r is not None and r.token == "T1" for r in results)
    assert len(calls) == 1 and calls[0] != loop_thread
    assert (await cache.get()) is results[0]  # cached: far from expiry now
    assert len(calls) == 1
    await cache.close()


async def test_expired_token_refreshes_credentials() -> None:
    """ExpiredToken: forget the cached credentials, fetch new ones, retry."""
    fetched: list[str] = []

    class Provider:  # static keys: no expiry
        def get_frozen_credentials(self) -> Any:
            fetched.append("x")

            @dataclass
            class Frozen:
                access_key: str = f"AK{len(fetched)}"
                secret_key: str = "SK"
                token: str = "T"

            return Frozen()

    expired = Reply(400, b"<Error><Code>ExpiredToken</Code><Message>old</Message></Error>")
    async with scripted(expired, Reply(200, b"ok", OBJ_HEADERS)) as (store, srv, rec):
        store._creds = CredentialCache()
        store._creds._provider = Provider()
        assert (await store.get("k")).data == b"ok"
    assert len(fetched) == 2 and rec.calls == [("get", "retry"), ("get", "ok")]
    assert "Credential=AK1/" in srv.requests[0][2]["authorization"]
    assert "Credential=AK2/" in srv.requests[1][2]["authorization"]
    assert srv.requests[1][2]["x-amz-security-token"] == "T"


async def test_credential_failure_is_transient_and_sends_nothing() -> None:
    class Broken:
        def get_frozen_credentials(self) -> Any:
            raise OSError("instance metadata service unreachable")

    async with scripted(Reply(200, b"ok", OBJ_HEADERS)) as (store, srv, rec):
        store._creds = CredentialCache()
        store._creds._provider = Broken()
        with pytest.raises(BackendUnavailable, match="metadata service"):
            await store.get("k")
    assert srv.requests == [] and rec.calls == []
