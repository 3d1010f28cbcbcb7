"""The Linux kernel's NFSv3 client (Debian's kernel in QEMU, ``tests.e2e.guest``) against
nfsgw serving SeaweedFS:

- the whole tree: listing (types, sizes) and the md5 of every file equal the source;
- ImageFolder-style epochs (class folders sorted, files shuffled, four readers) after the
  guest dropped its caches: every file read once per epoch, every byte right, and the
  gateway's cache serving the epochs (backend GETs stay at one per file for the whole run);
- the write phases (mkdir, create, write, append, setattr, rename, symlink, link, statfs,
  rm, rmdir), each checked in the guest against what a local file system does, and the
  bucket checked from here; root writing to a ``root_squash`` export gets the anonymous
  owner; a client outside an export's list cannot mount it;
- kill -9 of the gateway in the middle of a read loop, restart on the same port and state
  directory: the loop finishes with no ESTALE and every checksum right; then a gateway that
  stays dead makes the soft mount fail the guest's reads (EIO) instead of hanging them;
- the object store failing for longer than the gateway's deadline: the guest's READs get
  NFS3ERR_JUKEBOX, the kernel waits and retries, and once the store is back every checksum is
  right (no EIO: JUKEBOX is "retry later", not an error).

Every mount is ``soft`` with a timeout and every guest run has a timeout, so a broken gateway
fails these tests rather than hanging them. One guest at a time.
"""

from __future__ import annotations

import asyncio
import ipaddress
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.backend.s3 import S3Store
from gateway.exports import ExportConfig
from loadgen.gwprocess import GatewayProcess
from loadgen.seaweed import SeaweedServer
from tests.e2e.guest import SLIRP_INSECURE, Guest, GuestResult
from tests.e2e.tree import MiB, Tree, md5
from tests.faultproxy import Rule
from tests.harness.buckets import MakeBucket
from tests.harness.proxy import ThreadProxy
from tests.harness.thread import GatewayThread

pytestmark = [pytest.mark.s3, pytest.mark.kclient]

RUN_TIMEOUT_S = 300.0
SMALL_FILE_MAX = 4 * MiB  # the gateway's default: extras/big.bin is read in 1 MiB blocks


def _section(out: str, name: str) -> list[str]:
    """The lines between ``@@<name>`` and the next ``@@`` line."""
    lines: list[str] = []
    inside = False
    for line in out.splitlines():
        if line.startswith("@@"):
            inside = line == f"@@{name}"
            continue
        if inside:
            lines.append(line)
    return lines


def _md5_lines(lines: list[str]) -> list[tuple[str, str]]:
    """busybox md5sum lines ("<md5>  ./path") -> (path without "./", md5)."""
    out = []
    for line in lines:
        digest, sep, path = line.partition("  ")
        assert sep, f"not an md5sum line: {line!r}"
        out.append((path.removeprefix("./"), digest))
    return out


def _ok(r: GuestResult) -> None:
    assert r.rc == 0 and not r.timed_out, r.describe()


# --------------------------------------------------------------------------- read path

READ_SCRIPT = r"""
nfs_mount /data /mnt/data || exit 9
cd /mnt/data
echo @@DIRS
find . -type d
echo @@FILES
find . -type f -exec stat -c '%s %n' {} +
echo @@LINKS
find . -type l
echo @@MD5
find . -type f -exec md5sum {} +
ls train | sort > /tmp/classes
: > /tmp/samples
while read -r c; do ls "train/$c" | sort | sed "s|^|train/$c/|" >> /tmp/samples; done < /tmp/classes
for e in 1 2; do
    drop_caches
    echo "@@EPOCH$e"
    shuf /tmp/samples | xargs -P 4 -n 8 md5sum
done
echo @@END
"""


@pytest.fixture(scope="module")
def read_run(
    guest: Guest,
    seaweed: SeaweedServer,
    tree: Tree,
    tree_bucket: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[GuestResult, Counter[str], Counter[str]]]:
    export = ExportConfig(
        "/data", f"s3://{tree_bucket}/{tree.prefix}", read_only=True, insecure=SLIRP_INSECURE
    )
    with GatewayThread(
        [export],
        state_dir=tmp_path_factory.mktemp("e2e-read"),
        s3=seaweed.store_kwargs(),
        cache_small_file_max=SMALL_FILE_MAX,
        cache_data_prefetch=True,  # as deployed: listed small files fetched ahead of READs
    ) as gw:
        r = guest.run(READ_SCRIPT, nfs_port=gw.port, timeout_s=RUN_TIMEOUT_S)
        yield r, gw.backend_counts(), gw.call_counts()


def test_tree_listing_and_md5_equal_the_source(
    read_run: tuple[GuestResult, Counter[str], Counter[str]], tree: Tree
) -> None:
    r, backend, _ = read_run
    _ok(r)
    dirs = {d.removeprefix("./") for d in _section(r.output, "DIRS")} - {"."}
    assert dirs == tree.dirs()
    sizes = {}
    for line in _section(r.output, "FILES"):
        size, _, path = line.partition(" ")
        sizes[path.removeprefix("./")] = int(size)
    assert sizes == {p: len(b) for p, b in tree.files.items()}
    assert _section(r.output, "LINKS") == []
    assert dict(_md5_lines(_section(r.output, "MD5"))) == tree.md5s()
    # one GET per small file at most, the big one in 1 MiB blocks (read-ahead may merge them),
    # no HEAD: attributes come from listings
    blocks = -(-len(tree.files["extras/big.bin"]) // MiB)
    assert backend["get"] <= len(tree.files) - 1 + blocks, backend
    assert backend["head"] == 0, backend


def test_imagefolder_epochs(
    read_run: tuple[GuestResult, Counter[str], Counter[str]], tree: Tree
) -> None:
    r, backend, calls = read_run
    _ok(r)
    want = {p: md5(tree.files[p]) for p in tree.train_files()}
    for epoch in ("EPOCH1", "EPOCH2"):
        got = _md5_lines(_section(r.output, epoch))
        assert sorted(p for p, _ in got) == sorted(want), f"{epoch}: not every file once"
        assert dict(got) == want, epoch
    # the guest dropped its caches before each epoch: the epochs were READs at the gateway,
    # served from its cache (the tree listing above already fetched every file once)
    assert calls["NFS3.READ"] >= 3 * len(want)
    assert backend["get"] <= len(tree.files) + 6, backend


# --------------------------------------------------------------------------- write path

WRITE_SCRIPT = r"""
ok() { echo "PHASE $1 ok"; }
check() { if [ -z "$2" ]; then ok "$1"; else echo "PHASE $1 FAIL$2"; fi; }
nfs_mount /rw /mnt/rw || { echo "PHASE mount FAIL"; exit 9; }
cd /mnt/rw
W=work
dd if=/dev/urandom of=/tmp/big bs=65536 count=176 2>/dev/null     # 11 MiB: 3 parts of 5 MiB
echo "BIGMD5 $(md5sum < /tmp/big | cut -d' ' -f1)"
SMALL="$(printf 'first line\nsecond line')"

why=""
mkdir $W || why="$why mkdir"
[ -d $W ] || why="$why not-a-dir"
mkdir $W 2>/dev/null && why="$why second-mkdir-succeeded"
check mkdir "$why"

why=""
: > $W/empty || why="$why create"
{ [ -f $W/empty ] && [ ! -s $W/empty ]; } || why="$why not-an-empty-file"
check create "$why"

why=""
printf 'first line\n' > $W/small.txt || why="$why small"
cp /tmp/big $W/big.bin || why="$why big"
drop_caches
[ "$(cat $W/small.txt)" = "first line" ] || why="$why small-content"
cmp -s /tmp/big $W/big.bin || why="$why big-content"
[ "$(stat -c %s $W/big.bin)" = 11534336 ] || why="$why big-size"
check write "$why"

why=""
printf 'second line\n' >> $W/small.txt || why="$why append"
drop_caches
[ "$(cat $W/small.txt)" = "$SMALL" ] || why="$why content"
check append "$why"

why=""
chmod 640 $W/small.txt || why="$why chmod"
touch -d @1700000000 $W/small.txt || why="$why touch"
truncate -s 1000 $W/big.bin || why="$why shrink"
drop_caches
[ "$(stat -c %a $W/small.txt)" = 640 ] || why="$why mode=$(stat -c %a $W/small.txt)"
[ "$(stat -c %Y $W/small.txt)" = 1700000000 ] || why="$why mtime=$(stat -c %Y $W/small.txt)"
[ "$(stat -c %s $W/big.bin)" = 1000 ] || why="$why size=$(stat -c %s $W/big.bin)"
head -c 1000 /tmp/big | cmp -s - $W/big.bin || why="$why shrunk-content"
truncate -s 3000 $W/big.bin || why="$why extend"
drop_caches
{ head -c 1000 /tmp/big; head -c 2000 /dev/zero; } > /tmp/extended
cmp -s /tmp/extended $W/big.bin || why="$why extended-content"
check setattr "$why"

why=""
mv $W/small.txt $W/renamed.txt || why="$why mv"
[ ! -e $W/small.txt ] || why="$why old-name-left"
echo other > $W/other.txt
mv $W/renamed.txt $W/other.txt || why="$why mv-over"
drop_caches
[ ! -e $W/renamed.txt ] || why="$why source-left"
[ "$(cat $W/other.txt)" = "$SMALL" ] || why="$why target-content"
[ "$(stat -c %a $W/other.txt)" = 640 ] || why="$why target-mode"
check rename "$why"

why=""
ln -s other.txt $W/link || why="$why ln-s"
[ -L $W/link ] || why="$why not-a-link"
[ "$(readlink $W/link)" = other.txt ] || why="$why readlink"
drop_caches
[ "$(cat $W/link)" = "$SMALL" ] || why="$why follow"
check symlink "$why"

if ln $W/other.txt $W/hard 2>/dev/null || [ -e $W/hard ]; then
    echo "PHASE link FAIL created"
else
    echo "PHASE link refused"
fi

why=""
df . > /dev/null || why="$why df"
stat -f . > /dev/null || why="$why stat-f"
check statfs "$why"

mkdir keep && cp $W/other.txt keep/small.txt && cp /tmp/big keep/big.bin && ln -s small.txt keep/sym

why=""
rm $W/other.txt $W/big.bin $W/link $W/empty || why="$why rm"
drop_caches
[ -z "$(ls -A $W)" ] || why="$why left:$(ls -A $W | tr '\n' ,)"
check rm "$why"

why=""
mkdir $W/d && : > $W/d/f
rmdir $W/d 2>/dev/null && why="$why non-empty-removed"
rm $W/d/f && rmdir $W/d || why="$why rmdir-d"
rmdir $W || why="$why rmdir-work"
drop_caches
[ ! -e $W ] || why="$why still-there"
check rmdir "$why"

# root_squash: root in the guest writes as the anonymous user
nfs_mount /squash /mnt/sq || { echo "PHASE squash FAIL mount"; exit 9; }
echo hello > /mnt/sq/by-root.txt || echo "PHASE squash FAIL write"
drop_caches
echo "SQUASH $(stat -c %u:%g /mnt/sq/by-root.txt)"

# a client outside the export's list cannot mount it
if nfs_mount /denied /mnt/denied 2> /tmp/denied.err; then
    echo "PHASE denied FAIL mounted"
else
    echo "PHASE denied refused $(head -c 200 /tmp/denied.err)"
fi
echo "PHASES DONE"
"""

EXPECTED_PHASES = {
    "mkdir": "ok",
    "create": "ok",
    "write": "ok",
    "append": "ok",
    "setattr": "ok",
    "rename": "ok",
    "symlink": "ok",
    "link": "refused",  # no hard links in an object store: NFS3ERR_NOTSUPP
    "statfs": "ok",
    "rm": "ok",
    "rmdir": "ok",
    "denied": "refused",
}


@pytest.fixture
def bucket(make_bucket: MakeBucket) -> str:
    return make_bucket("e2ew")


async def _bucket_state(
    seaweed: SeaweedServer, bucket: str
) -> tuple[dict[str, bytes], dict[str, dict[str, str]]]:
    store = S3Store(bucket, **seaweed.store_kwargs())
    try:
        keys: list[str] = []
        token = None
        for _ in range(100):
            page = await store.list_page("", delimiter=None, token=token)
            keys += [o.key for o in page.objects]
            token = page.next_token
            if token is None:
                break
        bodies, meta = {}, {}
        for k in keys:
            g = await store.get(k)
            bodies[k] = g.data
            meta[k] = dict(g.metadata)
        return bodies, meta
    finally:
        await store.close()


def test_write_phases_squash_and_denied(
    guest: Guest, seaweed: SeaweedServer, bucket: str, tmp_path: Path
) -> None:
    exports = [
        ExportConfig("/rw", f"s3://{bucket}/rw/", squash="none", insecure=SLIRP_INSECURE),
        ExportConfig(  # root_squash (default)
            "/squash", f"s3://{bucket}/sq/", dir_mode=0o777, insecure=SLIRP_INSECURE
        ),
        ExportConfig(
            "/denied",
            f"s3://{bucket}/rw/",
            clients=(ipaddress.ip_network("10.99.0.0/16"),),
            insecure=SLIRP_INSECURE,
        ),
    ]
    with GatewayThread(
        exports, state_dir=tmp_path / "state", s3=seaweed.store_kwargs(), writes_part_size=5 * MiB
    ) as gw:
        r = guest.run(WRITE_SCRIPT, nfs_port=gw.port, timeout_s=RUN_TIMEOUT_S)
        calls = gw.call_counts()
        staged = gw.stats(lambda s: s.gateway.writes.stats)  # type: ignore[union-attr]
    _ok(r)
    assert "PHASES DONE" in r.output, r.describe()
    phases = {}
    for line in r.lines():
        if line.startswith("PHASE "):
            name, _, rest = line[6:].partition(" ")
            phases[name] = rest.split(" ", 1)[0]
    assert phases == EXPECTED_PHASES, r.output
    big_md5 = next(x.split()[1] for x in r.lines() if x.startswith("BIGMD5 "))
    assert "SQUASH 65534:65534" in r.lines(), r.output

    bodies, meta = asyncio.run(_bucket_state(seaweed, bucket))
    assert md5(bodies["rw/keep/big.bin"]) == big_md5
    assert bodies["rw/keep/small.txt"] == b"first line\nsecond line\n"
    assert bodies["rw/keep/sym"] == b"small.txt"
    assert bodies["sq/by-root.txt"] == b"hello\n"
    assert meta["sq/by-root.txt"].get("uid") == "65534", meta["sq/by-root.txt"]
    assert not [k for k in bodies if k.startswith("rw/work/")], sorted(bodies)
    for proc in ("CREATE", "MKDIR", "WRITE", "SETATTR", "RENAME", "SYMLINK", "REMOVE", "RMDIR"):
        assert calls[f"NFS3.{proc}"] > 0, proc
    assert staged["staged_files"] == 0 and staged["spool_bytes"] == 0


# --------------------------------------------------------------------------- restarts

LOOP_SCRIPT = r"""
nfs_mount /data /mnt/data || exit 9
cd /mnt/data
find train extras/big.bin -type f | sort > /tmp/files
xargs stat -c %s < /tmp/files > /dev/null   # every inode (and its file handle) is cached
for i in 1 2 3; do
    drop_caches 1                           # page cache only: the inodes keep their handles
    echo "@@ITER$i"
    xargs md5sum < /tmp/files || echo "ERRORS in iteration $i"
done
echo "@@DEAD"
# the host now stops the gateway for good: reads fail (soft mount) instead of hanging
n=0
while [ $n -lt 600 ]; do
    drop_caches 1
    if ! cat extras/big.bin > /dev/null 2> /tmp/err; then
        echo "read failed: $(cat /tmp/err)"
        break
    fi
    sleep 0.2
    n=$((n + 1))
done
echo "@@END"
"""


def test_kill9_mid_read_loop_then_dead_server(
    guest: Guest, seaweed: SeaweedServer, tree: Tree, tree_bucket: str, tmp_path: Path
) -> None:
    gw = GatewayProcess(
        tmp_path,
        [
            {
                "path": "/data",
                "backend": f"s3://{tree_bucket}/{tree.prefix}",
                "read_only": True,
                "insecure": SLIRP_INSECURE,
            }
        ],
        s3=seaweed,
    )
    gw.start()
    try:
        with guest.start(
            LOOP_SCRIPT, nfs_port=gw.port, timeout_s=RUN_TIMEOUT_S, timeo_ds=20, retrans=3
        ) as run:
            assert run.wait_for(r"^@@ITER2$", RUN_TIMEOUT_S), run.wait().describe()
            gw.kill()  # in the middle of iteration 2
            killed_mid_iteration = "@@ITER3" not in run.output()
            gw.start()  # same port, same state directory (same handle secret)
            assert run.wait_for(r"^@@DEAD$", RUN_TIMEOUT_S), run.wait().describe()
            after = gw.metrics()
            gw.stop()
            r = run.wait()
    finally:
        gw.stop()
    _ok(r)
    assert killed_mid_iteration
    want = {p: md5(b) for p, b in tree.files.items() if p.startswith("train/")}
    want["extras/big.bin"] = md5(tree.files["extras/big.bin"])
    assert "ERRORS" not in r.output, r.output
    for it in ("ITER1", "ITER2", "ITER3"):
        assert dict(_md5_lines(_section(r.output, it))) == want, it
    # the restarted gateway served the guest's old handles: READs, and no STALE/BADHANDLE
    bad = {k: v for k, v in after.items() if ("STALE" in k or "BADHANDLE" in k) and v}
    assert not bad, bad
    assert (
        sum(
            v
            for k, v in after.items()
            if k.startswith("nfsgw_rpc_requests_total{proc=NFS3.READ,status=ok")
        )
        > 0
    )
    dead = _section(r.output, "DEAD")
    assert dead and dead[-1].startswith("read failed:"), r.output


# --------------------------------------------------------------------------- backend outage

OUTAGE_SCRIPT = r"""
nfs_mount /data /mnt/data || exit 9
cd /mnt/data
ls train/n00000004 > /dev/null     # listings work: only GETs fail
echo @@READING
md5sum train/n00000004/n00000004_0000*.JPEG || echo "ERRORS"
echo @@END
"""


def test_backend_outage_is_jukebox_and_the_kernel_retries(
    guest: Guest, seaweed: SeaweedServer, tree: Tree, tree_bucket: str, tmp_path: Path
) -> None:
    proxy = ThreadProxy(seaweed.endpoint_url, name="e2e-faultproxy")
    gw = GatewayProcess(
        tmp_path,
        [
            {
                "path": "/data",
                "backend": f"s3://{tree_bucket}/{tree.prefix}",
                "read_only": True,
                "insecure": SLIRP_INSECURE,
            }
        ],
        s3=seaweed,
        sections={
            "s3": {
                "endpoint_url": proxy.endpoint_url,
                "request_timeout_s": 1.0,
                "max_attempts": 3,
                "deadline_s": 2.0,
            }
        },
    )
    jukebox = "nfsgw_rpc_requests_total{proc=NFS3.READ,status=NFS3ERR_JUKEBOX}"
    try:
        gw.start()
        proxy.add(Rule("503", {"GET"}))  # every GET fails: an outage
        with guest.start(OUTAGE_SCRIPT, nfs_port=gw.port, timeout_s=RUN_TIMEOUT_S) as run:
            assert run.wait_for(r"^@@READING$", RUN_TIMEOUT_S), run.wait().describe()
            for _ in range(600):  # until the gateway has answered JUKEBOX (bounded: 60 s)
                if gw.metrics().get(jukebox, 0) > 0:
                    break
                time.sleep(0.1)
            proxy.clear()  # the store is back
            r = run.wait()
        served = gw.metrics()
    finally:
        gw.stop()
        proxy.close()
    _ok(r)
    assert served.get(jukebox, 0) > 0, "the outage never reached the client"
    assert "ERRORS" not in r.output, r.output
    got = dict(_md5_lines(_section(r.output, "READING")))
    want = {
        p: md5(b) for p, b in tree.files.items() if p.startswith("train/n00000004/n00000004_0000")
    }
    assert got == want
