"""A packed immutable export answers listings from its index from the first call:
listings asked for while the index loads wait for it and then cost 0 LISTs; readiness
(``/readyz``, ``READY=1``) follows the index; an index that does not come is waited for
``PackConfig.index_wait_s`` only, then listings go to the bucket and one line says so."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from structlog.testing import capture_logs

from gateway.backend.memory import MemoryStore
from gateway.exports import ExportConfig
from gateway.pack.format import INDEX_NAME
from gateway.pack.store import PackConfig, PackedStore
from nfsproto.nfs3 import NfsStat3
from tests.harness.memory import MemoryGateway, gateway_config
from tests.harness.stores import Gate, GatedStore
from tests.unit.gateway.test_pack_store import PACK, read_tree, tree, write_pack
from tests.unit.ops.helpers import Http, admin_config


def slow_gateway(tmp_path: Path, store: GatedStore, wait_s: float) -> tuple[MemoryGateway, Gate]:
    """The in-memory gateway over ``store``, whose pack index (its HEAD and GETs) is held
    back until the gate returned opens."""
    gate = store.hold(("head", "get"), lambda key: key.endswith(INDEX_NAME))
    ec = ExportConfig("/data", "s3://b/ds/", read_only=True, immutable=True, pack=PACK)
    cfg = gateway_config(tmp_path / "state", [ec], admin=admin_config())
    gw = MemoryGateway(cfg, store=store)
    gw.server.pack_config = PackConfig(index_wait_s=wait_s)
    return gw, gate


def packed(gw: MemoryGateway) -> PackedStore:
    store = gw.export("/data").store
    assert isinstance(store, PackedStore)
    return store


def announced(gw: MemoryGateway) -> bool:
    """Whether READY=1 was sent."""
    return gw.server.announced


def lists(store: MemoryStore) -> list[str]:
    """LISTs of the export's tree (not of the pack's shards, which loading it lists)."""
    return [k for op, k in store.log if op == "list" and k.startswith("ds/")]


async def list_classes(gw: MemoryGateway) -> list[Any]:
    """What a client does once mounted: READDIRPLUS of the root, then of each class folder."""
    root = await gw.mount(b"/data")
    out = [await gw.readdirplus(root)]
    for c in range(4):
        out.append(await gw.readdirplus(await gw.walk(root, f"c{c}")))
    return out


async def test_listings_while_the_index_loads_wait_for_it(tmp_path: Path) -> None:
    files = tree()
    store = GatedStore("mem")
    for k, v in files.items():
        store.seed(k, v)
    write_pack(store, files)
    store.reset_counts()
    gw, gate = slow_gateway(tmp_path, store, wait_s=30.0)
    async with gw:
        pack = packed(gw)
        http = Http(gw.server.metrics_port)
        # mounted as the gateway started: the listings wait, none goes to the bucket
        client = asyncio.create_task(list_classes(gw))
        await asyncio.sleep(0.2)
        assert not client.done() and pack.pending and pack.listings_waited >= 1
        assert not announced(gw)  # READY=1 waits for the index too
        status, body = await http.json("GET", "/readyz")
        assert status == 503 and body["reason"] == "/data: pack index loading"
        assert body["packs"] == {"/data": "loading"}
        store.reset_counts()  # (the LIST /readyz sends to probe the bucket)
        gate.open()
        async with asyncio.timeout(10):
            answers = await client
        assert all(a.status == NfsStat3.NFS3_OK for a in answers)
        assert lists(store) == []  # the root and the class folders from the index: 0 LISTs
        assert (pack.status, pack.pending) == ("ok", False)
        status, body = await http.json("GET", "/readyz")
        assert status == 200 and body["packs"] == {"/data": "ok"}
        async with asyncio.timeout(5):
            while not announced(gw):  # noqa: ASYNC110 - READY=1 is sent by a task
                await asyncio.sleep(0.01)
        await read_tree(gw, files)
        assert lists(store) == []
        await http.close()


async def test_an_index_that_does_not_come_is_waited_for_a_bounded_time(tmp_path: Path) -> None:
    files = tree(40)
    store = GatedStore("mem")
    for k, v in files.items():
        store.seed(k, v)
    write_pack(store, files)
    store.reset_counts()
    gw, gate = slow_gateway(tmp_path, store, wait_s=0.3)
    with capture_logs() as logs:
        async with gw:
            pack = packed(gw)
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            async with asyncio.timeout(10):
                answers = await list_classes(gw)
            assert all(a.status == NfsStat3.NFS3_OK for a in answers)
            assert loop.time() - t0 < 0.3 + 2.0  # waited the bound, not more
            assert lists(store)  # from the bucket, as without a pack
            (gave_up,) = [e for e in logs if e["event"] == "pack_index_wait_gave_up"]
            assert gave_up["log_level"] == "error" and gave_up["pack"] == PACK
            assert gave_up["waited_s"] == 0.3 and "from the bucket" in gave_up["consequence"]
            assert pack.status.startswith("loading; not waited for after 0.3 s")
            assert not pack.pending  # readiness no longer waits
            http = Http(gw.server.metrics_port)
            assert (await http.json("GET", "/readyz"))[0] == 200
            # the index arrives later: it is used from then on
            gate.open()
            async with asyncio.timeout(10):
                while pack.status != "ok":  # noqa: ASYNC110 - the index loads in a task
                    await asyncio.sleep(0.01)
            await read_tree(gw, files)
            await http.close()
