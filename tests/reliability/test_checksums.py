"""Every byte verified, against SeaweedFS through a proxy that inverts one bit
of a GET body and keeps its length (``tests.faultproxy`` fault ``flip-bit``).

- The store (``S3Store``): for objects stored with a CRC32, CRC32C, CRC64NVME, SHA-1 or
  SHA-256 checksum (the default policy; CRC32C and CRC64NVME with the compiled CRCs, else
  ``verify_crc32c``) and a single-part object verified by its MD5 ETag (``verify_md5``), each
  with the other sources off so the one under test is
  what catches it: one corrupted body is retried and the right bytes come back; bodies
  corrupted on every attempt end in ``ChecksumMismatch``, never in bytes. Every mismatch is
  counted (observer outcome ``checksum_mismatch``). A range that covers the whole object is
  verified too (by the MD5 ETag: SeaweedFS sends no checksum with a 206). With verification
  off the same proxy does hand over wrong bytes: the check, not luck, keeps them out.
- The store's own uploads carry a CRC32, so what nfsgw writes is verified by default.
- The gateway, default settings: a READ of a file whose every GET is corrupted answers
  NFS3ERR_IO, counted in ``nfsgw_s3_requests_total{op="get",outcome="checksum_mismatch"}``;
  once the store recovers, the same READ returns the right bytes (the failure is not cached);
  one corrupted GET is retried and the READ returns the right bytes.
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import os
import zlib
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from gateway.backend.checksums import digest
from gateway.backend.config import ChecksumPolicy, RetryPolicy
from gateway.backend.s3 import ChecksumMismatch, S3Store
from gateway.backend.sigv4 import Credentials, encode_path
from gateway.exports import ExportConfig
from loadgen.seaweed import SeaweedServer
from nfsproto import nfs3
from nfsproto.nfs3 import Diropargs3, Nfs3Proc, NfsStat3
from tests.faultproxy import FaultProxy, Rule
from tests.harness.proxy import ThreadProxy
from tests.harness.thread import GatewayThread
from tests.rpcclient import BlockingRpcClient

pytestmark = [pytest.mark.s3]

ATTEMPTS = 3
RETRY = RetryPolicy(max_attempts=ATTEMPTS, deadline_s=20.0, base_delay_s=0.01, max_delay_s=0.05)


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def _stored_checksum(algorithm: str, body: bytes) -> str:
    if algorithm == "crc32":
        return _b64(zlib.crc32(body).to_bytes(4, "big"))
    return _b64(digest(algorithm, body))


def put_object(
    sw: SeaweedServer, bucket: str, key: str, body: bytes, headers: dict[str, str]
) -> None:
    """A signed PUT with extra headers (the store keeps ``x-amz-checksum-*`` ones)."""
    path = f"/{encode_path(bucket)}/{encode_path(key)}"
    h = {"host": f"127.0.0.1:{sw.s3_port}", **headers}
    signer = sw._signer
    signer.sign(
        Credentials(sw.access_key, sw.secret_key),
        "PUT",
        path,
        "",
        h,
        hashlib.sha256(body).hexdigest(),
    )
    conn = http.client.HTTPConnection("127.0.0.1", sw.s3_port, timeout=30)
    try:
        conn.request("PUT", path, body=body, headers=h)
        resp = conn.getresponse()
        assert resp.status == 200, (resp.status, resp.read()[:300])
        resp.read()
    finally:
        conn.close()


# key -> (body, the checksum header it was stored with, if any)
OBJECTS = {
    "plain.bin": None,
    "crc32.bin": "crc32",
    "crc32c.bin": "crc32c",
    "crc64nvme.bin": "crc64nvme",
    "sha1.bin": "sha1",
    "sha256.bin": "sha256",
}


@pytest.fixture
def objects(seaweed: SeaweedServer, s3_bucket: str) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for i, (key, algorithm) in enumerate(OBJECTS.items()):
        body = os.urandom(110_000 + i)
        headers = {}
        if algorithm is not None:
            headers[f"x-amz-checksum-{algorithm}"] = _stored_checksum(algorithm, body)
        put_object(seaweed, s3_bucket, key, body, headers)
        out[key] = body
    return out


@pytest.fixture
async def proxy(seaweed: SeaweedServer) -> AsyncIterator[FaultProxy]:
    async with FaultProxy(seaweed.endpoint_url, seed=14) as p:
        yield p


class Outcomes:
    def __init__(self) -> None:
        self.seen: Counter[tuple[str, str]] = Counter()

    def __call__(self, op: str, outcome: str, seconds: float) -> None:
        self.seen[(op, outcome)] += 1


def store_via(
    proxy: FaultProxy, sw: SeaweedServer, bucket: str, policy: ChecksumPolicy, seen: Outcomes
) -> S3Store:
    kw = {**sw.store_kwargs(), "endpoint_url": proxy.endpoint_url}
    return S3Store(bucket, **kw, retry=RETRY, checksums=policy, observer=seen)  # type: ignore[arg-type]


@pytest.mark.parametrize("key", sorted(OBJECTS))
async def test_a_corrupted_body_is_retried_then_refused(
    seaweed: SeaweedServer,
    s3_bucket: str,
    objects: dict[str, bytes],
    proxy: FaultProxy,
    key: str,
) -> None:
    body = objects[key]
    algorithm = OBJECTS[key]
    policy = ChecksumPolicy(stored=algorithm is not None, md5=algorithm is None)
    seen = Outcomes()
    store = store_via(proxy, seaweed, s3_bucket, policy, seen)
    try:
        proxy.add(Rule("flip-bit", {"GET"}, times=1, key=key))
        got = await store.get(key)
        assert got.data == body
        assert seen.seen == {("get", "checksum_mismatch"): 1, ("get", "ok"): 1}
        assert proxy.counts[("GET", "flip-bit")] == 1

        proxy.clear()
        proxy.add(Rule("flip-bit", {"GET"}, key=key))
        seen.seen.clear()
        with pytest.raises(ChecksumMismatch):
            await store.get(key)
        assert seen.seen == {("get", "checksum_mismatch"): ATTEMPTS}
    finally:
        await store.close()
    # A range that covers the whole object is verified like a whole-object GET (by the MD5
    # ETag: SeaweedFS sends no x-amz-checksum-* with a 206).
    store = store_via(proxy, seaweed, s3_bucket, ChecksumPolicy(md5=True), seen)
    try:
        with pytest.raises(ChecksumMismatch):
            await store.get(key, 0, len(body))
    finally:
        await store.close()


async def test_without_verification_the_proxy_does_corrupt(
    seaweed: SeaweedServer, s3_bucket: str, objects: dict[str, bytes], proxy: FaultProxy
) -> None:
    """The control: the same fault, verification off, hands over wrong bytes of the right
    length (so the test above is not passing on a proxy that does nothing)."""
    seen = Outcomes()
    store = store_via(proxy, seaweed, s3_bucket, ChecksumPolicy(stored=False), seen)
    try:
        proxy.add(Rule("flip-bit", {"GET"}, key="crc32.bin"))
        got = await store.get("crc32.bin")
        body = objects["crc32.bin"]
        assert len(got.data) == len(body) and got.data != body
        diff = [i for i, (a, b) in enumerate(zip(got.data, body, strict=True)) if a != b]
        assert len(diff) == 1 and bin(got.data[diff[0]] ^ body[diff[0]]).count("1") == 1
        assert seen.seen == {("get", "ok"): 1}
    finally:
        await store.close()


async def test_what_the_store_uploads_it_verifies(
    seaweed: SeaweedServer, s3_bucket: str, proxy: FaultProxy
) -> None:
    """Default policy: a PUT carries a CRC32, the store keeps it, a corrupted read of the
    object is refused."""
    seen = Outcomes()
    store = store_via(proxy, seaweed, s3_bucket, ChecksumPolicy(), seen)
    body = os.urandom(50_000)
    try:
        await store.put("ours.bin", body)
        proxy.add(Rule("flip-bit", {"GET"}, key="ours.bin"))
        with pytest.raises(ChecksumMismatch):
            await store.get("ours.bin")
        proxy.clear()
        assert (await store.get("ours.bin")).data == body
    finally:
        await store.close()


@pytest.fixture
def thread_proxy(seaweed: SeaweedServer) -> Iterator[ThreadProxy]:
    with ThreadProxy(seaweed.endpoint_url, seed=14, name="faultproxy") as p:
        yield p


def test_the_gateway_answers_io_and_never_serves_a_corrupted_body(
    seaweed: SeaweedServer,
    s3_bucket: str,
    objects: dict[str, bytes],
    thread_proxy: ThreadProxy,
    tmp_path: Path,
) -> None:
    s3 = {**seaweed.store_kwargs(), "endpoint_url": thread_proxy.endpoint_url}
    exports = [ExportConfig("/data", f"s3://{s3_bucket}/", read_only=True, insecure=True)]
    name = "crc32.bin"  # stored with a CRC32, as nfsgw's own uploads are
    with (
        GatewayThread(exports, state_dir=tmp_path / "state", s3=s3) as gw,
        BlockingRpcClient("127.0.0.1", gw.port, timeout_s=60.0) as c,
    ):
        root = c.mnt(b"/data").fhandle

        def read(name: str) -> tuple[NfsStat3, bytes]:
            res = c.nfs(Nfs3Proc.LOOKUP, nfs3.Lookup3Args(Diropargs3(root, name.encode())))
            assert res.status == NfsStat3.NFS3_OK, res.status
            r = c.nfs(Nfs3Proc.READ, nfs3.Read3Args(res.object, 0, 1 << 20))
            return r.status, bytes(r.data) if r.status == NfsStat3.NFS3_OK else b""

        def mismatches() -> int:
            hists = gw.call(lambda: dict(gw.server.metrics.s3))
            return sum(h.count for (op, out), h in hists.items() if out == "checksum_mismatch")

        thread_proxy.add(Rule("flip-bit", {"GET"}, key=name))
        assert read(name) == (NfsStat3.NFS3ERR_IO, b"")
        assert mismatches() == 5  # the default [s3] max_attempts, every one refused
        thread_proxy.clear()
        assert read(name) == (NfsStat3.NFS3_OK, objects[name])

        thread_proxy.add(Rule("flip-bit", {"GET"}, times=1, key="sha256.bin"))
        assert read("sha256.bin") == (NfsStat3.NFS3_OK, objects["sha256.bin"])
        assert mismatches() == 6
