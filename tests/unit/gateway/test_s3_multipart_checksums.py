"""COMPOSITE checksums of multipart objects on SeaweedFS (large objects are uploaded in parts,
and their bytes must be verified like any other's): an object uploaded in two parts with CRC32
or CRC32C checksums keeps ``<base64>-2`` (``x-amz-checksum-type: COMPOSITE``) and answers
GetObjectAttributes ``ObjectParts`` with the parts' sizes (no per-part checksums, which the
verification does not need); a whole-object GET is verified against it, and a body with one bit
flipped (``tests.faultproxy`` ``flip-bit``) is never served. The uploads go through boto3
(nfsgw's own multipart uploads send no checksums)."""

from __future__ import annotations

import base64
import os
from collections.abc import Iterator

import pytest

from gateway.backend.checksums import digest, fast_crcs
from gateway.backend.config import RetryPolicy
from gateway.backend.s3 import ChecksumMismatch, S3Store
from loadgen.seaweed import SeaweedServer
from tests.faultproxy import FaultProxy, Rule

pytestmark = [pytest.mark.s3]

MiB = 1 << 20
PARTS = (os.urandom(5 * MiB), os.urandom(300_000))
RETRY = RetryPolicy(max_attempts=3, deadline_s=20.0, base_delay_s=0.01, max_delay_s=0.05)


@pytest.fixture
def uploaded(seaweed: SeaweedServer, s3_bucket: str) -> Iterator[dict[str, str]]:
    """key -> the COMPOSITE value SeaweedFS keeps, for a two-part upload per algorithm."""
    boto3 = pytest.importorskip("boto3")
    from botocore.config import Config

    kw = seaweed.store_kwargs()
    client = boto3.client(
        "s3",
        endpoint_url=kw["endpoint_url"],
        region_name=kw["region"],
        aws_access_key_id=kw["access_key"],
        aws_secret_access_key=kw["secret_key"],
        config=Config(request_checksum_calculation="when_required"),
    )
    out = {}
    for algorithm in ("crc32", "crc32c"):
        key = f"mp-{algorithm}"
        arg = f"Checksum{algorithm.upper()}"
        up = client.create_multipart_upload(
            Bucket=s3_bucket, Key=key, ChecksumAlgorithm=algorithm.upper()
        )
        done = []
        for n, part in enumerate(PARTS, 1):
            value = base64.b64encode(digest(algorithm, part)).decode()
            r = client.upload_part(
                Bucket=s3_bucket,
                Key=key,
                UploadId=up["UploadId"],
                PartNumber=n,
                Body=part,
                **{arg: value},
            )
            done.append({"PartNumber": n, "ETag": r["ETag"], arg: value})
        r = client.complete_multipart_upload(
            Bucket=s3_bucket, Key=key, UploadId=up["UploadId"], MultipartUpload={"Parts": done}
        )
        out[key] = r[arg]
    client.close()
    yield out


@pytest.mark.parametrize("algorithm", ["crc32", "crc32c"])
async def test_a_multipart_object_with_part_checksums_is_verified(
    seaweed: SeaweedServer, s3_bucket: str, uploaded: dict[str, str], algorithm: str
) -> None:
    if algorithm == "crc32c" and not fast_crcs():
        pytest.skip("CRC32C is verified by default only with the compiled CRCs")
    key = f"mp-{algorithm}"
    value = uploaded[key]
    inner = b"".join(digest(algorithm, p) for p in PARTS)
    assert value == f"{base64.b64encode(digest(algorithm, inner)).decode()}-2"  # COMPOSITE
    seen: list[tuple[str, str]] = []
    async with FaultProxy(seaweed.endpoint_url, seed=25) as proxy:
        kw = {**seaweed.store_kwargs(), "endpoint_url": proxy.endpoint_url}
        store = S3Store(
            s3_bucket, retry=RETRY, observer=lambda op, o, s: seen.append((op, o)), **kw
        )
        try:
            assert (await store.get(key)).data == b"".join(PARTS)
            assert seen == [("attributes", "ok"), ("get", "ok")]  # the parts' sizes, once
            # one corrupted body: retried, the right bytes
            proxy.add(Rule("flip-bit", kinds={"GET"}, key=key, times=1))
            assert (await store.get(key)).data == b"".join(PARTS)
            assert seen[2:] == [("get", "checksum_mismatch"), ("get", "ok")]
            # corrupted every time: never served
            proxy.add(Rule("flip-bit", kinds={"GET"}, key=key))
            with pytest.raises(ChecksumMismatch):
                await store.get(key)
            assert seen[4:] == [("get", "checksum_mismatch")] * RETRY.max_attempts
        finally:
            await store.close()
