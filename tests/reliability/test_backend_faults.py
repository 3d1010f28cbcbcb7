"""Backend faults: the gateway (``nfsgw serve``, a child process configured with
``[s3] request_timeout_s = 1``, ``max_attempts = 4``, ``deadline_s = 4``) reads SeaweedFS
through ``tests.faultproxy.FaultProxy`` (on a ``ThreadProxy``): 500s, SlowDown, resets before
and in the middle of a body, truncated bodies, Content-Lengths that lie in both directions,
stalls before and inside a body, latency.

What must hold, for every fault:

- a transient fault (fewer failures than attempts) is retried: the READ succeeds with exactly
  the object's bytes;
- a persistent fault ends in an answer within the deadline, NFS3ERR_JUKEBOX (retry later) or
  NFS3ERR_IO, never a hung call (the client's socket timeout is the bound) and never wrong
  bytes; once the backend recovers, the same READ returns the right bytes (failures are not
  cached);
- the same for directory listings (LIST) and for uploads (PUT), and under random faults of
  every kind at once over many files, where every READ that succeeds has the right bytes.

The outcomes per fault are printed at the end (``-s``) for docs/reliability.md.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from loadgen.gwprocess import GatewayProcess
from loadgen.seaweed import SeaweedServer
from nfsproto import nfs3
from nfsproto.nfs3 import Diropargs3, Nfs3Proc, NfsStat3, StableHow
from tests.e2e.tree import Tree, md5
from tests.faultproxy import FAULTS, Rule
from tests.harness.proxy import ThreadProxy
from tests.rpcclient import BlockingRpcClient

pytestmark = [pytest.mark.s3]

MiB = 1 << 20
OK, JUKEBOX, IO = NfsStat3.NFS3_OK, NfsStat3.NFS3ERR_JUKEBOX, NfsStat3.NFS3ERR_IO
CLIENT_TIMEOUT_S = 60.0  # far above the 4 s deadline: a call that needs it is a hung call
STALL_S = 3.0  # above request_timeout_s
# what a persistent fault must end in (short-cl: the object looks shorter than listed, which
# is a changed object that stays changed: IO; everything else: unavailable, retry later)
PERSISTENT = {f: (IO if f == "short-cl" else JUKEBOX) for f in FAULTS if f != "latency"}
OUTCOMES: dict[str, Counter[str]] = {}


class Env:
    def __init__(self, gw: GatewayProcess, proxy: ThreadProxy, tree: Tree) -> None:
        self.gw = gw
        self.proxy = proxy
        self.tree = tree
        self.rpc = BlockingRpcClient("127.0.0.1", gw.port, timeout_s=CLIENT_TIMEOUT_S)
        self.root = self.rpc.mnt(b"/data").fhandle
        self.rw = self.rpc.mnt(b"/rw").fhandle
        self._fh: dict[str, bytes] = {}
        self._unused = [p for p in tree.train_files()]
        random.Random(3).shuffle(self._unused)

    def fresh_file(self) -> str:
        """A file no other test read (so nothing of it is cached)."""
        return self._unused.pop()

    def lookup(self, path: str) -> tuple[NfsStat3, bytes]:
        fh = self.root
        for name in path.split("/"):
            res = self.rpc.nfs(Nfs3Proc.LOOKUP, nfs3.Lookup3Args(Diropargs3(fh, name.encode())))
            if res.status != OK:
                return res.status, b""
            fh = res.object
        return OK, fh

    def fh(self, path: str) -> bytes:
        if path not in self._fh:
            status, fh = self.lookup(path)
            assert status == OK, (path, status)
            self._fh[path] = fh
        return self._fh[path]

    def read(self, path: str, offset: int = 0, count: int = MiB) -> tuple[NfsStat3, bytes]:
        res = self.rpc.nfs(Nfs3Proc.READ, nfs3.Read3Args(self.fh(path), offset, count))
        return res.status, bytes(res.data) if res.status == OK else b""

    def expect(self, path: str, offset: int = 0, count: int = MiB) -> bytes:
        return self.tree.files[path][offset : offset + count]


@pytest.fixture(scope="module")
def env(
    seaweed: SeaweedServer, tree: Tree, tree_bucket: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Env]:
    proxy = ThreadProxy(seaweed.endpoint_url, seed=5, name="faultproxy")
    tmp: Path = tmp_path_factory.mktemp("faults")
    gw = GatewayProcess(
        tmp,
        [
            {
                "path": "/data",
                "backend": f"s3://{tree_bucket}/{tree.prefix}",
                "read_only": True,
                "insecure": True,
            },
            {
                "path": "/rw",
                "backend": f"s3://{tree_bucket}/faults-rw/",
                "squash": "none",
                "insecure": True,
            },
        ],
        s3=seaweed,
        sections={
            "s3": {
                "endpoint_url": proxy.endpoint_url,
                "request_timeout_s": 1.0,
                "max_attempts": 4,
                "deadline_s": 4.0,
            }
        },
        # Each fault is aimed at the GET a READ makes: data prefetch (whose own faults are
        # tests/integration/test_data_prefetch.py's) would have fetched the file first.
        flags=["--no-data-prefetch"],
    )
    try:
        gw.start()
        e = Env(gw, proxy, tree)
        # list every class directory now, without faults: the tests below fault GETs
        for path in tree.train_files():
            e.fh(path)
        e.fh("extras/big.bin")
        yield e
        e.rpc.close()
        summary = ", ".join(f"{f}: {dict(c)}" for f, c in sorted(OUTCOMES.items()))
        print(f"\nfaults injected: {e.proxy.counts()}\noutcomes: {summary}")
    finally:
        gw.stop()
        proxy.close()


def _tally(fault: str, status: NfsStat3) -> None:
    OUTCOMES.setdefault(fault, Counter())[status.name] += 1


@pytest.mark.parametrize("fault", FAULTS)
def test_transient_fault_is_retried(env: Env, fault: str) -> None:
    path = env.fresh_file()
    key = env.tree.prefix + path
    env.proxy.add(
        Rule(fault, {"GET"}, times=2, key=key, stall_s=0.2 if fault == "latency" else STALL_S)
    )
    try:
        status, data = env.read(path)
        _tally(f"{fault} x2", status)
        if fault == "short-cl":
            # the first READ may see the object as changed twice (IO); the next one is right
            assert status in (OK, IO)
            if status == IO:
                status, data = env.read(path)
        assert status == OK, status
        assert data == env.expect(path)
        faulted = env.proxy.counts()[("GET", fault)]
        assert faulted >= (1 if fault == "latency" else 2)  # a slow answer is not retried
    finally:
        env.proxy.clear()


@pytest.mark.parametrize("fault", sorted(PERSISTENT))
def test_persistent_fault_answers_in_time_then_recovers(env: Env, fault: str) -> None:
    path = env.fresh_file()
    key = env.tree.prefix + path
    env.proxy.add(Rule(fault, {"GET"}, key=key, stall_s=STALL_S))
    try:
        status, data = env.read(path)  # returns (the socket timeout would fail the test)
        _tally(fault, status)
        assert status == PERSISTENT[fault], status
        assert data == b""
    finally:
        env.proxy.clear()
    status, data = env.read(path)  # the backend recovered
    assert status == OK and data == env.expect(path)


def test_listing_faults(env: Env) -> None:
    """A directory whose LIST keeps failing answers JUKEBOX (not NOENT, not a hang); after the
    store recovers it lists completely."""
    env.proxy.add(Rule("503", {"LIST"}, key="extras%2Fa%2F"))
    env.proxy.add(Rule("reset-body", {"LIST"}, key="extras%2Fa%2F"))
    try:
        status, _ = env.lookup("extras/a/b")
        _tally("LIST 503", status)
        assert status == JUKEBOX, status
    finally:
        env.proxy.clear()
    status, fh = env.lookup("extras/a/b/c/deep.txt")
    assert status == OK
    res = env.rpc.nfs(Nfs3Proc.READ, nfs3.Read3Args(fh, 0, 100))
    assert res.status == OK and bytes(res.data) == b"deep\n"


def test_block_reads_under_random_faults(env: Env) -> None:
    """The 6 MiB file (read in 1 MiB blocks, with read-ahead) under random faults of every
    kind on half its GETs: every READ is right or an error, and retries get every byte."""
    path = "extras/big.bin"
    key = env.tree.prefix + path
    rng = random.Random(9)
    for f in FAULTS:
        env.proxy.add(
            Rule(f, {"GET"}, key=key, probability=0.1, stall_s=STALL_S if "stall" in f else 0.3)
        )
    size = len(env.tree.files[path])
    got = bytearray()
    try:
        offsets = list(range(0, size, 256 * 1024))
        for off in offsets:
            count = min(256 * 1024 + rng.randrange(0, 4096), size - off)
            for _ in range(20):
                status, data = env.read(path, off, count)
                _tally("random (big file)", status)
                if status == OK:
                    assert data == env.expect(path, off, count), off  # never wrong bytes
                    got[off : off + len(data)] = data[: min(len(data), 256 * 1024)]
                    break
                assert status in (JUKEBOX, IO), status
            else:
                raise AssertionError(f"READ at {off} failed 20 times")
    finally:
        env.proxy.clear()
    assert md5(bytes(got[:size])) == md5(env.tree.files[path])


def test_many_files_under_random_faults(env: Env) -> None:
    """Thirty fresh files, every fault kind at 10 % each on GET and HEAD: each READ is right
    or JUKEBOX/IO; retried, every file is read right."""
    for f in FAULTS:
        env.proxy.add(
            Rule(f, {"GET", "HEAD"}, probability=0.1, stall_s=STALL_S if "stall" in f else 0.3)
        )
    try:
        for _ in range(30):
            path = env.fresh_file()
            for _attempt in range(20):
                status, data = env.read(path)
                _tally("random (many files)", status)
                if status == OK:
                    assert data == env.expect(path)
                    break
                assert status in (JUKEBOX, IO), status
            else:
                raise AssertionError(f"{path}: 20 failed READs")
    finally:
        env.proxy.clear()


def _create(env: Env, name: bytes) -> bytes:
    res = env.rpc.nfs(
        Nfs3Proc.CREATE,
        nfs3.Create3Args(
            Diropargs3(env.rw, name),
            nfs3.CreateHow3(nfs3.CreateMode3.UNCHECKED, nfs3.Sattr3(mode=0o644)),
        ),
    )
    assert res.status == OK, res.status
    fh: bytes = res.obj
    return fh


def _write_sync(env: Env, fh: bytes, data: bytes) -> NfsStat3:
    res = env.rpc.nfs(Nfs3Proc.WRITE, nfs3.Write3Args(fh, 0, len(data), StableHow.FILE_SYNC, data))
    status: NfsStat3 = res.status
    return status


def test_upload_faults(env: Env, seaweed: SeaweedServer, tree_bucket: str) -> None:
    """FILE_SYNC WRITEs: two failed PUTs are retried (OK); PUTs that keep failing answer
    JUKEBOX or IO, not OK (nothing claimed durable that is not); after recovery the resent
    WRITE stores exactly the bytes."""
    data = random.Random(1).randbytes(300_000)
    fh = _create(env, b"retried.bin")
    env.proxy.add(Rule("500", {"PUT"}, times=2, key="retried.bin"))
    try:
        status = _write_sync(env, fh, data)
        _tally("PUT 500 x2", status)
        assert status == OK
    finally:
        env.proxy.clear()
    fh2 = _create(env, b"failing.bin")
    env.proxy.add(Rule("reset-body", {"PUT"}, key="failing.bin"))
    env.proxy.add(Rule("503", {"PUT"}, key="failing.bin"))
    try:
        status = _write_sync(env, fh2, data)
        _tally("PUT persistent", status)
        assert status in (JUKEBOX, IO), status
    finally:
        env.proxy.clear()
    status = _write_sync(env, fh2, data)
    assert status == OK
    for name in ("retried.bin", "failing.bin"):
        got = seaweed.boto3_client().get_object(Bucket=tree_bucket, Key=f"faults-rw/{name}")
        assert md5(got["Body"].read()) == md5(data), name


def test_no_fault_was_silent(env: Env) -> None:
    """The proxy really injected every kind (a typo in a rule would make the tests above
    pass vacuously)."""
    counts = env.proxy.counts()
    for f in FAULTS:
        assert counts[("GET", f)] > 0, f
