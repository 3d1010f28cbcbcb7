"""A minimal NFSv3 + MOUNTv3 server over an in-memory tree, on nfsproto, for the load
generator's unit tests (so they do not depend on the gateway).

It serves MNT, FSINFO, GETATTR, LOOKUP, ACCESS, READ and READDIRPLUS; handles are
``b"h" + path``; READDIRPLUS returns at most ``page_entries`` entries per reply (so clients
must page); READ returns at most ``max_read`` bytes (short reads); ``counts`` holds the calls
served per procedure name. Files may be changed after start (``files[path] = ...``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter

from nfsproto import mount3, nfs3, rpc
from nfsproto.nfs3 import Fattr3, Ftype3, NfsStat3, NfsTime3, Specdata3
from nfsproto.xdr import Reader, Writer

ROOT = b"h"
T0 = NfsTime3(1_700_000_000, 0)


class FakeNfsServer:
    def __init__(
        self,
        files: dict[str, bytes],
        *,
        page_entries: int = 4,
        max_read: int = 1 << 20,
        handles_in_readdir: bool = True,
    ) -> None:
        self.files = files
        self.page_entries = page_entries
        self.max_read = max_read
        self.handles_in_readdir = handles_in_readdir
        self.counts: Counter[str] = Counter()
        self.port = 0
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        return f"nfs://127.0.0.1:{self.port}/data"

    async def start(self) -> FakeNfsServer:
        self._server = await asyncio.start_server(self._conn, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            for w in list(self._conns):
                w.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    # ----------------------------------------------------------------- the tree

    def _dirs(self) -> set[str]:
        out = {""}
        for p in self.files:
            parts = p.split("/")
            for i in range(1, len(parts)):
                out.add("/".join(parts[:i]))
        return out

    def _attr(self, path: str) -> Fattr3 | None:
        if path in self.files:
            size, t, mode = len(self.files[path]), Ftype3.NF3REG, 0o644
        elif path in self._dirs():
            size, t, mode = 4096, Ftype3.NF3DIR, 0o755
        else:
            return None
        fid = abs(hash(path)) & 0xFFFFFFFF
        return Fattr3(t, mode, 1, 0, 0, size, size, Specdata3(0, 0), 1, fid, T0, T0, T0)

    def _children(self, d: str) -> list[str]:
        lead = d + "/" if d else ""
        names = set()
        for p in list(self.files) + list(self._dirs()):
            if p and p.startswith(lead) and p != d:
                names.add(p[len(lead) :].split("/", 1)[0])
        return sorted(names)

    @staticmethod
    def _path(fh: bytes) -> str:
        return fh[1:].decode()

    # ----------------------------------------------------------------- transport

    async def _conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._conns.add(writer)
        records = rpc.RecordReader()
        try:
            while data := await reader.read(1 << 20):
                for rec in records.feed(data):
                    r = Reader(bytes(rec))
                    call = rpc.unpack_call(r)
                    w = Writer()
                    rpc.pack_success_header(w, call.xid)
                    self._dispatch(call, r, w)
                    writer.writelines(rpc.frame(w.buffers()))
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            self._conns.discard(writer)
            writer.close()

    def _dispatch(self, call: rpc.CallHeader, r: Reader, w: Writer) -> None:
        if call.prog == mount3.PROGRAM:
            self.counts["MNT"] += 1
            args = mount3.unpack_mnt3args(r)
            ok = args.dirpath == b"/data"
            mst = mount3.MountStat3.MNT3_OK if ok else mount3.MountStat3.MNT3ERR_NOENT
            mount3.pack_mnt3res(w, mount3.Mnt3Res(mst, ROOT if ok else b"", [1]))
            return
        proc = nfs3.Nfs3Proc(call.proc)
        self.counts[proc.name] += 1
        if proc == nfs3.Nfs3Proc.FSINFO:
            a = nfs3.unpack_fsinfo3args(r)
            nfs3.pack_fsinfo3res(
                w,
                nfs3.Fsinfo3Res(
                    NfsStat3.NFS3_OK,
                    self._attr(self._path(a.fsroot)),
                    rtmax=1 << 20,
                    rtpref=1 << 20,
                    rtmult=4096,
                    wtmax=1 << 20,
                    wtpref=1 << 20,
                    wtmult=4096,
                    dtpref=65536,
                    maxfilesize=1 << 40,
                ),
            )
        elif proc == nfs3.Nfs3Proc.GETATTR:
            g = nfs3.unpack_getattr3args(r)
            attr = self._attr(self._path(g.object))
            st = NfsStat3.NFS3_OK if attr else NfsStat3.NFS3ERR_STALE
            nfs3.pack_getattr3res(w, nfs3.Getattr3Res(st, attr))
        elif proc == nfs3.Nfs3Proc.ACCESS:
            ac = nfs3.unpack_access3args(r)
            attr = self._attr(self._path(ac.object))
            nfs3.pack_access3res(w, nfs3.Access3Res(NfsStat3.NFS3_OK, attr, ac.access))
        elif proc == nfs3.Nfs3Proc.LOOKUP:
            lk = nfs3.unpack_lookup3args(r)
            d = self._path(lk.what.dir)
            path = f"{d}/{lk.what.name.decode()}" if d else lk.what.name.decode()
            attr = self._attr(path)
            if attr is None:
                nfs3.pack_lookup3res(w, nfs3.Lookup3Res(NfsStat3.NFS3ERR_NOENT))
            else:
                res = nfs3.Lookup3Res(NfsStat3.NFS3_OK, b"h" + path.encode(), attr)
                nfs3.pack_lookup3res(w, res)
        elif proc == nfs3.Nfs3Proc.READ:
            rd = nfs3.unpack_read3args(r)
            body = self.files[self._path(rd.file)]
            n = min(rd.count, self.max_read)
            data = body[rd.offset : rd.offset + n]
            eof = rd.offset + len(data) >= len(body)
            res3 = nfs3.Read3Res(NfsStat3.NFS3_OK, None, len(data), eof, data)
            nfs3.pack_read3res(w, res3)
        elif proc == nfs3.Nfs3Proc.READDIRPLUS:
            rp = nfs3.unpack_readdirplus3args(r)
            d = self._path(rp.dir)
            names = self._children(d)
            start = rp.cookie
            page = names[start : start + self.page_entries]
            entries = []
            for i, name in enumerate(page, start=start + 1):
                path = f"{d}/{name}" if d else name
                fh = b"h" + path.encode() if self.handles_in_readdir else None
                entries.append(nfs3.Entryplus3(i, name.encode(), i, self._attr(path), fh))
            eof = start + len(page) >= len(names)
            nfs3.pack_readdirplus3res(
                w,
                nfs3.Readdirplus3Res(NfsStat3.NFS3_OK, self._attr(d), b"v" * 8, entries, eof),
            )
        else:
            raise AssertionError(f"unexpected {proc.name}")
