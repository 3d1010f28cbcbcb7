"""Data prefetch end to end: SeaweedFS <- counting fault proxy <- gateway (in
process, ``tests.harness.thread``) <- libnfs. The in-process versions over a ``MemoryStore``
are in ``tests/unit/gateway/test_data_prefetch.py``.

The tree: four class directories of 70 small files (1 to 20 KiB) and one empty file, and
``eq/``, 40 files of 8 KiB (for exact cache accounting). The client lists the class
directories (as ``ImageFolder``'s scan does), then reads files whole. Requests are counted at
the proxy, i.e. what reached S3, per kind and per key.

- The dataset fits the cache: once the prefetcher's queue is empty, each non-empty file was
  fetched exactly once; reading every file in shuffled order then costs 0 GETs, every
  prefetch is useful, none wasted.
- A READ of an object whose prefetch is in flight (its GET held at the proxy) joins it: one
  GET for the key.
- A memory cache a third of the tree, no disk tier: the prefetcher stops once the cache is
  full of unread data (the GET count stays put, ``waiting_room`` 1); reading some of it makes
  room and the prefetcher resumes; nothing unread is evicted.
- A storm of 503 SlowDown on GETs: every READ of every file succeeds with the right bytes,
  the prefetcher backs off, the gateway still answers afterwards.
- Off (``cache_data_prefetch=False``, or ``data_prefetch = false`` on the export): listing
  costs no GET, each file read costs exactly one (the empty file none), directories are
  listed once each.
- Objects fetched into a nearly full cache are all kept: the prefetcher reserves room for
  what it has in flight with the per-entry overhead (it once did not, and dropped some).

Every byte read is checked against the uploaded bodies. Nothing here asserts a duration: the
waits are bounded polls on the gateway's prefetch metrics and the proxy's counts.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import pytest

from gateway.data.cache import BLOCK_ENTRY_CHARGE_BYTES
from gateway.exports import ExportConfig
from loadgen.seaweed import SeaweedServer
from tests.faultproxy import Rule
from tests.harness.buckets import Buckets
from tests.harness.proxy import ThreadProxy
from tests.harness.thread import GatewayThread
from tests.libnfs import LibNfs, libnfs_available

pytestmark = [
    pytest.mark.s3,
    pytest.mark.libnfs,
    pytest.mark.skipif(not libnfs_available(), reason="libnfs (libnfs.so.13) is not installed"),
]

T = TypeVar("T")
KiB = 1024
MiB = 1024 * KiB
DIRS = ("c0", "c1", "c2", "c3")
PER_DIR = 70
PREFIX = "ds/"
WAIT_S = 60.0  # bound of every poll: far above what any of them needs
EQ_FILES = 40
EQ_SIZE = 8 * KiB
RO: dict[str, Any] = {"read_only": True, "immutable": True, "insecure": True}  # TCP clients


def make_tree(seed: int = 13) -> dict[str, bytes]:
    """Path (from the export root, no leading slash) -> body."""
    rng = random.Random(seed)
    files = {
        f"{d}/img_{i:04d}.jpg": rng.randbytes(rng.randrange(1 * KiB, 20 * KiB))
        for d in DIRS
        for i in range(PER_DIR)
    }
    files["c1/empty.jpg"] = b""
    for i in range(EQ_FILES):  # equal sizes: exact cache accounting
        files[f"eq/f_{i:03d}.bin"] = rng.randbytes(EQ_SIZE)
    return files


def in_dirs(files: Mapping[str, bytes], dirs: tuple[str, ...] = DIRS) -> list[str]:
    return sorted(p for p in files if p.partition("/")[0] in dirs)


def non_empty(files: Mapping[str, bytes], dirs: tuple[str, ...] = DIRS) -> list[str]:
    return sorted(p for p, v in files.items() if v and p.partition("/")[0] in dirs)


# ---------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def tree(seaweed: SeaweedServer) -> Iterator[tuple[str, dict[str, bytes]]]:
    """A bucket holding ``make_tree()`` under ``ds/`` (no test changes it)."""
    files = make_tree()
    with Buckets(seaweed) as buckets:
        yield buckets.make("dp", {PREFIX + k: v for k, v in files.items()}), files


@pytest.fixture
def proxy(seaweed: SeaweedServer) -> Iterator[ThreadProxy]:
    with ThreadProxy(seaweed.endpoint_url, seed=7) as p:
        yield p


def gateway(
    tmp_path: Path,
    seaweed: SeaweedServer,
    proxy: ThreadProxy,
    bucket: str,
    exports: list[ExportConfig] | None = None,
    **settings: Any,
) -> GatewayThread:
    """The gateway over ``proxy``, data prefetch on unless ``settings`` say otherwise; no disk
    tier."""
    s3 = dict(seaweed.store_kwargs())
    s3["endpoint_url"] = proxy.endpoint_url
    settings.setdefault("cache_data_prefetch", True)
    settings.setdefault("cache_disk", 0)  # the memory tier's prefetching is measured here
    if exports is None:
        exports = [ExportConfig("/data", f"s3://{bucket}/{PREFIX}", **RO)]
    return GatewayThread(exports, state_dir=tmp_path / "state", s3=s3, **settings)


# ---------------------------------------------------------------------------------- helpers


def prefetch_metrics(gw: GatewayThread) -> dict[str, float]:
    """The ``nfsgw_prefetch_*`` samples as a scrape sees them (gauges refreshed first)."""

    def scrape() -> dict[str, float]:
        if gw.server.prefetcher is not None:
            gw.server.prefetcher.snapshot()
        out: dict[str, float] = {}
        for fam in gw.server.metrics.families():
            if fam.name.startswith("nfsgw_prefetch"):
                for s in fam.samples:
                    if not s.labels:
                        out[s.name] = s.value
        return out

    return gw.call(scrape)


def wait_for(probe: Callable[[], T], ok: Callable[[T], bool], what: str) -> T:
    """Poll ``probe`` until ``ok`` holds (at most ``WAIT_S``); its last value."""
    deadline = time.monotonic() + WAIT_S
    while True:
        v = probe()
        if ok(v):
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not reached in {WAIT_S} s; last {v!r}")
        time.sleep(0.02)


def settle(gw: GatewayThread) -> dict[str, float]:
    """Until the prefetcher's queue is empty and nothing is in flight; its metrics then."""

    def idle(m: dict[str, float]) -> bool:
        return m["nfsgw_prefetch_queued_files"] == 0 and m["nfsgw_prefetch_inflight"] == 0

    return wait_for(lambda: prefetch_metrics(gw), idle, "prefetch queue empty")


def stopped(gw: GatewayThread, proxy: ThreadProxy, polls: int = 5) -> dict[str, float]:
    """Until the prefetcher waits for room with nothing in flight and the GET count at the
    proxy stays put over ``polls`` polls 0.1 s apart (twice its 0.05 s look-again period: a
    moment with nothing in flight may come just before it finds room again); its metrics."""
    deadline = time.monotonic() + WAIT_S
    last: tuple[int, dict[str, float]] = (-1, {})
    same = 0
    while same < polls:
        if time.monotonic() > deadline:
            raise AssertionError(f"the prefetcher did not stop in {WAIT_S} s; last {last!r}")
        time.sleep(0.1)
        m = prefetch_metrics(gw)
        n = sum(proxy.gets(PREFIX).values())
        waiting = m["nfsgw_prefetch_waiting_room"] == 1 and m["nfsgw_prefetch_inflight"] == 0
        same = same + 1 if waiting and n == last[0] else 0
        last = (n, m)
    return last[1]


def in_memory(gw: GatewayThread, paths: list[str], export: str = "/data") -> list[str]:
    """Of ``paths``, those whose current version is in the gateway's memory tier (or being
    fetched)."""

    async def check() -> list[str]:
        exp = gw.export(export)
        reader = gw.server.gateway.reader if gw.server.gateway else None
        assert reader is not None
        out = []
        for p in paths:
            etag = (await exp.ns.getattr(p)).etag
            if reader.cached(exp.store.name, exp.prefix + p, etag):
                out.append(p)
        return out

    return gw.run(check())


def scan(nfs: LibNfs, files: Mapping[str, bytes], dirs: tuple[str, ...] = DIRS) -> None:
    """ImageFolder's scan: list the root and every class directory, read no file."""
    assert set(nfs.listdir("/")) >= set(dirs)
    for d in dirs:
        want = sorted(p.partition("/")[2] for p in files if p.partition("/")[0] == d)
        assert sorted(nfs.listdir("/" + d)) == want, d


def read_all(nfs: LibNfs, files: Mapping[str, bytes], paths: list[str], root: str = "") -> None:
    for p in paths:
        got = nfs.read_file(f"{root}/{p}")
        assert got == files[p], (p, len(got), len(files[p]))


def shuffled(paths: list[str], seed: int) -> list[str]:
    out = sorted(paths)
    random.Random(seed).shuffle(out)
    return out


def read_statuses(gw: GatewayThread) -> Counter[str]:
    """NFS READ replies by status ("ok", "NFS3ERR_JUKEBOX", ...)."""

    def snap() -> Counter[str]:
        rpc = gw.server.metrics.rpc
        return Counter({st: h.count for (proc, st), h in rpc.items() if proc == "NFS3.READ"})

    return gw.call(snap)


# ---------------------------------------------------------------------------------- tests


def test_dataset_that_fits_is_fetched_once_ahead_and_read_with_no_get(
    tmp_path: Path,
    seaweed: SeaweedServer,
    proxy: ThreadProxy,
    tree: tuple[str, dict[str, bytes]],
) -> None:
    bucket, files = tree
    small = non_empty(files)
    with gateway(tmp_path, seaweed, proxy, bucket) as gw, LibNfs(gw.libnfs_url()) as nfs:
        scan(nfs, files)
        wait_for(
            lambda: prefetch_metrics(gw),
            lambda m: m["nfsgw_prefetch_objects_total"] >= len(small),
            "every small file prefetched",
        )
        m = settle(gw)
        assert m["nfsgw_prefetch_objects_total"] == len(small)
        assert m["nfsgw_prefetch_errors_total"] == 0
        assert proxy.gets(PREFIX) == Counter(small)  # each non-empty file once, the empty one never
        before = proxy.kinds()

        read_all(nfs, files, shuffled(in_dirs(files), seed=1))

        assert proxy.kinds() == before  # not a single request during the read phase
        assert proxy.gets(PREFIX) == Counter(small)  # 1.00 GET per file
        m = prefetch_metrics(gw)
        assert m["nfsgw_prefetch_useful_total"] == len(small)
        assert m["nfsgw_prefetch_wasted_total"] == 0
        assert m["nfsgw_prefetch_dropped_total"] == 0
        assert read_statuses(gw).keys() == {"ok"}


def test_a_read_of_an_object_being_prefetched_costs_no_second_get(
    tmp_path: Path,
    seaweed: SeaweedServer,
    proxy: ThreadProxy,
    tree: tuple[str, dict[str, bytes]],
) -> None:
    bucket, files = tree
    target = "c0/img_0000.jpg"  # the first file of the first directory listed
    proxy.add(Rule("latency", kinds={"GET"}, key=f"/{PREFIX}{target}", stall_s=2.0))
    with gateway(tmp_path, seaweed, proxy, bucket) as gw, LibNfs(gw.libnfs_url()) as nfs:
        scan(nfs, files, dirs=("c0",))
        # The prefetch's GET of the target reached S3's side and is held there.
        wait_for(
            lambda: proxy.gets(PREFIX), lambda g: g[target] == 1, "the prefetch GET of the target"
        )
        assert prefetch_metrics(gw)["nfsgw_prefetch_inflight"] >= 1
        assert nfs.read_file("/" + target) == files[target]
        assert proxy.gets(PREFIX)[target] == 1
        assert gw.data_stats()["ahead_joined"] >= 1
        assert prefetch_metrics(gw)["nfsgw_prefetch_joined_total"] >= 1
        settle(gw)
        c0 = non_empty(files, ("c0",))
        assert proxy.gets(PREFIX) == Counter(c0)
        read_all(nfs, files, shuffled(c0, seed=2))
        assert proxy.gets(PREFIX) == Counter(c0)


def test_a_cache_full_of_unread_prefetched_data_stops_the_prefetcher(
    tmp_path: Path,
    seaweed: SeaweedServer,
    proxy: ThreadProxy,
    tree: tuple[str, dict[str, bytes]],
) -> None:
    bucket, files = tree
    small = non_empty(files)
    assert sum(len(files[p]) for p in small) > 2.5 * MiB  # about three times the cache
    with (
        gateway(tmp_path, seaweed, proxy, bucket, cache_memory=1 * MiB) as gw,
        LibNfs(gw.libnfs_url()) as nfs,
    ):
        scan(nfs, files)
        m = stopped(gw, proxy)
        fetched = proxy.gets(PREFIX)
        n = sum(fetched.values())
        assert 20 <= n < len(small) // 2, n  # what 1 MiB holds, not the tree
        assert set(fetched.values()) == {1}
        for _ in range(5):  # and stays stopped: nothing evicted for more prefetch
            time.sleep(0.1)
            assert proxy.gets(PREFIX) == fetched
            assert prefetch_metrics(gw)["nfsgw_prefetch_waiting_room"] == 1
        assert m["nfsgw_prefetch_wasted_total"] == 0

        # Of what it fetched, what memory kept (not what was dropped on landing: see the
        # last test) is read: 20 files, all from memory, that may now go.
        kept = in_memory(gw, sorted(fetched))
        assert len(kept) == n - m["nfsgw_prefetch_dropped_total"] >= 20
        got = kept[:20]
        read_all(nfs, files, got)
        after = proxy.gets(PREFIX)
        assert all(after[p] == 1 for p in got)
        wait_for(
            lambda: proxy.gets(PREFIX), lambda g: sum(g.values()) > n, "the prefetcher resumes"
        )
        m = prefetch_metrics(gw)
        assert m["nfsgw_prefetch_useful_total"] == 20
        assert m["nfsgw_prefetch_wasted_total"] == 0  # nothing unread was evicted
        assert set(proxy.gets(PREFIX).values()) == {1}


def test_a_503_storm_slows_the_prefetcher_and_fails_no_read(
    tmp_path: Path,
    seaweed: SeaweedServer,
    proxy: ThreadProxy,
    tree: tuple[str, dict[str, bytes]],
) -> None:
    bucket, files = tree
    small = non_empty(files)
    # 40 % of GETs answer 503 SlowDown, 150 times in all. With 10 attempts per call a GET
    # gives up with odds of 0.4 ** 10 (1e-4): the storm is retried, not survived by luck.
    proxy.add(Rule("503", kinds={"GET"}, probability=0.4, times=150))
    with (
        gateway(tmp_path, seaweed, proxy, bucket, s3_max_attempts=10) as gw,
        LibNfs(gw.libnfs_url()) as nfs,
    ):
        scan(nfs, files)
        read_all(nfs, files, shuffled(in_dirs(files), seed=3))  # right after the scan: a storm
        storm = proxy.counts()[("GET", "503")]
        assert storm >= 50, storm
        m = prefetch_metrics(gw)
        assert m["nfsgw_prefetch_backoffs_total"] >= 1
        assert read_statuses(gw).keys() == {"ok"}
        # Each object's body crossed the network once: failures are retried, not duplicated.
        assert proxy.counts()[("GET", "ok")] == len(small)
        proxy.clear()
        # Still healthy: a new client reads every file again, from memory.
        with LibNfs(gw.libnfs_url()) as again:
            read_all(again, files, shuffled(in_dirs(files), seed=4))
        assert proxy.counts()[("GET", "ok")] == len(small)
        assert read_statuses(gw).keys() == {"ok"}


@pytest.mark.parametrize("where", ["global", "export"])
def test_off_restores_todays_request_counts(
    tmp_path: Path,
    seaweed: SeaweedServer,
    proxy: ThreadProxy,
    tree: tuple[str, dict[str, bytes]],
    where: str,
) -> None:
    """``/data`` (``ds/``, prefetch off) is scanned and read; ``/on`` (``ds/c3/``, on unless
    off globally) is listed after the scan: once the prefetcher has fetched ``/on``'s files it
    has looked at everything listed before them, so ``/data``'s 0 GETs are not a race."""
    bucket, files = tree
    dirs = ("c0", "c1", "c2")
    small = non_empty(files, dirs)
    on_files = non_empty(files, ("c3",))
    exports = [
        ExportConfig("/data", f"s3://{bucket}/{PREFIX}", data_prefetch=where == "global", **RO),
        ExportConfig("/on", f"s3://{bucket}/{PREFIX}c3/", **RO),
    ]
    # list_ahead 0: the scan's last folders would have their siblings (c3, eq) listed too
    settings: dict[str, Any] = {"cache_data_prefetch": where == "export", "cache_list_ahead": 0}
    with (
        gateway(tmp_path, seaweed, proxy, bucket, exports, **settings) as gw,
        LibNfs(gw.libnfs_url("/data")) as nfs,
        LibNfs(gw.libnfs_url("/on")) as on,
    ):
        scan(nfs, files, dirs)
        assert len(on.listdir("/")) == PER_DIR
        if where == "global":
            assert gw.server.prefetcher is None  # nothing could fetch anything
            assert proxy.kinds()["GET"] == 0
        else:
            wait_for(
                lambda: prefetch_metrics(gw),
                lambda m: m["nfsgw_prefetch_objects_total"] >= len(on_files),
                "/on prefetched",
            )
            settle(gw)
            assert proxy.gets(PREFIX) == Counter(on_files)  # the global switch is on
        assert not any(proxy.gets(PREFIX)[p] for p in small)  # listing /data: no GET at all
        before = proxy.kinds()
        listed = before["LIST"]

        read_all(nfs, files, shuffled(in_dirs(files, dirs), seed=5))

        reads = proxy.kinds()
        reads.subtract(before)
        assert +reads == Counter({"GET": len(small)})  # one GET per file read, nothing else
        assert Counter({p: n for p, n in proxy.gets(PREFIX).items() if p in small}) == Counter(
            small
        )
        assert listed == len(dirs) + 2  # today's: each directory listed once
        m = prefetch_metrics(gw)
        assert m["nfsgw_prefetch_useful_total"] == 0
        assert m["nfsgw_prefetch_objects_total"] == (len(on_files) if where == "export" else 0)


def test_objects_the_prefetcher_fetches_into_a_nearly_full_cache_are_kept(
    tmp_path: Path,
    seaweed: SeaweedServer,
    proxy: ThreadProxy,
    tree: tuple[str, dict[str, bytes]],
) -> None:
    """A memory tier with room for exactly 22 of ``eq/``'s 8 KiB files (24 would need 24 x
    ``BLOCK_ENTRY_CHARGE_BYTES`` more), GETs held 1 s so the prefetcher's 24 slots are all
    taken before the first lands: it must fetch only what it can keep."""
    bucket, files = tree
    charge = EQ_SIZE + BLOCK_ENTRY_CHARGE_BYTES
    limit = 22 * charge + charge // 2  # room for 22 and a half of them
    memory = next(b for b in range(limit, 2 * limit) if b - int(b * 0.01) >= limit)
    proxy.add(Rule("latency", kinds={"GET"}, key=f"/{PREFIX}eq/", stall_s=1.0))
    with (
        gateway(tmp_path, seaweed, proxy, bucket, cache_memory=memory) as gw,
        LibNfs(gw.libnfs_url()) as nfs,
    ):
        scan(nfs, files, dirs=("eq",))
        m = stopped(gw, proxy)
        fetched = sum(proxy.gets(PREFIX).values())
        assert m["nfsgw_prefetch_dropped_total"] == 0
        assert gw.data_stats()["entries"] == fetched == 22  # every GET made is kept
