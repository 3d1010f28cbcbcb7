"""Which checksum a GET reply lets the S3 store verify a whole-object body against
(``checksums.body_checksum``), and that each one catches a flipped bit (``Checksum.compute``);
with the compiled CRCs and without them (``compiled`` patched to None: the Python twins). The
CRCs' values are test_checksums.py's; the store over a real server and a corrupting proxy is
in tests/reliability/test_checksums.py."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import zlib
from pathlib import Path

import pytest

from gateway.backend import checksums
from gateway.backend.checksums import Checksum, body_checksum, digest, py_crc32c, py_crc64nvme
from gateway.backend.config import ChecksumPolicy, RetryPolicy
from gateway.backend.s3 import ChecksumMismatch, S3Store

BODY = os.urandom(5000)
MD5_ETAG = hashlib.md5(BODY).hexdigest()


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


CRC32 = b64(zlib.crc32(BODY).to_bytes(4, "big"))
SHA256 = b64(hashlib.sha256(BODY).digest())
SHA1 = b64(hashlib.sha1(BODY).digest())
CRC32C = b64(py_crc32c(BODY).to_bytes(4, "big"))
CRC64NVME = b64(py_crc64nvme(BODY).to_bytes(8, "big"))
STORED = {
    "crc32": CRC32,
    "crc32c": CRC32C,
    "crc64nvme": CRC64NVME,
    "sha1": SHA1,
    "sha256": SHA256,
}


@pytest.fixture(params=["compiled", "python"])
def twin(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "python":
        monkeypatch.setattr(checksums, "compiled", lambda: None)
    elif checksums.compiled() is None:
        pytest.skip("gateway._checksums is not built")
    return str(request.param)


@pytest.fixture
def compiled() -> None:
    if checksums.compiled() is None:
        pytest.skip("gateway._checksums is not built")


@pytest.fixture
def python_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(checksums, "compiled", lambda: None)


def algorithm_of(
    headers: dict[str, str], etag: str, *, md5: bool, python_crcs: bool = False
) -> str | None:
    c = body_checksum(headers, etag, stored=True, md5=md5, python_crcs=python_crcs)
    return None if c is None else c.algorithm


def flipped(data: bytes, at: int = 1234) -> bytes:
    bad = bytearray(data)
    bad[at] ^= 0x10
    return bytes(bad)


@pytest.mark.parametrize("algorithm", ["crc32", "crc32c", "crc64nvme", "sha1", "sha256", "md5"])
def test_a_body_verifies_against_its_own_digest_and_not_with_one_bit_flipped(
    twin: str, algorithm: str
) -> None:
    headers = {f"x-amz-checksum-{algorithm}": STORED[algorithm]} if algorithm in STORED else {}
    c = body_checksum(headers, MD5_ETAG, stored=True, md5=algorithm == "md5", python_crcs=True)
    assert c is not None and c.algorithm == algorithm
    assert digest(algorithm, BODY) == c.expected == c.compute(BODY)
    assert c.compute(flipped(BODY)) != c.expected
    assert c.compute(memoryview(BODY)) == c.expected


def test_the_cheapest_stored_checksum_wins(compiled: None) -> None:
    """The compiled CRCs cost the same (~3 µs per 110 kB): the widest first, then the hashes."""
    every = {f"x-amz-checksum-{a}": v for a, v in STORED.items()}
    assert body_checksum(every, MD5_ETAG, stored=True, md5=True) == Checksum(
        "crc64nvme", base64.b64decode(CRC64NVME)
    )
    del every["x-amz-checksum-crc64nvme"]
    assert algorithm_of(every, MD5_ETAG, md5=True) == "crc32c"
    del every["x-amz-checksum-crc32c"]
    assert algorithm_of(every, MD5_ETAG, md5=True) == "crc32"
    sha_and_c = {"x-amz-checksum-sha256": SHA256, "x-amz-checksum-crc32c": CRC32C}
    assert algorithm_of(sha_and_c, MD5_ETAG, md5=True) == "crc32c"
    only_nvme = {"x-amz-checksum-crc64nvme": CRC64NVME}
    assert algorithm_of(only_nvme, MD5_ETAG, md5=True) == "crc64nvme"
    assert algorithm_of(only_nvme, "abc-2", md5=False) == "crc64nvme"


def test_without_the_compiled_crcs_python_ones_are_the_opt_in_last_resort(
    python_only: None,
) -> None:
    every = {f"x-amz-checksum-{a}": v for a, v in STORED.items()}
    assert algorithm_of(every, MD5_ETAG, md5=True, python_crcs=True) == "crc32"
    sha_and_c = {"x-amz-checksum-sha256": SHA256, "x-amz-checksum-crc32c": CRC32C}
    assert algorithm_of(sha_and_c, MD5_ETAG, md5=True, python_crcs=True) == "sha256"
    for algorithm in ("crc32c", "crc64nvme"):
        only = {f"x-amz-checksum-{algorithm}": STORED[algorithm]}
        assert algorithm_of(only, MD5_ETAG, md5=True) == "md5"
        assert algorithm_of(only, "abc-2", md5=True) is None
        assert algorithm_of(only, "abc-2", md5=True, python_crcs=True) == algorithm
        assert algorithm_of(only, MD5_ETAG, md5=True, python_crcs=True) == "md5"


def test_settings_turn_each_source_off(twin: str) -> None:
    h = {"x-amz-checksum-crc32": CRC32}
    assert body_checksum(h, MD5_ETAG, stored=False, md5=False) is None
    assert body_checksum(h, MD5_ETAG, stored=False, md5=True) == Checksum(
        "md5", bytes.fromhex(MD5_ETAG)
    )
    assert body_checksum({}, MD5_ETAG, stored=True, md5=False) is None
    only_c = {"x-amz-checksum-crc32c": CRC32C}
    assert body_checksum(only_c, "abc-2", stored=False, md5=True) is None
    # verify_crc32c (python_crcs) on its own, as before: a stored CRC32C is verified
    assert body_checksum(only_c, "abc-2", stored=False, md5=False, python_crcs=True) == Checksum(
        "crc32c", base64.b64decode(CRC32C)
    )


def test_a_composite_checksum_of_one_part_is_the_checksum_of_the_bodys(twin: str) -> None:
    """A one-part multipart upload: S3's COMPOSITE value is the checksum of the part's binary
    checksum, ``-1``; verified from the body alone."""
    for algorithm in ("crc32", "crc32c", "crc64nvme", "sha1", "sha256"):
        inner = digest(algorithm, BODY)
        value = b64(digest(algorithm, inner)) + "-1"
        h = {f"x-amz-checksum-{algorithm}": value, "x-amz-checksum-type": "COMPOSITE"}
        c = body_checksum(h, "abc-1", stored=True, python_crcs=True)
        assert c == Checksum(algorithm, digest(algorithm, inner), of_one_part=True)
        assert c.compute(BODY) == c.expected
        assert c.compute(flipped(BODY)) != c.expected
        # the whole-body value is not mistaken for it
        assert c.compute(BODY) != inner


@pytest.mark.parametrize(
    ("headers", "etag"),
    [
        ({}, "d41d8cd98f00b204e9800998ecf8427e-3"),  # multipart ETag
        ({}, "not-an-md5"),
        ({}, "d41d8cd98f00b204e9800998ecf842"),  # 30 hex digits
        ({"x-amz-server-side-encryption": "aws:kms"}, MD5_ETAG),  # SSE-KMS: not the MD5
        ({"x-amz-server-side-encryption": "aws:kms:dsse"}, MD5_ETAG),
        ({"x-amz-server-side-encryption-customer-algorithm": "AES256"}, MD5_ETAG),  # SSE-C
        ({"x-amz-checksum-crc32": "AAAAAA==-4"}, "abc-4"),  # composite of 4 parts
        ({"x-amz-checksum-crc32": CRC32, "x-amz-checksum-type": "COMPOSITE"}, "abc-4"),
        ({"x-amz-checksum-crc32": "not base64!"}, "abc-4"),
        ({"x-amz-checksum-crc64nvme": "AAAAAAAAAAA=-3"}, "abc-3"),  # composite of 3 parts
        ({"x-amz-checksum-crc32c": "AAAAAA==-2", "x-amz-checksum-type": "COMPOSITE"}, "abc-2"),
        ({"x-amz-checksum-crc32c": "AAAAAA==-x"}, "abc-2"),
    ],
)
def test_nothing_to_verify_against(twin: str, headers: dict[str, str], etag: str) -> None:
    assert body_checksum(headers, etag, stored=True, md5=True, python_crcs=True) is None


def test_sse_s3_objects_keep_their_md5_etag() -> None:
    h = {"x-amz-server-side-encryption": "AES256"}
    assert body_checksum(h, MD5_ETAG, stored=True, md5=True) == Checksum(
        "md5", bytes.fromhex(MD5_ETAG)
    )


@pytest.mark.parametrize("algorithm", ["crc32", "crc32c", "crc64nvme"])
def test_a_full_object_checksum_of_a_multipart_object_is_used(twin: str, algorithm: str) -> None:
    """FULL_OBJECT CRCs of multipart objects (S3's default for uploads without a checksum:
    CRC64NVME) are plain whole-body CRCs."""
    h = {f"x-amz-checksum-{algorithm}": STORED[algorithm], "x-amz-checksum-type": "FULL_OBJECT"}
    c = body_checksum(h, "abc-4", stored=True, md5=True, python_crcs=True)
    assert c == Checksum(algorithm, base64.b64decode(STORED[algorithm]))
    assert c.compute(BODY) == c.expected
    assert c.compute(flipped(BODY, 4999)) != c.expected


def test_an_old_config_with_verify_crc32c_still_loads(tmp_path: Path) -> None:
    """``verify_crc32c`` keeps its key: it now also covers CRC64NVME, and matters only when
    the CRCs would be computed in Python (or with verify_checksums off)."""
    from gateway.ops.configfile import load_config

    path = tmp_path / "nfsgw.toml"
    path.write_text(
        "[s3]\nverify_checksums = true\nverify_md5 = false\nverify_crc32c = true\n"
        '[[export]]\npath = "/d"\nbackend = "s3://bucket/"\nclients = ["10.0.0.0/8"]\n'
    )
    cfg, warnings = load_config(path)
    assert warnings == []
    assert cfg.s3.checksums == ChecksumPolicy(stored=True, md5=False, python_crcs=True)
    assert ChecksumPolicy() == ChecksumPolicy(stored=True, md5=False, python_crcs=False)


# ------------------------------------------------- COMPOSITE checksums of several parts

PARTS = (os.urandom(3000), os.urandom(2000), os.urandom(17))  # as a store cuts them
WHOLE = b"".join(PARTS)


def composite(algorithm: str, parts: tuple[bytes, ...] = PARTS) -> str:
    """S3's COMPOSITE value: the checksum of the parts' binary checksums, ``-<parts>``."""
    inner = b"".join(digest(algorithm, p) for p in parts)
    return f"{b64(digest(algorithm, inner))}-{len(parts)}"


def test_a_composite_checksum_of_several_parts_needs_their_sizes(twin: str) -> None:
    sizes = tuple(map(len, PARTS))
    for algorithm in ("crc32", "crc32c", "crc64nvme", "sha1", "sha256"):
        h = {
            f"x-amz-checksum-{algorithm}": composite(algorithm),
            "x-amz-checksum-type": "COMPOSITE",
        }
        assert body_checksum(h, "abc-3", stored=True, python_crcs=True) is None  # as before
        c = body_checksum(h, "abc-3", stored=True, python_crcs=True, multipart=True)
        assert c is not None and c.parts == 3 and not c.of_one_part
        assert c.compute(WHOLE, sizes) == c.expected
        for at in (10, 3000 + 5, len(WHOLE) - 1):  # a bit in the first, second, last part
            assert c.compute(flipped(WHOLE, at), sizes) != c.expected
        assert c.compute(WHOLE, (2999, 2001, 17)) != c.expected  # other boundaries
        with pytest.raises(ValueError):
            c.compute(WHOLE)
        with pytest.raises(ValueError):
            c.compute(WHOLE, (3000, 2017))


ATTRIBUTES = (
    '<?xml version="1.0" encoding="UTF-8"?>\n<GetObjectAttributesResponse xmlns="http://s3.'
    'amazonaws.com/doc/2006-03-01/"><ETag>"{etag}"</ETag><ObjectParts><TotalPartsCount>3'
    "</TotalPartsCount><PartNumberMarker>0</PartNumberMarker><NextPartNumberMarker>3"
    "</NextPartNumberMarker><MaxParts>1000</MaxParts><IsTruncated>false</IsTruncated>{parts}"
    "</ObjectParts><ObjectSize>{size}</ObjectSize></GetObjectAttributesResponse>"
)


class FakeS3:
    """An in-process server with one 3-part object stored with a COMPOSITE CRC32 (as
    SeaweedFS keeps them: no per-part checksums, sizes from GetObjectAttributes); ``flip``
    corrupts one bit of every GET body at that offset; ``attributes`` is the status the
    GetObjectAttributes request gets (200: the parts)."""

    def __init__(self, flip: int | None = None, attributes: int = 200) -> None:
        self.flip = flip
        self.attributes = attributes
        self.requests: list[str] = []
        self.etag = "0123456789abcdef0123456789abcdef-3"

    async def handler(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = (await r.readuntil(b"\r\n\r\n")).decode()
                target = head.split(" ", 2)[1]
                self.requests.append(target)
                if target.endswith("?attributes="):
                    assert "x-amz-object-attributes: ETag,ObjectParts" in head
                    parts = "".join(
                        f"<Part><PartNumber>{i}</PartNumber><Size>{len(p)}</Size></Part>"
                        for i, p in enumerate(PARTS, 1)
                    )
                    body = ATTRIBUTES.format(etag=self.etag, parts=parts, size=len(WHOLE))
                    data = body.encode() if self.attributes == 200 else b""
                    w.write(
                        b"HTTP/1.1 %d X\r\nContent-Length: %d\r\n\r\n%s"
                        % (self.attributes, len(data), data)
                    )
                else:
                    data = WHOLE if self.flip is None else flipped(WHOLE, self.flip)
                    w.write(
                        b'HTTP/1.1 200 OK\r\nETag: "%s"\r\nContent-Length: %d\r\n'
                        b"x-amz-checksum-crc32: %s\r\nx-amz-checksum-type: COMPOSITE\r\n"
                        b"Last-Modified: Fri, 27 Nov 2026 01:00:00 GMT\r\n\r\n%s"
                        % (self.etag.encode(), len(data), composite("crc32").encode(), data)
                    )
                await w.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            w.close()


async def _store_on(fake: FakeS3, seen: list[tuple[str, str]]) -> tuple[asyncio.Server, S3Store]:
    srv = await asyncio.start_server(fake.handler, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    store = S3Store(
        "bucket",
        endpoint_url=f"http://127.0.0.1:{port}",
        region="us-east-1",
        access_key="AK",
        secret_key="SK",
        retry=RetryPolicy(max_attempts=3, base_delay_s=0.001, max_delay_s=0.002),
        observer=lambda op, outcome, s: seen.append((op, outcome)),
    )
    return srv, store


@pytest.mark.parametrize("lean_http", [True, False])
async def test_a_multipart_object_is_verified_against_its_composite_checksum(
    lean_http: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One GetObjectAttributes per object version gives the parts' sizes; each part's CRC over
    its slice of the body, their CRC against the stored value: the right bytes are served."""
    monkeypatch.setenv("NFSGW_S3_LEAN_HTTP", "1" if lean_http else "0")
    fake = FakeS3()
    seen: list[tuple[str, str]] = []
    srv, store = await _store_on(fake, seen)
    try:
        for _ in range(3):
            assert (await store.get("k")).data == WHOLE
    finally:
        await store.close()
        srv.close()
    assert seen.count(("attributes", "ok")) == 1  # once per (key, ETag)
    assert seen.count(("get", "ok")) == 3 and len(seen) == 4


@pytest.mark.parametrize("at", [3000 + 1000, 3000 + 1999, 10, len(WHOLE) - 1])
async def test_a_bit_flipped_in_a_part_is_never_served(at: int) -> None:
    """A bit flipped in part 2 (or 1, or 3) on every attempt: retried, then ChecksumMismatch,
    never the bytes."""
    fake = FakeS3(flip=at)
    seen: list[tuple[str, str]] = []
    srv, store = await _store_on(fake, seen)
    try:
        with pytest.raises(ChecksumMismatch):
            await store.get("k")
        fake.flip = None  # the store recovers: the right bytes, no new attributes request
        assert (await store.get("k")).data == WHOLE
    finally:
        await store.close()
        srv.close()
    assert seen.count(("get", "checksum_mismatch")) == 3
    assert seen.count(("attributes", "ok")) == 1


async def test_a_store_without_object_parts_serves_unverified_as_before() -> None:
    """GetObjectAttributes not implemented (501): the COMPOSITE checksum cannot be checked,
    the body is served as before, and the store is not asked again for that version."""
    fake = FakeS3(attributes=501, flip=4000)
    seen: list[tuple[str, str]] = []
    srv, store = await _store_on(fake, seen)
    try:
        for _ in range(2):
            assert (await store.get("k")).data == flipped(WHOLE, 4000)  # nothing to check with
    finally:
        await store.close()
        srv.close()
    assert seen.count(("attributes", "error")) == 1
