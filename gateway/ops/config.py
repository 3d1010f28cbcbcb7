"""The configuration's shape: ``ServerConfig``, one section object per table of
``nfsgw.toml``; the command-line flags the sections declare; what a reload applies.

Every key is declared once, on the section type of the layer that owns it (``gateway.settings``
explains how):

- ``[server]``: ``ServerSettings`` here, with ``TransportLimits`` (``gateway.transport``:
  ``max_record``, ``max_inflight_per_conn``) and ``NfsConfig`` (``gateway.registry``:
  ``rsize``, ``wsize``) inlined;
- ``[admin]``, ``[log]``: ``AdminConfig``, ``LogConfig`` here;
- ``[s3]``: ``S3Config`` with ``RetryPolicy`` inlined (``gateway.backend.config``);
- ``[cache]``: ``CacheConfig`` here (``memory``, ``metadata_memory``, ``coalesce``) with
  ``DataConfig`` (``gateway.data.config``) and ``NamespaceConfig``
  (``gateway.namespace.config``: ``prefetch``) inlined;
- ``[writes]``: ``WriteConfig`` (``gateway.writes.config``);
- ``[export_defaults]``, ``[[export]]``: ``ExportConfig`` (``gateway.exports``).

``gateway.ops.configfile`` reads the file and the command-line overrides by walking these
declarations; ``flags`` gives ``gateway.ops.cli`` its flags; ``reload_plan`` and
``needs_rebuild`` tell ``gateway.ops.server`` what a reload applies. Must not: read files or
open sockets.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

from gateway.backend.config import S3Config
from gateway.data.config import DataConfig
from gateway.data.fleet import FleetConfig
from gateway.exports import ExportConfig
from gateway.namespace.config import NamespaceConfig
from gateway.ops.logs import LEVELS
from gateway.registry import NfsConfig
from gateway.settings import (
    INLINE,
    Conv,
    Entry,
    Invalid,
    MiB,
    abs_path,
    boolean,
    changed,
    choice,
    entries,
    int_in,
    seconds,
    setting,
    size,
    string,
)
from gateway.transport import TransportLimits
from gateway.writes.config import WriteConfig

LogFormat = Literal["auto", "json", "console"]

DEFAULT_ADMIN_LISTEN: Final = "127.0.0.1:9426"


class ConfigError(ValueError):
    pass


def default_cache_memory() -> int:
    """A quarter of the host's RAM, so a dataset that fits is served from memory from the
    second epoch on."""
    try:
        pages = os.sysconf("SC_PHYS_PAGES")
        page = os.sysconf("SC_PAGE_SIZE")
        return max(64 * MiB, pages * page // 4)
    except (ValueError, OSError):
        return 1 << 30


# ============================================================================ ops converters


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


def _host(v: object) -> str:
    s = string.parse(v)
    if s == "localhost":
        return s
    try:
        ipaddress.ip_address(s)
    except ValueError:
        raise Invalid(
            f"{s!r} is not an IP address",
            'an address of this host: "0.0.0.0" (all IPv4), "::" (all), "127.0.0.1"',
        ) from None
    return s


UNIX_PREFIX: Final = "unix:"  # admin.listen = "unix:/run/nfsgw/admin.sock"


def _listen(v: object) -> str | None:
    s = string.parse(v)
    if not s:
        return None
    if s.startswith(UNIX_PREFIX):
        path = s[len(UNIX_PREFIX) :]
        if not path.startswith("/") or "\0" in path or len(path.encode()) > 107:
            raise Invalid(
                f"{s!r} is not unix:/ABSOLUTE/PATH (at most 107 bytes)",
                'e.g. "unix:/run/nfsgw/admin.sock"',
            )
        return s
    try:
        host, _ = split_listen(s)
        if host != "localhost":
            ipaddress.ip_address(host)
    except ValueError:
        raise Invalid(
            f"{s!r} is not HOST:PORT or unix:/PATH",
            'e.g. "127.0.0.1:9426", "[::1]:9426" or "unix:/run/nfsgw/admin.sock"; "" turns it off',
        ) from None
    return s


_PORT: Final = int_in(0, 65535)


# ============================================================================ the sections


def _parse_workers(v: object) -> int:
    if v == "auto":
        return 0
    if isinstance(v, str) and v.isdigit():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_WORKERS:
        raise Invalid(f'workers must be "auto" or 1..{MAX_WORKERS}, not {v!r}', 'e.g. 2 or "auto"')
    return v


MAX_WORKERS: Final = 256
_WORKERS: Final = Conv(_parse_workers, show=lambda n: "auto" if n == 0 else str(n))


@dataclass(frozen=True, slots=True)
class ServerSettings:
    """``[server]``: listeners, directories and per-connection bounds."""

    listen: str = field(
        default="127.0.0.1",
        metadata=setting(Conv(_host), "address to listen on", flag="--listen"),
    )
    port: int = field(
        default=2049,
        metadata=setting(_PORT, "TCP port for NFS, MOUNT and PORTMAP; 0 = any", flag="--port"),
    )
    portmap_port: int | None = field(
        default=None,
        metadata=setting(
            _PORT,
            "also answer PORTMAP on this port (111); if a system rpcbind owns it, register "
            "our programs there instead",
            flag="--portmap-port",
        ),
    )
    state_dir: Path = field(
        default=Path("/var/lib/nfsgw"),
        metadata=setting(
            abs_path, "handle secret and long-handle map live here", flag="--state-dir"
        ),
    )
    cache_dir: Path | None = field(
        default=None,
        metadata=setting(
            abs_path,
            "the data cache's disk tier, the host's one data cache shared by the workers "
            "(e.g. /var/cache/nfsgw)",
            flag="--cache-dir",
            default_text="$CACHE_DIRECTORY (systemd CacheDirectory=), else STATE_DIR/cache",
        ),
    )
    max_connections: int = field(
        default=1024,
        metadata=setting(
            int_in(1, 1 << 20), "client connections", flag="--max-connections", reload="live"
        ),
    )
    max_connections_per_address: int = field(
        default=256,
        metadata=setting(
            int_in(1, 1 << 20),
            "client connections from one address (a node's mounts with nconnect fit)",
            flag="--max-connections-per-address",
            reload="live",
        ),
    )
    refuse_unknown_peers: bool = field(
        default=False,
        metadata=setting(
            boolean,
            "close at accept a connection from an address in no export's clients (before it "
            "can send a byte)",
            flag="--refuse-unknown-peers",
            reload="live",
        ),
    )
    idle_timeout_s: float = field(
        default=360.0,
        metadata=setting(
            seconds(),
            "seconds a connection may stay idle (no call, nothing unsent) before it is closed "
            "(knfsd's 6 minutes; 0: never)",
            flag="--idle-timeout",
            reload="live",
        ),
    )
    transport: TransportLimits = field(default_factory=TransportLimits, metadata=INLINE)
    nfs: NfsConfig = field(default_factory=NfsConfig, metadata=INLINE)
    drain_timeout_s: float = field(
        default=10.0,
        metadata=setting(
            seconds(),
            "seconds in-flight calls get to finish at shutdown",
            flag="--drain-timeout",
            reload="live",
        ),
    )
    workers: int = field(
        default=0,
        metadata=setting(
            _WORKERS,
            "gateway processes sharing the port (SO_REUSEPORT), under a supervisor; "
            '"auto" = one per CPU; 1 = a single process, no supervisor',
            flag="--workers",
            metavar="N|auto",
        ),
    )
    uvloop: bool = field(
        default=True, metadata=setting(boolean, "use the asyncio loop", flag="--no-uvloop")
    )
    fast_path: bool = field(
        default=True,
        metadata=setting(
            boolean,
            "answer cached GETATTR/LOOKUP/ACCESS/READ in the receive callback (gateway.fastpath)",
            flag="--no-fast-path",
        ),
    )


@dataclass(frozen=True, slots=True)
class AdminConfig:
    """``[admin]``: the admin HTTP API (/metrics, /healthz, /readyz, /v1/...). ``listen`` None:
    off (with a config file it defaults to ``DEFAULT_ADMIN_LISTEN``). ``token`` is read from
    ``token_file`` when the configuration is loaded."""

    listen: str | None = field(
        default=None,
        metadata=setting(
            Conv(_listen),
            "serve /metrics, /healthz, /readyz and /v1/* here: HOST:PORT, or unix:/PATH "
            '(mode 0660, trusted: mutating calls need no token); "" = off',
            flag="--admin-listen",
            metavar="HOST:PORT|unix:PATH",
            default_text=f"on at {DEFAULT_ADMIN_LISTEN} with a config file, off without",
        ),
    )
    token_file: Path | None = field(
        default=None,
        metadata=setting(
            abs_path,
            "require this bearer token on the admin API (mutating calls on TCP need it; a "
            "non-loopback listen needs it to start)",
            flag="--admin-token-file",
            reload="live",
        ),
    )
    token: str | None = field(default=None, repr=False)


@dataclass(frozen=True, slots=True)
class LogConfig:
    """``[log]``."""

    level: str = field(
        default="info", metadata=setting(choice(LEVELS), "log level", flag="--log-level")
    )
    format: LogFormat = field(
        default="auto",
        metadata=setting(
            choice(("auto", "json", "console")),
            "auto: console on a TTY, JSON otherwise",
            flag="--log-format",
        ),
    )


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """``[cache]``: the data cache budget, the directory index budget (split between the
    exports) and the data and namespace layers' cache keys."""

    memory: int = field(
        default_factory=default_cache_memory,
        metadata=setting(
            size(0),
            "data cache budget, e.g. 8G",
            flag="--cache-memory",
            default_text="a quarter of RAM",
        ),
    )
    metadata_memory: int = field(
        default=1 << 30,  # ~80 B per entry + ~2 KiB per directory: ImageNet needs ~100 MiB
        metadata=setting(
            size(1 * MiB), "directory index budget across exports", flag="--metadata-memory"
        ),
    )
    data: DataConfig = field(default_factory=DataConfig, metadata=INLINE)
    namespace: NamespaceConfig = field(default_factory=NamespaceConfig, metadata=INLINE)
    coalesce: bool = field(
        default=True,
        metadata=setting(
            boolean,
            "disable whole-object reads and read-ahead (for comparisons)",
            flag="--no-coalesce",
        ),
    )

    @property
    def reads(self) -> DataConfig:
        """What the data layer runs with: without ``coalesce``, one ranged GET per READ."""
        if self.coalesce:
            return self.data
        return dataclasses.replace(self.data, small_file_max=0, max_readahead=0)

    def namespace_for(self, export: ExportConfig, exports: int) -> NamespaceConfig:
        """One export's index settings: its TTL rules and its share of ``metadata_memory``."""
        return dataclasses.replace(
            self.namespace,
            attr_ttl_s=export.attr_ttl_s,
            immutable=export.immutable,
            memory_bytes=max(1 * MiB, self.metadata_memory // max(1, exports)),
        )


_TABLE: Final = "nfsgw.table"


def _table(group: str) -> Mapping[str, str]:
    """Metadata of a ``ServerConfig`` field that is a TOML table; ``group``: the title of
    its flags in ``--help``."""
    return {_TABLE: group}


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """The whole configuration: one section object per table of ``nfsgw.toml`` (the field
    is named after the table; ``exports`` holds the ``[[export]]`` tables with
    ``[export_defaults]`` applied) and the file it came from."""

    server: ServerSettings = field(default_factory=ServerSettings, metadata=_table("server"))
    exports: tuple[ExportConfig, ...] = field(default=(), metadata=_table("exports"))
    s3: S3Config = field(default_factory=S3Config, metadata=_table("S3"))
    cache: CacheConfig = field(default_factory=CacheConfig, metadata=_table("caches"))
    writes: WriteConfig = field(default_factory=WriteConfig, metadata=_table("writes"))
    fleet: FleetConfig = field(default_factory=FleetConfig, metadata=_table("fleet"))
    admin: AdminConfig = field(default_factory=AdminConfig, metadata=_table("admin API and logs"))
    log: LogConfig = field(default_factory=LogConfig, metadata=_table("admin API and logs"))
    source: Path | None = None  # the file this came from (SIGHUP re-reads it)

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for e in self.exports:
            if e.path in seen:
                raise ConfigError(f"export {e.path} given twice")
            seen.add(e.path)
        if not self.exports:
            raise ConfigError("no exports: give at least one --export /PATH=s3://BUCKET/PREFIX")

    @classmethod
    def of(cls, exports: Sequence[ExportConfig], **settings: object) -> ServerConfig:
        """A configuration built in code (tests, embedding): ``exports`` and, by keyword,
        settings named ``<table>_<key>`` (``server_port=0``, ``cache_memory=1 << 30``,
        ``writes_part_size=16 << 20``) or whole sections (``admin=AdminConfig(...)``); the
        rest keep their defaults. Values are not converted: give them typed."""
        sections: dict[str, Any] = {
            name: settings.pop(name) if name in settings else cls_()
            for name, cls_ in SECTIONS.items()
        }
        for name, value in settings.items():
            table, _, key = name.partition("_")
            entry = entries(SECTIONS[table]).get(key) if table in SECTIONS else None
            if entry is None:
                raise TypeError(f"ServerConfig.of: no setting {name!r} (<table>_<key>)")
            sections[table] = entry.replace(sections[table], value)
        return cls(exports=tuple(exports), **sections)


# TOML table -> section type, in ``ServerConfig`` order
SECTIONS: Final[dict[str, type]] = {
    f.name: f.default_factory  # type: ignore[misc]
    for f in dataclasses.fields(ServerConfig)
    if _TABLE in f.metadata and f.name != "exports"
}
_GROUPS: Final = {
    f.name: f.metadata[_TABLE] for f in dataclasses.fields(ServerConfig) if _TABLE in f.metadata
}


# ============================================================================ flags and reload


@dataclass(frozen=True, slots=True)
class Flag:
    """A command-line flag of ``serve``/``check-config``: it sets ``table.key`` (``table``
    "export": the key of every export)."""

    group: str
    table: str
    entry: Entry

    @property
    def name(self) -> str:
        assert self.entry.setting.flag is not None
        return self.entry.setting.flag

    @property
    def switch(self) -> bool:
        """A boolean flag: given, it sets the opposite of the default."""
        return self.entry.setting.conv is boolean

    def help(self) -> str:
        s = self.entry.setting
        default = self.entry.describe_default()
        if self.switch or not default:
            return s.help
        return f"{s.help} (default{default})"


def flags() -> Iterator[Flag]:
    """Every flag, grouped by table in ``ServerConfig`` order."""
    for table, group in _GROUPS.items():
        cls = ExportConfig if table == "exports" else SECTIONS[table]
        for e in entries(cls).values():
            if e.setting.flag is not None:
                yield Flag(group, "export" if table == "exports" else table, e)


def reload_plan(old: ServerConfig, new: ServerConfig) -> tuple[ServerConfig, list[str]]:
    """What a reload runs with: ``new``, with every changed setting a running process cannot
    take keeping its running value; and the names (``table.key``) of those settings."""
    merged: dict[str, Any] = {}
    restart: list[str] = []
    for table, cls in SECTIONS.items():
        running, section = getattr(old, table), getattr(new, table)
        for e in changed(cls, running, section):
            if e.setting.reload == "restart":
                restart.append(f"{table}.{e.key}")
                section = e.replace(section, e.get(running))
        merged[table] = section
    return dataclasses.replace(new, **merged), restart


def needs_rebuild(old: ExportConfig, new: ExportConfig) -> bool:
    """Whether a changed export needs a fresh store and index (else the next call sees it)."""
    return any(e.setting.reload == "rebuild" for e in changed(ExportConfig, old, new))
