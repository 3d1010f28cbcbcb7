"""knfsd's defaults, each with its refusal (issue 37 item 4): ``secure_port`` on by default
(an unprivileged source port is refused over real TCP; ``insecure = true`` accepts it),
``sec = ["sys"]`` (AUTH_NONE answered AUTH_ERROR AUTH_TOOWEAK unless listed; MNT's
auth_flavors lists the export's ``sec``), MOUNT EXPORT and DUMP showing only what the caller
may mount (``mount_lists = "all"`` keeps the old answer), MNT of a refused export answered
exactly as MNT of a missing one; the admin API (a mutating call needs the token or the Unix
socket, a body must be ``application/json``, the Unix socket is 0660, a non-loopback listen
without a token does not start, ``nfsgw reload`` over the socket); ``check-config``'s
warning on a writable insecure export."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import ipaddress
import json
import os
import stat
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import structlog

from gateway.exports import ExportConfig
from gateway.ops import cli, logs
from gateway.ops.config import AdminConfig
from gateway.ops.configfile import Overrides, check_config
from gateway.transport import Peer
from nfsproto import mount3, rpc
from nfsproto.client import RpcError, decode_reply
from nfsproto.nfs3 import NfsStat3
from nfsproto.xdr import Reader, Writer
from tests.harness.memory import MemoryGateway, cred
from tests.unit.ops.helpers import TOKEN, Http, admin_config

OK = NfsStat3.NFS3_OK
ACCES = mount3.MountStat3.MNT3ERR_ACCES
LOCAL = (ipaddress.ip_network("127.0.0.0/8"),)
ELSEWHERE = (ipaddress.ip_network("10.9.9.0/24"),)
FILES = {f"{p}/top.txt": b"top" for p in ("data", "open", "lab", "far")}
LAB_HOST = Peer("10.9.9.7", 700, 2049)  # in ELSEWHERE, privileged port
STRANGER = Peer("192.0.2.1", 700, 2049)  # in no export's clients


def exports() -> list[ExportConfig]:
    return [
        ExportConfig("/data", "s3://b/data/", clients=LOCAL),  # every default
        ExportConfig("/open", "s3://b/open/", clients=LOCAL, insecure=True, sec=("sys", "none")),
        ExportConfig("/lab", "s3://b/lab/", clients=ELSEWHERE),
        ExportConfig("/far", "s3://b/far/", clients=ELSEWHERE),
    ]


def gateway(tmp_path: Path, **kw: Any) -> MemoryGateway:
    return MemoryGateway.of(tmp_path, exports(), files=FILES, **kw)


def test_the_defaults_are_knfsds() -> None:
    e = ExportConfig("/d", "s3://b/")
    assert e.secure_port and not e.insecure and e.secure
    assert e.sec == ("sys",) and e.flavors == (rpc.AuthFlavor.AUTH_SYS,)
    assert not dataclasses.replace(e, insecure=True).secure
    assert not dataclasses.replace(e, secure_port=False).secure
    with pytest.raises(ValueError, match="krb5"):
        ExportConfig("/d", "s3://b/", sec=("krb5",))


# -- secure_port ---------------------------------------------------------------------------


async def test_unprivileged_port_refused_by_default_allowed_with_insecure(
    tmp_path: Path,
) -> None:
    async with gateway(tmp_path) as g:
        c = await g.connect()  # an ephemeral (unprivileged) source port: real TCP
        assert (await c.mnt(b"/data")).status == ACCES
        # a handle learned elsewhere does not help either: NFS3ERR_ACCES
        assert (await c.getattr(g.export("/data").root_handle)).status == NfsStat3.NFS3ERR_ACCES
        root = await c.mount(b"/open")  # insecure = true
        assert (await c.getattr(root)).status == OK
        await c.close()
        if os.geteuid() != 0:
            return  # binding a source port below 1024 needs root
        for port in range(600, 1000):
            try:
                p = await g.connect(source_port=port)
                break
            except OSError:
                continue
        data = await p.mount(b"/data")  # the default admits a privileged port
        assert (await p.lookup(data, b"top.txt")).status == OK
        await p.close()


# -- sec ------------------------------------------------------------------------------------


async def test_auth_none_refused_unless_listed(tmp_path: Path) -> None:
    async with gateway(tmp_path) as g:
        gw = g.gateway
        sys_c, none_c = g.client(cred(1000, 1000)), g.client(rpc.NULL_AUTH)
        data, opened = await sys_c.mount(b"/data"), await sys_c.mount(b"/open")
        mnt = await sys_c.mnt(b"/data")  # RFC 1813 mountres3_ok.auth_flavors: the export's sec
        assert mnt.auth_flavors == [rpc.AuthFlavor.AUTH_SYS]
        assert (await sys_c.mnt(b"/open")).auth_flavors == [
            rpc.AuthFlavor.AUTH_SYS,
            rpc.AuthFlavor.AUTH_NONE,
        ]
        # AUTH_NONE on a sys-only export: RPC AUTH_ERROR AUTH_TOOWEAK (RFC 5531 §9), on the
        # ordinary path and the fast path alike (the GETATTR is cached after the first)
        assert (await sys_c.getattr(data)).status == OK
        for _ in range(2):
            with pytest.raises(RpcError, match="AUTH_TOOWEAK"):
                await none_c.getattr(data)
            with pytest.raises(RpcError, match="AUTH_TOOWEAK"):
                await none_c.lookup(data, b"top.txt")
        # the raw reply: MSG_DENIED, AUTH_ERROR, AUTH_TOOWEAK
        hdr, _ = await _raw_getattr(none_c, data)
        assert hdr.stat == rpc.ReplyStat.MSG_DENIED
        assert hdr.reject_stat == rpc.RejectStat.AUTH_ERROR
        assert hdr.auth_stat == rpc.AuthStat.AUTH_TOOWEAK
        # listed: served, as nobody
        assert (await none_c.getattr(opened)).status == OK
        assert (await none_c.lookup(opened, b"top.txt")).status == OK
        assert gw.stats.clients_denied == 0  # an auth refusal is not a client-list one


async def _raw_getattr(c: Any, fh: bytes) -> tuple[rpc.ReplyHeader, Reader]:
    c.xid += 1
    w = Writer()
    rpc.pack_call(w, c.xid, 100003, 3, 1, c.cred)
    w.opaque(fh)
    reply = await c.record(w.getvalue())
    assert reply is not None
    return decode_reply(reply)


# -- MOUNT: MNT, EXPORT, DUMP -----------------------------------------------------------------


async def test_mnt_of_a_refused_export_is_answered_as_a_missing_one(tmp_path: Path) -> None:
    buf = io.StringIO()
    logs.configure("info", json=True, stream=buf, cache=False)
    try:
        async with gateway(tmp_path) as g:
            c = g.client(peer=STRANGER)
            refused = await _raw_mnt(c, b"/data")
            missing = await _raw_mnt(c, b"/nowhere")
            inside = await _raw_mnt(c, b"/data/sub/dir")  # a directory of a refused export
            assert refused[4:] == missing[4:] == inside[4:]  # all but the xid
            hdr, r = decode_reply(refused)
            assert hdr.stat == rpc.ReplyStat.MSG_ACCEPTED
            assert mount3.unpack_mnt3res(r).status == ACCES
            assert g.gateway.stats.mounts_denied == 3
            # an allowed caller still learns NOENT for a missing directory of its export
            ok = g.client(peer=LAB_HOST)
            assert (await ok.mnt(b"/lab/nope")).status == mount3.MountStat3.MNT3ERR_NOENT
    finally:
        structlog.reset_defaults()
    lines = [json.loads(x) for x in buf.getvalue().splitlines()]
    denied = [x for x in lines if x["event"] == "mount_denied"]
    assert len(denied) == 3
    # the same event, level and keys for both; only the operator's reason differs
    assert {tuple(sorted(set(x) - {"timestamp", "xid"})) for x in denied} == {
        ("client", "event", "level", "path", "proc", "reason")
    }
    assert {x["level"] for x in denied} == {"warning"}


async def _raw_mnt(c: Any, path: bytes) -> bytes:
    c.xid += 1
    w = Writer()
    rpc.pack_call(w, c.xid, mount3.PROGRAM, mount3.VERSION, mount3.MountProc.MNT, c.cred)
    mount3.pack_mnt3args(w, mount3.Mnt3Args(path))
    reply = await c.record(w.getvalue())
    assert reply is not None
    return reply


async def _exports(c: Any) -> list[bytes]:
    res = await c.call(
        mount3.PROGRAM,
        mount3.VERSION,
        mount3.MountProc.EXPORT,
        lambda w, v: None,
        None,
        mount3.unpack_exports,
    )
    return [e.dir for e in res]


async def _dump(c: Any) -> list[tuple[bytes, bytes]]:
    res = await c.call(
        mount3.PROGRAM,
        mount3.VERSION,
        mount3.MountProc.DUMP,
        lambda w, v: None,
        None,
        mount3.unpack_mountlist,
    )
    return [(m.hostname, m.directory) for m in res]


async def test_export_and_dump_show_only_what_the_caller_may_mount(tmp_path: Path) -> None:
    async with gateway(tmp_path) as g:
        local, lab, stranger = g.client(), g.client(peer=LAB_HOST), g.client(peer=STRANGER)
        await local.mount(b"/data")
        await lab.mount(b"/lab")
        await lab.mount(b"/far")
        assert await _exports(local) == [b"/data", b"/open"]
        assert await _exports(lab) == [b"/far", b"/lab"]
        assert await _exports(stranger) == []
        assert await _dump(local) == [(b"127.0.0.1", b"/data")]
        assert sorted(await _dump(lab)) == [(b"10.9.9.7", b"/far"), (b"10.9.9.7", b"/lab")]
        assert await _dump(stranger) == []
        # mount_lists = "all": today's answer, every export and mount to anyone
        g.gateway.config = dataclasses.replace(g.gateway.config, mount_lists="all")
        assert await _exports(stranger) == [b"/data", b"/far", b"/lab", b"/open"]
        assert len(await _dump(stranger)) == 3


def test_mount_lists_setting_and_port_rule_in_the_file(tmp_path: Path) -> None:
    def cfg(text: str) -> Any:
        p = tmp_path / "nfsgw.toml"
        p.write_text('[admin]\nlisten = ""\n' + text)
        return check_config(p)

    base = '[[export]]\npath = "/d"\nbackend = "s3://b/"\nclients = ["10.0.0.0/8"]\n'
    r = cfg(base)
    assert r.config is not None and r.config.server.nfs.mount_lists == "allowed"
    e = r.config.exports[0]
    assert e.secure and e.sec == ("sys",)
    r = cfg('[server]\nmount_lists = "all"\n' + base)
    assert r.config is not None and r.config.server.nfs.mount_lists == "all"
    assert cfg('[server]\nmount_lists = "some"\n' + base).config is None
    # insecure is the knfsd spelling of secure_port = false; the export's own table wins
    for extra, secure in (
        ("insecure = true\n", False),
        ("secure_port = false\n", False),
        ("insecure = false\n", True),
    ):
        r = cfg(base + extra + "read_only = true\n")
        assert r.config is not None and r.config.exports[0].secure is secure, extra
    r = cfg("[export_defaults]\ninsecure = true\n" + base + "secure_port = true\n")
    assert r.config is not None and r.config.exports[0].secure
    r = cfg("[export_defaults]\ninsecure = true\n" + base + "read_only = true\n")
    assert r.config is not None and not r.config.exports[0].secure
    r = cfg(base + "insecure = true\nsecure_port = true\n")
    assert r.config is None and "contradict" in r.errors[0].message
    # --insecure (every export) wins over the file's rule, whichever name it uses
    p = tmp_path / "nfsgw.toml"
    p.write_text('[admin]\nlisten = ""\n' + base + "secure_port = true\nread_only = true\n")
    ov = Overrides(all_exports={"insecure": (True, "--insecure")})
    r = check_config(p, ov)
    assert r.config is not None and not r.config.exports[0].secure
    r = cfg(base + 'sec = ["sys", "none"]\n')
    assert r.config is not None and r.config.exports[0].sec == ("sys", "none")
    r = cfg(base + 'sec = ["krb5"]\n')
    assert r.config is None and r.errors[0].where == "export[0].sec"


# -- check-config -------------------------------------------------------------------------------


def test_check_config_warns_on_a_writable_insecure_export(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    p = tmp_path / "nfsgw.toml"
    base = '[admin]\nlisten = ""\n[[export]]\npath = "/d"\nbackend = "s3://b/"\n'
    base += 'clients = ["10.0.0.0/8"]\n'
    p.write_text(base + "insecure = true\n")
    r = check_config(p)
    (w,) = [i for i in r.warnings if "source port" in i.message]
    assert w.where == "export[0].insecure" and "writable" in w.message
    assert cli.main(["check-config", "--config", str(p)]) == 0
    out = capsys.readouterr()
    assert "any source port" in out.out + out.err
    for quiet in ("insecure = true\nread_only = true\n", "", "secure_port = true\n"):
        p.write_text(base + quiet)
        assert not [i for i in check_config(p).warnings if "source port" in i.message], quiet
    p.write_text(base + "secure_port = false\n")
    (w,) = [i for i in check_config(p).warnings if "source port" in i.message]
    assert w.where == "export[0].secure_port"


# -- admin API -----------------------------------------------------------------------------------


def _admin_gateway(tmp_path: Path, admin: AdminConfig) -> MemoryGateway:
    return MemoryGateway.of(
        tmp_path, [ExportConfig("/data", "s3://b/data/")], files=FILES, admin=admin
    )


async def test_admin_without_token_answers_reads_and_refuses_mutations(tmp_path: Path) -> None:
    async with _admin_gateway(tmp_path, admin_config(token=None)) as g:
        http = Http(g.server.metrics_port, token=None)
        assert (await http.get("/metrics"))[0] == 200
        assert (await http.get("/healthz"))[0] == 200
        assert (await http.get("/v1/stats"))[0] == 200
        for method, path, body in (
            ("POST", "/v1/reload", None),
            ("POST", "/v1/invalidate", {"path": "/data"}),
            ("POST", "/v1/warmup", {"path": "/data"}),
            ("DELETE", "/v1/warmup/1", None),
        ):
            status, reply = await http.json(method, path, body)
            assert status == 403 and "token" in reply["error"], (method, path)
            assert "unix:" in reply["error"]
        # a browser's cross-site POST without a body is refused too (no token to forge)
        async with http.session.post(http.base + "/v1/invalidate?path=/data") as r:
            assert r.status == 403
        await http.close()


async def test_admin_token_and_content_type(tmp_path: Path) -> None:
    async with _admin_gateway(tmp_path, admin_config()) as g:
        http = Http(g.server.metrics_port)  # with the token
        url = http.base + "/v1/invalidate"
        body = json.dumps({"path": "/data"})
        for ctype in ("text/plain", "application/x-www-form-urlencoded", None):
            headers = dict(http.headers)
            if ctype is not None:
                headers["Content-Type"] = ctype
            async with http.session.post(url, data=body.encode(), headers=headers) as r:
                assert r.status == 415, ctype
                assert "application/json" in (await r.json())["error"]
        status, reply = await http.json("POST", "/v1/invalidate", {"path": "/data"})
        assert status == 200, reply
        anon = Http(g.server.metrics_port, token=None)
        assert (await anon.json("POST", "/v1/reload"))[0] == 401
        assert (await anon.get("/v1/stats"))[0] == 401
        assert (await anon.get("/readyz"))[0] == 200  # probes stay open
        await anon.close()
        await http.close()


async def test_admin_unix_socket_is_0660_and_trusted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sock = tmp_path / "run" / "admin.sock"
    sock.parent.mkdir()
    async with _admin_gateway(tmp_path, AdminConfig(listen=f"unix:{sock}")) as g:
        assert stat.S_ISSOCK(sock.stat().st_mode)
        assert stat.S_IMODE(sock.stat().st_mode) == 0o660
        conn = aiohttp.UnixConnector(path=str(sock))
        async with aiohttp.ClientSession(connector=conn) as s:
            async with s.post("http://nfsgw/v1/invalidate", json={"path": "/data"}) as r:
                assert r.status == 200, await r.text()
            async with s.get("http://nfsgw/v1/stats") as r:
                assert r.status == 200
            async with s.post("http://nfsgw/v1/invalidate", data=b'{"path": "/data"}') as r:
                assert r.status == 415  # JSON only, on the socket too
        # nfsgw invalidate over the socket, no token (blocking client: off the loop)
        args = ["invalidate", "/data", "--admin-url", f"unix:{sock}"]
        assert await asyncio.to_thread(cli.main, args) == 0
        (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
        assert json.loads(line)["path"] == ""
        assert g.server.admin is not None


async def test_admin_cli_sends_the_token(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    async with _admin_gateway(tmp_path, admin_config()) as g:
        url = f"http://127.0.0.1:{g.server.metrics_port}"
        args = ["invalidate", "/data", "--admin-url", url]
        assert await asyncio.to_thread(cli.main, args) == 1  # no token: 401
        capsys.readouterr()
        assert await asyncio.to_thread(cli.main, [*args, "--token-file", str(token)]) == 0
        assert '"path"' in capsys.readouterr().out


def test_non_loopback_admin_without_token_does_not_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    p = tmp_path / "nfsgw.toml"
    exp = '[[export]]\npath = "/d"\nbackend = "s3://b/"\nclients = ["10.0.0.0/8"]\n'
    p.write_text('[admin]\nlisten = "0.0.0.0:9426"\n' + exp)
    r = check_config(p)
    assert r.config is None
    (e,) = r.errors
    assert e.where == "admin.listen" and "without a token" in e.message
    assert cli.main(["serve", "--config", str(p)]) != 0
    err = capsys.readouterr().err
    assert "admin.listen" in err and "without a token" in err
    for ok in ('"127.0.0.1:9426"', '"[::1]:9426"', f'"unix:{tmp_path}/a.sock"'):
        p.write_text(f"[admin]\nlisten = {ok}\n" + exp)
        assert check_config(p).config is not None, ok
    p.write_text('[admin]\nlisten = "unix:relative.sock"\n' + exp)
    assert check_config(p).config is None
