"""An export as the layers see it: its settings (``ExportConfig``, the ``[[export]]`` table of
``nfsgw.toml``, each key declared once with its converter), object store, namespace index and
key prefix, and a client's mount record.

Must not: apply policy (``gateway.policy``), resolve handles or touch wire types.
"""

from __future__ import annotations

import functools
import ipaddress
import re
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from gateway.backend import StoreUrlError, check_store_url
from gateway.backend.base import ObjectStore
from gateway.namespace import Namespace
from gateway.settings import (
    Conv,
    Invalid,
    InvalidItems,
    Setting,
    boolean,
    choice,
    int_in,
    seconds,
    setting,
    string,
    tname,
)
from nfsproto.mount3 import MNTPATHLEN

Squash = Literal["root", "all", "none"]
IpNet = ipaddress.IPv4Network | ipaddress.IPv6Network
EVERYONE: Final[tuple[IpNet, ...]] = (
    ipaddress.ip_network("0.0.0.0/0"),
    ipaddress.ip_network("::/0"),
)
MAX_ID: Final = (1 << 32) - 1  # uid3/gid3 are uint32 (RFC 1813 §2.5)


def export_id_for(path: str) -> int:
    """A stable 16-bit id from the export path, so handles survive restarts and are the same
    on every gateway of a fleet with the same exports."""
    return zlib.crc32(path.encode()) & 0xFFFF or 1


# -- converters of export keys (raise Invalid(message, hint)) --------------------------------


def _export_path(v: object) -> str:
    s = string.parse(v)
    parts = s.split("/")[1:]
    if (
        not s.startswith("/")
        or "//" in s
        or (s != "/" and s.endswith("/"))
        or any(p in (".", "..") for p in parts)
        or "\0" in s
    ):
        raise Invalid(f"{s!r} is not a clean absolute path", 'like "/imagenet" (no trailing /)')
    if len(s.encode()) > MNTPATHLEN:
        raise Invalid(
            f"export path longer than {MNTPATHLEN} bytes (MNTPATHLEN)", "use a shorter path"
        )
    return s


def _backend(v: object) -> str:
    s = string.parse(v)
    try:
        check_store_url(s)
    except StoreUrlError as e:
        raise Invalid(str(e), e.hint) from None
    return s


def _pack(v: object) -> str | None:
    s = string.parse(v)
    if not s:
        return None
    try:
        check_store_url(s, object_store=True)
    except StoreUrlError as e:
        raise Invalid(str(e), e.hint) from None
    return s


def _mode(v: object) -> int:
    if isinstance(v, int) and not isinstance(v, bool):
        raise Invalid(
            f"a mode must be a string of octal digits, not the integer {v}",
            'quote it: "0644" (a bare 644 would be read as a decimal number)',
        )
    s = string.parse(v)
    if not re.fullmatch(r"0?o?[0-7]{1,4}", s):
        raise Invalid(
            f"{s!r} is not an octal mode", 'e.g. "0644" for files, "0755" for directories'
        )
    return int(s.replace("o", ""), 8)


def _clients(v: object) -> tuple[IpNet, ...]:
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list):
        raise Invalid(f"must be an array of networks, not {tname(v)}", 'e.g. ["10.0.0.0/8"]')
    if not v:
        raise Invalid(
            "an empty client list lets nobody mount",
            'list networks, e.g. ["10.0.0.0/8"], or remove the key to allow every client',
        )
    nets: list[IpNet] = []
    bad: list[tuple[int, Invalid]] = []
    for i, item in enumerate(v):
        try:
            nets.extend(_client(item))
        except Invalid as e:
            bad.append((i, e))
    if bad:
        raise InvalidItems(bad)
    return tuple(dict.fromkeys(nets))


def _client(item: object) -> list[IpNet]:
    if not isinstance(item, str):
        raise Invalid(f"{item!r} is not a string", 'quote it: "10.0.0.0/8"')
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
        raise Invalid(
            f"{s!r} is not an IP address or network",
            'write an address ("10.1.2.3") or a CIDR network ("10.0.0.0/8"); host names are not '
            "resolved",
        ) from None
    raise Invalid(f"{s!r} has host bits set", f'did you mean "{loose}"?')


SEC_FLAVORS: Final = {"sys": 1, "none": 0}  # RFC 5531 AUTH_SYS, AUTH_NONE


def _sec(v: object) -> tuple[str, ...]:
    if isinstance(v, str):
        v = [v]
    if isinstance(v, tuple):
        v = list(v)
    if not isinstance(v, list) or not v:
        raise Invalid("must be a non-empty array of flavours", 'e.g. ["sys"] or ["sys", "none"]')
    out: list[str] = []
    for item in v:
        s = item.strip().lower() if isinstance(item, str) else None
        if s is None or s not in SEC_FLAVORS:
            raise Invalid(
                f"{item!r} is not an auth flavour this gateway serves",
                '"sys" (AUTH_SYS) or "none" (AUTH_NONE); krb5 is not supported',
            )
        out.append(s)
    return tuple(dict.fromkeys(out))


_SQUASH: Final = {
    "root": "root",
    "root_squash": "root",
    "all": "all",
    "all_squash": "all",
    "none": "none",
    "no_root_squash": "none",
}
_ID: Final = int_in(0, MAX_ID)
_MODE: Final = Conv(_mode, show=lambda m: f"{m:04o}")


def _live(conv: Conv[Any], help: str, flag: str | None = None) -> Mapping[str, Setting]:
    """An export key a reload applies to the next call (the export keeps its caches)."""
    return setting(conv, help, flag=flag, reload="live")


@dataclass(frozen=True, slots=True)
class ExportConfig:
    """One ``[[export]]`` table (``[export_defaults]`` sets any key but path and backend).
    A change of ``backend``, ``attr_ttl_s`` or ``immutable`` gives the export a fresh store
    and index on reload; the other keys apply to the next call."""

    path: str = field(
        metadata=setting(
            Conv(_export_path), 'the path clients mount, e.g. "/imagenet"', reload="rebuild"
        )
    )
    backend: str = field(
        metadata=setting(Conv(_backend), '"s3://BUCKET/PREFIX/" or "file:///DIR"', reload="rebuild")
    )
    read_only: bool = field(
        default=False,
        metadata=_live(boolean, "make every export read-only", flag="--read-only"),
    )
    clients: tuple[IpNet, ...] = field(
        default=EVERYONE,
        metadata=_live(Conv(_clients), "addresses and CIDR networks allowed to mount"),
    )
    squash: Squash = field(
        default="root",
        metadata=_live(
            choice(
                _SQUASH, 'use "root" (root_squash), "all" (all_squash) or "none" (no_root_squash)'
            ),
            "root, all or none",
        ),
    )
    anonuid: int = field(default=65534, metadata=_live(_ID, "uid squashed callers get"))
    anongid: int = field(default=65534, metadata=_live(_ID, "gid squashed callers get"))
    uid: int = field(default=0, metadata=_live(_ID, "owner of objects without nfsgw metadata"))
    gid: int = field(default=0, metadata=_live(_ID, "group of objects without nfsgw metadata"))
    file_mode: int = field(default=0o644, metadata=_live(_MODE, "mode of such files"))
    dir_mode: int = field(default=0o755, metadata=_live(_MODE, "mode of directories"))
    attr_ttl_s: float = field(
        default=60.0,
        metadata=setting(
            seconds(),
            "seconds before a listed directory is re-listed, for every export",
            flag="--attr-ttl",
            reload="rebuild",
        ),
    )
    immutable: bool = field(
        default=False,
        metadata=setting(
            boolean,
            "the bucket never changes under the gateway: listings never expire (every export)",
            flag="--immutable",
            reload="rebuild",
        ),
    )
    secure_port: bool = field(
        default=True,
        metadata=_live(
            boolean,
            "only clients on a privileged source port (< 1024), like knfsd's secure "
            "(false is insecure = true)",
        ),
    )
    insecure: bool = field(
        default=False,
        metadata=_live(
            boolean,
            "accept clients on any source port, like knfsd's insecure (needed behind a NAT "
            "or QEMU user networking, and for clients that bind no reserved port)",
            flag="--insecure",
        ),
    )
    sec: tuple[str, ...] = field(
        default=("sys",),
        metadata=_live(
            Conv(_sec, show=lambda t: "[" + ", ".join(f'"{x}"' for x in t) + "]"),
            'RPC auth flavours the export accepts, like knfsd\'s sec=: "sys" (AUTH_SYS), '
            '"none" (AUTH_NONE, squashed to anonuid)',
        ),
    )
    pack: str | None = field(
        default=None,
        metadata=setting(
            Conv(_pack),
            "serve packed objects from this pack (nfsgw pack SRC --to URL); see docs/packs.md",
            flag="--pack",
            metavar="URL",
            reload="rebuild",
        ),
    )
    data_prefetch: bool = field(
        default=True,
        metadata=setting(
            boolean,
            "fetch listed small files ahead of READs (with [cache] data_prefetch on; "
            "never for a file:// backend)",
            reload="rebuild",
        ),
    )

    def __post_init__(self) -> None:
        for name, conv in (("path", _export_path), ("backend", _backend), ("sec", _sec)):
            try:
                conv(getattr(self, name))
            except Invalid as e:
                raise ValueError(f"export {name} {getattr(self, name)!r}: {e.message}") from None

    def allows(self, host: str) -> bool:
        return _allows(self.clients, host)

    @property
    def secure(self) -> bool:
        """Whether a client must call from a privileged source port (``secure_port`` and
        not ``insecure``)."""
        return self.secure_port and not self.insecure

    @property
    def flavors(self) -> tuple[int, ...]:
        """The RPC auth flavour numbers ``sec`` lists, in its order (MNT's auth_flavors)."""
        return _flavors(self.sec)


@functools.lru_cache(maxsize=64)
def _flavors(sec: tuple[str, ...]) -> tuple[int, ...]:
    """``sec`` as flavour numbers (cached: every call checks it)."""
    return tuple(SEC_FLAVORS[s] for s in sec)


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


@dataclass(slots=True)
class Export:
    id: int
    cfg: ExportConfig
    store: ObjectStore
    ns: Namespace
    prefix: str
    root_handle: bytes = b""

    @property
    def fsid(self) -> int:
        return self.id


@dataclass(slots=True)
class Mount:
    host: str
    path: str
