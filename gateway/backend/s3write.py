"""The S3 store's writes: PUT, multipart uploads, server-side copy and DELETE.

Owns: ``S3Writes``, the methods ``S3Store`` inherits for them: their requests, the part
sizes an upload accumulates (so completing it needs no HEAD), the CRC32 a PUT carries.
Must not: send a request but through the store's ``_call`` (retries, signing, the observer),
map an error itself (``S3Store._error`` and ``_embedded_error`` do), or import nfsproto.
"""

from __future__ import annotations

import base64
import contextlib
from collections.abc import Awaitable, Callable, Mapping
from typing import Final, Protocol, TypeVar

import aiohttp

from gateway.backend.base import BackendError, ObjectInfo, ObjectNotFound
from gateway.backend.checksums import digest
from gateway.backend.config import ChecksumPolicy
from gateway.backend.http1 import BodyTooLarge
from gateway.backend.s3verify import off_loop_if_big
from gateway.backend.s3wire import (
    child_text,
    complete_multipart_body,
    embedded_error,
    http_date_ns,
    metadata_headers,
    unquote_etag,
    xml_root,
)
from gateway.backend.sigv4 import UNSIGNED_PAYLOAD, canonical_query, encode_path, payload_sha256

T = TypeVar("T")

_S200_204: Final = frozenset({200, 204})
# The XML replies of writes (CreateMultipartUpload, CompleteMultipartUpload, CopyObject) and
# the empty bodies of PUT, UploadPart, DELETE: a few hundred bytes; also GetObjectAttributes'.
_MAX_XML_BODY: Final = 1 << 20


class S3Calls(Protocol):
    """What the writes use of the store."""

    bucket: str
    checksums: ChecksumPolicy
    _sign_payload: bool
    _part_sizes: dict[str, dict[int, int]]

    def _call(
        self,
        op: str,
        method: str,
        key: str,
        *,
        handle: Callable[[aiohttp.ClientResponse], Awaitable[T]],
        query: str = ...,
        headers: Mapping[str, str] | None = ...,
        body: bytes | None = ...,
        payload_hash: str = ...,
        expect: frozenset[int] = ...,
    ) -> Awaitable[T]: ...

    def _embedded_error(self, what: str, code: str, message: str) -> Exception: ...

    async def head(self, key: str) -> ObjectInfo: ...


async def read_bounded(resp: aiohttp.ClientResponse, limit: int) -> bytes:
    """An aiohttp reply's body, at most ``limit`` bytes: a longer ``Content-Length`` is
    refused before reading, a body without one as soon as it passes ``limit``
    (``BodyTooLarge``)."""
    clen = resp.content_length
    if clen is not None and clen > limit:
        raise BodyTooLarge(resp.status, clen, limit)
    if clen is not None:
        return await resp.read()  # aiohttp stops at Content-Length
    chunks: list[bytes] = []
    got = 0
    async for chunk in resp.content.iter_any():
        got += len(chunk)
        if got > limit:
            raise BodyTooLarge(resp.status, got, limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _crc32(data: bytes) -> bytes:
    return digest("crc32", data)


async def _put_body(
    store: S3Calls,
    op: str,
    key: str,
    data: bytes,
    handle: Callable[[aiohttp.ClientResponse], Awaitable[T]],
    *,
    query: str = "",
    headers: Mapping[str, str] | None = None,
) -> T:
    """A PUT of ``data`` (an object or a part) with its payload hash (signed over plain
    HTTP: computed off the loop when big; ``UNSIGNED-PAYLOAD`` over HTTPS)."""
    payload_hash = UNSIGNED_PAYLOAD
    if store._sign_payload:
        payload_hash = await off_loop_if_big(payload_sha256, data)
    return await store._call(
        op, "PUT", key, query=query, headers=headers, body=data, payload_hash=payload_hash,
        handle=handle,
    )  # fmt: skip


class S3Writes:
    """The writes of ``S3Store`` (a mixin: ``self`` is the store)."""

    async def put(
        self: S3Calls, key: str, data: bytes, metadata: Mapping[str, str] | None = None
    ) -> ObjectInfo:
        headers = metadata_headers(metadata)
        size = len(data)
        if self.checksums.stored:
            # The store checks it on the way in (400 BadDigest) and keeps it: a later
            # whole-object read of this object is verified for 17 µs per 110 kB.
            crc = await off_loop_if_big(_crc32, data)
            headers["x-amz-checksum-crc32"] = base64.b64encode(crc).decode()

        async def handle(resp: aiohttp.ClientResponse) -> ObjectInfo:
            await read_bounded(resp, _MAX_XML_BODY)
            h = resp.headers
            return ObjectInfo(
                key,
                size,
                unquote_etag(h.get("ETag", "")),
                http_date_ns(h.get("Last-Modified") or h.get("Date", "")),
                dict(metadata or {}),
            )

        return await _put_body(self, "put", key, data, handle, headers=headers)

    async def create_multipart(
        self: S3Calls, key: str, metadata: Mapping[str, str] | None = None
    ) -> str:
        async def handle(resp: aiohttp.ClientResponse) -> str:
            root = xml_root(await read_bounded(resp, _MAX_XML_BODY))
            upload_id = child_text(root, "UploadId")
            if not upload_id:
                raise BackendError(f"create_multipart {self.bucket}/{key}: no UploadId")
            return upload_id

        upload_id = await self._call(
            "create_multipart",
            "POST",
            key,
            query="uploads=",
            headers=metadata_headers(metadata),
            handle=handle,
        )
        self._part_sizes[upload_id] = {}
        return upload_id

    async def upload_part(
        self: S3Calls, key: str, upload_id: str, part_no: int, data: bytes
    ) -> str:
        query = canonical_query((("partNumber", str(part_no)), ("uploadId", upload_id)))

        async def handle(resp: aiohttp.ClientResponse) -> str:
            await read_bounded(resp, _MAX_XML_BODY)
            etag = unquote_etag(resp.headers.get("ETag", ""))
            if not etag:
                raise BackendError(f"upload_part {self.bucket}/{key}: no ETag")
            return etag

        etag = await _put_body(self, "upload_part", key, data, handle, query=query)
        sizes = self._part_sizes.get(upload_id)
        if sizes is not None:
            sizes[part_no] = len(data)
        return etag

    async def complete_multipart(
        self: S3Calls, key: str, upload_id: str, parts: list[tuple[int, str]]
    ) -> ObjectInfo:
        body = complete_multipart_body(parts)

        async def handle(resp: aiohttp.ClientResponse) -> tuple[str, int]:
            # S3 may answer 200 and still fail: the error is then in the body.
            root = xml_root(await read_bounded(resp, _MAX_XML_BODY))
            if (error := embedded_error(root)) is not None:
                raise self._embedded_error(f"complete_multipart {self.bucket}/{key}", *error)
            etag = unquote_etag(child_text(root, "ETag"))
            return etag, http_date_ns(resp.headers.get("Date", ""))

        etag, mtime_ns = await self._call(
            "complete_multipart",
            "POST",
            key,
            query=canonical_query((("uploadId", upload_id),)),
            body=body,
            payload_hash=payload_sha256(body),
            handle=handle,
        )
        sizes = self._part_sizes.pop(upload_id, None)
        if sizes is not None and all(n in sizes for n, _ in parts):
            return ObjectInfo(key, sum(sizes[n] for n, _ in parts), etag, mtime_ns)
        return await self.head(key)  # parts were uploaded by another process

    async def abort_multipart(self: S3Calls, key: str, upload_id: str) -> None:
        self._part_sizes.pop(upload_id, None)

        async def handle(resp: aiohttp.ClientResponse) -> None:
            await read_bounded(resp, _MAX_XML_BODY)

        with contextlib.suppress(ObjectNotFound):  # NoSuchUpload: already gone
            await self._call(
                "abort_multipart",
                "DELETE",
                key,
                query=canonical_query((("uploadId", upload_id),)),
                expect=_S200_204,
                handle=handle,
            )

    async def copy(
        self: S3Calls, src: str, dst: str, metadata: Mapping[str, str] | None = None
    ) -> ObjectInfo:
        """Server-side copy (objects up to 5 GiB), then a HEAD of ``dst`` for its size and
        metadata: two requests."""
        headers = metadata_headers(metadata)
        headers["x-amz-copy-source"] = f"/{encode_path(self.bucket)}/{encode_path(src)}"
        headers["x-amz-metadata-directive"] = "COPY" if metadata is None else "REPLACE"

        async def handle(resp: aiohttp.ClientResponse) -> None:
            body = await read_bounded(resp, _MAX_XML_BODY)
            if (error := embedded_error(xml_root(body))) is not None:
                raise self._embedded_error(f"copy {self.bucket}/{src} -> {dst}", *error)

        await self._call("copy", "PUT", dst, headers=headers, handle=handle)
        return await self.head(dst)

    async def delete(self: S3Calls, key: str) -> None:
        """Delete; deleting a missing key succeeds (S3 semantics)."""

        async def handle(resp: aiohttp.ClientResponse) -> None:
            await read_bounded(resp, _MAX_XML_BODY)

        with contextlib.suppress(ObjectNotFound):
            await self._call("delete", "DELETE", key, expect=_S200_204, handle=handle)
