"""``[s3]`` keys reach the store ``nfsgw serve`` builds: ``lean_http`` (the wire of GET, HEAD
and LIST) from the file, with ``NFSGW_S3_LEAN_HTTP`` deciding when the key is left on."""

from __future__ import annotations

import pytest

from gateway.backend import open_store
from gateway.backend.s3 import S3Store
from gateway.ops.configfile import check_config

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
    # What ``nfsgw serve`` builds for the export (gateway.ops.build): its URL and [s3].
    store = open_store(r.config.exports[0].backend, s3=r.config.s3)
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


def _settings(store: S3Store) -> tuple[object, ...]:
    return (
        store.name,
        store.traits,
        store.region,
        store._style,
        store._netloc,
        store._profile,
        store._max_connections,
        store._lean_http,
        store.retry,
        store.checksums,
        store._creds,
    )


async def test_open_store_takes_the_s3_section(monkeypatch: pytest.MonkeyPatch) -> None:
    """``open_store(url, s3=section)`` builds the store the server's keyword list builds;
    a keyword given wins over the section."""
    monkeypatch.delenv("NFSGW_S3_LEAN_HTTP", raising=False)
    r = check_config(None, text=CONFIG.format(extra="max_connections = 7\nlean_http = false"))
    assert r.config is not None, r.issues
    ec, s3 = r.config.exports[0], r.config.s3
    old = open_store(  # the keyword list the server passed before the section did
        ec.backend,
        endpoint_url=s3.endpoint_url,
        region=s3.region,
        addressing_style=s3.addressing_style,
        profile=s3.profile,
        anonymous=s3.anonymous or None,
        lean_http=s3.lean_http and None,
        max_connections=s3.max_connections,
        retry=s3.retry,
        checksums=s3.checksums,
    )
    new = open_store(ec.backend, s3=s3)
    wider = open_store(ec.backend, s3=s3, max_connections=40)
    assert isinstance(old, S3Store) and isinstance(new, S3Store) and isinstance(wider, S3Store)
    try:
        assert _settings(new)[:-1] == _settings(old)[:-1]
        assert new._max_connections == 7 and wider._max_connections == 40
        assert new._lean_http is False
        assert new.traits.endpoint == "http://127.0.0.1:1" and new.traits.latency_to_hide
    finally:
        for s in (old, new, wider):
            await s.close()


async def test_s3_traits_name_the_endpoint_as_the_probe_did() -> None:
    """Without an endpoint the text names AWS and the region (or the chain that gives it)."""
    for region, want in ((None, "AWS S3 (region from the AWS chain)"), ("eu-west-1", None)):
        store = open_store("s3://b/p/", region=region)
        try:
            assert store.traits.kind == "s3"
            assert store.traits.endpoint == (want or f"AWS S3 ({region})")
        finally:
            await store.close()
