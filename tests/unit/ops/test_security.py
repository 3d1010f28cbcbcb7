"""Export security through MOUNT and NFS calls: client lists (MNT3ERR_ACCES at mount,
NFS3ERR_ACCES on every call with the export's handles), squashing on every procedure (ACCESS,
LOOKUP, READDIRPLUS, READ and the mutating ones), handles that cannot reach another export
(".." stops at the root, RENAME/LINK across exports are XDEV), called straight into the
dispatcher from 127.0.0.1 (``tests.harness.memory``); over real TCP the privileged-port
rule, rule changes by reload applying to the next call on the same connection, and what is
logged per connection."""

from __future__ import annotations

import dataclasses
import io
import ipaddress
import json
import os
from pathlib import Path
from typing import Any

import pytest
import structlog

from gateway.exports import ExportConfig
from gateway.ops import logs
from nfsproto import mount3, nfs3, rpc
from nfsproto.nfs3 import Nfs3Proc, NfsStat3
from tests.harness.memory import MemoryGateway, cred

ACCES = NfsStat3.NFS3ERR_ACCES
OK = NfsStat3.NFS3_OK
LOCAL = (ipaddress.ip_network("127.0.0.0/8"),)
ELSEWHERE = (ipaddress.ip_network("10.9.9.9/32"),)


EXPORTS = ("/data", "/other", "/private", "/team", "/secure")
FILES = {
    f"{p.strip('/')}/{k}": v
    for p in EXPORTS
    for k, v in (("d/f.bin", b"x" * 100), ("top.txt", b"top"))
}


def gateway(tmp_path: Path, cfgs: list[ExportConfig] | None = None, **kw: Any) -> MemoryGateway:
    return MemoryGateway.of(tmp_path, exports() if cfgs is None else cfgs, **kw)


def exports() -> list[ExportConfig]:
    return [
        # reached over TCP from unprivileged ports too (test_secure_port): says so
        ExportConfig("/data", "s3://b/data/", read_only=True, clients=LOCAL, insecure=True),
        ExportConfig("/other", "s3://b/other/", clients=LOCAL),
        # over TCP from an unprivileged port after a reload (test_reload_...): says so
        ExportConfig("/private", "s3://b/private/", clients=ELSEWHERE, insecure=True),
        # objects owned by 1000:1000, rw-r----- / rwxr-x---
        ExportConfig(
            "/team",
            "s3://b/team/",
            clients=LOCAL,
            uid=1000,
            gid=1000,
            file_mode=0o640,
            dir_mode=0o750,
            sec=("sys", "none"),  # AUTH_NONE callers are tested as nobody
        ),
        ExportConfig("/secure", "s3://b/secure/", clients=LOCAL),  # secure: the default
    ]


async def test_clients_mount_and_every_call(tmp_path: Path) -> None:
    async with gateway(tmp_path, files=FILES) as c:
        server = c.server
        # MNT of a denied export, and of a directory inside it: MNT3ERR_ACCES
        for path in (b"/private", b"/private/d"):
            assert (await c.mnt(path)).status == mount3.MountStat3.MNT3ERR_ACCES
        assert server.gateway is not None
        assert server.gateway.stats.mounts_denied == 2
        root = await c.mount(b"/data")
        # a handle of the denied export (as a client allowed earlier would hold): every NFS
        # procedure that takes a handle answers NFS3ERR_ACCES, before touching the backend
        gw = server.gateway
        private = gw.by_path["/private"]
        pfh = gw.handle_for(private, "")
        ffh = gw.handle_for(private, "d/f.bin")
        before = len(c.store.log)
        calls = {
            Nfs3Proc.GETATTR: nfs3.Getattr3Args(pfh),
            Nfs3Proc.LOOKUP: nfs3.Lookup3Args(nfs3.Diropargs3(pfh, b"d")),
            Nfs3Proc.ACCESS: nfs3.Access3Args(pfh, 0x3F),
            Nfs3Proc.READ: nfs3.Read3Args(ffh, 0, 10),
            Nfs3Proc.READDIR: nfs3.Readdir3Args(pfh, 0, bytes(8), 4096),
            Nfs3Proc.READDIRPLUS: nfs3.Readdirplus3Args(pfh, 0, bytes(8), 4096, 4096),
            Nfs3Proc.READLINK: nfs3.Readlink3Args(ffh),
            Nfs3Proc.FSSTAT: nfs3.Fsstat3Args(pfh),
            Nfs3Proc.FSINFO: nfs3.Fsinfo3Args(pfh),
            Nfs3Proc.PATHCONF: nfs3.Pathconf3Args(pfh),
            Nfs3Proc.SETATTR: nfs3.Setattr3Args(ffh, nfs3.Sattr3(), None),
            Nfs3Proc.WRITE: nfs3.Write3Args(ffh, 0, 1, nfs3.StableHow.UNSTABLE, b"y"),
            Nfs3Proc.CREATE: nfs3.Create3Args(
                nfs3.Diropargs3(pfh, b"n"),
                nfs3.CreateHow3(nfs3.CreateMode3.UNCHECKED, nfs3.Sattr3()),
            ),
            Nfs3Proc.REMOVE: nfs3.Remove3Args(nfs3.Diropargs3(pfh, b"top.txt")),
            Nfs3Proc.COMMIT: nfs3.Commit3Args(ffh, 0, 0),
        }
        for proc, args in calls.items():
            res = await c.nfs(proc, args)
            assert res.status == ACCES, proc
        assert not [k for _, k in c.store.log[before:] if k.startswith("private/")]
        assert gw.stats.clients_denied == len(calls)
        # the allowed export still works for the same client
        assert (await c.lookup(root, b"top.txt")).status == OK


@pytest.mark.skipif(os.geteuid() != 0, reason="binding a source port below 1024 needs root")
async def test_secure_port(tmp_path: Path) -> None:
    async with gateway(tmp_path, files=FILES) as g:
        server = g.server
        c = await g.connect()
        assert (await c.mnt(b"/secure")).status == mount3.MountStat3.MNT3ERR_ACCES
        assert (await c.mnt(b"/data")).status == mount3.MountStat3.MNT3_OK
        gw = server.gateway
        assert gw is not None
        fh = gw.handle_for(gw.by_path["/secure"], "")
        assert (await c.getattr(fh)).status == ACCES
        await c.close()
        for port in range(700, 1000):
            try:
                p = await g.connect(source_port=port)
                break
            except OSError:
                continue
        root = await p.mount(b"/secure")
        assert (await p.getattr(root)).status == OK
        assert (await p.lookup(root, b"top.txt")).status == OK
        await p.close()


async def test_squash_applies_to_every_procedure(tmp_path: Path) -> None:
    async with gateway(tmp_path, files=FILES) as g:
        # root is squashed to nobody (65534): "other" bits of 0750/0640 grant nothing
        root_c = g.client()
        troot = await root_c.mount(b"/team")
        assert (await root_c.lookup(troot, b"top.txt")).status == ACCES
        assert (await root_c.readdirplus(troot)).status == ACCES
        acc = await root_c.access(troot)
        assert acc.status == OK and acc.access == 0
        # handles come from an allowed identity; the squashed caller still cannot READ
        owner = g.client(cred(1000, 1000))
        d = await owner.lookup(troot, b"d")
        f = await owner.lookup(d.object, b"f.bin")
        assert d.status == OK and f.status == OK
        assert (await owner.readdirplus(d.object)).status == OK
        assert (await owner.read(f.object)).status == OK
        assert (await root_c.read(f.object)).status == ACCES
        assert (await root_c.lookup(d.object, b"f.bin")).status == ACCES
        # group member (primary or supplementary gid 1000): r-x on dirs, r-- on files
        for ident in (cred(2000, 1000), cred(2000, 5, [7, 1000])):
            m = g.client(ident)
            assert (await m.lookup(d.object, b"f.bin")).status == OK
            assert (await m.read(f.object)).status == OK
            acc = await m.access(f.object)
            assert acc.access == nfs3.ACCESS3_READ
        # a stranger: nothing
        s = g.client(cred(3000, 3000))
        assert (await s.read(f.object)).status == ACCES
        assert (await s.readdirplus(d.object)).status == ACCES
        # AUTH_NONE is nobody
        n = g.client(rpc.NULL_AUTH)
        assert (await n.read(f.object)).status == ACCES
        assert g.gateway.stats.permission_denied == 7


async def test_squash_modes(tmp_path: Path) -> None:
    base = exports()[3]  # /team: 1000:1000 0640/0750
    cfgs = [
        dataclasses.replace(base, path="/none", backend="s3://b/none/", squash="none"),
        dataclasses.replace(
            base, path="/all", backend="s3://b/all/", squash="all", anonuid=1000, anongid=1000
        ),
        # uid 5 with primary gid 0 on objects of group 0: root_squash maps gid 0 too
        dataclasses.replace(
            base, path="/gid0", backend="s3://b/gid0/", uid=1, gid=0, squash="root"
        ),
    ]
    files = {f"{p}/f.bin": b"abc" for p in ("none", "all", "gid0")}
    async with gateway(tmp_path, cfgs, files=files) as g:
        root_c = g.client()
        r = await root_c.mount(b"/none")  # no_root_squash: root reads anything
        f = await root_c.lookup(r, b"f.bin")
        assert f.status == OK and (await root_c.read(f.object)).status == OK
        # all_squash: every caller, root or AUTH_NONE or anyone, is anonuid 1000 = the owner
        for ident in (rpc.auth_sys(0, 0, [0], b"r"), cred(4242, 4242), rpc.NULL_AUTH):
            cl = g.client(ident)
            a = await cl.mount(b"/all")
            f = await cl.lookup(a, b"f.bin")
            assert f.status == OK and (await cl.read(f.object)).status == OK, ident
        cl = g.client(cred(5, 0))
        g0 = await cl.mount(b"/gid0")
        assert (await cl.lookup(g0, b"f.bin")).status == ACCES  # gid 0 squashed to 65534
        ok = g.client(cred(5, 0))
        none_squash = g.export("/gid0")
        none_squash.cfg = dataclasses.replace(none_squash.cfg, squash="none")
        assert (await ok.lookup(g0, b"f.bin")).status == OK  # gid 0 kept: group r-x


async def test_handles_cannot_reach_another_export(tmp_path: Path) -> None:
    async with gateway(tmp_path, files=FILES) as c:
        data = await c.mount(b"/data")
        other = await c.mount(b"/other")
        # ".." of an export root is the root itself
        up = await c.lookup(data, b"..")
        assert up.status == OK
        assert up.obj_attributes.fileid == (await c.getattr(data)).obj_attributes.fileid
        listing = await c.readdirplus(data)
        assert [e.name for e in listing.entries] == [b".", b"..", b"d", b"top.txt"]
        # two handles of different exports in one call: XDEV
        ren = await c.nfs(
            Nfs3Proc.RENAME,
            nfs3.Rename3Args(nfs3.Diropargs3(other, b"top.txt"), nfs3.Diropargs3(data, b"x")),
        )
        assert ren.status == NfsStat3.NFS3ERR_XDEV
        top = await c.lookup(other, b"top.txt")
        link = await c.nfs(Nfs3Proc.LINK, nfs3.Link3Args(top.object, nfs3.Diropargs3(data, b"x")))
        # (LINK is never supported; across exports it must fail whichever check comes first)
        assert link.status in (NfsStat3.NFS3ERR_XDEV, NfsStat3.NFS3ERR_ROFS)
        # a handle whose export id was tampered with fails its MAC
        forged = bytearray(data)
        forged[2:4] = (await c.mount(b"/other"))[2:4]
        assert (await c.getattr(bytes(forged))).status == NfsStat3.NFS3ERR_BADHANDLE


async def test_reload_changes_rules_for_the_next_call(tmp_path: Path) -> None:
    async with gateway(tmp_path, files=FILES) as g:
        cfg, server = g.server.config, g.server
        c = await g.connect()
        gw = server.gateway
        assert gw is not None
        pfh = gw.handle_for(gw.by_path["/private"], "")
        assert (await c.getattr(pfh)).status == ACCES
        opened = server.conn_stats.opened
        new = [
            dataclasses.replace(e, clients=LOCAL if e.path == "/private" else e.clients)
            for e in exports()
        ]
        new[0] = dataclasses.replace(new[0], clients=ELSEWHERE)  # /data now denied
        changes = server.apply(dataclasses.replace(cfg, exports=tuple(new)))
        assert changes["updated"] == ["/data", "/private"] and not changes["rebuilt"]
        assert (await c.getattr(pfh)).status == OK  # same connection
        assert (await c.mount(b"/private")) == pfh
        assert (await c.mnt(b"/data")).status == mount3.MountStat3.MNT3ERR_ACCES
        assert server.conn_stats.opened == opened and server.conn_stats.open == 1
        await c.close()


async def test_denials_are_logged_with_call_context_and_successes_are_not(
    tmp_path: Path,
) -> None:
    buf = io.StringIO()
    logs.configure("info", json=True, stream=buf, cache=False)
    try:
        async with gateway(tmp_path, files=FILES) as g:
            c = await g.connect()
            root = await c.mount(b"/data")
            for _ in range(5):
                assert (await c.getattr(root)).status == OK
            assert (await c.mnt(b"/private")).status == mount3.MountStat3.MNT3ERR_ACCES
            await c.close()
    finally:
        structlog.reset_defaults()
    lines = [json.loads(x) for x in buf.getvalue().splitlines()]
    events = [x["event"] for x in lines]
    (denied,) = [x for x in lines if x["event"] == "mount_denied"]
    assert denied["proc"] == "MOUNT3.MNT" and denied["client"] == "127.0.0.1"
    assert isinstance(denied["xid"], int) and denied["level"] == "warning"
    assert "not in the clients" in denied["reason"] and denied["path"] == "/private"
    # one line per connection open/close and per directory prefetch; none per call
    assert events.count("connection_opened") == 1 and events.count("connection_closed") == 1
    per_call = [x for x in lines if "xid" in x and x["event"] != "mount_denied"]
    assert all(x["event"] == "dir_prefetched" for x in per_call), per_call
    assert len(lines) < 10


async def test_squash_applies_to_mutating_procedures(tmp_path: Path) -> None:
    cfgs = [
        # directories 0755 owned by root: only an unsquashed root may create
        ExportConfig("/rw", "s3://b/rw/", clients=LOCAL),
        ExportConfig("/rwnone", "s3://b/rwnone/", clients=LOCAL, squash="none"),
        # everyone is 1000:1000, the owner of the objects
        ExportConfig(
            "/rwall",
            "s3://b/rwall/",
            clients=LOCAL,
            squash="all",
            anonuid=1000,
            anongid=1000,
            uid=1000,
            gid=1000,
        ),
    ]
    files = {f"{p}/old.txt": b"old" for p in ("rw", "rwnone", "rwall")}
    how = nfs3.CreateHow3(nfs3.CreateMode3.UNCHECKED, nfs3.Sattr3())
    async with gateway(tmp_path, cfgs, files=files) as c:  # uid 0
        results = {}
        for path in (b"/rw", b"/rwnone", b"/rwall"):
            root = await c.mount(path)
            cr = await c.nfs(Nfs3Proc.CREATE, nfs3.Create3Args(nfs3.Diropargs3(root, b"new"), how))
            rm = await c.nfs(Nfs3Proc.REMOVE, nfs3.Remove3Args(nfs3.Diropargs3(root, b"old.txt")))
            md = await c.nfs(
                Nfs3Proc.MKDIR, nfs3.Mkdir3Args(nfs3.Diropargs3(root, b"sub"), nfs3.Sattr3())
            )
            results[path] = (cr, rm, md)
        assert [r.status for r in results[b"/rw"]] == [ACCES] * 3
        assert [r.status for r in results[b"/rwnone"]] == [OK] * 3
        assert [r.status for r in results[b"/rwall"]] == [OK] * 3
        # what root created on an all_squash export belongs to the mapped identity
        created = results[b"/rwall"][0]
        assert created.obj_attributes.uid == 1000 and created.obj_attributes.gid == 1000
        none_created = results[b"/rwnone"][0]
        assert none_created.obj_attributes.uid == 0
