"""The fast path never answers what the bucket no longer says (``gateway.fastpath``), seen by
a client over a real connection to the server, on both mechanics: the C one
(``gateway._fastwire``) and the pure-Python twin, picked the way an operator picks it
(``NFSGW_PURE_PYTHON``), and the server's own choice checked.

Each test first has the fast path answer a call (its counters say so), then changes what the
answer depends on -- an object in the bucket (new bytes, new ETag) with the clock past the
attribute TTL, or the export's client list or squash rule by a configuration reload -- and
then makes the next call on the same connection. The fast path must not answer from what it
kept: removing its TTL checks (the handle table's, the LOOKUP table's), the epoch bump of
``FastPath.clear`` or the server's ``fastpath.clear()`` on reload each turns one of these red
(docs/reliability.md, "Tests that bite").
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import os
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from structlog.testing import capture_logs

from gateway import fastwire
from gateway.clock import FakeClock
from gateway.exports import ExportConfig
from gateway.fastpath import FastPath
from nfsproto import nfs3
from nfsproto.nfs3 import NfsStat3
from tests.harness.memory import MemoryGateway, TcpClient, cred

T = TypeVar("T")
TTL = 60.0
USER = cred(1000, 1000)
# ``secure_port`` off on purpose: the test client connects from an unprivileged port.
DATA = ExportConfig(
    "/data",
    "s3://bucket/ds/",
    read_only=True,
    uid=1000,
    gid=1000,
    file_mode=0o600,
    attr_ttl_s=TTL,
    secure_port=False,
)
OLD = b"old bytes\n" * 10
NEW = b"the new object, longer than the old one\n" * 7


def _native_built() -> bool:
    try:
        from gateway import _fastwire  # type: ignore[attr-defined,unused-ignore]  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.fixture(params=["native", "python"])
def mechanics(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The mechanics the server is to pick, set as an operator sets them."""
    kind = str(request.param)
    if kind == "native" and not _native_built():
        if os.environ.get("NFSGW_REQUIRE_NATIVE") == "1":
            pytest.fail("NFSGW_REQUIRE_NATIVE=1 but gateway._fastwire is not built")
        pytest.skip("gateway._fastwire is not built")
    monkeypatch.setenv("NFSGW_PURE_PYTHON", "1" if kind == "python" else "0")
    fastwire.compiled.cache_clear()
    yield kind
    monkeypatch.delenv("NFSGW_PURE_PYTHON")
    fastwire.compiled.cache_clear()


def _size(res: nfs3.Getattr3Res | nfs3.Lookup3Res) -> int | None:
    """The size in a GETATTR or LOOKUP reply (None: no attributes)."""
    attr = res.obj_attributes
    return None if attr is None else attr.size


def _fast(gw: MemoryGateway) -> FastPath:
    fast = gw.server.fastpath
    assert fast is not None
    return fast


class Answered:
    """Whether the fast path answered the calls made inside the block."""

    def __init__(self, gw: MemoryGateway) -> None:
        self.fast = _fast(gw)
        self.n = 0

    def __enter__(self) -> Answered:
        self.before = self.fast.stats.answered
        return self

    def __exit__(self, *_: object) -> None:
        self.n = self.fast.stats.answered - self.before


async def _started(tmp_path: Path, mechanics: str, export: ExportConfig = DATA) -> MemoryGateway:
    gw = MemoryGateway.of(tmp_path, [export], files={"ds/c0/f0.jpg": OLD, "ds/c0/f1.jpg": OLD})
    with capture_logs() as logs:
        await gw.__aenter__()
    # The server's own choice of mechanics, as it says it at start and as it serves.
    started = [x for x in logs if x["event"] == "gateway_started"]
    assert [x["fast_path"] for x in started] == [mechanics], started
    assert _fast(gw).kind == mechanics
    return gw


async def _warm(gw: MemoryGateway, c: TcpClient, name: str) -> tuple[bytes, bytes]:
    """The handles of c0 and c0/``name``, and the file read once by the ordinary path: the
    next GETATTR, LOOKUP and READ of it are the fast path's."""
    root = await c.mount(b"/data")
    # The connection reassembles records with the same mechanics (C, or nfsproto's).
    (conn,) = gw.server.connections
    reader = type(conn._reader)
    assert (reader.__module__ == "gateway._fastwire") == (_fast(gw).kind == "native"), reader
    dh = await c.walk(root, "c0")
    fh = await c.walk(dh, name)
    r = await c.read(fh)
    assert r.status == NfsStat3.NFS3_OK and bytes(r.data) == OLD
    with Answered(gw) as a:
        assert _size(await c.getattr(fh)) == len(OLD)
        assert _size(await c.lookup(dh, name.encode())) == len(OLD)
        r = await c.read(fh)
        assert bytes(r.data) == OLD
    assert a.n == 3, "the fast path did not answer the warm calls: this test checks nothing"
    return dh, fh


def _change(gw: MemoryGateway, expiry: str) -> None:
    """A new object under the same key (new bytes, size and ETag), then the clock past the
    TTL ("ttl": the old view may answer once more while the directory is re-listed in the
    background) or past the hard limit ("hard": the next call waits for the re-list)."""
    before = gw.store.seed("ds/c0/f0.jpg", OLD).etag  # the same object: the same ETag
    after = gw.store.seed("ds/c0/f0.jpg", NEW)
    assert after.size == len(NEW) and after.etag != before
    _expire(gw, expiry)


def _expire(gw: MemoryGateway, expiry: str) -> None:
    clock = gw.clock
    assert isinstance(clock, FakeClock)
    clock.advance(TTL + 1 if expiry == "ttl" else 100 * TTL)


async def _settles(expiry: str, call: Callable[[], Awaitable[T]], fresh: Callable[[T], bool]) -> T:
    """``call``'s answer once it is fresh: the first one past the hard limit; past the TTL,
    within a bounded time (the background re-list's), while the calls go on. Fails with the
    last answer if it never is."""
    got = await call()
    deadline = time.monotonic() + (2.0 if expiry == "ttl" else 0.0)
    while not fresh(got) and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
        got = await call()
    assert fresh(got), f"a stale answer ({expiry} expiry): {got}"
    return got


EXPIRY = pytest.mark.parametrize("expiry", ["ttl", "hard"])


@EXPIRY
async def test_a_stale_attribute_is_never_answered(
    tmp_path: Path, mechanics: str, expiry: str
) -> None:
    """GETATTR after the object changed and the TTL ran out: the new size."""
    gw = await _started(tmp_path, mechanics)
    try:
        c = await gw.connect(USER)
        try:
            _dh, fh = await _warm(gw, c, "f0.jpg")
            _change(gw, expiry)
            res = await _settles(expiry, lambda: c.getattr(fh), lambda r: _size(r) == len(NEW))
            assert res.status == NfsStat3.NFS3_OK
            # Fresh again: the fast path answers, with the new attributes.
            with Answered(gw) as a:
                assert _size(await c.getattr(fh)) == len(NEW)
            assert a.n == 1
        finally:
            await c.close()
    finally:
        await gw.__aexit__(None, None, None)


@EXPIRY
async def test_a_stale_lookup_is_never_answered(
    tmp_path: Path, mechanics: str, expiry: str
) -> None:
    """LOOKUP (the LOOKUP table's answer) after the object changed and the TTL ran out:
    the new attributes; after the object went away: NOENT."""
    gw = await _started(tmp_path, mechanics)
    try:
        c = await gw.connect(USER)
        try:
            dh, _fh = await _warm(gw, c, "f0.jpg")
            _dh, _fh1 = await _warm(gw, c, "f1.jpg")
            _change(gw, expiry)
            await _settles(
                expiry,
                lambda: c.lookup(dh, b"f0.jpg"),
                lambda r: r.status == NfsStat3.NFS3_OK and _size(r) == len(NEW),
            )
            with Answered(gw) as a:
                assert _size(await c.lookup(dh, b"f0.jpg")) == len(NEW)
            assert a.n == 1
            # Gone from the bucket: NOENT once the TTL ran out, not the entry kept.
            await c.lookup(dh, b"f1.jpg")  # in the LOOKUP table, fresh
            gw.store.unseed("ds/c0/f1.jpg")
            _expire(gw, expiry)
            await _settles(
                expiry,
                lambda: c.lookup(dh, b"f1.jpg"),
                lambda r: r.status == NfsStat3.NFS3ERR_NOENT,
            )
        finally:
            await c.close()
    finally:
        await gw.__aexit__(None, None, None)


@EXPIRY
async def test_a_stale_read_is_never_answered(tmp_path: Path, mechanics: str, expiry: str) -> None:
    """READ of a small file whose bytes the fast path serves from memory, after the object
    changed (new ETag) and the TTL ran out: the new bytes."""
    gw = await _started(tmp_path, mechanics)
    try:
        c = await gw.connect(USER)
        try:
            _dh, fh = await _warm(gw, c, "f0.jpg")
            _change(gw, expiry)
            await _settles(
                expiry,
                lambda: c.read(fh),
                lambda r: r.status == NfsStat3.NFS3_OK and bytes(r.data) == NEW,
            )
            with Answered(gw) as a:
                assert bytes((await c.read(fh)).data) == NEW
            assert a.n == 1
        finally:
            await c.close()
    finally:
        await gw.__aexit__(None, None, None)


def _reload(gw: MemoryGateway, **change: object) -> None:
    cfg = gw.server.config
    exports = tuple(dataclasses.replace(e, **change) for e in cfg.exports)  # type: ignore[arg-type]
    gw.server.apply(dataclasses.replace(cfg, exports=exports))


async def test_a_reload_that_squashes_is_seen_on_an_open_connection(
    tmp_path: Path, mechanics: str
) -> None:
    """squash "none" -> "all" by a reload: the owner (uid 1000) of a 0600 file becomes the
    anonymous user; the next READ and ACCESS on the connection it already had are refused."""
    gw = await _started(tmp_path, mechanics, dataclasses.replace(DATA, squash="none"))
    try:
        c = await gw.connect(USER)
        try:
            _dh, fh = await _warm(gw, c, "f0.jpg")
            with Answered(gw) as a:
                assert (await c.access(fh)).access & 0x1 == 0x1  # ACCESS3_READ
            assert a.n == 1
            _reload(gw, squash="all")
            r = await c.read(fh)
            assert r.status == NfsStat3.NFS3ERR_ACCES, "the reload's squash was not applied"
            res = await c.access(fh)
            assert res.status == NfsStat3.NFS3_OK and res.access & 0x1 == 0
        finally:
            await c.close()
    finally:
        await gw.__aexit__(None, None, None)


async def test_a_reload_that_drops_the_client_is_seen_on_an_open_connection(
    tmp_path: Path, mechanics: str
) -> None:
    """``clients`` narrowed by a reload to a network without 127.0.0.1: the next GETATTR,
    LOOKUP and READ on the connection the client already had are refused."""
    gw = await _started(tmp_path, mechanics)
    try:
        c = await gw.connect(USER)
        try:
            dh, fh = await _warm(gw, c, "f0.jpg")
            _reload(gw, clients=(ipaddress.ip_network("10.9.0.0/16"),))
            assert (await c.getattr(fh)).status == NfsStat3.NFS3ERR_ACCES
            assert (await c.lookup(dh, b"f0.jpg")).status == NfsStat3.NFS3ERR_ACCES
            assert (await c.read(fh)).status == NfsStat3.NFS3ERR_ACCES
            # And back: the same connection is served again.
            _reload(gw, clients=DATA.clients)
            assert (await c.getattr(fh)).status == NfsStat3.NFS3_OK
        finally:
            await c.close()
    finally:
        await gw.__aexit__(None, None, None)
