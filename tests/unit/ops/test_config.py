"""The TOML configuration, CLI overrides and ``nfsgw check-config``: the issue's shape is
accepted, every error is reported with its line and a fix, unknown keys are errors, flags win
over the file."""

from __future__ import annotations

import ipaddress
import itertools
import re
from pathlib import Path

import pytest

from gateway.exports import EVERYONE, ExportConfig, export_id_for
from gateway.ops import cli
from gateway.ops.config import SECTIONS
from gateway.ops.configfile import (
    ConfigErrors,
    ConfigIssue,
    Overrides,
    check_config,
    load_config,
)
from gateway.settings import entries

REPO = Path(__file__).resolve().parents[3]

ISSUE_SHAPE = """\
[server]
listen = "0.0.0.0"
port = 2049
state_dir = "/var/lib/nfsgw"
[admin]
listen = "127.0.0.1:9426"
[s3]
endpoint_url = "https://s3.example.internal"
region = "us-east-1"
[[export]]
path = "/imagenet"
backend = "s3://datasets/imagenet/"
read_only = true
clients = ["10.0.0.0/8"]
squash = "root"
"""


def write(tmp_path: Path, text: str, name: str = "nfsgw.toml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def errors(issues: list[ConfigIssue]) -> dict[str, ConfigIssue]:
    return {i.where: i for i in issues if i.severity == "error"}


def test_issue_shape_is_accepted(tmp_path: Path) -> None:
    path = write(tmp_path, ISSUE_SHAPE)
    cfg, warnings = load_config(path)
    assert warnings == []
    srv = cfg.server
    assert (srv.listen, srv.port, srv.state_dir) == ("0.0.0.0", 2049, Path("/var/lib/nfsgw"))
    assert cfg.admin.listen == "127.0.0.1:9426"
    assert cfg.s3.endpoint_url == "https://s3.example.internal" and cfg.s3.region == "us-east-1"
    (e,) = cfg.exports
    assert (e.path, e.backend, e.read_only, e.squash) == (
        "/imagenet",
        "s3://datasets/imagenet/",
        True,
        "root",
    )
    assert e.clients == (ipaddress.ip_network("10.0.0.0/8"),)
    assert cfg.source == path


def test_example_config_in_systemd_dir_is_valid() -> None:
    r = check_config(REPO / "systemd" / "nfsgw.toml")
    assert r.errors == [] and r.warnings == [], [i.format() for i in r.issues]
    assert r.config is not None
    scratch = r.config.exports[1]
    assert scratch.squash == "all" and (scratch.anonuid, scratch.anongid) == (1000, 1000)
    assert (scratch.file_mode, scratch.dir_mode) == (0o644, 0o755) and scratch.secure_port
    imagenet = r.config.exports[0]
    assert imagenet.immutable and imagenet.attr_ttl_s == 60  # from [export_defaults]
    assert r.config.cache.memory == 8 << 30 and r.config.cache.metadata_memory == 1 << 30


def test_every_error_has_its_line_and_a_fix(tmp_path: Path) -> None:
    text = """\
[server]
port = 70000
stat_dir = "/var/lib/nfsgw"
[s3]
endpoint_url = "s3.example.internal"
[cache]
memory = "8X"
[[export]]
path = "imagenet"
backend = "s3://datasets/imagenet/"
read_only = "yes"
clients = ["10.0.0.0/33", "10.0.0.1/8", "gpu-node-1", "10.2.0.0/16"]
squash = "root_sqash"
file_mode = 644
attr_ttl_s = -1
[[export]]
backend = "s3://b/x/"
[[exports]]
path = "/b"
"""
    r = check_config(write(tmp_path, text))
    assert r.config is None
    errs = errors(r.issues)
    expected = {
        "server.port": (2, "out of range"),
        "server.stat_dir": (3, "unknown key"),
        "s3.endpoint_url": (5, "not an http(s) URL"),
        "cache.memory": (7, "not a size"),
        "export[0].path": (9, "not a clean absolute path"),
        "export[0].read_only": (11, "must be true or false"),
        "export[0].clients[0]": (12, "not an IP address or network"),
        "export[0].clients[1]": (12, "host bits set"),
        "export[0].clients[2]": (12, "not an IP address or network"),
        "export[0].squash": (13, "not allowed"),
        "export[0].file_mode": (14, "string of octal digits"),
        "export[0].attr_ttl_s": (15, "out of range"),
        "export[1]": (16, "missing 'path'"),
        "exports": (18, "unknown table"),
    }
    assert set(errs) == set(expected), sorted(errs)
    for where, (line, text_) in expected.items():
        i = errs[where]
        assert i.location == f"{tmp_path / 'nfsgw.toml'}:{line}", (where, i.location)
        assert text_ in i.message, (where, i.message)
        assert i.hint, where
    assert "state_dir" in errs["server.stat_dir"].hint  # did you mean
    assert "10.0.0.0/8" in errs["export[0].clients[1]"].hint
    assert "root_squash" in errs["export[0].squash"].hint
    assert '"0644"' in errs["export[0].file_mode"].hint
    assert "[[export]]" in errs["exports"].hint
    # reported in file order
    lines = [int(i.location.rpartition(":")[2]) for i in r.issues]
    assert lines == sorted(lines)


def test_unknown_keys_everywhere_are_errors(tmp_path: Path) -> None:
    text = ISSUE_SHAPE.replace('region = "us-east-1"', 'region = "us-east-1"\nregoin = "x"')
    text += 'squahs = "all"\n[log]\nlevl = "debug"\n[export_defaults]\nread_onyl = true\n'
    r = check_config(write(tmp_path, text))
    errs = errors(r.issues)
    assert set(errs) == {
        "s3.regoin",
        "export[0].squahs",
        "log.levl",
        "export_defaults.read_onyl",
    }
    assert "did you mean 'region'" in errs["s3.regoin"].hint
    assert "'squash'" in errs["export[0].squahs"].hint
    assert "'read_only'" in errs["export_defaults.read_onyl"].hint


def test_syntax_error_has_its_line(tmp_path: Path) -> None:
    r = check_config(write(tmp_path, "[server]\nport = 2049\nlisten = 0.0.0.0\n"))
    (i,) = r.issues
    assert i.location.endswith(":3") and "TOML syntax" in i.message and r.config is None


def test_missing_file_and_no_exports(tmp_path: Path) -> None:
    r = check_config(tmp_path / "absent.toml")
    assert r.config is None and "no such file" in r.issues[0].message
    assert "--config" in r.issues[0].hint
    r = check_config(write(tmp_path, "[server]\nport = 2049\n"))
    assert errors(r.issues)["export"].message == "no exports"


def test_cli_flags_override_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, ISSUE_SHAPE)
    a = cli.build_parser().parse_args(
        [
            "serve",
            "--config",
            str(path),
            "--port",
            "3049",
            "--export",
            "/imagenet=s3://other/in/",
            "--export",
            "/extra=file:///srv/extra",
            "--attr-ttl",
            "5",
            "--admin-listen",
            "",
            "--cache-memory",
            "1G",
            "--no-prefetch",
            "--state-dir",
            "rel/state",
        ]
    )
    cfg = cli.config_from_args(a)
    assert cfg.server.port == 3049 and cfg.server.listen == "0.0.0.0"
    assert [(e.path, e.backend) for e in cfg.exports] == [
        ("/imagenet", "s3://other/in/"),
        ("/extra", "file:///srv/extra"),
    ]
    # a replaced export takes only what the flag says: the file's clients are gone
    assert cfg.exports[0].clients == EVERYONE
    assert all(e.attr_ttl_s == 5.0 for e in cfg.exports)
    assert cfg.admin.listen is None and cfg.cache.memory == 1 << 30
    assert not cfg.cache.namespace.prefetch
    state_dir = cfg.server.state_dir
    assert state_dir.is_absolute() and state_dir.parts[-2:] == ("rel", "state")


def test_flag_errors_name_the_flag(tmp_path: Path) -> None:
    path = write(tmp_path, ISSUE_SHAPE)
    r = check_config(
        path,
        Overrides(
            {("server", "port"): (99999, "--port")},
            ("/x=s3:/nobucket", "noequals"),
            {"attr_ttl_s": (-3.0, "--attr-ttl")},
        ),
    )
    by_loc = {i.location: i for i in r.errors}
    assert "out of range" in by_loc["--port"].message
    assert "no bucket" in by_loc["--export /x=s3:/nobucket"].message
    assert "expected /PATH=URL" in by_loc["--export noequals"].message
    assert "out of range" in by_loc["--attr-ttl"].message


def test_squash_aliases_defaults_and_modes(tmp_path: Path) -> None:
    text = """\
[export_defaults]
squash = "all_squash"
anonuid = 1000
anongid = 1001
file_mode = "0640"
clients = ["*"]
[[export]]
path = "/a"
backend = "s3://b/a/"
[[export]]
path = "/b"
backend = "s3://b/b/"
squash = "no_root_squash"
dir_mode = "750"
clients = ["192.168.1.7", "fd00::/8"]
uid = 42
[[export]]
path = "/c"
backend = "file:///srv/c"
squash = "root_squash"
immutable = true
secure_port = true
"""
    r = check_config(write(tmp_path, text))
    assert r.config is not None, [i.format() for i in r.issues]
    a, b, c = r.config.exports
    assert (a.squash, a.anonuid, a.anongid, a.file_mode, a.dir_mode) == (
        "all",
        1000,
        1001,
        0o640,
        0o755,
    )
    assert a.clients == EVERYONE and a.allows("10.1.2.3") and a.allows("::1")
    assert (b.squash, b.dir_mode, b.uid, b.anonuid) == ("none", 0o750, 42, 1000)
    assert b.allows("192.168.1.7") and b.allows("::ffff:192.168.1.7")
    assert not b.allows("192.168.1.8") and b.allows("fd00::1") and not b.allows("fe80::1")
    assert c.squash == "root" and c.immutable and c.secure_port
    # no_root_squash is allowed, with a warning
    assert any(i.where == "export[1].squash" for i in r.warnings)


def test_duplicates_collisions_and_overlaps(tmp_path: Path) -> None:
    # two export paths with the same 16-bit id
    seen: dict[int, str] = {}
    pair: tuple[str, str] | None = None
    for n in itertools.count():
        p = f"/e{n}"
        other = seen.setdefault(export_id_for(p), p)
        if other != p:
            pair = (other, p)
            break
    assert pair is not None
    text = f"""\
[[export]]
path = "/data"
backend = "s3://b/ds/"
clients = ["10.0.0.0/8"]
[[export]]
path = "/data"
backend = "s3://b/other/"
clients = ["10.0.0.0/8"]
[[export]]
path = "{pair[0]}"
backend = "s3://c/"
clients = ["10.0.0.0/8"]
[[export]]
path = "{pair[1]}"
backend = "s3://d/"
clients = ["10.0.0.0/8"]
[[export]]
path = "/data-private"
backend = "s3://b/ds/private/"
clients = ["10.0.0.5"]
"""
    r = check_config(write(tmp_path, text))
    errs = errors(r.issues)
    assert "given twice" in errs["export[1].path"].message
    assert "same export id" in errs["export[3].path"].message
    (w,) = [i for i in r.warnings if i.where == "export[0].backend"]
    assert "/data-private" in w.message and w.location.endswith(":3")


def test_admin_token_file(tmp_path: Path) -> None:
    token = tmp_path / "admin.token"
    text = ISSUE_SHAPE.replace(
        '[admin]\nlisten = "127.0.0.1:9426"',
        f'[admin]\nlisten = "0.0.0.0:9426"\ntoken_file = "{token}"',
    )
    r = check_config(write(tmp_path, text))
    assert "cannot read" in errors(r.issues)["admin.token_file"].message
    token.write_text("s3cret\n")
    token.chmod(0o644)
    r = check_config(write(tmp_path, text))
    assert r.config is not None and r.config.admin.token == "s3cret"
    assert "s3cret" not in repr(r.config)
    assert [i.where for i in r.warnings] == ["admin.token_file"]  # world-readable
    token.chmod(0o600)
    no_token = text.replace(f'token_file = "{token}"', "")
    r = check_config(write(tmp_path, no_token))  # on the network without a token: no start
    assert r.config is None and [i.where for i in r.errors] == ["admin.listen"]
    assert "without a token" in r.errors[0].message and "\n" not in str(r.errors[0])


def test_admin_is_on_by_default_with_a_file_only(tmp_path: Path) -> None:
    text = '[[export]]\npath = "/d"\nbackend = "s3://b/"\nclients = ["10.0.0.0/8"]\n'
    cfg, _ = load_config(write(tmp_path, text))
    assert cfg.admin.listen == "127.0.0.1:9426"
    cfg, _ = load_config(None, Overrides(exports=("/d=s3://b/",)))
    assert cfg.admin.listen is None


def test_load_config_raises_with_every_error(tmp_path: Path) -> None:
    path = write(tmp_path, "[server]\nport = -1\nlisten = 'gateway.local'\n")
    with pytest.raises(ConfigErrors) as ei:
        load_config(path)
    assert {i.where for i in ei.value.errors} == {"server.port", "server.listen", "export"}
    assert ":2: server.port" in str(ei.value)


def test_check_config_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = write(tmp_path, ISSUE_SHAPE)
    assert cli.main(["check-config", "--config", str(good)]) == 0
    assert "OK: 1 export (/imagenet)" in capsys.readouterr().out
    bad = write(tmp_path, ISSUE_SHAPE.replace("port = 2049", "port = 'x'"), "bad.toml")
    assert cli.main(["check-config", "--config", str(bad)]) == 1
    err = capsys.readouterr().err
    assert f"{bad}:3: server.port: must be an integer" in err and "fix:" in err
    assert "1 error in the configuration" in err
    # serve refuses to start with the same report
    assert cli.main(["serve", "--config", str(bad)]) == 2
    assert "server.port" in capsys.readouterr().err


def test_writes_table(tmp_path: Path) -> None:
    text = (
        ISSUE_SHAPE
        + """[writes]
spool_dir = "/srv/spool"
spool_bytes = "1G"
part_size = "16M"
flush_idle_s = 5
rename_max_entries = 50
"""
    )
    cfg, _ = load_config(write(tmp_path, text))
    w = cfg.writes
    assert w.spool_dir == Path("/srv/spool") and w.spool_bytes == 1 << 30
    assert (w.part_size, w.flush_idle_s, w.rename_max_entries) == (
        16 << 20,
        5.0,
        50,
    )
    r = check_config(write(tmp_path, ISSUE_SHAPE + '[writes]\npart_size = "1M"\n'))
    assert "out of range" in errors(r.issues)["writes.part_size"].message


def test_docs_reference_lists_every_declared_key() -> None:
    """The configuration reference in docs/operations.md has a row for every key the
    settings classes declare, and no other."""
    text = (REPO / "docs" / "operations.md").read_text(encoding="utf-8")
    ref = text.split("## Configuration reference", 1)[1].split("\n## ", 1)[0]
    documented: dict[str, set[str]] = {}
    for part in re.split(r"^### ", ref, flags=re.M)[1:]:
        title, _, body = part.partition("\n")
        tables = re.findall(r"`\[+([a-z0-9_]+)\]+`", title)
        if tables:
            rows = re.findall(r"^\| (.+?) \|", body, flags=re.M)
            documented[tables[0]] = {k for row in rows for k in re.findall(r"`([a-z0-9_]+)`", row)}
    declared = {table: set(entries(cls)) for table, cls in SECTIONS.items()}
    declared["export_defaults"] = set(entries(ExportConfig))
    assert documented == declared


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    """``nfsgw --version`` prints the version ``/v1/stats`` reports (gateway.version)."""
    from gateway import version

    with pytest.raises(SystemExit) as ei:
        cli.main(["--version"])
    assert ei.value.code == 0
    assert capsys.readouterr().out == f"nfsgw {version()}\n"
    assert version() != ""


def test_log_format_auto(tmp_path: Path) -> None:
    """auto: a readable console on a terminal; JSON into a pipe, a file, or the journal (the
    stream systemd names in JOURNAL_STREAM), even when that variable is inherited by a
    terminal it does not name."""
    import os

    from gateway.ops.logs import wants_json

    r, w = os.pipe()
    with os.fdopen(w, "w") as pipe:
        assert wants_json(pipe, {})
    os.close(r)
    with (tmp_path / "log").open("w") as f:
        st = os.fstat(f.fileno())
        assert wants_json(f, {})
        assert wants_json(f, {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"})
    main_fd, tty_fd = os.openpty()
    try:
        with os.fdopen(tty_fd, "w") as tty:
            assert not wants_json(tty, {})
            assert not wants_json(tty, {"JOURNAL_STREAM": "8:12345", "INVOCATION_ID": "x"})
    finally:
        os.close(main_fd)


def test_pack_configures_logging(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``nfsgw pack`` renders its lines like ``serve`` (from ``[log]``), not with structlog's
    defaults (console lines into a pipe or a file)."""
    from gateway.ops import logs

    got: list[tuple[str, str]] = []
    monkeypatch.setattr(logs, "configure_from", lambda level, fmt: got.append((level, fmt)))
    src = tmp_path / "src"
    src.mkdir()
    (src / "f").write_bytes(b"x")
    cfg = write(tmp_path, '[log]\nlevel = "warning"\nformat = "json"\n')
    dst = f"file://{tmp_path}/nowhere"
    rc = cli.main(["pack", f"file://{src}", "--to", dst, "--quiet", "--config", str(cfg)])
    assert rc == 2  # DST does not exist: refused after the configuration was read
    assert got == [("warning", "json")]
