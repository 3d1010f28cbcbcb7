"""Synthetic ImageFolder-shaped datasets for integration tests, their upload, the directory
listings the gateway must show for them (the spy that wraps an export's object store is
``tests.harness.stores.SpyStore``).

Owns: the source of truth the tests compare NFS reads and listings against. Must not: talk
NFS. Object bodies are deterministic (``random.Random(seed)``), so a failing run repeats.

The layout rules of DESIGN §3 ("Object keys <-> files") are restated in ``expected_dir``: a
key ``prefix + "a/b.jpg"`` is file ``a/b.jpg``; directories come from common prefixes and
zero-byte ``dir/`` markers; a name that is both an object and a prefix is the directory; keys
that cannot be a path (empty segment, ``.``, ``..``) are skipped.

SeaweedFS (the test S3 server) cannot store the last kind: it normalises ``a//b`` to ``a/b``
and answers 400 InvalidRequest to ``./x`` and ``x/../y``. Those keys are therefore not
uploaded; ``tests.harness.stores.SpyStore`` injects them into the listings the gateway
receives, the way S3 itself would return them (as common prefixes with the delimiter).
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from gateway.backend.base import (
    BackendError,
    ObjectStore,
)

__all__ = [
    "Dataset",
    "Expected",
    "build_imagefolder",
    "md5",
    "put_objects",
    "upload",
]

KiB = 1024
MiB = 1024 * 1024


def md5(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


@dataclass(frozen=True, slots=True)
class Expected:
    """One directory entry as a client must see it: "file" or "dir", and the size (directories
    are 4096 in the gateway's attributes)."""

    kind: str
    size: int


DIR_SIZE = 4096


@dataclass(slots=True)
class Dataset:
    """``files``: relative path -> body (uploaded as ``prefix + path``). ``markers``: relative
    directory paths uploaded as zero-byte ``path/`` objects. ``unstorable``: relative keys the
    S3 server cannot hold (injected by ``SpyStore``)."""

    prefix: str
    files: dict[str, bytes] = field(default_factory=dict)
    markers: list[str] = field(default_factory=list)
    unstorable: list[str] = field(default_factory=list)

    def keys(self) -> Iterable[str]:
        """Every relative key as the bucket sees it (markers end in '/'), plus the injected."""
        yield from self.files
        yield from (m + "/" for m in self.markers)
        yield from self.unstorable

    def expected_dir(self, rel_dir: str) -> dict[str, Expected]:
        """The entries of directory ``rel_dir`` ("" = the export root)."""
        lead = rel_dir + "/" if rel_dir else ""
        out: dict[str, Expected] = {}
        for key in self.keys():
            if not key.startswith(lead):
                continue
            rest = key[len(lead) :]
            if not rest:
                continue  # the directory's own marker
            name, slash, _ = rest.partition("/")
            if name in ("", ".", ".."):
                continue  # cannot be a path: skipped
            if slash:
                out[name] = Expected("dir", DIR_SIZE)  # a prefix: wins over an object
            elif name not in out:
                out[name] = Expected("file", len(self.files.get(key, b"")))
        return out

    def dirs(self) -> list[str]:
        """Every directory reachable through NFS, root first."""
        seen = {""}
        todo = [""]
        out: list[str] = []
        while todo:
            d = todo.pop(0)
            out.append(d)
            for name, e in sorted(self.expected_dir(d).items()):
                if e.kind == "dir":
                    p = f"{d}/{name}" if d else name
                    if p not in seen:
                        seen.add(p)
                        todo.append(p)
        return out


def _image_sizes(rng: random.Random, n: int) -> list[int]:
    """ImageNet-like sizes: log-normal around ~110 KB (DESIGN §1: mean 114,660 B)."""
    return [min(600_000, max(1, int(rng.lognormvariate(math.log(95_000), 0.55)))) for _ in range(n)]


def build_imagefolder(seed: int = 1281167, prefix: str = "ds/") -> Dataset:
    """The tree the read-path integration tests use (relative to ``prefix``)::

    classes/{cat,dog,owl}/img_NNNN.jpg   small classes: ~110 KB typical, some 0 B, and
                                         edge sizes 1, 4095, 4096, 4097, 1 MiB, 4 MiB
    n01440764/n01440764_NNNNN.JPEG       1,300 files (tiny bodies: only stat'ed)
    wide/img_NNNNN.jpg                   5,000 entries (tiny bodies: only listed)
    large/block.bin                      5 MiB + 4099 B: the block path
    large/blob64.bin                     64 MiB: concurrent readers
    cv2/sample.jpg                       112,640 B: the cv2.imread pattern
    with space/file name.jpg, ünï cødé/файл.jpg, README.txt
    empty/                               a zero-byte marker, nothing under it
    both, both/x                         an object that is also a prefix: a directory
    weird/ok.txt                         + injected a//b, ./x, x/../y (not storable)
    """
    rng = random.Random(seed)
    ds = Dataset(prefix)
    edge = [0, 1, 4095, 4096, 4097, MiB, 4 * MiB]
    for c, n in (("cat", 16), ("dog", 14), ("owl", 12)):
        sizes = _image_sizes(rng, n)
        sizes[1] = 0
        if c == "cat":
            sizes[2 : 2 + len(edge)] = edge
        for i, size in enumerate(sizes):
            ds.files[f"classes/{c}/img_{i:04d}.jpg"] = rng.randbytes(size)
    for i in range(1300):
        ds.files[f"n01440764/n01440764_{i:05d}.JPEG"] = rng.randbytes(i % 61)
    for i in range(5000):
        ds.files[f"wide/img_{i:05d}.jpg"] = rng.randbytes(i % 7)
    ds.files["large/block.bin"] = rng.randbytes(5 * MiB + 4099)
    ds.files["large/blob64.bin"] = rng.randbytes(64 * MiB)
    ds.files["cv2/sample.jpg"] = rng.randbytes(112_640)
    ds.files["with space/file name.jpg"] = rng.randbytes(3210)
    ds.files["ünï cødé/файл.jpg"] = rng.randbytes(4321)
    ds.files["README.txt"] = b"synthetic ImageFolder for nfsgw integration tests\n"
    ds.markers.append("empty")
    ds.files["both"] = b"the object under the prefix\n"
    ds.files["both/x"] = rng.randbytes(77)
    ds.files["weird/ok.txt"] = b"ok\n"
    ds.unstorable += ["weird/a//b", "weird/./x", "weird/x/../y"]
    return ds


async def upload(ds: Dataset, store: ObjectStore, concurrency: int = 64) -> None:
    """Put every file and marker of ``ds`` (concurrently)."""
    sem = asyncio.Semaphore(concurrency)

    async def put(key: str, body: bytes) -> None:
        async with sem:
            await store.put(key, body)

    jobs = [put(ds.prefix + k, v) for k, v in ds.files.items()]
    jobs += [put(ds.prefix + m + "/", b"") for m in ds.markers]
    await asyncio.gather(*jobs)


async def put_objects(
    store: ObjectStore,
    objects: Mapping[str, bytes],
    *,
    concurrency: int = 16,
    refusable: Callable[[str], bool] = lambda key: False,
) -> set[str]:
    """PUT every object (``concurrency`` at once); the keys the store refused among those
    ``refusable`` says it may refuse (e.g. names with a tab) are returned, any other refusal
    raises."""
    sem = asyncio.Semaphore(concurrency)
    refused: set[str] = set()

    async def put(key: str, body: bytes) -> None:
        async with sem:
            try:
                await store.put(key, body)
            except BackendError:
                if not refusable(key):
                    raise
                refused.add(key)

    await asyncio.gather(*(put(k, v) for k, v in objects.items()))
    return refused
