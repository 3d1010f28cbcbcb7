"""The duplicate-request cache over real TCP: a client that loses its
connection re-sends its outstanding calls with the same XIDs and bytes on a new connection
(from a new source port); REMOVE and RENAME must not run twice.

- Connection 1: CREATE a file, REMOVE it, RENAME another; connection 2: the identical REMOVE
  and RENAME records -> byte for byte the original replies (NFS3_OK), and the store saw one
  DELETE of the removed file and one COPY of the renamed one.
- A different REMOVE reusing an XID (other arguments) is executed.
- A retransmission that arrives while the original still runs (its connection closed
  mid-call) waits for it and gets its reply; the removal happens once.
- A flood of distinct calls keeps the cache within its entry and byte bounds.

The gateway is the in-process one over a memory store (``tests.harness.memory``), listening on
127.0.0.1; the calls are hand-built records on raw sockets, so XIDs and bytes are ours.
"""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path
from typing import Any

from gateway.backend.memory import MemoryStore
from gateway.exports import ExportConfig
from nfsproto import nfs3, rpc
from nfsproto.client import decode_result
from nfsproto.nfs3 import CreateHow3, CreateMode3, Diropargs3, Nfs3Proc, NfsStat3, Sattr3
from nfsproto.xdr import Writer
from tests.harness.memory import ROOT, MemoryGateway
from tests.harness.stores import GatedStore

EXPORTS = [ExportConfig("/data", "s3://bkt/ds/", squash="none", insecure=True)]
OK = NfsStat3.NFS3_OK
TIMEOUT_S = 30.0  # a bound on waits for the gateway (never reached when it works)


class RawConn:
    """One TCP connection carrying hand-built call records."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.records = rpc.RecordReader(1 << 20)
        self.pending: list[bytes] = []

    @classmethod
    async def open(cls, port: int) -> RawConn:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        return cls(reader, writer)

    async def send(self, record: bytes) -> None:
        self.writer.writelines(rpc.frame([record]))
        await self.writer.drain()

    async def reply(self) -> bytes:
        async with asyncio.timeout(TIMEOUT_S):
            while not self.pending:
                data = await self.reader.read(1 << 16)
                assert data, "the gateway closed the connection"
                self.pending.extend(bytes(r) for r in self.records.feed(data))
        return self.pending.pop(0)

    async def call(self, record: bytes) -> bytes:
        await self.send(record)
        return await self.reply()

    def abort(self) -> None:
        self.writer.transport.abort()

    async def close(self) -> None:
        self.writer.close()
        await self.writer.wait_closed()


def record(xid: int, proc: Nfs3Proc, args: Any) -> bytes:
    w = Writer()
    rpc.pack_call(w, xid, nfs3.PROGRAM, nfs3.VERSION, proc, ROOT)
    nfs3.PROCS[proc].pack_args(w, args)
    return w.getvalue()


def result(proc: Nfs3Proc, reply: bytes) -> Any:
    return decode_result(reply, nfs3.PROCS[proc].unpack_res)


def remove(xid: int, d: bytes, name: bytes) -> bytes:
    return record(xid, Nfs3Proc.REMOVE, nfs3.Remove3Args(Diropargs3(d, name)))


def ops(store: MemoryStore, op: str, key: str) -> int:
    return sum(1 for o, k in store.log if o == op and k == key)


async def test_replayed_remove_and_rename_get_the_original_replies(tmp_path: Path) -> None:
    files = {"ds/other.jpg": b"x" * 100, "ds/d.jpg": b"d"}
    async with MemoryGateway.of(tmp_path, EXPORTS, files=files) as gw:
        root = await gw.mount(b"/data")
        store = gw.store
        c1 = await RawConn.open(gw.port)
        how = CreateHow3(CreateMode3.UNCHECKED, Sattr3(mode=0o644))
        create = record(0x5000, Nfs3Proc.CREATE, nfs3.Create3Args(Diropargs3(root, b"a"), how))
        assert result(Nfs3Proc.CREATE, await c1.call(create)).status == OK
        rm = remove(0x5001, root, b"a")
        mv = record(
            0x5002,
            Nfs3Proc.RENAME,
            nfs3.Rename3Args(Diropargs3(root, b"other.jpg"), Diropargs3(root, b"moved.jpg")),
        )
        rm_reply = await c1.call(rm)
        mv_reply = await c1.call(mv)
        assert result(Nfs3Proc.REMOVE, rm_reply).status == OK
        assert result(Nfs3Proc.RENAME, mv_reply).status == OK
        await c1.close()

        # The client reconnects (another source port) and re-sends both calls.
        c2 = await RawConn.open(gw.port)
        assert await c2.call(rm) == rm_reply
        assert await c2.call(mv) == mv_reply
        assert ops(store, "delete", "ds/a") == 1
        assert ops(store, "copy", "ds/other.jpg") == 1
        assert sorted(store.keys()) == ["ds/d.jpg", "ds/moved.jpg"]
        assert gw.server.drc.stats.hits == 2

        # The same XID with other arguments is another call: it runs.
        other = await c2.call(remove(0x5001, root, b"d.jpg"))
        assert result(Nfs3Proc.REMOVE, other).status == OK
        assert ops(store, "delete", "ds/d.jpg") == 1
        assert store.keys() == ["ds/moved.jpg"]
        assert gw.server.drc.stats.hits == 2
        totals = gw.server.metrics.totals("drc")
        assert totals["hits"] == 2 and totals["stored"] == 4  # CREATE, REMOVE x2, RENAME
        await c2.close()


async def test_a_replay_while_the_original_runs_waits_and_the_file_goes_once(
    tmp_path: Path,
) -> None:
    store = GatedStore("mem")
    slow = store.hold("delete", lambda key: key.endswith("slow"))
    store.seed("ds/slow", b"s")
    async with MemoryGateway.of(tmp_path, EXPORTS, store=store) as gw:
        root = await gw.mount(b"/data")
        rm = remove(0x6000, root, b"slow")
        c1 = await RawConn.open(gw.port)
        await c1.send(rm)
        async with asyncio.timeout(TIMEOUT_S):
            await slow.entered.wait()  # the DELETE is under way...
        c1.abort()  # ...when the connection drops
        c2 = await RawConn.open(gw.port)
        await c2.send(rm)
        drc = gw.server.drc
        async with asyncio.timeout(TIMEOUT_S):
            for _ in itertools.count():  # until the replay has joined the running original
                if drc.stats.waits:
                    break
                await asyncio.sleep(0.005)
        slow.open()
        reply = await c2.reply()
        assert result(Nfs3Proc.REMOVE, reply).status == OK
        assert ops(store, "delete", "ds/slow") == 1
        assert store.keys() == []
        assert drc.stats.running == 0 and drc.stats.stored == 1
        # And once more after it finished: the kept reply.
        assert await c2.call(rm) == reply
        assert ops(store, "delete", "ds/slow") == 1
        await c2.close()


async def test_a_flood_of_distinct_calls_stays_within_the_bounds(tmp_path: Path) -> None:
    max_entries, max_bytes = 32, 20 << 10
    async with MemoryGateway.of(
        tmp_path,
        EXPORTS,
        server_drc_max_entries=max_entries,
        server_drc_memory=max_bytes,
    ) as gw:
        root = await gw.mount(b"/data")
        drc = gw.server.drc
        c = await RawConn.open(gw.port)
        n = 400
        for i in range(n):
            # Distinct calls (names) answered NOENT: cheap, and kept like any reply.
            reply = await c.call(remove(0x7000 + i, root, b"missing-%d" % i))
            assert result(Nfs3Proc.REMOVE, reply).status == NfsStat3.NFS3ERR_NOENT
            assert drc.stats.entries <= max_entries
            assert drc.stats.bytes <= max_bytes
        assert drc.stats.stored == n
        assert drc.stats.evicted_space == n - drc.stats.entries
        # The newest are still answered from the cache, the oldest are gone.
        hits = drc.stats.hits
        await c.call(remove(0x7000 + n - 1, root, b"missing-%d" % (n - 1)))
        assert drc.stats.hits == hits + 1
        await c.call(remove(0x7000, root, b"missing-0"))
        assert drc.stats.hits == hits + 1
        await c.close()
