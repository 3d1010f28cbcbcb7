"""SigV4: the AWS documentation vector, encoding rules, and agreement with botocore's
signer on random requests."""

from __future__ import annotations

import datetime
import hashlib
import random

import pytest

from gateway.backend.sigv4 import (
    EMPTY_SHA256,
    UNSIGNED_PAYLOAD,
    Credentials,
    SigV4Signer,
    amz_date,
    canonical_query,
    encode_path,
)

EXAMPLE = Credentials("AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY")


def test_aws_docs_get_object_vector() -> None:
    # "Example: GET Object" in the S3 API reference (sig-v4-header-based-auth).
    headers = {"host": "examplebucket.s3.amazonaws.com", "range": "bytes=0-9"}
    SigV4Signer("us-east-1").sign(
        EXAMPLE, "GET", "/test.txt", "", headers, EMPTY_SHA256, date="20130524T000000Z"
    )
    assert headers["authorization"] == (
        "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
        "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
        "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
    )
    assert headers["x-amz-date"] == "20130524T000000Z"
    assert headers["x-amz-content-sha256"] == EMPTY_SHA256


def test_aws_docs_list_objects_vector() -> None:
    # "Example: GET Bucket (List Objects)" in the same page.
    headers = {"host": "examplebucket.s3.amazonaws.com"}
    SigV4Signer("us-east-1").sign(
        EXAMPLE,
        "GET",
        "/",
        canonical_query([("max-keys", "2"), ("prefix", "J")]),
        headers,
        EMPTY_SHA256,
        date="20130524T000000Z",
    )
    assert headers["authorization"].endswith(
        "Signature=34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7"
    )


def test_session_token_is_signed() -> None:
    headers = {"host": "h"}
    SigV4Signer("us-east-1").sign(
        Credentials("AK", "SK", "TOKEN"), "GET", "/b/k", "", headers, UNSIGNED_PAYLOAD
    )
    assert headers["x-amz-security-token"] == "TOKEN"
    assert "x-amz-security-token" in headers["authorization"].split("SignedHeaders=")[1]


@pytest.mark.parametrize(
    ("key", "encoded"),
    [
        ("plain/key.jpg", "plain/key.jpg"),
        ("a b/c", "a%20b/c"),
        ("x+y%z", "x%2By%25z"),
        ("ünï/cöde", "%C3%BCn%C3%AF/c%C3%B6de"),
        ("a//b/./c", "a//b/./c"),
        ("~tilde-_.", "~tilde-_."),
        ("q?x=1&y#z", "q%3Fx%3D1%26y%23z"),
        ("😀", "%F0%9F%98%80"),
    ],
)
def test_encode_path(key: str, encoded: str) -> None:
    assert encode_path(key) == encoded


def test_canonical_query_sorts_and_encodes() -> None:
    q = canonical_query(
        [("prefix", "a b/"), ("list-type", "2"), ("delimiter", "/"), ("uploads", "")]
    )
    assert q == "delimiter=%2F&list-type=2&prefix=a%20b%2F&uploads="


def test_amz_date() -> None:
    assert amz_date(1369353600.5) == "20130524T000000Z"


def _botocore_authorization(
    creds: Credentials,
    region: str,
    method: str,
    url: str,
    headers: dict[str, str],
    body: bytes,
    when: datetime.datetime,
    monkeypatch: pytest.MonkeyPatch,
) -> str:
    import botocore.auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials as BotoCredentials

    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda: when)
    req = AWSRequest(method=method, url=url, headers=dict(headers), data=body)
    botocore.auth.S3SigV4Auth(
        BotoCredentials(creds.access_key, creds.secret_key, creds.token), "s3", region
    ).add_auth(req)
    return str(req.headers["Authorization"])


_ALPHABET = "abcXYZ019 -_.~+%/&=?#ü日本😀'\"!*()"


def test_matches_botocore_on_random_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(1234)
    when = datetime.datetime(2024, 2, 29, 23, 59, 58)
    date = when.strftime("%Y%m%dT%H%M%SZ")
    for _ in range(200):
        key = "".join(rng.choice(_ALPHABET) for _ in range(rng.randint(1, 24)))
        region = rng.choice(["us-east-1", "eu-west-3", "ap-southeast-2"])
        token = rng.choice([None, "FwoGZXIvYXdzEJr//////////token=="])
        creds = Credentials("AKIDEXAMPLE", "secret/" + str(rng.random()), token)
        method = rng.choice(["GET", "HEAD", "PUT", "POST", "DELETE"])
        params = [
            (rng.choice(["prefix", "uploadId", "partNumber", "x-id", "start-after"]), v)
            for v in ("".join(rng.choice(_ALPHABET) for _ in range(rng.randint(0, 8))),)
        ]
        if rng.random() < 0.5:
            params.append(("list-type", "2"))
        host = rng.choice(["127.0.0.1:8333", "bucket.s3.eu-west-3.amazonaws.com"])
        path = "/bkt/" + encode_path(key)
        query = canonical_query(params)
        body = rng.randbytes(rng.randint(0, 64)) if method in ("PUT", "POST") else b""
        extra = {}
        if rng.random() < 0.5:
            extra["range"] = f"bytes={rng.randint(0, 99)}-{rng.randint(100, 999)}"
        if rng.random() < 0.3:
            extra["x-amz-meta-mtime"] = str(rng.randint(0, 2**40))

        ours = {"host": host, **extra}
        SigV4Signer(region).sign(
            creds, method, path, query, ours, hashlib.sha256(body).hexdigest(), date=date
        )
        url = f"http://{host}{path}" + (f"?{query}" if query else "")
        theirs = _botocore_authorization(creds, region, method, url, extra, body, when, monkeypatch)
        assert ours["authorization"] == theirs, (method, key, params)


def test_credentials_never_print_their_secret() -> None:
    """A traceback or a log line may print credentials (issue 37: a crash below the S3
    client logged the access key and half the secret through this repr)."""
    from gateway.backend.sigv4 import Credentials, SigV4Signer

    c = Credentials("AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "tok3n")
    for text in (repr(c), str(c), f"{c}", repr([c]), repr(SigV4Signer("us-east-1"))):
        assert "IOSFODNN7EXAMPLE" not in text and "wJalr" not in text and "EXAMPLEKEY" not in text
        assert "tok3n" not in text
    assert repr(c) == "Credentials(access_key='AKIA…', secret_key=<hidden>, token=<hidden>)"
    assert "AKIA" not in repr(Credentials("AKIA1234", "s"))  # too short to show any of it
    signer = SigV4Signer("us-east-1")
    signer.signing_key(c.secret_key, "20261130")
    assert "wJalr" not in repr(signer) and repr(signer).startswith("SigV4Signer(")
