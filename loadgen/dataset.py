"""Synthetic ImageFolder datasets: the plan (names and sizes), the bodies, the manifest, and
writing them to a local folder and/or uploading them to an S3 prefix.

Owns: everything that makes a dataset reproducible. The same ``DatasetSpec`` (seed included)
always gives the same names, sizes and bytes, so a manifest can be rebuilt and a failing run
repeated. Must not: talk NFS.

Layout: ``n{class:08d}/n{class:08d}_{i:05d}.JPEG`` like ImageNet's train split. Sizes follow a
lognormal distribution with ImageNet's mean and standard deviation (114,660 B, 136,076 B),
clipped to ``[min_size, max_size]`` (which moves the mean by well under 1 %). Bodies start with
a JPEG SOI marker and a per-file digest of (seed, path), end with an EOI marker, and are filled
from a seeded 8 MiB random pool at a per-file offset: no two files are equal (a gateway that
serves the wrong file fails the check) and generation runs at memory speed.

The manifest is a text file: a ``# nfsgw-loadgen manifest v1 {json}`` line with the spec, then
``path<TAB>size<TAB>sha256`` per file in ImageFolder order (classes sorted, files sorted).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import os
import random
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from loadgen.progress import Progress

__all__ = [
    "DatasetSpec",
    "FileSpec",
    "Manifest",
    "ManifestEntry",
    "BodyMaker",
    "plan",
    "make_dataset",
    "parse_per_class",
]

MANIFEST_MAGIC = "# nfsgw-loadgen manifest v1 "
IMAGENET_MEAN = 114_660
IMAGENET_SD = 136_076
_POOL_BYTES = 8 << 20
_SOI = b"\xff\xd8\xff\xe0"
_EOI = b"\xff\xd9"


def parse_per_class(text: str) -> tuple[int, int]:
    """ "200" -> (200, 200); "732-1300" -> (732, 1300)."""
    lo, sep, hi = text.partition("-")
    try:
        a = int(lo)
        b = int(hi) if sep else a
    except ValueError:
        raise ValueError(f"files per class: expected N or MIN-MAX, not {text!r}") from None
    if a < 0 or b < a:
        raise ValueError(f"files per class: bad range {text!r}")
    return a, b


@dataclass(frozen=True, slots=True)
class DatasetSpec:
    classes: int = 1000
    per_class_min: int = 1281
    per_class_max: int = 1281
    mean_size: int = IMAGENET_MEAN
    sd_size: int = IMAGENET_SD
    min_size: int = 1024
    max_size: int = 16 << 20
    seed: int = 0

    def __post_init__(self) -> None:
        if self.classes < 1 or self.classes > 99_999_999:
            raise ValueError("classes must be in 1..99999999")
        if self.per_class_min < 0 or self.per_class_max < self.per_class_min:
            raise ValueError("bad files-per-class range")
        if self.per_class_max > 99_999:
            raise ValueError("at most 99999 files per class")
        if not 0 <= self.min_size <= self.max_size:
            raise ValueError("need 0 <= min_size <= max_size")
        if self.mean_size <= 0 or self.sd_size < 0:
            raise ValueError("mean size must be > 0 and sd >= 0")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> DatasetSpec:
        return cls(**{k: int(v) for k, v in d.items() if k in cls.__dataclass_fields__})


@dataclass(frozen=True, slots=True)
class FileSpec:
    path: str
    size: int


def class_name(c: int) -> str:
    return f"n{c:08d}"


def plan(spec: DatasetSpec) -> list[FileSpec]:
    """Every file of the dataset in ImageFolder order (deterministic by ``spec.seed``)."""
    rng = random.Random(f"{spec.seed}:plan")
    if spec.sd_size:
        sigma2 = math.log1p((spec.sd_size / spec.mean_size) ** 2)
        mu = math.log(spec.mean_size) - sigma2 / 2
        sigma = math.sqrt(sigma2)
    out: list[FileSpec] = []
    for c in range(spec.classes):
        cn = class_name(c)
        n = rng.randint(spec.per_class_min, spec.per_class_max)
        for i in range(n):
            size = int(rng.lognormvariate(mu, sigma)) if spec.sd_size else spec.mean_size
            size = min(max(size, spec.min_size), spec.max_size)
            out.append(FileSpec(f"{cn}/{cn}_{i:05d}.JPEG", size))
    return out


class BodyMaker:
    """Deterministic file bodies for one seed (see the module docstring)."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.pool = random.Random(f"{seed}:pool").randbytes(_POOL_BYTES)

    def body(self, path: str, size: int) -> bytes:
        tag = hashlib.sha256(f"{self.seed}:{path}".encode()).digest()
        head = _SOI + tag
        if size <= len(head) + len(_EOI):
            return head[:size]
        fill = size - len(head) - len(_EOI)
        pool = self.pool
        off = int.from_bytes(tag[:8], "big") % len(pool)
        parts = [head]
        while fill > 0:
            take = min(fill, len(pool) - off)
            parts.append(pool[off : off + take])
            fill -= take
            off = 0
        parts.append(_EOI)
        return b"".join(parts)


@dataclass(frozen=True, slots=True)
class ManifestEntry:
    path: str
    size: int
    sha256: str


class Manifest:
    """The expected content of a dataset: ``entries`` in ImageFolder order, ``by_path``."""

    def __init__(self, entries: list[ManifestEntry], spec: dict[str, Any] | None = None) -> None:
        self.entries = entries
        self.spec = dict(spec or {})
        self.by_path = {e.path: e for e in entries}
        if len(self.by_path) != len(entries):
            raise ValueError("manifest lists a path twice")

    @property
    def total_bytes(self) -> int:
        return sum(e.size for e in self.entries)

    @property
    def classes(self) -> list[str]:
        return sorted({e.path.split("/", 1)[0] for e in self.entries if "/" in e.path})

    def write(self, path: str | os.PathLike[str]) -> None:
        p = Path(path)
        tmp = p.with_name(p.name + ".tmp")
        with tmp.open("w", encoding="utf-8") as f:
            f.write(MANIFEST_MAGIC + json.dumps(self.spec, sort_keys=True) + "\n")
            for e in self.entries:
                f.write(f"{e.path}\t{e.size}\t{e.sha256}\n")
        tmp.replace(p)

    @classmethod
    def read(cls, path: str | os.PathLike[str]) -> Manifest:
        entries: list[ManifestEntry] = []
        spec: dict[str, Any] = {}
        with Path(path).open(encoding="utf-8") as f:
            first = f.readline()
            if not first.startswith(MANIFEST_MAGIC):
                raise ValueError(f"{path}: not an nfsgw-loadgen manifest")
            spec = json.loads(first[len(MANIFEST_MAGIC) :])
            for n, line in enumerate(f, start=2):
                line = line.rstrip("\n")
                if not line:
                    continue
                parts = line.split("\t")
                if len(parts) != 3 or len(parts[2]) != 64:
                    raise ValueError(f"{path}:{n}: expected PATH<TAB>SIZE<TAB>SHA256")
                entries.append(ManifestEntry(parts[0], int(parts[1]), parts[2]))
        return cls(entries, spec)

    def check(self, path: str, data: bytes | bytearray | memoryview) -> str | None:
        """None if ``data`` is the file's exact content, else what is wrong."""
        e = self.by_path.get(path)
        if e is None:
            return f"{path}: not in the manifest"
        if len(data) != e.size:
            return f"{path}: {len(data)} bytes, expected {e.size}"
        got = hashlib.sha256(data).hexdigest()
        if got != e.sha256:
            return f"{path}: sha256 {got[:16]}..., expected {e.sha256[:16]}..."
        return None


def _bodies(spec: DatasetSpec, files: list[FileSpec]) -> Iterator[tuple[FileSpec, bytes]]:
    maker = BodyMaker(spec.seed)
    for f in files:
        yield f, maker.body(f.path, f.size)


def _write_local(out: Path, f: FileSpec, body: bytes) -> None:
    p = out / f.path
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".part")
    tmp.write_bytes(body)
    tmp.replace(p)


async def make_dataset(
    spec: DatasetSpec,
    *,
    out_dir: str | os.PathLike[str] | None = None,
    s3_url: str | None = None,
    s3_endpoint_url: str | None = None,
    s3_region: str | None = None,
    access_key: str | None = None,
    secret_key: str | None = None,
    concurrency: int = 64,
    manifest_path: str | os.PathLike[str] | None = None,
    progress: bool = True,
) -> Manifest:
    """Generate the dataset once and write it to ``out_dir`` and/or upload it under
    ``s3_url`` (``s3://bucket/prefix``) with ``concurrency`` PUTs in flight. Returns the
    manifest (also written to ``manifest_path`` when given)."""
    files = plan(spec)
    total = sum(f.size for f in files)
    out = Path(out_dir) if out_dir is not None else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    store: Any = None
    prefix = ""
    if s3_url is not None:
        from gateway.backend import parse_store_url
        from gateway.backend.s3 import S3Store

        u = parse_store_url(s3_url)
        if u.scheme != "s3":
            raise ValueError(f"{s3_url}: expected s3://BUCKET/PREFIX")
        prefix = u.prefix
        store = S3Store(
            u.location,
            endpoint_url=s3_endpoint_url,
            region=s3_region,
            access_key=access_key,
            secret_key=secret_key,
            max_connections=max(1, concurrency),
        )
    where = " + ".join(x for x in (str(out) if out else "", f"{s3_url}" if s3_url else "") if x)
    bar = Progress(len(files), f"dataset -> {where or 'manifest only'}"[:60], enabled=progress)
    digests: list[str] = [""] * len(files)
    gen = enumerate(_bodies(spec, files))
    loop = asyncio.get_running_loop()

    async def worker() -> None:
        for i, (f, body) in gen:  # the shared iterator hands each file to one worker
            digests[i] = hashlib.sha256(body).hexdigest()
            if out is not None:
                await loop.run_in_executor(None, _write_local, out, f, body)
            if store is not None:
                await store.put(prefix + f.path, body)
            bar.update(1, len(body))

    try:
        n_workers = max(1, concurrency if store is not None else min(concurrency, 8))
        async with asyncio.TaskGroup() as tg:
            for _ in range(min(n_workers, max(1, len(files)))):
                tg.create_task(worker())
    finally:
        bar.close()
        if store is not None:
            await store.close()
    params = spec.to_json()
    params["files"] = len(files)
    params["bytes"] = total
    manifest = Manifest(
        [ManifestEntry(f.path, f.size, d) for f, d in zip(files, digests, strict=True)], params
    )
    if manifest_path is not None:
        manifest.write(manifest_path)
    return manifest
