"""What verifying GET bodies costs (every byte served is checked against the checksum its object
carries, so that check must stay cheap next to the GET): the gateway's S3 client CPU per
whole-object GET of ``--size``-byte objects (default 110 kB, the ImageNet mean) on a local
SeaweedFS, with verification off, by the MD5 ETag (on the loop, and in a thread), by a stored
CRC32, CRC32C or CRC64NVME (the compiled CRCs, ``gateway._checksums``), and the digests alone.

    .venv/bin/python benchmarks/s3_checksum_cpu.py [--objects 200] [--size 110000]

Libraries made for the job, when importable (awscrt's ``awscrt.checksums``, ``google-crc32c``,
``crc32c``; not dependencies of nfsgw: install them beside it, or put a venv that has them on
``PYTHONPATH``), are measured on the same bodies: digests alone, and the GET modes again with
their CRC in place of ours (``--libraries`` to run those too).

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
import functools
import gc
import hashlib
import http.client
import importlib
import os
import sys
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/: _common
import _common  # noqa: F401 (puts the repository on sys.path)

from gateway.backend import checksums, s3verify
from gateway.backend.checksums import digest, py_crc32c, py_crc64nvme
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


def libraries() -> dict[str, SimpleNamespace]:
    """The CRC libraries importable here, each as a stand-in for ``gateway._checksums``
    (``crc32c``/``crc64nvme``/``crc32`` taking ``(data, crc)``; a missing one is None)."""
    out: dict[str, SimpleNamespace] = {}
    with_ours = checksums.compiled()
    ours_crc32 = with_ours.crc32 if with_ours is not None else zlib.crc32
    try:
        aws: Any = importlib.import_module("awscrt.checksums")
        out["awscrt"] = SimpleNamespace(
            crc32=ours_crc32,
            crc32c=lambda d, c=0: aws.crc32c(d, c),
            crc64nvme=lambda d, c=0: aws.crc64nvme(d, c),
        )
    except ImportError:
        pass
    try:
        g: Any = importlib.import_module("google_crc32c")
        out["google-crc32c"] = SimpleNamespace(
            crc32=ours_crc32, crc32c=lambda d, c=0: g.extend(c, d), crc64nvme=None
        )
    except ImportError:
        pass
    try:
        ic: Any = importlib.import_module("crc32c")
        out["crc32c"] = SimpleNamespace(
            crc32=ours_crc32, crc32c=lambda d, c=0: ic.crc32c(d, c), crc64nvme=None
        )
    except ImportError:
        pass
    return out


async def measure(
    sw: SeaweedServer,
    keys: list[str],
    policy: ChecksumPolicy,
    repeat: int,
    off_loop: bool,
    crcs: SimpleNamespace | None = None,
) -> tuple[float, float]:
    """(process CPU, loop-thread CPU) seconds per GET; ``crcs`` in place of
    ``gateway._checksums`` if given."""
    store = S3Store(BUCKET, **sw.store_kwargs(), checksums=policy)
    saved = s3verify._HASH_OFF_LOOP_BYTES
    saved_compiled = checksums.compiled
    if off_loop:
        s3verify._HASH_OFF_LOOP_BYTES = 0  # type: ignore[misc]  # benchmark-only
    if crcs is not None:
        checksums.compiled = lambda: crcs  # type: ignore[assignment]  # benchmark-only
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
        s3verify._HASH_OFF_LOOP_BYTES = saved  # type: ignore[misc]
        checksums.compiled = saved_compiled
        await store.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--objects", type=int, default=200, help="objects to GET (default 200)")
    p.add_argument("--size", type=int, default=110_000, help="bytes per object (default 110000)")
    p.add_argument("--repeat", type=int, default=3, help="passes; the best counts (default 3)")
    p.add_argument(
        "--libraries", action="store_true", help="also GET with each importable CRC library"
    )
    a = p.parse_args()
    if a.objects < 1 or a.repeat < 1 or a.size < 1:
        p.error("--objects, --repeat and --size must be >= 1")

    body = os.urandom(a.size)
    n = max(20, 20_000_000 // a.size)
    ours = checksums.compiled()
    engine = "none: pure Python" if ours is None else ours.engine
    digests = {
        "MD5": best(lambda: hashlib.md5(body).digest(), n),
        "SHA-1": best(lambda: hashlib.sha1(body).digest(), n),
        "SHA-256": best(lambda: hashlib.sha256(body).digest(), n),
        "CRC32 (zlib)": best(lambda: zlib.crc32(body), n),
    }
    if ours is not None:
        for name in ("crc32", "crc32c", "crc64nvme"):
            call = functools.partial(getattr(ours, name), body)
            digests[f"{name.upper()} (ours, {engine})"] = best(call, n)
    libs = libraries()
    for lib, ns in libs.items():
        for name in ("crc32c", "crc64nvme"):
            if (fn := getattr(ns, name)) is not None:
                digests[f"{name.upper()} ({lib})"] = best(functools.partial(fn, body), n)
    slow = max(3, n // 200)
    digests["CRC32C (Python)"] = best(lambda: py_crc32c(body), slow, repeat=3)
    digests["CRC64NVME (Python)"] = best(lambda: py_crc64nvme(body), slow, repeat=3)
    plain = [f"plain/obj-{i:05d}" for i in range(a.objects)]
    stored = {
        alg: [f"{alg}/obj-{i:05d}" for i in range(a.objects)]
        for alg in ("crc32", "crc32c", "crc64nvme")
    }
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
            for alg, keys in stored.items():
                value = base64.b64encode(digest(alg, body)).decode()
                for k in keys:
                    put_with_headers(sw, k, body, {f"x-amz-checksum-{alg}": value})
            on = ChecksumPolicy(stored=True, md5=False)
            modes: list[tuple[str, list[str], ChecksumPolicy, bool, SimpleNamespace | None]] = [
                ("off", plain, ChecksumPolicy(stored=False, md5=False), False, None),
                (
                    "MD5 ETag, on the loop",
                    plain,
                    ChecksumPolicy(stored=False, md5=True),
                    False,
                    None,
                ),
                (
                    "MD5 ETag, in a thread",
                    plain,
                    ChecksumPolicy(stored=False, md5=True),
                    True,
                    None,
                ),
            ]
            for alg, keys in stored.items():
                modes.append((f"stored {alg.upper()}, on the loop", keys, on, False, None))
            if a.libraries:
                for lib, ns in libs.items():
                    for alg in ("crc32c", "crc64nvme"):
                        if getattr(ns, alg) is not None:
                            modes.append((f"{alg.upper()} by {lib}", stored[alg], on, False, ns))
            out = []
            for name, keys, policy, off_loop, crcs in modes:
                proc, loop = await measure(sw, keys, policy, a.repeat, off_loop, crcs)
                out.append((name, proc, loop))
            return out

        rows = asyncio.run(run())
    print(f"{a.objects} GETs of {a.size} B objects, best of {a.repeat}; our CRCs: {engine}")
    print(f"{'verification':28} {'µs CPU/GET':>11} {'vs off':>7} {'µs loop/GET':>12} {'vs off':>7}")
    base_proc, base_loop = rows[0][1], rows[0][2]
    for name, proc, loop in rows:
        dp = (proc - base_proc) / base_proc * 100
        dl = (loop - base_loop) / base_loop * 100
        print(f"{name:28} {proc * 1e6:11.0f} {dp:+6.0f}% {loop * 1e6:12.0f} {dl:+6.0f}%")
    print("digests alone, µs per body:")
    for k, v in digests.items():
        print(f"  {k:32} {v * 1e6:9.1f}")
    print(f"(took {time.monotonic() - t_start:.0f} s)")


if __name__ == "__main__":
    main()
