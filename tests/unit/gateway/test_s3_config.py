"""``[s3]`` keys reach the store ``nfsgw serve`` builds: ``lean_http`` (the wire of GET, HEAD
and LIST) from the file, with ``NFSGW_S3_LEAN_HTTP`` deciding when the key is left on."""

from __future__ import annotations

import pytest

from gateway.backend import open_store
from gateway.backend.s3 import S3Store
from gateway.ops.configfile import check_config
from gateway.ops.server import Server

CONFIG = """
[s3]
endpoint_url = "http://127.0.0.1:1"
region = "r"
{extra}

[[export]]
path = "/data"
backend = "s3://bucket/prefix/"
"""


async def _lean_of(extra: str) -> bool:
    r = check_config(None, text=CONFIG.format(extra=extra))
    assert r.config is not None, r.issues
    server = Server(r.config)
    store = server._open_store(r.config.exports[0])
    assert isinstance(store, S3Store)
    try:
        return store._lean_http
    finally:
        await store.close()


async def test_lean_http_key_reaches_the_store(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NFSGW_S3_LEAN_HTTP", raising=False)
    assert await _lean_of("") is True
    assert await _lean_of("lean_http = true") is True
    assert await _lean_of("lean_http = false") is False
    # The key left on: the environment switch still works (it is what it was before the key).
    monkeypatch.setenv("NFSGW_S3_LEAN_HTTP", "0")
    assert await _lean_of("") is False
    assert await _lean_of("lean_http = false") is False


def test_lean_http_key_is_checked() -> None:
    r = check_config(None, text=CONFIG.format(extra='lean_http = "maybe"'))
    assert r.config is None
    assert any("lean_http" in i.where for i in r.issues), r.issues


async def test_open_store_passes_lean_http(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NFSGW_S3_LEAN_HTTP", raising=False)
    for given, want in ((None, True), (True, True), (False, False)):
        store = open_store(
            "s3://b/p/", endpoint_url="http://127.0.0.1:1", region="r", lean_http=given
        )
        assert isinstance(store, S3Store) and store._lean_http is want
        await store.close()
