"""The tree the e2e (and reliability) tests serve: an ImageFolder-shaped ``train/`` plus the
shapes a real bucket has (a file larger than ``small_file_max`` read in blocks, an empty file,
names with spaces and non-ASCII, a path too long for an inline handle, deep directories, a
``dir/`` marker of an empty directory).

Owns: the source of truth guest listings and checksums are compared with. Bodies are
deterministic (``random.Random(seed)``). Must not: talk NFS or start servers.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import random
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

from gateway.backend.base import ObjectStore
from gateway.backend.s3 import S3Store
from loadgen.seaweed import SeaweedServer

__all__ = ["Tree", "bucket_with", "make_tree", "md5", "upload_tree"]

MiB = 1024 * 1024
LONG_NAME = "a-file-name-long-enough-that-its-handle-is-hashed-not-inline.jpg"


def md5(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


@dataclass(slots=True)
class Tree:
    """``files``: relative path -> body; ``markers``: relative directories stored as zero-byte
    ``dir/`` objects."""

    prefix: str
    files: dict[str, bytes] = field(default_factory=dict)
    markers: list[str] = field(default_factory=list)

    def dirs(self) -> set[str]:
        out = set(self.markers)
        for p in self.files:
            parts = p.split("/")[:-1]
            for i in range(1, len(parts) + 1):
                out.add("/".join(parts[:i]))
        return out

    def md5s(self) -> dict[str, str]:
        return {p: md5(b) for p, b in self.files.items()}

    def train_files(self) -> list[str]:
        return sorted(p for p in self.files if p.startswith("train/"))

    @property
    def total_bytes(self) -> int:
        return sum(len(b) for b in self.files.values())


def make_tree(prefix: str = "ds/", *, classes: int = 6, per_class: int = 20, seed: int = 7) -> Tree:
    rng = random.Random(seed)
    t = Tree(prefix)
    for c in range(classes):
        for i in range(per_class):
            # JPEG-like sizes (lognormal around 30 KB), clipped to [1 KiB, 256 KiB]
            size = int(min(max(rng.lognormvariate(10.3, 0.8), 1024), 256 * 1024))
            t.files[f"train/n{c:08d}/n{c:08d}_{i:05d}.JPEG"] = rng.randbytes(size)
    t.files["extras/big.bin"] = rng.randbytes(6 * MiB + 12345)
    t.files["extras/empty"] = b""
    t.files["extras/with space & ü.txt"] = "spaces and ü\n".encode()
    t.files[f"extras/{LONG_NAME}"] = rng.randbytes(5000)
    t.files["extras/a/b/c/deep.txt"] = b"deep\n"
    t.markers.append("extras/emptydir")
    return t


async def upload_tree(tree: Tree, store: ObjectStore, concurrency: int = 16) -> None:
    sem = asyncio.Semaphore(concurrency)

    async def put(key: str, body: bytes) -> None:
        async with sem:
            await store.put(key, body)

    await asyncio.gather(
        *(put(tree.prefix + p, b) for p, b in tree.files.items()),
        *(put(tree.prefix + d + "/", b"") for d in tree.markers),
    )


@contextlib.contextmanager
def bucket_with(seaweed: SeaweedServer, tree: Tree, name: str | None = None) -> Iterator[str]:
    """A new bucket holding ``tree``, deleted afterwards."""
    name = name or f"tree-{uuid.uuid4().hex[:12]}"
    seaweed.create_bucket(name)

    async def fill() -> None:
        store = S3Store(name, **seaweed.store_kwargs())
        try:
            await upload_tree(tree, store)
        finally:
            await store.close()

    try:
        asyncio.run(fill())
        yield name
    finally:
        seaweed.delete_bucket(name)
