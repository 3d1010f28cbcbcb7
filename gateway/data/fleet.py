"""A fleet of gateways sharing one shared tier, and which of them fetches each object from the
origin: rendezvous (highest random weight) hashing over the members, so a member joining or
leaving moves only the objects it wins or held (~1/N of them) and a dead member's objects go
to their next-highest member.

Members are a static list (``[fleet] members``) or the addresses of a DNS name (``[fleet]
members_dns``, e.g. a Kubernetes headless Service), re-resolved every ``resolve_every_s``; a
resolution that fails or returns nobody keeps the last members (logged). This gateway is
``[fleet] self`` (default: its listen address and port). Gateways never talk to each other:
each one computes the same owners from the same member list.

Owns: the member list, its refresh and the owner of an object. Must not: fetch or store
anything (the data prefetcher asks ``owns``; the shared tier keeps the bytes).
"""

from __future__ import annotations

import asyncio
import hashlib
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import structlog

from gateway.data.tiers import Piece
from gateway.settings import Conv, Invalid, seconds, setting, string

__all__ = ["Fleet", "FleetConfig", "parse_member"]

log = structlog.get_logger(__name__)


def parse_member(text: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[V6]:PORT`` as (host, port); ValueError if it is neither."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{text!r} is not HOST:PORT")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host or any(c.isspace() for c in host):
        raise ValueError(f"{text!r} is not HOST:PORT")
    return host, int(port)


def _member(v: object) -> str:
    s = string.parse(v)
    try:
        parse_member(s)
    except ValueError as e:
        raise Invalid(str(e), 'e.g. "10.0.0.7:2049"') from None
    return s


def _members(v: object) -> tuple[str, ...]:
    items = [v] if isinstance(v, str) else v
    if not isinstance(items, list | tuple):
        raise Invalid(f"must be a list of HOST:PORT, not {v!r}", '["10.0.0.7:2049", ...]')
    return tuple(_member(m) for m in items)


def _optional_member(v: object) -> str | None:
    return _member(v) if string.parse(v) else None


@dataclass(frozen=True, slots=True)
class FleetConfig:
    """``[fleet]``: the gateways sharing ``[cache] shared``; no members, no fleet (each
    gateway then fetches what it misses itself and fills the shared tier)."""

    members: tuple[str, ...] = field(
        default=(),
        metadata=setting(
            Conv(_members, show=lambda v: ", ".join(v) or "none", many=True),
            "a gateway of the fleet (HOST:PORT, this one included); repeatable",
            flag="--fleet-member",
            metavar="HOST:PORT",
        ),
    )
    members_dns: str | None = field(
        default=None,
        metadata=setting(
            Conv(_optional_member),
            "a DNS name whose addresses are the fleet's gateways (a headless Service), "
            "with their port",
            flag="--fleet-members-dns",
            metavar="NAME:PORT",
        ),
    )
    self_: str | None = field(
        default=None,
        metadata=setting(
            Conv(_optional_member),
            "this gateway as the fleet names it",
            key="self",
            flag="--fleet-self",
            metavar="HOST:PORT",
            default_text="the listen address and port",
        ),
    )
    resolve_every_s: float = field(
        default=30.0,
        metadata=setting(seconds(1.0), "how often members_dns is resolved again"),
    )

    @property
    def enabled(self) -> bool:
        return bool(self.members or self.members_dns)


Resolver = Callable[[str, int], Awaitable[Sequence[str]]]


async def resolve(host: str, port: int) -> list[str]:
    """The addresses of ``host`` as ``HOST:PORT`` members (TCP, any family)."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    out = []
    for family, _, _, _, addr in infos:
        a = str(addr[0])
        out.append(f"[{a}]:{port}" if family == socket.AF_INET6 else f"{a}:{port}")
    return out


def _weight(member: str, ident: bytes) -> bytes:
    return hashlib.blake2b(ident, key=member.encode()[:64], digest_size=8).digest()


def _canon(member: str) -> str:
    host, port = parse_member(member)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class Fleet:
    """The members and the owner of each object (see the module docstring)."""

    def __init__(
        self,
        self_: str,
        members: Sequence[str] = (),
        *,
        dns: str | None = None,
        resolve_every_s: float = 30.0,
        resolver: Resolver = resolve,
    ) -> None:
        self.self_ = _canon(self_)
        self.dns = dns
        self.resolve_every_s = resolve_every_s
        self._resolver = resolver
        self.members: tuple[str, ...] = ()
        self.changes = 0
        self.resolve_failures = 0
        self.set_members(members or ([] if dns else [self.self_]))

    def set_members(self, members: Sequence[str]) -> bool:
        """Use ``members`` (this gateway is always one); True if they changed."""
        new = tuple(sorted({_canon(m) for m in members} | {self.self_}))
        if new == self.members:
            return False
        if self.members:
            log.info(
                "fleet_members_changed",
                members=len(new),
                joined=sorted(set(new) - set(self.members)),
                left=sorted(set(self.members) - set(new)),
            )
        self.members = new
        self.changes += 1
        return True

    def owner(self, piece: Piece) -> str:
        """The member that fetches ``piece``'s object from the origin (every piece of an
        object has the same owner)."""
        if len(self.members) == 1:
            return self.members[0]
        ident = f"{piece.store}\0{piece.key}\0{piece.etag}".encode()
        return max(self.members, key=lambda m: _weight(m, ident))

    def owns(self, piece: Piece) -> bool:
        return self.owner(piece) == self.self_

    async def refresh(self) -> bool:
        """Resolve ``dns`` again; True if the members changed."""
        if self.dns is None:
            return False
        host, port = parse_member(self.dns)
        try:
            found = list(await self._resolver(host, port))
        except (OSError, UnicodeError) as e:
            found, why = [], str(e)
        else:
            why = "no addresses"
        if not found:
            self.resolve_failures += 1
            log.warning(
                "fleet_members_unresolved", name=self.dns, error=why, kept=len(self.members)
            )
            return False
        return self.set_members(found)

    async def run(self) -> None:
        """Keep ``members`` current (a background task of the server)."""
        while self.dns is not None:
            await self.refresh()
            await asyncio.sleep(self.resolve_every_s)
