"""A fleet of three gateways sharing one shared tier, end to end: the origin SeaweedFS bucket
behind a counting proxy, the shared tier a second bucket of SeaweedFS reached directly (its
own endpoint and, through the AWS chain, its own credentials), libnfs reading through each
gateway. Each gateway has its own state, memory and no disk tier: what they share is the
shared tier only.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.backend.s3 import S3Store
from gateway.exports import ExportConfig
from loadgen.seaweed import SeaweedServer
from tests.datasets import md5
from tests.harness.buckets import MakeBucket
from tests.harness.proxy import ThreadProxy
from tests.harness.thread import GatewayThread
from tests.libnfs import LibNfs, libnfs_available

pytestmark = [
    pytest.mark.libnfs,
    pytest.mark.skipif(not libnfs_available(), reason="libnfs (libnfs.so.13) is not installed"),
]

KiB = 1024
MEMBERS = ("127.0.0.1:20491", "127.0.0.1:20492", "127.0.0.1:20493")


def make_files(n: int = 120, seed: int = 35) -> dict[str, bytes]:
    rng = random.Random(seed)
    return {
        f"c{i % 4}/img_{i:04d}.jpg": rng.randbytes(rng.randrange(4 * KiB, 48 * KiB))
        for i in range(n)
    }


@pytest.fixture
def origin(make_bucket: MakeBucket) -> tuple[str, dict[str, bytes]]:
    files = make_files()
    return make_bucket("fo", {"ds/" + k: v for k, v in files.items()}), files


@pytest.fixture
def proxy(seaweed: SeaweedServer) -> Iterator[ThreadProxy]:
    with ThreadProxy(seaweed.endpoint_url, seed=35) as p:
        yield p


@pytest.fixture(autouse=True)
def shared_credentials(seaweed: SeaweedServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """The shared tier finds its credentials in the AWS chain, as it would on a node."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", seaweed.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", seaweed.secret_key)


def gateway(
    tmp_path: Path,
    seaweed: SeaweedServer,
    proxy: ThreadProxy,
    bucket: str,
    shared: str,
    me: int,
    **settings: object,
) -> GatewayThread:
    s3 = dict(seaweed.store_kwargs())
    s3["endpoint_url"] = proxy.endpoint_url
    return GatewayThread(
        [ExportConfig("/data", f"s3://{bucket}/ds/", read_only=True, insecure=True)],
        state_dir=tmp_path / f"gw{me}",
        s3=s3,
        cache_memory=64 << 20,
        cache_disk=0,
        cache_shared=f"s3://{shared}/fleet/",
        cache_shared_endpoint_url=seaweed.endpoint_url,
        cache_shared_region=seaweed.region,
        fleet_members=MEMBERS,
        fleet_self=MEMBERS[me],
        **settings,
    ).start()


def epoch(gw: GatewayThread, files: dict[str, bytes], seed: int) -> None:
    """Read every file once, shuffled, byte-exact; then let the shared tier's fills land."""
    order = sorted(files)
    random.Random(seed).shuffle(order)
    with LibNfs(gw.libnfs_url("/data")) as nfs:
        for path in order:
            assert md5(nfs.read_file("/" + path)) == md5(files[path]), path
    shared = gw.server.shared
    assert shared is not None
    gw.run(shared.drain())


async def put(seaweed: SeaweedServer, bucket: str, key: str, data: bytes) -> None:
    store = S3Store(bucket, **seaweed.store_kwargs())
    try:
        await store.put(key, data)
    finally:
        await store.close()


def origin_gets(proxy: ThreadProxy) -> int:
    return sum(n for k, n in proxy.gets().items() if k.startswith("ds/"))


def test_three_gateways_one_after_another_fetch_each_object_from_the_origin_once(
    tmp_path: Path,
    seaweed: SeaweedServer,
    make_bucket: MakeBucket,
    origin: tuple[str, dict[str, bytes]],
    proxy: ThreadProxy,
) -> None:
    bucket, files = origin
    shared = make_bucket("fs")
    gets: list[int] = []
    for me in range(3):
        gw = gateway(tmp_path, seaweed, proxy, bucket, shared, me)
        try:
            epoch(gw, files, seed=me)
            gets.append(origin_gets(proxy))
            st = gw.server.shared.stats if gw.server.shared else None
            assert st is not None and st.errors == 0
            assert st.bad_checksum == st.bad_metadata == st.bad_length == 0
            if me == 0:
                assert st.fills == len(files) and st.hits == 0
                # it owns about a third; it fetched (and filled) the others too
                assert 0 < st.foreign_fills < len(files)
            else:
                assert st.hits == len(files) and st.fills == 0
            assert gw.server.shared is not None
            assert gw.server.shared.read_stats().fleet_members == 3
        finally:
            gw.stop()
    assert gets == [len(files)] * 3  # the second and third gateways: 0 origin GETs


def test_a_replaced_origin_object_is_never_served_from_the_shared_tier(
    tmp_path: Path,
    seaweed: SeaweedServer,
    make_bucket: MakeBucket,
    origin: tuple[str, dict[str, bytes]],
    proxy: ThreadProxy,
) -> None:
    bucket, files = origin
    shared = make_bucket("fs")
    gw = gateway(tmp_path, seaweed, proxy, bucket, shared, 0)
    try:
        epoch(gw, files, seed=1)
    finally:
        gw.stop()
    changed = dict(files)
    path = sorted(files)[7]
    changed[path] = b"a new version of the object " * 100
    asyncio.run(put(seaweed, bucket, "ds/" + path, changed[path]))
    before = origin_gets(proxy)
    gw = gateway(tmp_path, seaweed, proxy, bucket, shared, 1)
    try:
        epoch(gw, changed, seed=2)
        st = gw.server.shared.stats if gw.server.shared else None
        assert st is not None and st.hits == len(files) - 1 and st.fills == 1
    finally:
        gw.stop()
    assert origin_gets(proxy) - before == 1  # only the replaced object


def test_a_shared_tier_that_cannot_be_used_serves_every_read_from_the_origin(
    tmp_path: Path,
    seaweed: SeaweedServer,
    origin: tuple[str, dict[str, bytes]],
    proxy: ThreadProxy,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A shared bucket that does not exist: the probe says so once, the breaker opens, and
    every READ is served from the origin, byte-exact."""
    bucket, files = origin
    gw = gateway(tmp_path, seaweed, proxy, bucket, "no-such-bucket-35", 0)
    try:
        epoch(gw, files, seed=3)
        st = gw.server.shared.stats if gw.server.shared else None
        assert st is not None and st.hits == 0 and st.fills == 0
        assert st.breaker_trips >= 1 and st.errors <= 3  # then skipped, not retried per READ
    finally:
        gw.stop()
    assert origin_gets(proxy) == len(files)
