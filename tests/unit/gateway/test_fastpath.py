"""The fast path against the ordinary path, byte for byte (``gateway.fastpath``).

Random call streams -- valid GETATTR/LOOKUP/ACCESS/READ calls over good, forged, foreign and
stale handles, several credentials (root, users, AUTH_NONE, malformed AUTH_SYS, an unknown
flavour), exports with different client lists, squash rules and modes; the same calls
truncated, with a byte flipped, with bytes added; other procedures -- are given to both paths
on one gateway, interleaved with mutations (SETATTR, WRITE, REMOVE, CREATE, made by the
files' owner, so they take effect: the test counts them), TTL expiry and a configuration
reload (which clears the fast path under test: it is the server's). Whenever the fast path
answers, its reply must be the ordinary path's for the same record, to the byte. Run with the
Python mechanics and, when built, the C ones.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from gateway import fastwire
from gateway.exports import ExportConfig
from gateway.fastpath import FastPath
from gateway.transport import Peer
from nfsproto import nfs3, rpc
from nfsproto.nfs3 import CreateHow3, CreateMode3, Diropargs3, Nfs3Proc, NfsStat3, Sattr3
from nfsproto.rpc import frame
from nfsproto.xdr import Buffer, Writer
from tests.harness.memory import PEER, ROOT, MemoryClient, MemoryGateway, cred

try:
    from gateway import _fastwire  # type: ignore[attr-defined,unused-ignore]
except ImportError:
    _fastwire = None

WIRES = [pytest.param(fastwire, id="python")]
if _fastwire is not None or os.environ.get("NFSGW_REQUIRE_NATIVE") == "1":
    WIRES.append(pytest.param(_fastwire, id="native"))

# Clients connect over TCP from unprivileged ports: each export says insecure. AUTH_NONE is
# refused (AUTH_TOOWEAK) but on /all, whose sec lists it.
_TCP = {"insecure": True}
EXPORTS = (
    ExportConfig("/data", "s3://bucket/ds/", read_only=True, **_TCP),
    ExportConfig("/rw", "s3://bucket/rw/", file_mode=0o640, uid=1000, gid=1000, **_TCP),
    ExportConfig(
        "/all",
        "s3://bucket/all/",
        read_only=True,
        squash="all",
        file_mode=0o600,
        sec=("sys", "none"),
        **_TCP,
    ),
    ExportConfig(
        "/far",
        "s3://bucket/far/",
        read_only=True,
        clients=(ipaddress.ip_network("10.9.0.0/16"),),
        **_TCP,
    ),
)
CREDS = [
    ROOT,
    cred(1000, 1000),
    cred(1001, 1000, [5, 1000]),
    cred(4242, 4242),
    rpc.NULL_AUTH,
    rpc.OpaqueAuth(rpc.AuthFlavor.AUTH_SYS, b"\0\0\0\1short"),  # malformed body
    rpc.OpaqueAuth(6, b"gss"),  # RPCSEC_GSS: not ours
]
SMALL_MAX = 4 << 20
OWNER = cred(1000, 1000)  # owns /rw's files: its mutations succeed


def _files(rng: random.Random) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for top in ("ds", "rw", "all", "far"):
        for d in range(3):
            for f in range(6):
                n = rng.choice((0, 1, 3, 4095, 16384, 70001, 131072))
                out[f"{top}/c{d}/f{f}.jpg"] = rng.randbytes(n)
        out[f"{top}/top.txt"] = b"top\n"
    out["ds/big.bin"] = rng.randbytes(SMALL_MAX + 5)  # not a small file: never fast
    return out


class Ordinary(MemoryClient):
    """A client whose calls only the ordinary path answers (the mutations: the fast path
    under test sees only the stream's calls, so its counters are the stream's)."""

    async def record(self, record: Buffer) -> bytes | None:
        out = await self.server.dispatcher.handle(record, self.peer)
        return None if out is None else b"".join(bytes(b) for b in out)


class Stream:
    """Builds call records and compares the two paths' replies."""

    def __init__(self, gw: MemoryGateway, fast: FastPath, rng: random.Random) -> None:
        self.gw = gw
        self.fast = fast
        self.rng = rng
        self.xid = rng.getrandbits(31)
        self.sessions: dict[tuple[str, int], Any] = {}
        self.answered = 0
        self.compared = 0
        self.handles: list[bytes] = []
        self.dirs: list[bytes] = []
        self.names: list[bytes] = [b"f0.jpg", b"f5.jpg", b"nope.jpg", b"c1", b"top.txt", b"big.bin"]
        self.owner = Ordinary(gw.server, OWNER)
        self.mutations: Counter[tuple[str, str]] = Counter()  # (what, NFS status)

    def record(self, proc: int, args: bytes, c: rpc.OpaqueAuth, prog: int = nfs3.PROGRAM) -> bytes:
        self.xid = (self.xid + 1) & 0xFFFFFFFF
        w = Writer()
        rpc.pack_call(w, self.xid, prog, 3, proc, c)
        w.raw(args)
        return w.getvalue()

    async def ordinary(self, rec: bytes, peer: Peer) -> bytes | None:
        out = await self.gw.server.dispatcher.handle(rec, peer)
        return None if out is None else b"".join(bytes(b) for b in frame(out))

    def fast_answer(self, rec: bytes, peer: Peer) -> bytes | None:
        k = (peer.host, peer.port)
        s = self.sessions.get(k)
        if s is None:
            s = self.sessions[k] = self.fast.session(peer)
        got = self.fast.answer(rec, s)
        return None if got is None else b"".join(bytes(b) for b in got)

    async def both(self, rec: bytes, peer: Peer = PEER) -> None:
        """The record through both paths, in a random order; equal whenever fast answers."""
        if self.rng.random() < 0.5:
            want = await self.ordinary(rec, peer)
            got = self.fast_answer(rec, peer)
        else:
            got = self.fast_answer(rec, peer)
            want = await self.ordinary(rec, peer)
        self.compared += 1
        if got is not None:
            self.answered += 1
            assert got == want, (rec.hex(), got.hex(), want and want.hex())

    def args(self, proc: int, fh: bytes) -> bytes:
        w = Writer()
        rng = self.rng
        if proc == Nfs3Proc.GETATTR:
            nfs3.PROCS[proc].pack_args(w, nfs3.Getattr3Args(fh))
        elif proc == Nfs3Proc.ACCESS:
            nfs3.PROCS[proc].pack_args(w, nfs3.Access3Args(fh, rng.choice((0x3F, 1, 0x1F, 0))))
        elif proc == Nfs3Proc.READ:
            off = rng.choice((0, 0, 1, 4093, 70000, 131071, 1 << 40))
            count = rng.choice((0, 1, 16384, 1 << 20, 1 << 30))
            nfs3.PROCS[proc].pack_args(w, nfs3.Read3Args(fh, off, count))
        else:
            name = rng.choice(self.names)
            nfs3.PROCS[proc].pack_args(w, nfs3.Lookup3Args(Diropargs3(fh, name)))
        return w.getvalue()

    def handle(self) -> bytes:
        rng = self.rng
        r = rng.random()
        fh = rng.choice(self.handles)
        if r < 0.85:
            return fh
        if r < 0.9:
            b = bytearray(fh)
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)  # forged: the MAC fails
            return bytes(b)
        if r < 0.95:
            return fh[: rng.randrange(len(fh))]
        return rng.randbytes(rng.choice((0, 8, 64)))

    async def random_call(self) -> None:
        rng = self.rng
        proc = rng.choice((Nfs3Proc.GETATTR, Nfs3Proc.LOOKUP, Nfs3Proc.ACCESS, Nfs3Proc.READ))
        fh = rng.choice(self.dirs) if proc == Nfs3Proc.LOOKUP and rng.random() < 0.8 else None
        rec = self.record(proc, self.args(proc, fh or self.handle()), rng.choice(CREDS))
        r = rng.random()
        if r < 0.08:
            rec = rec[: rng.randrange(len(rec))]
        elif r < 0.16:
            b = bytearray(rec)
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
            rec = bytes(b)
        elif r < 0.2:
            rec += rng.randbytes(rng.choice((1, 4, 8)))
        peer = PEER if rng.random() < 0.9 else Peer("127.0.0.1", 40000, 2049)
        await self.both(rec, peer)


async def _walk(gw: MemoryGateway, s: Stream) -> None:
    for path in ("/data", "/rw", "/all", "/far"):
        root = await gw.mount(path.encode()) if path != "/far" else None
        if root is None:
            continue
        s.handles.append(root)
        s.dirs.append(root)
        for d in range(3):
            dh = await gw.walk(root, f"c{d}")
            s.handles.append(dh)
            s.dirs.append(dh)
            for f in range(6):
                s.handles.append(await gw.walk(dh, f"f{f}.jpg"))
    data = gw.export("/data")
    s.handles.append(gw.gateway.handle_for(data, "big.bin"))
    s.handles.append(gw.gateway.handle_for(data, "c0/missing.jpg"))  # stale
    far = gw.export("/far")
    s.handles.append(gw.gateway.handle_for(far, ""))  # an export this client may not use
    s.handles.append(gw.gateway.handle_for(far, "c0/f0.jpg"))


async def _mutate(gw: MemoryGateway, s: Stream) -> None:
    """One change through the ordinary path by /rw's owner (counted by its status), or one
    in the bucket behind the gateway's back (new bytes under a /data key), or the clock past
    the TTL, or a reload of /data's squash rule and file mode."""
    rng = s.rng
    owner = s.owner
    rw = gw.export("/rw")
    d = rng.randrange(3)
    dh = gw.gateway.handle_for(rw, f"c{d}")
    name = f"f{rng.randrange(8)}.jpg".encode()
    k = rng.randrange(7)
    if k == 0:
        res = await owner.lookup(dh, name)
        if res.status == NfsStat3.NFS3_OK:
            sattr = Sattr3(mode=rng.choice((0o600, 0o644, 0o711, 0o000)))
            got = await owner.nfs(Nfs3Proc.SETATTR, nfs3.Setattr3Args(res.object, sattr))
            s.mutations["SETATTR", got.status.name] += 1
    elif k == 1:
        res = await owner.lookup(dh, name)
        if res.status == NfsStat3.NFS3_OK:
            data = rng.randbytes(rng.choice((5, 5000)))
            w = nfs3.Write3Args(res.object, 0, len(data), nfs3.StableHow.FILE_SYNC, data)
            got = await owner.nfs(Nfs3Proc.WRITE, w)
            s.mutations["WRITE", got.status.name] += 1
    elif k == 2:
        got = await owner.nfs(Nfs3Proc.REMOVE, nfs3.Remove3Args(Diropargs3(dh, name)))
        s.mutations["REMOVE", got.status.name] += 1
    elif k == 3:
        how = CreateHow3(CreateMode3.UNCHECKED, Sattr3(mode=0o644))
        got = await owner.nfs(Nfs3Proc.CREATE, nfs3.Create3Args(Diropargs3(dh, name), how))
        s.mutations["CREATE", got.status.name] += 1
        if got.status == NfsStat3.NFS3_OK and got.obj is not None:
            s.handles.append(got.obj)  # the stream calls it too
    elif k == 4:
        key = f"ds/c{rng.randrange(3)}/f{rng.randrange(6)}.jpg"
        gw.store.seed(key, rng.randbytes(rng.choice((2, 4095, 16385))))
        s.mutations["bucket", "ok"] += 1
    elif k == 5:
        gw.clock.advance(rng.choice((1.0, 61.0, 3600.0)))  # type: ignore[attr-defined]
    else:
        cfg = gw.server.config
        exports = tuple(
            dataclasses.replace(
                e,
                squash=rng.choice(("root", "none", "all")),
                file_mode=rng.choice((0o644, 0o600, 0o640)),
            )
            if e.path == "/data"
            else e
            for e in cfg.exports
        )
        epoch = s.fast.session(PEER).epoch
        gw.server.apply(dataclasses.replace(cfg, exports=exports))
        assert s.fast.session(PEER).epoch != epoch, "the reload did not clear the fast path"
        s.mutations["reload", "ok"] += 1


@pytest.mark.parametrize("wire", WIRES)
@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_fast_path_answers_as_the_ordinary_path(tmp_path: Path, wire: Any, seed: int) -> None:
    if wire is None:
        pytest.fail("NFSGW_REQUIRE_NATIVE=1 but gateway._fastwire is not built")
    rng = random.Random(seed)
    async with MemoryGateway.of(tmp_path, EXPORTS, files=_files(rng)) as gw:
        fast = FastPath(gw.gateway, gw.server.metrics.call, wire=wire)
        # The server's own fast path is the one under test: a reload (``Server.apply``)
        # clears this one. (No connection is open: none holds the one it replaces.)
        s = Stream(gw, fast, rng)
        await _walk(gw, s)
        gw.server.fastpath = fast
        for step in range(1500):
            if step % 30 == 29:
                await _mutate(gw, s)
            await s.random_call()
        # A stream that mostly hits must mostly be answered fast, or this compared nothing.
        assert s.answered > s.compared // 5, (s.answered, s.compared)
        assert fast.stats.answered == s.answered
        # The mutations took effect (the owner made them): none was refused, and some of
        # them changed the bucket, so the stream compared answers across real changes.
        refused = {
            k: n for k, n in s.mutations.items() if k[1] in ("NFS3ERR_ACCES", "NFS3ERR_PERM")
        }
        assert not refused, s.mutations
        changed = sum(n for (what, st), n in s.mutations.items() if st == "NFS3_OK")
        assert changed >= 5, s.mutations


@pytest.mark.parametrize("wire", WIRES)
async def test_what_the_fast_path_leaves_to_the_ordinary_path(tmp_path: Path, wire: Any) -> None:
    """Misses, other procedures, odd credentials, refused clients, large files: declined."""
    if wire is None:
        pytest.fail("NFSGW_REQUIRE_NATIVE=1 but gateway._fastwire is not built")
    rng = random.Random(7)
    files = _files(rng)
    async with MemoryGateway.of(tmp_path, EXPORTS, files=files) as gw:
        fast = FastPath(gw.gateway, gw.server.metrics.call, wire=wire)
        s = Stream(gw, fast, rng)
        root = await gw.mount(b"/data")
        args = s.args(Nfs3Proc.GETATTR, root)
        # Not listed yet, another program, another procedure, an unknown flavour: declined.
        w = Writer()
        nfs3.PROCS[Nfs3Proc.LOOKUP].pack_args(w, nfs3.Lookup3Args(Diropargs3(root, b"c0")))
        assert s.fast_answer(s.record(Nfs3Proc.LOOKUP, w.getvalue(), ROOT), PEER) is None
        assert s.fast_answer(s.record(Nfs3Proc.GETATTR, args, ROOT, prog=100005), PEER) is None
        assert s.fast_answer(s.record(Nfs3Proc.FSINFO, args, ROOT), PEER) is None
        assert s.fast_answer(s.record(Nfs3Proc.GETATTR, args, CREDS[-1]), PEER) is None
        # Answered once known; a client the export refuses is the ordinary path's to refuse.
        dh = await gw.walk(root, "c0")
        fh = await gw.walk(dh, "f0.jpg")
        assert s.fast_answer(s.record(Nfs3Proc.GETATTR, args, ROOT), PEER) is not None
        far = gw.gateway.handle_for(gw.export("/far"), "")
        far_args = s.args(Nfs3Proc.GETATTR, far)
        assert s.fast_answer(s.record(Nfs3Proc.GETATTR, far_args, ROOT), PEER) is None
        # READ: not cached yet -> declined; after the ordinary READ fetched it -> answered.
        w = Writer()
        nfs3.PROCS[Nfs3Proc.READ].pack_args(w, nfs3.Read3Args(fh, 0, 1 << 20))
        rd = s.record(Nfs3Proc.READ, w.getvalue(), ROOT)
        if files["ds/c0/f0.jpg"]:
            assert s.fast_answer(rd, PEER) is None
        await s.both(rd)
        # A write to the export's index drops what the fast path kept: the next GETATTR of a
        # changed file answers the new attributes (both paths agree, checked by ``both``).
        await s.both(s.record(Nfs3Proc.GETATTR, s.args(Nfs3Proc.GETATTR, fh), ROOT))
        gen = gw.export("/data").ns.generation
        gw.export("/data").ns.invalidate("c0")
        assert gw.export("/data").ns.generation > gen
        assert (
            s.fast_answer(s.record(Nfs3Proc.GETATTR, s.args(Nfs3Proc.GETATTR, fh), ROOT), PEER)
            is None
        )


async def test_the_server_serves_through_the_fast_path_over_tcp(tmp_path: Path) -> None:
    """A real connection: cached calls are answered by the fast path, counted in the
    per-procedure metrics like any call, and ``--no-fast-path`` turns it off."""
    files = {f"ds/c0/f{i}.jpg": bytes([i]) * (1000 + i) for i in range(20)}
    async with MemoryGateway.of(tmp_path, EXPORTS[:1], files=files) as gw:
        c = await gw.connect()
        try:
            root = await c.mount(b"/data")
            dh = await c.walk(root, "c0")
            for i in range(20):
                fh = await c.walk(dh, f"f{i}.jpg")
                assert (await c.access(fh)).status == NfsStat3.NFS3_OK
                for _ in range(2):
                    r = await c.read(fh)
                    assert (
                        r.status == NfsStat3.NFS3_OK and bytes(r.data) == files[f"ds/c0/f{i}.jpg"]
                    )
        finally:
            await c.close()
        assert gw.server.fastpath is not None
        st = gw.server.fastpath.stats
        # Every LOOKUP after the one that listed c0, every ACCESS, every second READ.
        assert st.answered >= 19 + 20 + 20
        assert gw.statuses()[("NFS3.READ", "ok")] == 40
    async with MemoryGateway.of(tmp_path, EXPORTS[:1], files=files, server_fast_path=False) as gw:
        assert gw.server.fastpath is None


async def test_a_fast_path_bug_costs_the_client_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unexpected error inside the fast path is logged and the call goes down the
    ordinary path, which answers it; the connection is not lost."""
    files = {"ds/c0/f0.jpg": b"abc"}
    async with MemoryGateway.of(tmp_path, EXPORTS[:1], files=files) as gw:
        root = await gw.mount(b"/data")
        fh = await gw.walk(root, "c0/f0.jpg")
        assert (await gw.getattr(fh)).status == NfsStat3.NFS3_OK
        fast = gw.server.fastpath
        assert fast is not None
        answered = gw.fast_answers

        def broken(*_: object) -> None:
            raise RuntimeError("a bug")

        monkeypatch.setattr(fast, "_answer", broken)
        with capture_logs() as logs:
            res = await gw.getattr(fh)
        assert res.status == NfsStat3.NFS3_OK and res.obj_attributes.size == 3
        assert gw.fast_answers == answered  # the ordinary path answered
        assert [x["event"] for x in logs if x["log_level"] == "error"] == ["fast_path_failed"]
