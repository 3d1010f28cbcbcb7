"""Server and export configuration (frozen dataclasses), parsed from CLI flags.

Owns: the shape of the configuration and its validation. The TOML file comes with the
operations issue; flags map onto the same dataclasses.
"""

from __future__ import annotations

import functools
import ipaddress
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

Squash = Literal["root", "all", "none"]
IpNet = ipaddress.IPv4Network | ipaddress.IPv6Network


class ConfigError(ValueError):
    pass


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


@dataclass(frozen=True, slots=True)
class ExportConfig:
    path: str  # the export path clients mount, e.g. "/data"
    backend: str  # s3://bucket/prefix or file:///dir
    read_only: bool = False
    clients: tuple[IpNet, ...] = (
        ipaddress.ip_network("0.0.0.0/0"),
        ipaddress.ip_network("::/0"),
    )
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
    return any(addr in net for net in clients)


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
    max_connections: int = 64
    request_timeout_s: float = 30.0
    max_attempts: int = 5


@dataclass(frozen=True, slots=True)
class ServerConfig:
    listen: str = "127.0.0.1"
    port: int = 2049
    portmap_port: int | None = None
    state_dir: Path = Path("/var/lib/nfsgw")
    exports: tuple[ExportConfig, ...] = ()
    s3: S3Config = field(default_factory=S3Config)
    cache_memory: int = field(default_factory=default_cache_memory)
    metadata_memory: int = 256 << 20
    small_file_max: int = 4 << 20
    block_size: int = 1 << 20
    max_readahead: int = 32 << 20
    max_inflight_per_conn: int = 64
    max_record: int = 4 * 1024 * 1024 + 64 * 1024
    max_connections: int = 1024
    rsize: int = 1 << 20
    wsize: int = 1 << 20
    metrics_listen: str | None = None
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
