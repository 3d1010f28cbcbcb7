"""No secret in any log line (issue 37): a gateway whose export's store is a real ``S3Store``
signing with known fake keys, its logging configured as ``nfsgw serve`` configures it (JSON
and console, ``gateway.ops.logs.configure``, into a buffer), and a failure injected at each
layer in turn, each one a crash with a traceback through the frames that hold the secrets:

- the S3 client: the signer raising after it signed (its frames hold the credentials, the
  signed headers, the signing key);
- the disk tier: its read raising under a READ;
- dispatch: a handler raising (its frames hold the call's AUTH_SYS credential and arguments);
- the fast path: its answer raising inside the transport's receive callback (asyncio's own
  "fatal error" line, through the standard library's logging);
- writes: the upload of a committed file raising (its frames hold the WRITE's data).

Then neither the access key nor the secret key (nor a recognisable half of either), nor the
WRITE's data bytes, appear anywhere in what was logged; and every injected failure was
logged with its traceback (so the test cannot pass by logging nothing).

The store behind the S3 client is a small S3 in the test (``tests.harness.fakes3.FakeS3``:
it checks no signature): what matters here is what the gateway prints, not what a store
accepts.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.backend.s3 import S3Store
from gateway.backend.sigv4 import SigV4Signer
from gateway.data.disk import DiskStore
from gateway.exports import ExportConfig
from gateway.fastpath import FastPath
from gateway.ops import logs
from nfsproto import nfs3, rpc
from nfsproto.nfs3 import CreateHow3, CreateMode3, Diropargs3, Nfs3Proc, NfsStat3, Sattr3
from tests.harness.fakes3 import FakeS3, S3Gateway
from tests.harness.memory import MemoryGateway

ACCESS_KEY = "AKIAZQ7NFSGWLOGTEST4X"
SECRET_KEY = "q7Rk2vXw9/LmN4pTz8BsYh3Jd6FgKcWe5UaQoEiT"
# What must not appear: the keys, the access key past the 4 characters a repr may show, and
# each half of the secret (a repr once printed half of it).
FORBIDDEN = (
    ACCESS_KEY,
    ACCESS_KEY[4:],
    SECRET_KEY,
    SECRET_KEY[: len(SECRET_KEY) // 2],
    SECRET_KEY[len(SECRET_KEY) // 2 :],
)
DATA_MARKER = b"WRITE-PAYLOAD-7f3a9c-do-not-log"
MACHINE = b"client-host-42"
CRED = rpc.auth_sys(0, 0, [0], MACHINE)
FILES = {
    f"rw/d{i}/f{j}.bin": bytes([i * 16 + j]) * (3000 + 100 * j) for i in range(6) for j in range(3)
}
LAST_MODIFIED = "Mon, 30 Nov 2026 10:00:00 GMT"


class Injected(RuntimeError):
    """The failure a test injects (its message names the layer)."""


@contextlib.contextmanager
def logged(fmt: str) -> Iterator[io.StringIO]:
    """Every line the process logs (structlog and the standard library), rendered as
    ``nfsgw serve`` renders them in ``fmt``."""
    out = io.StringIO()
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    logs.configure("debug", fmt == "json", stream=out, cache=False)
    try:
        yield out
    finally:
        root.handlers[:], root.level = saved
        logs.configure("info", True, stream=io.StringIO(), cache=False)


@contextlib.asynccontextmanager
async def gateway(tmp_path: Path) -> AsyncIterator[S3Gateway]:
    s3 = FakeS3("bucket", FILES)
    await s3.start()
    gw = S3Gateway.of(
        tmp_path,
        [ExportConfig("/rw", "s3://bucket/rw/", squash="none")],
        server_cache_dir=tmp_path / "cache",
        cache_disk=64 << 20,
    )
    gw.s3 = s3
    gw.access_key, gw.secret_key = ACCESS_KEY, SECRET_KEY
    gw.cred = CRED
    try:
        async with gw:
            yield gw
    finally:
        await s3.close()


async def fh_of(gw: MemoryGateway, root: bytes, path: str) -> bytes:
    return await gw.walk(root, path)


@pytest.mark.parametrize("fmt", ["json", "console"])
async def test_no_secret_in_any_log_line(
    fmt: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with logged(fmt) as out:
        async with gateway(tmp_path) as gw:
            root = await gw.mount(b"/rw")
            # An honest read first: the S3 wire works with these keys.
            f = await fh_of(gw, root, "d0/f0.bin")
            res = await gw.read(f)
            assert res.status == NfsStat3.NFS3_OK and bytes(res.data) == FILES["rw/d0/f0.bin"]

            # 1. The S3 client: the signer fails after it signed.
            sign = SigV4Signer.sign

            def failing_sign(self: SigV4Signer, creds: Any, *a: Any, **kw: Any) -> Any:
                sign(self, creds, *a, **kw)
                raise Injected("injected: the signer failed (S3 client)")

            f1 = await fh_of(gw, root, "d1/f2.bin")
            monkeypatch.setattr(SigV4Signer, "sign", failing_sign)
            res1 = await gw.read(f1)  # its GET is signed
            assert res1.status != NfsStat3.NFS3_OK
            monkeypatch.undo()

            # 2. The disk tier: its read fails under a READ.
            async def failing_read(self: DiskStore, *a: Any, **kw: Any) -> Any:
                raise Injected("injected: the disk tier failed")

            monkeypatch.setattr(DiskStore, "read", failing_read)
            f2 = await fh_of(gw, root, "d2/f1.bin")
            res2 = await gw.read(f2)
            assert res2.status != NfsStat3.NFS3_OK
            monkeypatch.undo()

            # 3. Dispatch: a handler fails (its frames hold the call's credential and args).
            fsstat = gw.server.dispatcher.programs[nfs3.PROGRAM].versions[3][Nfs3Proc.FSSTAT]

            async def failing_handler(ctx: Any, args: Any) -> Any:
                raise Injected("injected: a handler failed (dispatch)")

            original = fsstat.handler
            object.__setattr__(fsstat, "handler", failing_handler)  # a frozen dataclass
            try:
                res3 = await gw.nfs(Nfs3Proc.FSSTAT, nfs3.Fsstat3Args(root))
                assert res3.status != NfsStat3.NFS3_OK
            finally:
                object.__setattr__(fsstat, "handler", original)

            # 4. The fast path: its answer fails in the transport's receive callback.
            def failing_answer(self: FastPath, record: Any, s: Any) -> Any:
                raise Injected("injected: the fast path failed")

            monkeypatch.setattr(FastPath, "answer", failing_answer)
            client = await gw.connect(CRED)
            try:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(client.getattr(f), 2)
            finally:
                with contextlib.suppress(Exception):
                    await client.close()
            monkeypatch.undo()
            await asyncio.sleep(0.05)

            # 5. Writes: the upload of a committed file fails (its frames hold the data).
            put = S3Store.put

            async def failing_put(self: S3Store, key: str, data: bytes, *a: Any) -> Any:
                if not data:  # CREATE's empty object: stored (the failure is the data's)
                    return await put(self, key, data, *a)
                raise Injected("injected: the upload failed (writes)")

            monkeypatch.setattr(S3Store, "put", failing_put)
            how = CreateHow3(CreateMode3.UNCHECKED, Sattr3(mode=0o644), b"\0" * 8)
            cr = await gw.nfs(Nfs3Proc.CREATE, nfs3.Create3Args(Diropargs3(root, b"new"), how))
            assert cr.status == NfsStat3.NFS3_OK, cr.status
            data = DATA_MARKER * 4
            args = nfs3.Write3Args(cr.obj, 0, len(data), nfs3.StableHow.UNSTABLE, data)
            assert (await gw.nfs(Nfs3Proc.WRITE, args)).status == NfsStat3.NFS3_OK
            c = await gw.nfs(Nfs3Proc.COMMIT, nfs3.Commit3Args(cr.obj, 0, 0))
            assert c.status != NfsStat3.NFS3_OK
            monkeypatch.undo()
    text = out.getvalue()
    assert text, "nothing was logged"
    for bad in FORBIDDEN:
        assert bad not in text, f"{bad!r} in the log:\n{_around(text, bad)}"
    assert DATA_MARKER.decode() not in text, _around(text, DATA_MARKER.decode())
    assert DATA_MARKER.hex() not in text
    # Every layer's failure was logged, with a traceback.
    for layer in ("S3 client", "disk tier", "dispatch", "fast path", "writes"):
        assert f"{layer}" in text, f"the {layer} failure was not logged:\n{text[-3000:]}"
    assert text.count("Traceback") + text.count('"frames"') >= 4, text[-3000:]


def _around(text: str, bad: str) -> str:
    i = text.find(bad)
    return text[max(0, i - 600) : i + 200]
