"""``nfsgw.toml`` and command-line overrides -> ``ServerConfig``, with every problem reported:
the checks behind ``nfsgw check-config``, ``nfsgw serve`` and a reload.

Every problem found in a file (or in command-line overrides) becomes a ``ConfigIssue`` with
its location (file and line, or the flag), the key path (``export[1].clients[0]``), what is
wrong and a fix hint; all of them are collected before anything is reported. Values are
converted, and unknown keys found (with a "did you mean"), by the declarations of the section
types (``gateway.ops.config``); the rules that span keys (export paths and ids, overlapping
backends, the admin token, ``max_record`` against ``rsize``) are here. Must not: open
sockets, touch the backend, or read anything but the config file and the admin token file.
"""

from __future__ import annotations

import dataclasses
import difflib
import ipaddress
import os
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

from gateway.backend import parse_store_url
from gateway.data.fleet import FleetConfig, parse_member
from gateway.exports import ExportConfig, export_id_for
from gateway.ops.config import (
    DEFAULT_ADMIN_LISTEN,
    SECTIONS,
    UNIX_PREFIX,
    AdminConfig,
    ConfigError,
    ServerConfig,
    ServerSettings,
    split_listen,
)
from gateway.settings import Invalid, InvalidItems, build, entries, tname

DEFAULT_CONFIG_PATH: Final = Path("/etc/nfsgw/nfsgw.toml")
RPC_HEADROOM: Final = 4096  # RPC and NFS headers around READ data in one record
_EXPORT_ONLY: Final = ("path", "backend")  # the export keys [export_defaults] cannot set


@dataclass(frozen=True, slots=True)
class ConfigIssue:
    """One problem in a configuration. ``where`` is the key path (``export[1].clients[0]``),
    ``location`` the file and line (``nfsgw.toml:14``) or the flag (``--port``)."""

    location: str
    where: str
    message: str
    hint: str = ""
    severity: Literal["error", "warning"] = "error"

    def format(self) -> str:
        head = f"{self.location}: " if self.location else ""
        key = f"{self.where}: " if self.where else ""
        tag = "warning: " if self.severity == "warning" else ""
        text = f"{head}{tag}{key}{self.message}"
        if self.hint:
            text += f"\n    fix: {self.hint}"
        return text


class ConfigErrors(ConfigError):
    """Every error of a configuration (``issues`` also holds its warnings)."""

    def __init__(self, issues: Sequence[ConfigIssue]) -> None:
        self.issues = list(issues)
        errors = [i for i in self.issues if i.severity == "error"]
        super().__init__("\n".join(i.format() for i in errors))

    @property
    def errors(self) -> list[ConfigIssue]:
        return [i for i in self.issues if i.severity == "error"]


_TOP: Final = (*SECTIONS, "export_defaults", "export")


Key = tuple[str | int, ...]


def _where(key: Key) -> str:
    out = ""
    for k in key:
        if isinstance(k, int):
            out += f"[{k}]"
        else:
            out += f".{k}" if out else k
    return out


_HEADER = re.compile(r"^\s*(\[\[?)\s*([^\]]+?)\s*\]\]?\s*(#.*)?$")
_KEYLINE = re.compile(
    r"^\s*((?:[A-Za-z0-9_-]+|\"[^\"]*\"|'[^']*')(?:\s*\.\s*(?:[A-Za-z0-9_-]+|\"[^\"]*\"|'[^']*'))*)\s*="
)


def _split_dotted(text: str) -> tuple[str, ...]:
    parts = re.findall(r"\"([^\"]*)\"|'([^']*)'|([A-Za-z0-9_-]+)", text)
    return tuple(a or b or c for a, b, c in parts)


class _Locator:
    """Line numbers of keys in TOML text (tomllib keeps none): table headers, array-of-table
    entries and ``key =`` lines. Values spanning lines (arrays) point at their key's line."""

    def __init__(self, text: str) -> None:
        self.lines: dict[Key, int] = {}
        counts: dict[tuple[str, ...], int] = {}
        table: Key = ()
        for n, line in enumerate(text.splitlines(), 1):
            h = _HEADER.match(line)
            if h:
                name = _split_dotted(h.group(2))
                if h.group(1) == "[[":
                    i = counts.get(name, 0)
                    counts[name] = i + 1
                    table = (*name, i)
                    self.lines.setdefault(name, n)
                else:
                    table = name
                self.lines.setdefault(table, n)
                continue
            k = _KEYLINE.match(line)
            if k:
                self.lines.setdefault((*table, *_split_dotted(k.group(1))), n)

    def line(self, key: Key) -> int | None:
        while True:
            n = self.lines.get(key)
            if n is not None or not key:
                return n
            key = key[:-1]


@dataclass(slots=True)
class _Ctx:
    """Where issues go while one configuration is checked."""

    file: str
    locator: _Locator
    origins: dict[Key, str]  # key prefix -> "--flag" for values that came from the command line
    issues: list[ConfigIssue] = field(default_factory=list)

    def location(self, key: Key) -> str:
        for i in range(len(key), 0, -1):
            o = self.origins.get(key[:i])
            if o is not None:
                return o
        n = self.locator.line(key)
        if not self.file:
            return ""
        return f"{self.file}:{n}" if n else self.file

    def error(self, key: Key, message: str, hint: str = "") -> None:
        self.issues.append(ConfigIssue(self.location(key), _where(key), message, hint))

    def warn(self, key: Key, message: str, hint: str = "") -> None:
        self.issues.append(ConfigIssue(self.location(key), _where(key), message, hint, "warning"))


@dataclass(slots=True)
class _Read:
    """The converted values of one table by TOML key (only keys it gives); ``ok``: every
    given value converted."""

    values: dict[str, Any]
    ok: bool


def _read(ctx: _Ctx, key: Key, cls: type, raw: object, skip: Sequence[str] = ()) -> _Read:
    """Convert the keys of one TOML table by the declarations of section type ``cls``;
    report bad values and unknown keys (not ``skip``)."""
    if not isinstance(raw, dict):
        ctx.error(key, f"must be a table, not {tname(raw)}", f"write it as [{_where(key)}]")
        return _Read({}, False)
    known = {k: e for k, e in entries(cls).items() if k not in skip}
    out = _Read({}, True)
    for name, value in raw.items():
        e = known.get(name)
        if e is None:
            close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
            hint = f"did you mean {close[0]!r}?" if close else "known keys: " + ", ".join(known)
            ctx.error((*key, name), f"unknown key {name!r}", hint)
            continue
        try:
            out.values[name] = e.setting.conv.parse(value)
        except InvalidItems as err:
            for i, sub in err.items:
                ctx.error((*key, name, i), sub.message, sub.hint)
            out.ok = False
        except Invalid as err:
            ctx.error((*key, name), err.message, err.hint)
            out.ok = False
    return out


@dataclass(frozen=True, slots=True)
class Overrides:
    """Command-line values that win over the file: ``sections`` maps ``(table, key)`` to a
    value (already parsed by argparse) and the flag it came from; ``exports`` are ``--export``
    specs (replacing a file export with the same path); ``all_exports`` sets a key on every
    export (``--read-only``, ``--attr-ttl``, ``--immutable``)."""

    sections: Mapping[tuple[str, str], tuple[object, str]] = field(default_factory=dict)
    exports: Sequence[str] = ()
    all_exports: Mapping[str, tuple[object, str]] = field(default_factory=dict)


@dataclass(slots=True)
class CheckResult:
    config: ServerConfig | None
    issues: list[ConfigIssue]

    @property
    def errors(self) -> list[ConfigIssue]:
        return [i for i in self.issues if i.severity == "error"]

    @property
    def warnings(self) -> list[ConfigIssue]:
        return [i for i in self.issues if i.severity == "warning"]


def check_config(
    path: Path | None, overrides: Overrides | None = None, *, text: str | None = None
) -> CheckResult:
    """Read ``path`` (or ``text``; neither: CLI only), apply ``overrides``, validate
    everything. ``config`` is None when there is any error."""
    ov = overrides or Overrides()
    fname = str(path) if path is not None else ""
    raw: dict[str, Any] = {}
    locator = _Locator("")
    pre: list[ConfigIssue] = []
    if text is None and path is not None:
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            pre.append(
                ConfigIssue(
                    fname,
                    "",
                    "no such file",
                    "create it from systemd/nfsgw.toml, or pass --config PATH",
                )
            )
        except (OSError, UnicodeDecodeError) as e:
            pre.append(ConfigIssue(fname, "", f"cannot read: {e}", "check the file's permissions"))
    if text is not None:
        try:
            raw = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            m = re.search(r"\(at line (\d+), column (\d+)\)", str(e))
            loc = f"{fname or '<config>'}:{m.group(1)}" if m else fname
            msg = re.sub(r"\s*\(at line \d+, column \d+\)", "", str(e))
            pre.append(
                ConfigIssue(
                    loc, "", f"TOML syntax: {msg}", "see https://toml.io; strings need quotes"
                )
            )
            raw = {}
        locator = _Locator(text)
    ctx = _Ctx(fname, locator, {}, pre)
    if pre:
        return CheckResult(None, ctx.issues)
    cfg = _build(ctx, raw, ov)
    if any(i.severity == "error" for i in ctx.issues):
        cfg = None
    return CheckResult(cfg, sorted(ctx.issues, key=_order))


def _order(i: ConfigIssue) -> int:
    """Command-line issues first, then by line in the file."""
    tail = i.location.rpartition(":")[2]
    if i.location.startswith("--"):
        return -1
    return int(tail) if tail.isdigit() else 0


def _check_fleet(ctx: _Ctx, fleet: FleetConfig, shared: str | None, srv: ServerSettings) -> None:
    """A fleet without a shared tier does nothing; a fleet whose gateways cannot tell which
    member they are disagree on who owns what."""
    if not fleet.enabled:
        return
    if shared is None:
        ctx.warn(
            ("fleet",),
            "a fleet without a shared tier: its members change nothing",
            'set [cache] shared = "s3://BUCKET/PREFIX/" (--shared-cache)',
        )
    if fleet.self_ is None and srv.listen in ("0.0.0.0", "::"):
        ctx.warn(
            ("fleet", "self"),
            f"unset, and the listen address {srv.listen} names no member",
            "set it to this gateway's entry in members (--fleet-self, e.g. $(POD_IP):2049)",
        )
    elif fleet.members:
        me = fleet.self_ or f"{srv.listen}:{srv.port}"
        try:
            found = parse_member(me) in {parse_member(m) for m in fleet.members}
        except ValueError:
            found = True  # reported as the listen address's own error
        if not found:
            ctx.warn(
                ("fleet", "members"),
                f"this gateway ({me}) is not among them: the others do not count it",
                "list every gateway, this one included, or set self to its entry",
            )


def load_config(
    path: Path | None, overrides: Overrides | None = None
) -> tuple[ServerConfig, list[ConfigIssue]]:
    """The configuration and its warnings; raises ``ConfigErrors`` listing every error."""
    r = check_config(path, overrides)
    if r.config is None:
        raise ConfigErrors(r.issues)
    return r.config, r.warnings


def _apply_overrides(ctx: _Ctx, raw: dict[str, Any], ov: Overrides) -> None:
    for (table, key), (value, flag) in ov.sections.items():
        sect = raw.get(table)
        if not isinstance(sect, dict):
            sect = raw[table] = {}
        sect[key] = value
        ctx.origins[(table, key)] = flag
    if ov.exports:
        exports = raw.get("export")
        if not isinstance(exports, list):
            exports = raw["export"] = []
        for spec in ov.exports:
            path, sep, backend = spec.partition("=")
            flag = f"--export {spec}"
            if not sep:
                ctx.issues.append(
                    ConfigIssue(
                        flag, "", "expected /PATH=URL", "e.g. --export /data=s3://bucket/prefix/"
                    )
                )
                continue
            entry: dict[str, Any] = {"path": path, "backend": backend}
            same = [
                i for i, e in enumerate(exports) if isinstance(e, dict) and e.get("path") == path
            ]
            if same:
                exports[same[0]] = entry
                idx = same[0]
            else:
                exports.append(entry)
                idx = len(exports) - 1
            ctx.origins[("export", idx)] = flag
    if ov.all_exports:
        for i, e in enumerate(raw.get("export") or []):
            if isinstance(e, dict):
                for key, (value, flag) in ov.all_exports.items():
                    if key in _PORT_KEYS:  # --insecure wins over the file's port rule
                        for k in _PORT_KEYS:
                            e.pop(k, None)
                    e[key] = value
                    ctx.origins[("export", i, key)] = flag


def _build(ctx: _Ctx, raw: dict[str, Any], ov: Overrides) -> ServerConfig | None:
    _apply_overrides(ctx, raw, ov)
    for name in raw:
        if name not in _TOP:
            close = difflib.get_close_matches(name, _TOP, n=1, cutoff=0.6)
            hint = f"did you mean [{close[0]}]?" if close else "tables: " + ", ".join(_TOP)
            if name == "exports":
                hint = "write each export as [[export]]"
            ctx.error((name,), f"unknown table {name!r}", hint)

    read = {name: _read(ctx, (name,), cls, raw.get(name, {})) for name, cls in SECTIONS.items()}
    # With a config file the admin API is on by default (loopback only); without one, off.
    if ctx.file and "listen" not in read["admin"].values:
        read["admin"].values["listen"] = DEFAULT_ADMIN_LISTEN
    sections: dict[str, Any] = {}
    for name, cls in SECTIONS.items():
        try:
            sections[name] = build(cls, read[name].values)
        except ValueError as e:  # a section's own rule (e.g. read-ahead bounds)
            ctx.error((name,), str(e))
            sections[name] = cls()
    srv: ServerSettings = sections["server"]
    if read["server"].ok and srv.transport.max_record < srv.nfs.wsize + RPC_HEADROOM:
        ctx.warn(
            ("server", "max_record"),
            "smaller than wsize plus headers: a client's full-size WRITE closes its connection",
            "raise it above wsize, or leave it out (wsize plus 64 KiB)",
        )
    sections["admin"] = _admin(ctx, sections["admin"])
    _check_fleet(ctx, sections["fleet"], sections["cache"].data.shared.url, srv)

    defaults = _read(
        ctx, ("export_defaults",), ExportConfig, raw.get("export_defaults", {}), _EXPORT_ONLY
    )
    exports = _exports(ctx, raw.get("export"), defaults.values)

    if any(i.severity == "error" for i in ctx.issues):
        return None
    try:
        return ServerConfig(
            exports=tuple(exports), source=Path(ctx.file) if ctx.file else None, **sections
        )
    except ValueError as e:  # a rule the checks above missed: still reported, not raised
        ctx.error((), str(e))
        return None


def _admin(ctx: _Ctx, admin: AdminConfig) -> AdminConfig:
    """Read the token; refuse an admin API on the network without one (an error: the
    gateway does not start)."""
    token = None
    if admin.token_file is not None:
        token = _read_token(ctx, ("admin", "token_file"), admin.token_file)
    listen = admin.listen
    if listen is not None and not listen.startswith(UNIX_PREFIX) and admin.token_file is None:
        host, _ = split_listen(listen)
        if host != "localhost" and not ipaddress.ip_address(host).is_loopback:
            ctx.error(
                ("admin", "listen"),
                f"the admin API on {host} would be reachable from the network without a token",
                'set admin.token_file, or listen on 127.0.0.1 or "unix:/run/nfsgw/admin.sock"',
            )
    return dataclasses.replace(admin, token=token)


def _read_token(ctx: _Ctx, key: Key, path: Path) -> str | None:
    try:
        st = path.stat()
        token = path.read_text(encoding="utf-8").strip()
    except OSError as e:
        ctx.error(
            key,
            f"cannot read {path}: {e.strerror}",
            "create it (e.g. openssl rand -hex 32) and let the service user read it",
        )
        return None
    if not token:
        ctx.error(
            key, f"{path} is empty", "write a random token into it: openssl rand -hex 32 > FILE"
        )
        return None
    if st.st_mode & 0o004:
        ctx.warn(key, f"{path} is readable by every user", f"chmod 0640 {path}")
    return token


def _exports(ctx: _Ctx, raw: object, defaults: Mapping[str, Any]) -> list[ExportConfig]:
    if raw is None:
        ctx.error(
            ("export",),
            "no exports",
            "add an [[export]] table with path and backend, or --export /PATH=s3://BUCKET/PREFIX",
        )
        return []
    if not isinstance(raw, list):
        ctx.error(
            ("export",),
            f"must be an array of tables, not {tname(raw)}",
            "write each export as [[export]]",
        )
        return []
    out: list[ExportConfig] = []
    seen: dict[str, int] = {}
    ids: dict[int, str] = {}
    for i, item in enumerate(raw):
        key: Key = ("export", i)
        if not isinstance(item, dict):
            ctx.error(key, f"must be a table, not {tname(item)}", "write each export as [[export]]")
            continue
        if "path" not in item:
            ctx.error(key, "missing 'path'", 'add path = "/NAME", the path clients mount')
        if "backend" not in item:
            ctx.error(key, "missing 'backend'", 'add backend = "s3://BUCKET/PREFIX/"')
        own = _read(ctx, key, ExportConfig, item).values
        path, backend = own.get("path"), own.get("backend")
        if path is None or backend is None:
            continue
        if path in seen:
            ctx.error(
                (*key, "path"),
                f"export {path} is given twice (also export[{seen[path]}])",
                "give each export its own path",
            )
            continue
        seen[path] = i
        eid = export_id_for(path)
        if eid in ids:
            ctx.error(
                (*key, "path"),
                f"export {path} and {ids[eid]} hash to the same export id {eid}",
                "rename one of them (file handles carry a 16-bit export id)",
            )
            continue
        ids[eid] = path
        values = _port_rule(ctx, key, defaults, own)
        if "clients" not in values and key not in ctx.origins:
            ctx.warn(
                key, f"export {path} allows every client", 'list networks: clients = ["10.0.0.0/8"]'
            )
        if values.get("squash") == "none":
            ctx.warn(
                (*key, "squash"),
                f"export {path} trusts remote root (no_root_squash)",
                'use squash = "root" unless clients are trusted hosts',
            )
        cfg = build(ExportConfig, values)
        if not cfg.read_only and not cfg.secure:
            ctx.warn(
                (*key, "insecure" if "insecure" in own else "secure_port"),
                f"export {path} is writable and accepts clients on any source port: any user "
                "of a client host can write as any uid",
                "drop insecure (secure_port is the default), or make the export read_only",
            )
        out.append(cfg)
    _overlaps(ctx, out, [i for i, item in enumerate(raw) if isinstance(item, dict)])
    return out


_PORT_KEYS: Final = ("secure_port", "insecure")


def _port_rule(
    ctx: _Ctx, key: Key, defaults: Mapping[str, Any], own: Mapping[str, Any]
) -> dict[str, Any]:
    """An export's values over ``[export_defaults]``'s, where the source-port rule is one
    setting under two names (``secure_port = false`` is ``insecure = true``): the most
    specific table that names either decides; naming both with opposite meanings is an
    error."""
    for table, where in ((defaults, ("export_defaults",)), (own, key)):
        if all(k in table for k in _PORT_KEYS) and table["secure_port"] == table["insecure"]:
            ctx.error(
                (*where, "insecure"),
                f"secure_port = {str(table['secure_port']).lower()} and insecure = "
                f"{str(table['insecure']).lower()} contradict each other",
                "keep one of them: insecure = true (knfsd's insecure) or secure_port = true",
            )
    values = {**defaults, **own}
    if any(k in own for k in _PORT_KEYS):
        for k in _PORT_KEYS:
            if k not in own:
                values.pop(k, None)
    return values


def _overlaps(ctx: _Ctx, exports: list[ExportConfig], idx: list[int]) -> None:
    """Warn when one export's backend contains another's: clients of the outer export reach
    the inner export's objects through it, whatever the inner export's rules say."""
    spaces = [_space(e.backend) for e in exports]
    for ia, (a, sa) in enumerate(zip(exports, spaces, strict=True)):
        for b, sb in zip(exports, spaces, strict=True):
            if a is b or sa[0] != sb[0] or not sb[1].startswith(sa[1]):
                continue
            if sa[1] == sb[1] and a.path > b.path:
                continue  # the same backend twice: warn once
            ctx.warn(
                ("export", idx[ia], "backend"),
                f"export {a.path}'s backend covers {b.path}'s: clients of {a.path} can read "
                f"{b.path}'s objects through it, whatever {b.path}'s rules say",
                f"give {a.path} clients and squash at least as strict as {b.path}'s, or "
                "separate the prefixes",
            )


def _space(url: str) -> tuple[str, str]:
    """(store, key prefix) an export URL covers, comparable by prefix."""
    return parse_store_url(url).space()


def find_config_path(arg: str | None) -> Path | None:
    """``--config`` if given, else $NFSGW_CONFIG, else the default file if it exists."""
    if arg:
        return Path(arg)
    env = os.environ.get("NFSGW_CONFIG")
    if env:
        return Path(env)
    return DEFAULT_CONFIG_PATH if DEFAULT_CONFIG_PATH.exists() else None
