"""Server and export configuration: frozen dataclasses, the TOML file, CLI overrides and the
checks behind ``nfsgw check-config``.

Owns: the shape of the configuration, its defaults and its validation. Every problem found in
a file (or in command-line overrides) becomes a ``ConfigIssue`` with its location (file and
line, or the flag), the key path (``export[1].clients[0]``), what is wrong and a fix hint;
all of them are collected before anything is reported, and unknown keys are errors (with a
"did you mean" when one is close). Must not: open sockets, touch the backend, or read anything
but the config file and the admin token file.

The file (``/etc/nfsgw/nfsgw.toml`` by default; ``docs/operations.md`` has the reference)::

    [server]  listen, port, portmap_port, state_dir, cache_dir, max_connections,
              max_inflight_per_conn, max_record, rsize, wsize, drain_timeout_s, uvloop
    [admin]   listen ("" turns the admin API off), token_file
    [log]     level, format
    [s3]      endpoint_url, region, addressing_style, profile, anonymous, max_connections,
              request_timeout_s, max_attempts, deadline_s
    [cache]   memory, metadata_memory, small_file_max, block_size, max_readahead, prefetch,
              coalesce
    [writes]  spool_dir, spool_bytes, part_size, flush_idle_s, rename_max_entries
    [export_defaults]  any [[export]] key but path and backend
    [[export]] path, backend, read_only, clients, squash, anonuid, anongid, uid, gid,
              file_mode, dir_mode, attr_ttl_s, immutable, secure_port
"""

from __future__ import annotations

import difflib
import functools
import ipaddress
import os
import re
import tomllib
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

from gateway.backend import parse_store_url

Squash = Literal["root", "all", "none"]
IpNet = ipaddress.IPv4Network | ipaddress.IPv6Network
LogFormat = Literal["auto", "json", "console"]

DEFAULT_CONFIG_PATH = Path("/etc/nfsgw/nfsgw.toml")
DEFAULT_ADMIN_LISTEN = "127.0.0.1:9426"
EVERYONE: tuple[IpNet, ...] = (
    ipaddress.ip_network("0.0.0.0/0"),
    ipaddress.ip_network("::/0"),
)
MAX_ID = 0xFFFFFFFF


class ConfigError(ValueError):
    pass


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


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)?\s*$", re.I)


def parse_size(text: str) -> int:
    """'8G', '512M', '1.5g', '4096' -> bytes (binary multiples)."""
    m = _SIZE.match(text)
    if not m:
        raise ConfigError(f"not a size: {text!r} (use e.g. 512M, 8G)")
    mult = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}[m.group(2).lower()]
    return int(float(m.group(1)) * mult)


def default_cache_memory() -> int:
    """A quarter of the host's RAM, so a dataset that fits is served from memory from the
    second epoch on."""
    try:
        pages = os.sysconf("SC_PHYS_PAGES")
        page = os.sysconf("SC_PAGE_SIZE")
        return max(64 << 20, pages * page // 4)
    except (ValueError, OSError):
        return 1 << 30


def export_id_for(path: str) -> int:
    """A stable 16-bit id from the export path, so handles survive restarts and are the same
    on every gateway of a fleet with the same exports."""
    return zlib.crc32(path.encode()) & 0xFFFF or 1


@dataclass(frozen=True, slots=True)
class ExportConfig:
    path: str  # the export path clients mount, e.g. "/data"
    backend: str  # s3://bucket/prefix or file:///dir
    read_only: bool = False
    clients: tuple[IpNet, ...] = EVERYONE
    squash: Squash = "root"
    anonuid: int = 65534
    anongid: int = 65534
    uid: int = 0
    gid: int = 0
    file_mode: int = 0o644
    dir_mode: int = 0o755
    attr_ttl_s: float = 60.0
    immutable: bool = False
    secure_port: bool = False

    def __post_init__(self) -> None:
        if (
            not self.path.startswith("/")
            or "//" in self.path
            or (self.path != "/" and self.path.endswith("/"))
        ):
            raise ConfigError(f"export path {self.path!r} must be absolute, like /data")
        if not re.match(r"^(s3://[^/]+(/.*)?|file:///.+)$", self.backend):
            raise ConfigError(
                f"export backend {self.backend!r} must be s3://BUCKET[/PREFIX] or file:///DIR"
            )

    def allows(self, host: str) -> bool:
        return _allows(self.clients, host)


@functools.lru_cache(maxsize=4096)
def _allows(clients: tuple[IpNet, ...], host: str) -> bool:
    """Whether ``host`` is in one of ``clients`` (cached: it runs on every call)."""
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return any(addr.version == net.version and addr in net for net in clients)


def parse_export(spec: str, read_only: bool = False) -> ExportConfig:
    """'/data=s3://bucket/prefix' -> ExportConfig."""
    path, sep, backend = spec.partition("=")
    if not sep:
        raise ConfigError(f"--export {spec!r}: expected /PATH=s3://BUCKET/PREFIX")
    return ExportConfig(path=path, backend=backend, read_only=read_only)


@dataclass(frozen=True, slots=True)
class S3Config:
    endpoint_url: str | None = None
    region: str = "us-east-1"
    addressing_style: Literal["auto", "path", "virtual"] = "auto"
    profile: str | None = None
    anonymous: bool = False
    max_connections: int = 64
    request_timeout_s: float = 20.0
    max_attempts: int = 5
    deadline_s: float = 30.0


@dataclass(frozen=True, slots=True)
class AdminConfig:
    """The admin HTTP API (/metrics, /healthz, /readyz, /v1/...). ``listen`` None: off.
    ``token`` is read from ``token_file`` when the configuration is loaded."""

    listen: str | None = None
    token_file: Path | None = None
    token: str | None = field(default=None, repr=False)


@dataclass(frozen=True, slots=True)
class LogConfig:
    level: str = "info"
    format: LogFormat = "auto"


@dataclass(frozen=True, slots=True)
class ServerConfig:
    listen: str = "127.0.0.1"
    port: int = 2049
    portmap_port: int | None = None
    state_dir: Path = Path("/var/lib/nfsgw")
    exports: tuple[ExportConfig, ...] = ()
    s3: S3Config = field(default_factory=S3Config)
    cache_memory: int = field(default_factory=default_cache_memory)
    metadata_memory: int = 1 << 30  # ~525 B per entry: ImageNet (1.28 M files) needs ~670 MB
    small_file_max: int = 4 << 20
    block_size: int = 1 << 20
    max_readahead: int = 32 << 20
    max_inflight_per_conn: int = 64
    max_record: int = 4 * 1024 * 1024 + 64 * 1024
    max_connections: int = 1024
    rsize: int = 1 << 20
    wsize: int = 1 << 20
    metrics_listen: str | None = None  # the admin API's address (alias of admin.listen)
    uvloop: bool = True
    prefetch: bool = True  # directory metadata prefetch (off: HEAD/targeted lookups only)
    coalesce: bool = True  # whole-object reads + read-ahead (off: one ranged GET per READ)
    # Write path (gateway.writes): staged WRITE data lives in spool_dir (default
    # state_dir/spool) up to spool_bytes (past it: NFS3ERR_JUKEBOX); objects above
    # write_part_size are multipart uploads of such parts (>= 5 MiB; 10,000 parts at most);
    # staged data not written for write_flush_idle_s is committed without a COMMIT; RENAME
    # of a directory copies at most rename_max_entries keys (else NFS3ERR_NOTSUPP).
    spool_dir: Path | None = None
    spool_bytes: int = 2 << 30
    write_part_size: int = 8 << 20
    write_flush_idle_s: float = 30.0
    rename_max_entries: int = 1000
    cache_dir: Path | None = None
    admin: AdminConfig = field(default_factory=AdminConfig)
    log: LogConfig = field(default_factory=LogConfig)
    drain_timeout_s: float = 10.0
    source: Path | None = None  # the file this came from (SIGHUP re-reads it)

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for e in self.exports:
            if e.path in seen:
                raise ConfigError(f"export {e.path} given twice")
            seen.add(e.path)
        if not self.exports:
            raise ConfigError("no exports: give at least one --export /PATH=s3://BUCKET/PREFIX")
        if not 0 <= self.port < 65536:  # 0: any free port
            raise ConfigError(f"port {self.port} out of range")

    @property
    def admin_listen(self) -> str | None:
        return self.admin.listen or self.metrics_listen


# ============================================================================ the TOML file


class _Invalid(Exception):
    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class _InvalidItems(_Invalid):
    """Problems with elements of an array value: ``items`` are (index, problem)."""

    def __init__(self, items: list[tuple[int, _Invalid]]) -> None:
        super().__init__(items[0][1].message, items[0][1].hint)
        self.items = items


Key = tuple[str | int, ...]
T = TypeVar("T")
D = TypeVar("D")


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


class _Table:
    """Reads the keys of one TOML table with converters; what is left over is an error."""

    def __init__(self, ctx: _Ctx, key: Key, raw: object) -> None:
        self.ctx = ctx
        self.key = key
        self.ok = isinstance(raw, dict)
        if not self.ok:
            ctx.error(key, f"must be a table, not {_tname(raw)}", f"write it as [{_where(key)}]")
        self.raw: dict[str, Any] = dict(raw) if isinstance(raw, dict) else {}
        self.failed = False

    def get(self, name: str, conv: Callable[[Any], T], default: D) -> T | D:
        if name not in self.raw:
            return default
        value = self.raw.pop(name)
        try:
            return conv(value)
        except _InvalidItems as e:
            for i, sub in e.items:
                self.ctx.error((*self.key, name, i), sub.message, sub.hint)
        except _Invalid as e:
            self.ctx.error((*self.key, name), e.message, e.hint)
        self.failed = True
        return default

    def has(self, name: str) -> bool:
        return name in self.raw

    def finish(self, known: Sequence[str]) -> None:
        for name in self.raw:
            close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
            hint = f"did you mean {close[0]!r}?" if close else "known keys: " + ", ".join(known)
            self.ctx.error((*self.key, name), f"unknown key {name!r}", hint)


def _tname(v: object) -> str:
    return {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "an array",
        dict: "a table",
    }.get(type(v), type(v).__name__)


# -- converters (raise _Invalid(message, hint)) ------------------------------------------------


def _bool(v: object) -> bool:
    if not isinstance(v, bool):
        raise _Invalid(f"must be true or false, not {_tname(v)} {v!r}", "write true or false")
    return v


def _int_in(lo: int, hi: int) -> Callable[[object], int]:
    def conv(v: object) -> int:
        if isinstance(v, bool) or not isinstance(v, int):
            raise _Invalid(f"must be an integer, not {_tname(v)} {v!r}", f"an integer {lo}..{hi}")
        if not lo <= v <= hi:
            raise _Invalid(f"{v} is out of range", f"use a value from {lo} to {hi}")
        return v

    return conv


def _seconds(lo: float = 0.0) -> Callable[[object], float]:
    def conv(v: object) -> float:
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise _Invalid(f"must be a number of seconds, not {_tname(v)} {v!r}", "e.g. 60 or 0.5")
        if v < lo or v != v or v == float("inf"):
            raise _Invalid(f"{v} is out of range", f"a finite number of seconds >= {lo}")
        return float(v)

    return conv


def _size(lo: int = 0, hi: int = 1 << 50) -> Callable[[object], int]:
    def conv(v: object) -> int:
        if isinstance(v, bool):
            raise _Invalid("must be a size, not a boolean", 'e.g. "512M", "8G" or bytes')
        if isinstance(v, int):
            n = v
        elif isinstance(v, str):
            try:
                n = parse_size(v)
            except ConfigError:
                raise _Invalid(f"not a size: {v!r}", 'e.g. "512M", "8G", "1.5G" or 4096') from None
        else:
            raise _Invalid(f"must be a size, not {_tname(v)}", 'e.g. "512M", "8G" or bytes')
        if not lo <= n <= hi:
            raise _Invalid(f"{v!r} is out of range", f"a size from {lo} to {hi} bytes")
        return n

    return conv


def _str(v: object) -> str:
    if not isinstance(v, str):
        raise _Invalid(f"must be a string, not {_tname(v)} {v!r}", 'put it in quotes: "..."')
    return v


def _choice(choices: Mapping[str, str], hint: str = "") -> Callable[[object], str]:
    def conv(v: object) -> str:
        s = _str(v)
        if s not in choices:
            close = difflib.get_close_matches(s, list(choices), n=1, cutoff=0.6)
            fix = f"did you mean {close[0]!r}? " if close else ""
            raise _Invalid(
                f"{s!r} is not allowed", fix + (hint or "use one of " + ", ".join(choices))
            )
        return choices[s]

    return conv


def _abs_path(v: object) -> Path:
    s = _str(v)
    if not s.startswith("/"):
        raise _Invalid(
            f"{s!r} is not an absolute path", "write it from the root, like /var/lib/nfsgw"
        )
    return Path(s)


def _opt_str(v: object) -> str | None:
    s = _str(v)
    return s or None


def _host(v: object) -> str:
    s = _str(v)
    if s == "localhost":
        return s
    try:
        ipaddress.ip_address(s)
    except ValueError:
        raise _Invalid(
            f"{s!r} is not an IP address",
            'an address of this host: "0.0.0.0" (all IPv4), "::" (all), "127.0.0.1"',
        ) from None
    return s


def split_listen(s: str) -> tuple[str, int]:
    """'127.0.0.1:9426', '[::1]:9426', ':9426' -> (host, port); host defaults to 127.0.0.1."""
    host, sep, port = s.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(s)
    host = host.strip("[]") or "127.0.0.1"
    p = int(port)
    if not 0 <= p < 65536:
        raise ValueError(s)
    return host, p


def _listen(v: object) -> str | None:
    s = _str(v)
    if not s:
        return None
    try:
        host, _ = split_listen(s)
        if host != "localhost":
            ipaddress.ip_address(host)
    except ValueError:
        raise _Invalid(
            f"{s!r} is not HOST:PORT", 'e.g. "127.0.0.1:9426" or "[::1]:9426"; "" turns it off'
        ) from None
    return s


def _url(v: object) -> str | None:
    s = _str(v)
    if not s:
        return None
    if not re.match(r"^https?://[^/\s]+(/\S*)?$", s):
        raise _Invalid(f"{s!r} is not an http(s) URL", 'e.g. "https://s3.example.internal"')
    return s


def _mode(v: object) -> int:
    if isinstance(v, int) and not isinstance(v, bool):
        raise _Invalid(
            f"a mode must be a string of octal digits, not the integer {v}",
            'quote it: "0644" (a bare 644 would be read as a decimal number)',
        )
    s = _str(v)
    if not re.fullmatch(r"0?o?[0-7]{1,4}", s):
        raise _Invalid(
            f"{s!r} is not an octal mode", 'e.g. "0644" for files, "0755" for directories'
        )
    return int(s.replace("o", ""), 8)


_SQUASH = {
    "root": "root",
    "root_squash": "root",
    "all": "all",
    "all_squash": "all",
    "none": "none",
    "no_root_squash": "none",
}


def _clients(v: object) -> tuple[IpNet, ...]:
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list):
        raise _Invalid(f"must be an array of networks, not {_tname(v)}", 'e.g. ["10.0.0.0/8"]')
    if not v:
        raise _Invalid(
            "an empty client list lets nobody mount",
            'list networks, e.g. ["10.0.0.0/8"], or remove the key to allow every client',
        )
    nets: list[IpNet] = []
    bad: list[tuple[int, _Invalid]] = []
    for i, item in enumerate(v):
        try:
            nets.extend(_client(item))
        except _Invalid as e:
            bad.append((i, e))
    if bad:
        raise _InvalidItems(bad)
    return tuple(dict.fromkeys(nets))


def _client(item: object) -> list[IpNet]:
    if not isinstance(item, str):
        raise _Invalid(f"{item!r} is not a string", 'quote it: "10.0.0.0/8"')
    s = item.strip()
    if s in ("*", "all", "any"):
        return list(EVERYONE)
    try:
        return [ipaddress.ip_network(s, strict=True)]
    except ValueError:
        pass
    try:
        loose = ipaddress.ip_network(s, strict=False)
    except ValueError:
        raise _Invalid(
            f"{s!r} is not an IP address or network",
            'write an address ("10.1.2.3") or a CIDR network ("10.0.0.0/8"); host names are not '
            "resolved",
        ) from None
    raise _Invalid(f"{s!r} has host bits set", f'did you mean "{loose}"?')


def _backend(v: object) -> str:
    s = _str(v)
    try:
        u = parse_store_url(s)
    except ValueError as e:
        raise _Invalid(str(e), 'use "s3://BUCKET/PREFIX/" or "file:///DIR"') from None
    if u.scheme == "s3" and not re.fullmatch(r"[A-Za-z0-9._-]{1,255}", u.location):
        raise _Invalid(
            f"{u.location!r} is not a bucket name", "bucket names are letters, digits, '.', '-'"
        )
    if not re.match(r"^(s3://[^/]+(/.*)?|file:///.+)$", s):
        raise _Invalid(
            f"{s!r} is not s3://BUCKET[/PREFIX] or file:///DIR", 'e.g. "s3://datasets/imagenet/"'
        )
    return s


def _export_path(v: object) -> str:
    s = _str(v)
    parts = s.split("/")[1:]
    if (
        not s.startswith("/")
        or "//" in s
        or (s != "/" and s.endswith("/"))
        or any(p in (".", "..") for p in parts)
        or "\0" in s
    ):
        raise _Invalid(f"{s!r} is not a clean absolute path", 'like "/imagenet" (no trailing /)')
    if len(s.encode()) > 1024:
        raise _Invalid("export path longer than 1024 bytes (MNTPATHLEN)", "use a shorter path")
    return s


_UID = _int_in(0, MAX_ID)

# export key -> converter; the defaults are ExportConfig's
_EXPORT_KEYS: dict[str, Callable[[Any], Any]] = {
    "read_only": _bool,
    "clients": _clients,
    "squash": _choice(
        _SQUASH, 'use "root" (root_squash), "all" (all_squash) or "none" (no_root_squash)'
    ),
    "anonuid": _UID,
    "anongid": _UID,
    "uid": _UID,
    "gid": _UID,
    "file_mode": _mode,
    "dir_mode": _mode,
    "attr_ttl_s": _seconds(),
    "immutable": _bool,
    "secure_port": _bool,
}


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


_TOP = ("server", "admin", "log", "s3", "cache", "writes", "export_defaults", "export")


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

    srv = _Table(ctx, ("server",), raw.get("server", {}))
    listen = srv.get("listen", _host, "127.0.0.1")
    port = srv.get("port", _int_in(0, 65535), 2049)
    portmap_port = srv.get("portmap_port", _int_in(0, 65535), None)
    state_dir = srv.get("state_dir", _abs_path, Path("/var/lib/nfsgw"))
    cache_dir = srv.get("cache_dir", _abs_path, None)
    max_connections = srv.get("max_connections", _int_in(1, 1 << 20), 1024)
    max_inflight = srv.get("max_inflight_per_conn", _int_in(1, 4096), 64)
    max_record = srv.get("max_record", _size(64 << 10, 64 << 20), 4 * 1024 * 1024 + 64 * 1024)
    rsize = srv.get("rsize", _size(4096, 1 << 20), 1 << 20)
    wsize = srv.get("wsize", _size(4096, 1 << 20), 1 << 20)
    drain = srv.get("drain_timeout_s", _seconds(), 10.0)
    uvloop = srv.get("uvloop", _bool, True)
    srv.finish(
        (
            "listen",
            "port",
            "portmap_port",
            "state_dir",
            "cache_dir",
            "max_connections",
            "max_inflight_per_conn",
            "max_record",
            "rsize",
            "wsize",
            "drain_timeout_s",
            "uvloop",
        )
    )
    if not srv.failed and isinstance(max_record, int) and max_record < rsize + 4096:
        ctx.warn(
            ("server", "max_record"), "smaller than rsize plus headers", "raise it above rsize"
        )

    adm = _Table(ctx, ("admin",), raw.get("admin", {}))
    # With a config file the admin API is on by default (loopback only); without one, off.
    admin_listen = adm.get("listen", _listen, DEFAULT_ADMIN_LISTEN if ctx.file else None)
    token_file = adm.get("token_file", _abs_path, None)
    adm.finish(("listen", "token_file"))
    token = None
    if token_file is not None:
        token = _read_token(ctx, ("admin", "token_file"), token_file)
    if admin_listen is not None and token is None:
        host, _ = split_listen(admin_listen)
        if host != "localhost" and not ipaddress.ip_address(host).is_loopback:
            ctx.warn(
                ("admin", "listen"),
                f"the admin API on {host} is reachable from the network without a token",
                "set admin.token_file, or listen on 127.0.0.1",
            )

    lg = _Table(ctx, ("log",), raw.get("log", {}))
    level = lg.get("level", _choice({k: k for k in ("debug", "info", "warning", "error")}), "info")
    fmt = lg.get("format", _choice({k: k for k in ("auto", "json", "console")}), "auto")
    lg.finish(("level", "format"))

    s3t = _Table(ctx, ("s3",), raw.get("s3", {}))
    style: Any = s3t.get(
        "addressing_style", _choice({k: k for k in ("auto", "path", "virtual")}), "auto"
    )
    s3 = S3Config(
        endpoint_url=s3t.get("endpoint_url", _url, None),
        region=s3t.get("region", _str, "us-east-1"),
        addressing_style=style,
        profile=s3t.get("profile", _opt_str, None),
        anonymous=s3t.get("anonymous", _bool, False),
        max_connections=s3t.get("max_connections", _int_in(1, 4096), 64),
        request_timeout_s=s3t.get("request_timeout_s", _seconds(0.001), 20.0),
        max_attempts=s3t.get("max_attempts", _int_in(1, 100), 5),
        deadline_s=s3t.get("deadline_s", _seconds(0.001), 30.0),
    )
    s3t.finish(
        (
            "endpoint_url",
            "region",
            "addressing_style",
            "profile",
            "anonymous",
            "max_connections",
            "request_timeout_s",
            "max_attempts",
            "deadline_s",
        )
    )

    ct = _Table(ctx, ("cache",), raw.get("cache", {}))
    cache_memory = ct.get("memory", _size(0), None)
    metadata_memory = ct.get("metadata_memory", _size(1 << 20), 1 << 30)
    small_file_max = ct.get("small_file_max", _size(0, 1 << 30), 4 << 20)
    block_size = ct.get("block_size", _size(4096, 256 << 20), 1 << 20)
    max_readahead = ct.get("max_readahead", _size(0, 1 << 34), 32 << 20)
    prefetch = ct.get("prefetch", _bool, True)
    coalesce = ct.get("coalesce", _bool, True)
    ct.finish(
        (
            "memory",
            "metadata_memory",
            "small_file_max",
            "block_size",
            "max_readahead",
            "prefetch",
            "coalesce",
        )
    )

    wt = _Table(ctx, ("writes",), raw.get("writes", {}))
    spool_dir = wt.get("spool_dir", _abs_path, None)
    spool_bytes = wt.get("spool_bytes", _size(1 << 20), 2 << 30)
    part_size = wt.get("part_size", _size(5 << 20, 5 << 30), 8 << 20)
    flush_idle_s = wt.get("flush_idle_s", _seconds(0.001), 30.0)
    rename_max_entries = wt.get("rename_max_entries", _int_in(1, 10_000_000), 1000)
    wt.finish(("spool_dir", "spool_bytes", "part_size", "flush_idle_s", "rename_max_entries"))

    defaults = _export_fields(ctx, ("export_defaults",), raw.get("export_defaults", {}), {})
    exports = _exports(ctx, raw.get("export"), defaults or {})

    if any(i.severity == "error" for i in ctx.issues):
        return None
    try:
        return ServerConfig(
            listen=listen,
            port=port,
            portmap_port=portmap_port,
            state_dir=state_dir,
            exports=tuple(exports),
            s3=s3,
            cache_memory=cache_memory if cache_memory is not None else default_cache_memory(),
            metadata_memory=metadata_memory,
            small_file_max=small_file_max,
            block_size=block_size,
            max_readahead=max_readahead,
            max_inflight_per_conn=max_inflight,
            max_record=max_record,
            max_connections=max_connections,
            rsize=rsize,
            wsize=wsize,
            uvloop=uvloop,
            prefetch=prefetch,
            coalesce=coalesce,
            cache_dir=cache_dir,
            admin=AdminConfig(admin_listen, token_file, token),
            log=LogConfig(level, fmt),  # type: ignore[arg-type]
            drain_timeout_s=drain,
            source=Path(ctx.file) if ctx.file else None,
            spool_dir=spool_dir,
            spool_bytes=spool_bytes,
            write_part_size=part_size,
            write_flush_idle_s=flush_idle_s,
            rename_max_entries=rename_max_entries,
        )
    except ConfigError as e:  # a rule the checks above missed: still reported, not raised
        ctx.error((), str(e))
        return None


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


def _export_fields(
    ctx: _Ctx, key: Key, raw: object, base: Mapping[str, Any]
) -> dict[str, Any] | None:
    t = _Table(ctx, key, raw)
    if not t.ok:
        return None
    out = dict(base)
    for name, conv in _EXPORT_KEYS.items():
        if t.has(name):
            v = t.get(name, conv, None)
            if v is not None:
                out[name] = v
    t.finish(tuple(_EXPORT_KEYS))
    return out


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
            f"must be an array of tables, not {_tname(raw)}",
            "write each export as [[export]]",
        )
        return []
    out: list[ExportConfig] = []
    seen: dict[str, int] = {}
    ids: dict[int, str] = {}
    for i, item in enumerate(raw):
        key: Key = ("export", i)
        if not isinstance(item, dict):
            ctx.error(
                key, f"must be a table, not {_tname(item)}", "write each export as [[export]]"
            )
            continue
        item = dict(item)
        if "path" not in item:
            ctx.error(key, "missing 'path'", 'add path = "/NAME", the path clients mount')
        if "backend" not in item:
            ctx.error(key, "missing 'backend'", 'add backend = "s3://BUCKET/PREFIX/"')
        t = _Table(ctx, key, {k: item.pop(k) for k in ("path", "backend") if k in item})
        path = t.get("path", _export_path, None)
        backend = t.get("backend", _backend, None)
        fields = _export_fields(ctx, key, item, defaults)
        if path is None or backend is None or fields is None:
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
        if "clients" not in fields and key not in ctx.origins:
            ctx.warn(
                key, f"export {path} allows every client", 'list networks: clients = ["10.0.0.0/8"]'
            )
        if fields.get("squash") == "none":
            ctx.warn(
                (*key, "squash"),
                f"export {path} trusts remote root (no_root_squash)",
                'use squash = "root" unless clients are trusted hosts',
            )
        out.append(ExportConfig(path=path, backend=backend, **fields))
    _overlaps(ctx, out, [i for i, item in enumerate(raw) if isinstance(item, dict)])
    return out


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
    u = parse_store_url(url)
    if u.scheme == "file":
        return "file", u.location.rstrip("/") + "/"
    return f"s3:{u.location}", u.prefix


def find_config_path(arg: str | None) -> Path | None:
    """``--config`` if given, else $NFSGW_CONFIG, else the default file if it exists."""
    if arg:
        return Path(arg)
    env = os.environ.get("NFSGW_CONFIG")
    if env:
        return Path(env)
    return DEFAULT_CONFIG_PATH if DEFAULT_CONFIG_PATH.exists() else None
