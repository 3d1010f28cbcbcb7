"""Which checksum a GET reply lets the S3 store verify a whole-object body against
(``s3wire.body_checksum``), and the digests themselves (``s3wire.digest``, ``crc32c_of``) against
published check values. The store over a real server and a corrupting proxy is in
tests/reliability/test_checksums.py."""

from __future__ import annotations

import base64
import hashlib
import os
import zlib

import pytest

from gateway.backend.s3wire import Checksum, body_checksum, crc32c_of, digest

BODY = os.urandom(5000)
MD5_ETAG = hashlib.md5(BODY).hexdigest()


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


CRC32 = b64(zlib.crc32(BODY).to_bytes(4, "big"))
SHA256 = b64(hashlib.sha256(BODY).digest())
SHA1 = b64(hashlib.sha1(BODY).digest())
CRC32C = b64(crc32c_of(BODY).to_bytes(4, "big"))


def algorithm_of(headers: dict[str, str], etag: str, *, md5: bool) -> str | None:
    c = body_checksum(headers, etag, stored=True, md5=md5, crc32c=True)
    return None if c is None else c.algorithm


def test_crc32c_check_values() -> None:
    # RFC 3720 B.4 and the CRC catalogue's check value ("123456789" -> 0xE3069283).
    assert crc32c_of(b"123456789") == 0xE3069283
    assert crc32c_of(bytes(32)) == 0x8A9136AA
    assert crc32c_of(b"\xff" * 32) == 0x62A8AB43
    assert crc32c_of(bytes(range(32))) == 0x46DD794E
    assert crc32c_of(b"") == 0
    # incremental use gives the same result
    assert crc32c_of(b"6789", crc32c_of(b"12345")) == 0xE3069283


@pytest.mark.parametrize("algorithm", ["crc32", "crc32c", "sha1", "sha256", "md5"])
def test_a_body_verifies_against_its_own_digest_and_not_with_one_bit_flipped(
    algorithm: str,
) -> None:
    stored = {"crc32": CRC32, "crc32c": CRC32C, "sha1": SHA1, "sha256": SHA256}
    headers = {f"x-amz-checksum-{algorithm}": stored[algorithm]} if algorithm in stored else {}
    c = body_checksum(headers, MD5_ETAG, stored=True, md5=algorithm == "md5", crc32c=True)
    assert c is not None and c.algorithm == algorithm
    assert digest(algorithm, BODY) == c.expected
    bad = bytearray(BODY)
    bad[1234] ^= 0x10
    assert digest(algorithm, bytes(bad)) != c.expected


def test_the_cheapest_stored_checksum_wins_and_md5_comes_before_crc32c() -> None:
    every = {
        "x-amz-checksum-crc32c": CRC32C,
        "x-amz-checksum-sha256": SHA256,
        "x-amz-checksum-sha1": SHA1,
        "x-amz-checksum-crc32": CRC32,
    }
    assert body_checksum(every, MD5_ETAG, stored=True, md5=True, crc32c=True) == Checksum(
        "crc32", base64.b64decode(CRC32)
    )
    sha_and_c = {"x-amz-checksum-sha256": SHA256, "x-amz-checksum-crc32c": CRC32C}
    assert algorithm_of(sha_and_c, MD5_ETAG, md5=True) == "sha256"
    only_c = {"x-amz-checksum-crc32c": CRC32C}
    assert algorithm_of(only_c, MD5_ETAG, md5=True) == "md5"
    assert algorithm_of(only_c, MD5_ETAG, md5=False) == "crc32c"
    assert algorithm_of(only_c, "abc-2", md5=True) == "crc32c"


def test_settings_turn_each_source_off() -> None:
    h = {"x-amz-checksum-crc32": CRC32}
    assert body_checksum(h, MD5_ETAG, stored=False, md5=False) is None
    assert body_checksum(h, MD5_ETAG, stored=False, md5=True) == Checksum(
        "md5", bytes.fromhex(MD5_ETAG)
    )
    assert body_checksum({}, MD5_ETAG, stored=True, md5=False) is None
    only_c = {"x-amz-checksum-crc32c": CRC32C}
    assert body_checksum(only_c, "abc-2", stored=True, md5=True, crc32c=False) is None
    assert body_checksum(only_c, "abc-2", stored=False, md5=False, crc32c=True) == Checksum(
        "crc32c", base64.b64decode(CRC32C)
    )


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
        ({"x-amz-checksum-crc64nvme": "AAAAAAAAAAA="}, "abc-4"),  # no implementation here
    ],
)
def test_nothing_to_verify_against(headers: dict[str, str], etag: str) -> None:
    assert body_checksum(headers, etag, stored=True, md5=True, crc32c=True) is None


def test_sse_s3_objects_keep_their_md5_etag() -> None:
    h = {"x-amz-server-side-encryption": "AES256"}
    assert body_checksum(h, MD5_ETAG, stored=True, md5=True) == Checksum(
        "md5", bytes.fromhex(MD5_ETAG)
    )


def test_a_full_object_checksum_of_a_multipart_object_is_used() -> None:
    h = {"x-amz-checksum-crc32": CRC32, "x-amz-checksum-type": "FULL_OBJECT"}
    assert body_checksum(h, "abc-4", stored=True, md5=True) == Checksum(
        "crc32", base64.b64decode(CRC32)
    )
