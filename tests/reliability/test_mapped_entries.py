"""Disk-tier entries truncated or removed under their mappings while READs run.

A disk-tier hit is served from a read-only mapping of its bundle (``gateway.data.disk.entries``,
"Mappings"). Another program truncating a bundle makes a user-space touch of its pages raise
SIGBUS, which kills the process: the gateway must never make one. Here a real gateway
(``MemoryGateway``: the server listening on 127.0.0.1, a disk tier under the test's
directory) runs in a child process, so a SIGBUS shows as a child killed by a signal; its
entries are mapped into the memory tier (the tier is filled, the memory tier cleared, the
files read again), then, while four TCP clients send READs at random offsets (bounded:
at least ``READS`` over at least ``MIN_SECONDS``, at most ``MAX_READS`` and
``SECONDS``), a thread truncates (to a random length, or 0) or
unlinks random bundles, and the memory tier is cleared now and then so that READs keep
mapping the entries the attack reaches. Every answer must be NFS3_OK with the right bytes or
NFS3ERR_IO; a connection the server closes (a send that met a page broken in the
microseconds after its check: EFAULT) is counted and reconnected. Run with the compiled fast
path and with ``NFSGW_PURE_PYTHON=1``, each on asyncio's own loop and on uvloop.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
READS = 400  # at least, over at least MIN_SECONDS (at most MAX_READS, SECONDS)
MAX_READS = 2000
MIN_SECONDS = 2.0
SECONDS = 6.0
MiB = 1 << 20


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
@pytest.mark.parametrize("twin", ["c", "python"])
def test_truncated_and_removed_entries_never_kill_the_gateway(
    tmp_path: Path, twin: str, loop: str
) -> None:
    if loop == "uvloop":
        pytest.importorskip("uvloop")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("NFSGW_PURE_PYTHON", None)
    if twin == "python":
        env["NFSGW_PURE_PYTHON"] = "1"
    else:
        from gateway import fastwire

        if fastwire.compiled() is None:
            pytest.skip("gateway._fastwire is not built")
    out = subprocess.run(
        [sys.executable, __file__, str(tmp_path), loop],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != -signal.SIGBUS, "the gateway died of SIGBUS: " + out.stderr[-3000:]
    assert out.returncode == 0, (out.returncode, out.stderr[-3000:])
    got = json.loads(out.stdout.strip().splitlines()[-1])
    print(got)
    assert got["twin"] == twin and got["loop"] == loop
    assert got["mapped"] > 0  # the READs really were served from mappings
    assert got["wrong"] == 0 and got["other"] == {}
    assert got["ok"] + got["io"] + got["dropped"] == got["reads"] >= READS
    assert got["ok"] > 0
    assert got["truncated"] > 0 and got["removed"] > 0
    # broken mappings were met by READs and dropped; the disk tier found entries bad
    assert got["broken_mappings"] > 0 and got["corrupt"] > 0
    # the bytes came again from the backend
    assert got["gets_after_attack"] > 0


# --------------------------------------------------------------------------- the child


def _files(rng: random.Random) -> dict[str, bytes]:
    files = {f"ds/d/f{i}.bin": rng.randbytes(rng.randint(3_000, 300_000)) for i in range(24)}
    files["ds/d/big.bin"] = rng.randbytes(6 * MiB + 12_345)  # blocks of 1 MiB
    return files


async def _child(tmp: Path, loop_name: str) -> dict[str, Any]:
    from gateway import fastwire
    from gateway.data.mappings import is_mapping
    from gateway.exports import ExportConfig
    from nfsproto.nfs3 import NfsStat3
    from tests.harness.memory import MemoryGateway

    rng = random.Random(37)
    files = _files(rng)
    gw = MemoryGateway.of(
        tmp,
        [ExportConfig("/data", "s3://b/ds/", squash="none", insecure=True)],
        files=files,
        server_cache_dir=tmp / "cache",
        cache_disk=256 * MiB,
        cache_memory=128 * MiB,
    )
    result: dict[str, Any] = {
        "twin": "c" if fastwire.compiled() else "python",
        "loop": loop_name,
    }
    async with gw:
        reader = gw.gateway.reader
        disk = reader.disk
        assert disk is not None
        root = await gw.mount(b"/data")
        fhs = {k: await gw.walk(root, k.removeprefix("ds/")) for k in files}

        async def read_all() -> None:
            for k, data in files.items():
                off = 0
                while off < len(data):
                    res = await gw.read(fhs[k], off, MiB)
                    assert res.status == NfsStat3.NFS3_OK
                    assert bytes(res.data) == data[off : off + MiB]
                    off += MiB

        await read_all()  # fetched, published to the disk tier
        await disk.drain()
        reader.clear()
        await read_all()  # from the disk tier: mappings in the memory tier
        result["mapped"] = sum(1 for e in reader.cache._entries.values() if is_mapping(e[0]))
        gw.reset_requests()

        stop = threading.Event()
        attack = {"truncated": 0, "removed": 0}

        def attacker() -> None:
            arng = random.Random(1)
            tier = tmp / "cache" / "v2"
            while not stop.is_set():
                names = [p for p in tier.glob("??/*") if not p.name.startswith(".")]
                if names:
                    p = arng.choice(names)
                    try:
                        if arng.random() < 0.75:
                            size = p.stat().st_size
                            os.truncate(p, arng.choice([0, arng.randrange(max(1, size))]))
                            attack["truncated"] += 1
                        else:
                            p.unlink()
                            attack["removed"] += 1
                    except FileNotFoundError:
                        pass
                time.sleep(0.002)

        counts = {"reads": 0, "ok": 0, "io": 0, "wrong": 0, "dropped": 0}
        other: dict[str, int] = {}
        t0 = time.monotonic()
        deadline = t0 + SECONDS
        keys = list(files)

        def more() -> bool:
            now = time.monotonic()
            n = counts["reads"]
            return now < deadline and n < MAX_READS and (n < READS or now < t0 + MIN_SECONDS)

        async def client(seed: int) -> None:
            crng = random.Random(seed)
            c = await gw.connect()
            try:
                while more():
                    k = crng.choice(keys)
                    data = files[k]
                    off = crng.randrange(len(data))
                    count = crng.choice([4096, 65_536, MiB, 2 * MiB])
                    counts["reads"] += 1
                    try:
                        res = await asyncio.wait_for(c.read(fhs[k], off, count), 10)
                    except (ConnectionError, EOFError, asyncio.IncompleteReadError):
                        counts["dropped"] += 1
                        await c.close()
                        c = await gw.connect()
                        continue
                    if res.status == NfsStat3.NFS3_OK:
                        want = data[off : off + min(count, MiB)]
                        ok = bytes(res.data) == want[: len(res.data)] and len(res.data) > 0
                        counts["ok" if ok else "wrong"] += 1
                    elif res.status == NfsStat3.NFS3ERR_IO:
                        counts["io"] += 1
                    else:
                        other[res.status.name] = other.get(res.status.name, 0) + 1
            finally:
                await c.close()

        async def remap() -> None:  # READs keep mapping the entries the attack reaches
            while more():
                await asyncio.sleep(0.25)
                await disk.drain()
                reader.clear()

        t = threading.Thread(target=attacker, daemon=True)
        t.start()
        try:
            await asyncio.gather(*(client(i) for i in range(4)), remap())
        finally:
            stop.set()
            t.join(5)
        await asyncio.sleep(0.2)  # the drops of broken entries finish
        result.update(counts, **attack, other=other)
        result["corrupt"] = disk.stats.corrupt
        result["broken_mappings"] = disk.broken_mappings
        result["gets_after_attack"] = gw.requests().get("get", 0)
    return result


def _main() -> None:
    tmp, loop_name = Path(sys.argv[1]), sys.argv[2]
    if loop_name == "uvloop":
        import uvloop

        got = uvloop.run(_child(tmp, loop_name))
    else:
        got = asyncio.run(_child(tmp, loop_name))
    print(json.dumps(got), flush=True)


if __name__ == "__main__":
    _main()
