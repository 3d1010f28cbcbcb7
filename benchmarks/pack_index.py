"""Loading a pack index at ImageNet scale (docs/packs.md, "Memory and load time"): 1,281,167
members in 1,000 folders, written with ``gateway.pack.format.format_index`` and gzipped as
``nfsgw pack`` writes it, then parsed as the gateway does at start
(``gateway.pack.indexload.parse_gzipped_index``, in its thread); reports the parse time, the
memory the index holds per member (``PackIndex.nbytes``) and the cost of one lookup by path.

    .venv/bin/python benchmarks/pack_index.py [--members 1281167]

Compare with the namespace index's memory per entry (benchmarks/index_memory.py).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/: _common
import _common  # noqa: F401 (puts the repository on sys.path)

from gateway.pack.format import Member, Shard, format_index
from gateway.pack.indexload import parse_gzipped_index

PER_SHARD = 2400  # ~256 MiB of 110 kB files


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--members", type=int, default=1_281_167)
    a = ap.parse_args()
    n = a.members
    members = [
        Member(
            f"n{i // 1282:08d}/n{i // 1282:08d}_{i:07d}.JPEG",
            110_000,
            1_700_000_000_000_000_000,
            '"' + hashlib.md5(str(i).encode()).hexdigest() + '"',
            i // PER_SHARD,
            (i % PER_SHARD) * 110_592 + 1536,
            i & 0xFFFFFFFF,
        )
        for i in range(n)
    ]
    shards = [
        Shard(s, f"shard-{s:06d}.tar", PER_SHARD * 110_592 + 4096)
        for s in range(n // PER_SHARD + 1)
    ]
    t = time.perf_counter()
    raw = gzip.compress("".join(format_index("s3://b/train/", shards, members)).encode())
    took = time.perf_counter() - t
    print(f"index of {n:,} members: {len(raw) / 2**20:.1f} MiB gzipped ({took:.1f} s to write)")
    del members
    t = time.perf_counter()
    index = parse_gzipped_index(raw, 2 << 30)
    print(f"parse: {time.perf_counter() - t:.2f} s; held: {index.nbytes() / n:.0f} B per member")
    step = max(1, n // 1000)
    paths = [index.path(i) for i in range(0, n, step)]
    t = time.perf_counter()
    for p in paths:
        index.find(p)
    print(f"find: {(time.perf_counter() - t) / len(paths) * 1e6:.1f} us per lookup")
    return 0


if __name__ == "__main__":
    sys.exit(main())
