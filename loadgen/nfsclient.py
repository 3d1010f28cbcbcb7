"""A small asyncio NFSv3 client on nfsproto that works against any NFSv3 server over TCP.

Owns: ``nfs://`` target URLs, finding the NFS and MOUNT ports (given, or from the portmapper),
MOUNT, FSINFO, and typed calls for the procedures a training data loader issues (GETATTR,
LOOKUP, ACCESS, READ, READDIRPLUS) with a per-call timeout and client-side counts per
procedure. Several connections (``nconnect``) are used round-robin, like the Linux client's
``nconnect=`` option. Must not: know about datasets, epochs or reports.

A non-OK ``nfsstat3`` raises ``NfsError``; an RPC-level rejection raises ``RpcError``; a call
that takes longer than ``timeout_s`` raises ``TimeoutError``.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import parse_qsl, unquote, urlsplit

from gateway.pmap_client import getport
from gateway.rpcclient import RpcClient
from nfsproto import mount3, nfs3, rpc
from nfsproto.client import (
    MOUNT_MNT,
    NFS3_ACCESS,
    NFS3_FSINFO,
    NFS3_GETATTR,
    NFS3_LOOKUP,
    NFS3_READ,
    NFS3_READDIRPLUS,
    CallSpec,
    RpcError,
)
from nfsproto.nfs3 import NfsStat3
from nfsproto.xdr import Buffer

__all__ = [
    "NfsClient",
    "NfsError",
    "NfsUrl",
    "RpcError",
    "ACCESS_FILE_READ",
    "ACCESS_DIR",
]

PMAP_PORT = 111
# What the Linux client asks on open(O_RDONLY) of a regular file and on a directory.
ACCESS_FILE_READ = (
    nfs3.ACCESS3_READ | nfs3.ACCESS3_MODIFY | nfs3.ACCESS3_EXTEND | nfs3.ACCESS3_EXECUTE
)
ACCESS_DIR = (
    nfs3.ACCESS3_READ
    | nfs3.ACCESS3_LOOKUP
    | nfs3.ACCESS3_MODIFY
    | nfs3.ACCESS3_EXTEND
    | nfs3.ACCESS3_DELETE
)

A = TypeVar("A")
R = TypeVar("R")


class NfsError(Exception):
    """A procedure answered with a status other than NFS3_OK."""

    def __init__(self, proc: str, status: int, what: str = "") -> None:
        try:
            name = NfsStat3(status).name
        except ValueError:
            name = str(status)
        super().__init__(f"{proc}{' ' + what if what else ''}: {name}")
        self.proc = proc
        self.status = status


@dataclass(frozen=True, slots=True)
class NfsUrl:
    """``nfs://HOST[:PORT]/EXPORT[?mountport=N]``. Without a port, the portmapper on
    ``HOST:111`` is asked for both; with a port, MOUNT is expected on the same port unless
    ``mountport`` says otherwise (nfsgw serves NFS, MOUNT and PORTMAP on one port)."""

    host: str
    port: int | None
    export: str
    mount_port: int | None = None

    @classmethod
    def parse(cls, url: str) -> NfsUrl:
        parts = urlsplit(url)
        if parts.scheme != "nfs" or not parts.hostname:
            raise ValueError(f"{url!r}: expected nfs://HOST[:PORT]/EXPORT")
        export = unquote(parts.path) or "/"
        q = dict(parse_qsl(parts.query))
        unknown = set(q) - {"mountport"}
        if unknown:
            raise ValueError(f"{url!r}: unknown option(s) {', '.join(sorted(unknown))}")
        mport = int(q["mountport"]) if "mountport" in q else None
        return cls(parts.hostname, parts.port, export, mport)

    def __str__(self) -> str:
        port = f":{self.port}" if self.port is not None else ""
        q = f"?mountport={self.mount_port}" if self.mount_port is not None else ""
        return f"nfs://{self.host}{port}{self.export}{q}"


class NfsClient:
    """A mounted export. Create with ``await NfsClient.connect(url)``; ``root`` is the export's
    root handle; ``counts`` holds the calls made per procedure name."""

    def __init__(
        self,
        url: NfsUrl,
        conns: list[RpcClient],
        root: bytes,
        fsinfo: nfs3.Fsinfo3Res,
        *,
        timeout_s: float,
    ) -> None:
        self.url = url
        self._conns = conns
        self._next = itertools.cycle(range(len(conns)))
        self.root = root
        self.fsinfo = fsinfo
        self.timeout_s = timeout_s
        self.counts: Counter[str] = Counter()

    @classmethod
    async def connect(
        cls,
        url: str | NfsUrl,
        *,
        nconnect: int = 1,
        uid: int = 0,
        gid: int = 0,
        machine: bytes = b"nfsgw-loadgen",
        timeout_s: float = 60.0,
    ) -> NfsClient:
        u = NfsUrl.parse(url) if isinstance(url, str) else url
        if nconnect < 1:
            raise ValueError("nconnect must be >= 1")
        cred = rpc.auth_sys(uid, gid, [gid], machine)
        async with asyncio.timeout(timeout_s):
            port = u.port
            if port is None:
                port = await getport(u.host, PMAP_PORT, nfs3.PROGRAM, nfs3.VERSION)
                if not port:
                    raise ConnectionError(f"{u.host}: NFSv3 over TCP is not registered")
            mport = u.mount_port
            if mport is None:
                mport = port if u.port is not None else None
            if mport is None:
                mport = await getport(u.host, PMAP_PORT, mount3.PROGRAM, mount3.VERSION)
                if not mport:
                    raise ConnectionError(f"{u.host}: MOUNTv3 over TCP is not registered")
            mc = await RpcClient.connect(u.host, mport, cred=cred)
            try:
                res = await mc.invoke(MOUNT_MNT, mount3.Mnt3Args(u.export.encode()))
            finally:
                await mc.close()
            if res.status != mount3.MountStat3.MNT3_OK:
                raise NfsError("MNT", res.status, u.export)
            conns: list[RpcClient] = []
            try:
                for _ in range(nconnect):
                    conns.append(await RpcClient.connect(u.host, port, cred=cred))
                client = cls(
                    u, conns, res.fhandle, nfs3.Fsinfo3Res(NfsStat3.NFS3_OK), timeout_s=timeout_s
                )
                client.fsinfo = await client._fsinfo()
            except BaseException:
                for c in conns:
                    await c.close()
                raise
        return client

    async def close(self) -> None:
        for c in self._conns:
            await c.close()

    @property
    def closed(self) -> bool:
        return any(c.closed for c in self._conns)

    # ------------------------------------------------------------------ calls

    async def _call(self, spec: CallSpec[A, R], args: A) -> R:
        self.counts[spec.name] += 1
        conn = self._conns[next(self._next)] if len(self._conns) > 1 else self._conns[0]
        async with asyncio.timeout(self.timeout_s):
            return await conn.invoke(spec, args)

    async def _fsinfo(self) -> nfs3.Fsinfo3Res:
        res = await self._call(NFS3_FSINFO, nfs3.Fsinfo3Args(self.root))
        if res.status != NfsStat3.NFS3_OK:
            raise NfsError("FSINFO", res.status)
        return res

    async def getattr(self, fh: bytes) -> nfs3.Fattr3:
        res = await self._call(NFS3_GETATTR, nfs3.Getattr3Args(fh))
        if res.status != NfsStat3.NFS3_OK or res.obj_attributes is None:
            raise NfsError("GETATTR", res.status)
        return res.obj_attributes

    async def lookup(self, dir_fh: bytes, name: bytes) -> tuple[bytes, nfs3.Fattr3 | None]:
        res = await self._call(NFS3_LOOKUP, nfs3.Lookup3Args(nfs3.Diropargs3(dir_fh, name)))
        if res.status != NfsStat3.NFS3_OK:
            raise NfsError("LOOKUP", res.status, name.decode(errors="replace"))
        return res.object, res.obj_attributes

    async def access(self, fh: bytes, mask: int) -> int:
        res = await self._call(NFS3_ACCESS, nfs3.Access3Args(fh, mask))
        if res.status != NfsStat3.NFS3_OK:
            raise NfsError("ACCESS", res.status)
        return res.access

    async def read(self, fh: bytes, offset: int, count: int) -> tuple[Buffer, bool]:
        """(data, eof). ``data`` may be shorter than ``count`` (a short read)."""
        res = await self._call(NFS3_READ, nfs3.Read3Args(fh, offset, count))
        if res.status != NfsStat3.NFS3_OK:
            raise NfsError("READ", res.status)
        return res.data, res.eof

    async def readdirplus(
        self, dir_fh: bytes, *, maxcount: int = 65536, max_calls: int = 1_000_000
    ) -> list[nfs3.Entryplus3]:
        """Every entry of a directory ("." and ".." included when the server sends them),
        cookie by cookie like the Linux client, which sends ``dircount = maxcount`` (Linux 6.1,
        ``tests/data/readdirplus_call.bin``). Bounded by ``max_calls`` replies."""
        out: list[nfs3.Entryplus3] = []
        cookie = 0
        verf = b"\0" * nfs3.NFS3_COOKIEVERFSIZE
        for _ in range(max_calls):
            res = await self._call(
                NFS3_READDIRPLUS, nfs3.Readdirplus3Args(dir_fh, cookie, verf, maxcount, maxcount)
            )
            if res.status != NfsStat3.NFS3_OK:
                raise NfsError("READDIRPLUS", res.status)
            out.extend(res.entries)
            if res.eof:
                return out
            if not res.entries:
                raise NfsError("READDIRPLUS", NfsStat3.NFS3ERR_SERVERFAULT, "no entries, no eof")
            cookie = res.entries[-1].cookie
            verf = res.cookieverf
        raise NfsError("READDIRPLUS", NfsStat3.NFS3ERR_SERVERFAULT, f"over {max_calls} replies")
