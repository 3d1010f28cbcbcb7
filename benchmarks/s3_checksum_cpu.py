"""What verifying GET bodies costs (issue 14 part 3): the gateway's S3 client CPU per
whole-object GET of ``--size``-byte objects (default 110 kB, the ImageNet mean) on a local
SeaweedFS, with verification off, by the MD5 ETag (on the loop, and in a thread), by a stored
CRC32, and the digests alone.

    .venv/bin/python benchmarks/s3_checksum_cpu.py [--objects 200] [--size 110000]

Per mode it prints the process CPU per GET (``time.process_time``: every thread of this
process; the server's CPU is not counted) and the CPU of the event loop's thread
(``time.thread_time`` on it): the gateway is bound by its loop thread, so CPU spent in a
hashing thread (hashlib and zlib release the GIL) costs cores, not loop time. One request at a
time, best of ``--repeat`` passes. The figures are in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import gc
import hashlib
import http.client
import os
import time
import zlib
from collections.abc import Callable
from typing import Any

from gateway.backend import s3 as s3_module
from gateway.backend.checksums import py_crc32c
from gateway.backend.config import ChecksumPolicy
from gateway.backend.s3 import S3Store
from gateway.backend.sigv4 import Credentials, SigV4Signer
from loadgen.seaweed import SeaweedServer

BUCKET = "checksum-bench"


def put_with_headers(sw: SeaweedServer, key: str, body: bytes, headers: dict[str, str]) -> None:
    """A signed PUT with extra headers (SeaweedFS keeps ``x-amz-checksum-*`` ones)."""
    path = f"/{BUCKET}/{key}"
    h = {"host": f"127.0.0.1:{sw.s3_port}", **headers}
    creds = Credentials(sw.access_key, sw.secret_key)
    SigV4Signer(sw.region).sign(creds, "PUT", path, "", h, hashlib.sha256(body).hexdigest())
    conn = http.client.HTTPConnection("127.0.0.1", sw.s3_port, timeout=30)
    try:
        conn.request("PUT", path, body=body, headers=h)
        resp = conn.getresponse()
        resp.read()
        if resp.status != 200:
            raise RuntimeError(f"PUT {key}: HTTP {resp.status}")
    finally:
        conn.close()


def best(fn: Callable[[], Any], number: int, repeat: int = 5) -> float:
    """Seconds of process CPU per call of ``fn``: the best of ``repeat`` rounds."""
    out = float("inf")
    for _ in range(repeat):
        gc.collect()
        t0 = time.process_time()
        for _ in range(number):
            fn()
        out = min(out, (time.process_time() - t0) / number)
    return out


async def measure(
    sw: SeaweedServer, keys: list[str], policy: ChecksumPolicy, repeat: int, off_loop: bool
) -> tuple[float, float]:
    """(process CPU, loop-thread CPU) seconds per GET."""
    store = S3Store(BUCKET, **sw.store_kwargs(), checksums=policy)
    saved = s3_module._HASH_OFF_LOOP_BYTES
    if off_loop:
        s3_module._HASH_OFF_LOOP_BYTES = 0  # type: ignore[misc]  # benchmark-only
    try:
        for k in keys[:20]:
            await store.get(k)
        best_proc = best_loop = float("inf")
        for _ in range(repeat):
            gc.collect()
            gc.disable()
            try:
                p0, l0 = time.process_time(), time.thread_time()
                for k in keys:
                    await store.get(k)
                p1, l1 = time.process_time(), time.thread_time()
            finally:
                gc.enable()
            best_proc = min(best_proc, (p1 - p0) / len(keys))
            best_loop = min(best_loop, (l1 - l0) / len(keys))
        return best_proc, best_loop
    finally:
        s3_module._HASH_OFF_LOOP_BYTES = saved  # type: ignore[misc]
        await store.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--objects", type=int, default=200, help="objects to GET (default 200)")
    p.add_argument("--size", type=int, default=110_000, help="bytes per object (default 110000)")
    p.add_argument("--repeat", type=int, default=3, help="passes; the best counts (default 3)")
    a = p.parse_args()
    if a.objects < 1 or a.repeat < 1 or a.size < 1:
        p.error("--objects, --repeat and --size must be >= 1")

    body = os.urandom(a.size)
    n = max(20, 20_000_000 // a.size)
    digests = {
        "MD5": best(lambda: hashlib.md5(body).digest(), n),
        "SHA-256": best(lambda: hashlib.sha256(body).digest(), n),
        "CRC32 (zlib)": best(lambda: zlib.crc32(body), n),
        "CRC32C (our table)": best(lambda: py_crc32c(body), max(3, n // 200), repeat=3),
    }
    plain = [f"plain/obj-{i:05d}" for i in range(a.objects)]
    crc = [f"crc32/obj-{i:05d}" for i in range(a.objects)]
    t_start = time.monotonic()
    with SeaweedServer() as sw:
        sw.create_bucket(BUCKET)

        async def run() -> list[tuple[str, float, float]]:
            setup = S3Store(BUCKET, **sw.store_kwargs())
            try:
                for k in plain:
                    await setup.put(k, body)
            finally:
                await setup.close()
            crc_header = base64.b64encode(zlib.crc32(body).to_bytes(4, "big")).decode()
            for k in crc:
                put_with_headers(sw, k, body, {"x-amz-checksum-crc32": crc_header})
            modes = [
                ("off", plain, ChecksumPolicy(stored=False, md5=False), False),
                ("MD5 ETag, on the loop", plain, ChecksumPolicy(stored=False, md5=True), False),
                ("MD5 ETag, in a thread", plain, ChecksumPolicy(stored=False, md5=True), True),
                ("stored CRC32, on the loop", crc, ChecksumPolicy(stored=True, md5=False), False),
            ]
            out = []
            for name, keys, policy, off_loop in modes:
                proc, loop = await measure(sw, keys, policy, a.repeat, off_loop)
                out.append((name, proc, loop))
            return out

        rows = asyncio.run(run())
    print(f"{a.objects} GETs of {a.size} B objects, best of {a.repeat}")
    print(f"{'verification':28} {'µs CPU/GET':>11} {'vs off':>7} {'µs loop/GET':>12} {'vs off':>7}")
    base_proc, base_loop = rows[0][1], rows[0][2]
    for name, proc, loop in rows:
        dp = (proc - base_proc) / base_proc * 100
        dl = (loop - base_loop) / base_loop * 100
        print(f"{name:28} {proc * 1e6:11.0f} {dp:+6.0f}% {loop * 1e6:12.0f} {dl:+6.0f}%")
    print(
        "digests alone, µs per body: " + ", ".join(f"{k} {v * 1e6:.0f}" for k, v in digests.items())
    )
    print(f"(took {time.monotonic() - t_start:.0f} s)")


if __name__ == "__main__":
    main()
