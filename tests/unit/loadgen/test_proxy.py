"""The backend delay proxy: forwards requests unchanged, counts them by kind, paces bodies
through the bandwidth cap, and answers its counts on /__loadgen__/counts."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web
from yarl import URL

from loadgen.proxy import COUNTS_PATH, DelayProxy, request_kind

BODY = bytes(range(256)) * 400  # 100 KiB


@pytest.fixture
async def upstream() -> AsyncIterator[tuple[str, list[tuple[str, str, str]]]]:
    seen: list[tuple[str, str, str]] = []

    async def handle(request: web.Request) -> web.StreamResponse:
        seen.append((request.method, request.raw_path, request.headers.get("Authorization", "")))
        if request.method == "PUT":
            data = await request.read()
            return web.Response(status=200, headers={"ETag": f'"{len(data)}"'})
        if request.method == "HEAD":
            return web.Response(headers={"Content-Length": str(len(BODY)), "ETag": '"e"'})
        if "list-type" in request.query_string:
            return web.Response(text="<ListBucketResult/>", content_type="application/xml")
        return web.Response(body=BODY, headers={"ETag": '"e"'})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}", seen
    finally:
        await runner.cleanup()


def test_request_kind() -> None:
    assert request_kind("GET", "/b", "list-type=2&prefix=a%2F") == "LIST"
    assert request_kind("GET", "/b/", "") == "LIST"
    assert request_kind("GET", "/b/k.jpg", "") == "GET"
    assert request_kind("GET", "/b/dir/", "") == "GET"
    assert request_kind("HEAD", "/b/k", "") == "HEAD"
    assert request_kind("PUT", "/b/k", "") == "PUT"


async def test_forwards_counts_and_paces(
    upstream: tuple[str, list[tuple[str, str, str]]],
) -> None:
    url, seen = upstream
    async with (
        DelayProxy(url, latency_s=0.001, bandwidth_bps=50e6) as p,
        aiohttp.ClientSession() as s,
    ):
        base = p.endpoint_url
        auth = {"Authorization": "AWS4-HMAC-SHA256 Credential=x"}
        list_url = URL(f"{base}/bkt?list-type=2&prefix=a%2F", encoded=True)
        async with s.get(list_url, headers=auth) as r:
            assert r.status == 200 and b"ListBucketResult" in await r.read()
        get_url = URL(f"{base}/bkt/a/x%20y.jpg", encoded=True)
        async with s.get(get_url, headers={"Range": "bytes=0-9"}) as r:
            assert await r.read() == BODY and r.headers["ETag"] == '"e"'
        async with s.head(f"{base}/bkt/a/x.jpg") as r:
            assert r.status == 200
        async with s.put(f"{base}/bkt/a/new.jpg", data=b"12345") as r:
            assert r.headers["ETag"] == '"5"'
        async with s.get(base + COUNTS_PATH) as r:
            counts = await r.json()
        assert counts == {
            "LIST": 1,
            "GET": 1,
            "HEAD": 1,
            "PUT": 1,
            "bytes": len(BODY) + len(b"<ListBucketResult/>"),
            "errors": 0,
        }
        assert p.snapshot() == counts
        p.reset()
        assert p.snapshot() == {"bytes": 0, "errors": 0}
    # Raw paths and signature headers arrive unchanged.
    assert seen[0] == ("GET", "/bkt?list-type=2&prefix=a%2F", auth["Authorization"])
    assert seen[1][1] == "/bkt/a/x%20y.jpg"
    assert [m for m, _, _ in seen] == ["GET", "GET", "HEAD", "PUT"]


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        DelayProxy("http://x", latency_s=-1)
    with pytest.raises(ValueError):
        DelayProxy("http://x", bandwidth_bps=0)
