"""Synthetic datasets: deterministic plans and bodies, ImageNet-like sizes, the manifest, and
writing a tree to a local folder."""

from __future__ import annotations

import hashlib
import statistics
from pathlib import Path

import pytest

from loadgen.dataset import (
    BodyMaker,
    DatasetSpec,
    Manifest,
    ManifestEntry,
    make_dataset,
    parse_per_class,
    plan,
)


def test_plan_is_deterministic_and_imagefolder_shaped() -> None:
    spec = DatasetSpec(classes=3, per_class_min=4, per_class_max=4, seed=5)
    a = plan(spec)
    assert a == plan(spec)
    assert a != plan(DatasetSpec(classes=3, per_class_min=4, per_class_max=4, seed=6))
    assert [f.path for f in a[:2]] == [
        "n00000000/n00000000_00000.JPEG",
        "n00000000/n00000000_00001.JPEG",
    ]
    assert [f.path for f in a] == sorted(f.path for f in a)
    assert len(a) == 12


def test_sizes_follow_imagenet_mean_and_sd() -> None:
    files = plan(DatasetSpec(classes=20, per_class_min=1000, per_class_max=1000))
    sizes = [f.size for f in files]
    assert abs(statistics.fmean(sizes) - 114_660) / 114_660 < 0.05
    assert abs(statistics.stdev(sizes) - 136_076) / 136_076 < 0.15
    assert min(sizes) >= 1024 and max(sizes) <= 16 << 20


def test_per_class_range_and_fixed_sizes() -> None:
    files = plan(
        DatasetSpec(classes=50, per_class_min=732, per_class_max=1300, mean_size=10, sd_size=0)
    )
    counts: dict[str, int] = {}
    for f in files:
        counts[f.path.split("/")[0]] = counts.get(f.path.split("/")[0], 0) + 1
    assert min(counts.values()) >= 732 and max(counts.values()) <= 1300
    assert len(set(counts.values())) > 1
    # Fixed size 10, then clipped up to min_size (1024).
    assert {f.size for f in files} == {1024}
    assert parse_per_class("200") == (200, 200)
    assert parse_per_class("732-1300") == (732, 1300)
    for bad in ("x", "5-2", "-1"):
        with pytest.raises(ValueError):
            parse_per_class(bad)


def test_bodies_are_deterministic_distinct_and_jpeg_framed() -> None:
    m = BodyMaker(1)
    a = m.body("a/x.JPEG", 100_000)
    assert a == BodyMaker(1).body("a/x.JPEG", 100_000) and len(a) == 100_000
    assert a[:4] == b"\xff\xd8\xff\xe0" and a[-2:] == b"\xff\xd9"
    assert a != m.body("a/y.JPEG", 100_000) and a != BodyMaker(2).body("a/x.JPEG", 100_000)
    # Larger than the pool: wraps around, still exact.
    big = m.body("big", (8 << 20) + 12345)
    assert len(big) == (8 << 20) + 12345
    assert m.body("t", 3) == m.body("t", 40)[:3] and len(m.body("t", 0)) == 0


def test_manifest_round_trip_and_check(tmp_path: Path) -> None:
    body = b"hello world"
    e = ManifestEntry("c/a.JPEG", len(body), hashlib.sha256(body).hexdigest())
    m = Manifest([e], {"seed": 3})
    m.write(tmp_path / "m.tsv")
    r = Manifest.read(tmp_path / "m.tsv")
    assert r.entries == [e] and r.spec == {"seed": 3} and r.total_bytes == 11
    assert r.check("c/a.JPEG", body) is None
    assert "sha256" in (r.check("c/a.JPEG", b"hello World") or "")
    assert "bytes" in (r.check("c/a.JPEG", b"hello") or "")
    assert "not in the manifest" in (r.check("c/b.JPEG", body) or "")
    (tmp_path / "bad.tsv").write_text("nope\n")
    with pytest.raises(ValueError):
        Manifest.read(tmp_path / "bad.tsv")
    with pytest.raises(ValueError):
        Manifest([e, e])


async def test_make_dataset_local_matches_manifest(tmp_path: Path) -> None:
    spec = DatasetSpec(classes=2, per_class_min=3, per_class_max=3, mean_size=5000, sd_size=3000)
    m = await make_dataset(
        spec, out_dir=tmp_path / "tree", manifest_path=tmp_path / "m.tsv", progress=False
    )
    assert len(m.entries) == 6 and m.classes == ["n00000000", "n00000001"]
    for e in m.entries:
        assert m.check(e.path, (tmp_path / "tree" / e.path).read_bytes()) is None
    again = Manifest.read(tmp_path / "m.tsv")
    assert [x.sha256 for x in again.entries] == [x.sha256 for x in m.entries]
    assert again.spec["files"] == 6 and again.spec["seed"] == 0
    assert DatasetSpec.from_json(again.spec) == spec
