"""The tree the e2e (and reliability) tests serve: an ImageFolder-shaped ``train/`` plus the
shapes a real bucket has (a file larger than ``small_file_max`` read in blocks, an empty file,
names with spaces and non-ASCII, a path too long for an inline handle, deep directories, a
``dir/`` marker of an empty directory).

Owns: the source of truth guest listings and checksums are compared with. Bodies are
deterministic (``random.Random(seed)``). Must not: talk NFS or start servers.
"""

from __future__ import annotations

import contextlib
import hashlib
import random
from collections.abc import Iterator
from dataclasses import dataclass, field

from loadgen.seaweed import SeaweedServer
from tests.harness.buckets import Buckets

__all__ = ["Tree", "bucket_with", "make_tree", "md5"]

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

    def objects(self) -> dict[str, bytes]:
        """Full key -> body of what the bucket holds: the files and the markers."""
        out = {self.prefix + p: b for p, b in self.files.items()}
        out.update({self.prefix + d + "/": b"" for d in self.markers})
        return out

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


@contextlib.contextmanager
def bucket_with(seaweed: SeaweedServer, tree: Tree) -> Iterator[str]:
    """A new bucket (``tree-<hex>``, made by ``tests.harness.buckets.Buckets``) holding
    ``tree``, deleted afterwards."""
    with Buckets(seaweed) as buckets:
        yield buckets.make("tree", tree.objects())
