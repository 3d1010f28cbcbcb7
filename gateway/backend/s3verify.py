"""Every byte verified: the checks of whole-object GET bodies against the checksums their
replies carry, and where hashing runs (on the loop or in a thread).

Owns: ``BodyCheck`` (which checksum a reply's headers allow under the ``ChecksumPolicy``, the
part sizes of a multipart object's COMPOSITE checksum, hashing, the mismatch log line),
``_BadChecksum`` (an attempt whose body failed: retried by the request core) and
``ChecksumMismatch`` (every attempt's did), ``off_loop_if_big``. Must not: send requests
itself (the store gives ``BodyCheck`` the function that asks for a page of part sizes),
import nfsproto, or block the event loop with a large or a Python-coded hash.

Hashing runs on the loop below ``_HASH_OFF_LOOP_BYTES`` (a compiled CRC of a 110 kB body:
~3 µs, docs/benchmarks.md), in a thread above it (hashlib, zlib and ``gateway._checksums``
release the GIL); the Python CRC32C/CRC64NVME (without the compiled ones) always in a thread.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable, Mapping
from typing import Final, TypeVar

import structlog

from gateway.backend.base import BackendError, BackendUnavailable, ObjectNotFound
from gateway.backend.checksums import PYTHON_CRCS, Checksum, body_checksum, fast_crcs
from gateway.backend.config import ChecksumPolicy
from gateway.backend.s3wire import MalformedReply

log = structlog.get_logger("gateway.backend.s3")

R = TypeVar("R")

_HASH_OFF_LOOP_BYTES: Final = 1 << 20
_PARTS_CACHED: Final = 4096  # object versions whose part sizes are kept (``_object_parts``)

Parts = tuple[str, list[tuple[int, int]], int | None]
"""A page of GetObjectAttributes ``ObjectParts``: (the object's ETag, [(part number, size)],
the next part-number marker or None)."""
PartsPage = Callable[[str, dict[str, str]], Awaitable[Parts]]
"""(key, request headers) -> a page of its part sizes (``S3Store._attributes``)."""


class _BadChecksum(MalformedReply):
    """A whole-object body that does not hash to its checksum: retried (like any reply the
    store cannot use), then ``ChecksumMismatch``."""


class ChecksumMismatch(BackendError):
    """Every attempt's body failed its checksum: the bytes are not served (NFS3ERR_IO)."""


async def off_loop_if_big(fn: Callable[[bytes], R], data: bytes) -> R:
    """``fn(data)``, in a thread for bodies over ``_HASH_OFF_LOOP_BYTES`` (hashlib and zlib
    release the GIL; below it the thread hand-off costs more than it saves)."""
    if len(data) > _HASH_OFF_LOOP_BYTES:
        return await asyncio.to_thread(fn, data)
    return fn(data)


class BodyCheck:
    """Verifies the body of a GET that is the whole object of ``bucket`` against the
    cheapest full-object checksum its reply carries and ``policy`` allows
    (``checksums.body_checksum``). ``wanted``: whether the policy allows any."""

    def __init__(self, bucket: str, policy: ChecksumPolicy, parts_page: PartsPage) -> None:
        self.bucket = bucket
        self.policy = policy
        self.wanted = policy.stored or policy.md5 or policy.python_crcs
        self._parts_page = parts_page
        # (key, ETag) -> the part sizes of a multipart object (None: not to be had), LRU
        self._parts_of: collections.OrderedDict[tuple[str, str], tuple[int, ...] | None] = (
            collections.OrderedDict()
        )

    async def check(self, key: str, h: Mapping[str, str], etag: str, data: bytes) -> None:
        """Raise ``_BadChecksum`` unless ``data`` (the whole object at version ``etag``, its
        reply's headers ``h`` looked up by lowercase name) hashes to a checksum the reply
        carries; a body with none the policy allows, or a multipart one whose part sizes the
        store does not tell, passes unverified."""
        policy = self.policy
        c = body_checksum(
            h,
            etag,
            stored=policy.stored,
            md5=policy.md5,
            python_crcs=policy.python_crcs,
            multipart=True,
        )
        sizes = None
        if c is not None and c.parts > 1:
            sizes = await self._object_parts(key, etag, c.parts, len(data))
            if sizes is None:
                c = None  # the store does not say where the parts are: not verifiable
        if c is not None:
            await self._verify(key, data, c, sizes)

    async def _verify(
        self, key: str, data: bytes, c: Checksum, part_sizes: tuple[int, ...] | None = None
    ) -> None:
        """Raise ``_BadChecksum`` unless ``data`` hashes to ``c`` (logged: a body of the right
        length with wrong bytes is a store or network fault worth seeing)."""
        slow = c.algorithm in PYTHON_CRCS and not fast_crcs()  # Python, ~60 ns a byte
        if slow or len(data) > _HASH_OFF_LOOP_BYTES:
            got = await asyncio.to_thread(c.compute, data, part_sizes)
        else:
            got = c.compute(data, part_sizes)
        if got != c.expected:
            log.warning(
                "s3_checksum_mismatch",
                bucket=self.bucket,
                key=key,
                algorithm=c.algorithm,
                size=len(data),
                expected=c.expected.hex(),
                got=got.hex(),
            )
            raise _BadChecksum(
                f"{c.algorithm} of {len(data)} bytes is {got.hex()}, not {c.expected.hex()}"
            )

    async def _object_parts(
        self, key: str, etag: str, parts: int, size: int
    ) -> tuple[int, ...] | None:
        """The sizes of the ``parts`` parts of ``key`` at version ``etag`` (adding up to
        ``size``), from GetObjectAttributes ``ObjectParts`` (1,000 parts a request); None when
        the store does not tell them (remembered for the version: not asked again) or the
        object changed meanwhile. Cached per (key, ETag), ``_PARTS_CACHED`` versions: one
        request per object version read whole."""
        cache = self._parts_of
        ck = (key, etag)
        if ck in cache:
            cache.move_to_end(ck)
            return cache[ck]
        got: list[tuple[int, int]] = []
        marker: int | None = 0
        try:
            while marker is not None and len(got) < parts:
                headers = {
                    "x-amz-object-attributes": "ETag,ObjectParts",
                    "x-amz-max-parts": str(min(parts, 1000)),
                }
                if marker:
                    headers["x-amz-part-number-marker"] = str(marker)
                their_etag, page, marker = await self._parts_page(key, headers)
                if not their_etag:  # which version's parts: cannot tell
                    got = []
                    break
                if their_etag != etag:
                    return None  # another version now: not this body's parts
                got += page
        except (ObjectNotFound, BackendUnavailable):
            return None  # gone, or not answering now: unverified this time, asked again next
        except BackendError as e:  # not implemented, refused: this store does not tell
            log.info("s3_object_parts_unknown", bucket=self.bucket, key=key, error=str(e))
            got = []
        sizes: tuple[int, ...] | None = tuple(n for _, n in got)
        if [p for p, _ in got] != list(range(1, parts + 1)) or sum(sizes or ()) != size:
            sizes = None
        cache[ck] = sizes
        if len(cache) > _PARTS_CACHED:
            cache.popitem(last=False)
        return sizes
