"""Fleet membership and rendezvous ownership (gateway.data.fleet), and its configuration."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import pytest

from gateway.data.fleet import Fleet, parse_member
from gateway.data.tiers import Piece
from gateway.ops.configfile import ConfigErrors, Overrides, load_config

PIECES = [
    Piece("s3://origin", f"train/n{i % 100:03}/{i}.jpg", f"e{i}", 0, 1000) for i in range(9000)
]
A, B, C, D = "10.0.0.1:2049", "10.0.0.2:2049", "10.0.0.3:2049", "10.0.0.4:2049"


def owners(fleet: Fleet) -> list[str]:
    return [fleet.owner(p) for p in PIECES]


def test_every_object_has_one_owner_and_every_member_agrees() -> None:
    views = [Fleet(me, [A, B, C]) for me in (A, B, C)]
    assert owners(views[0]) == owners(views[1]) == owners(views[2])
    owned = [sum(f.owns(p) for f in views) for p in PIECES]
    assert set(owned) == {1}  # exactly one owner each
    share = Counter(owners(views[0]))
    assert set(share) == {A, B, C}
    assert all(abs(n / len(PIECES) - 1 / 3) < 0.03 for n in share.values()), share
    # all pieces of one object have one owner
    p = PIECES[0]
    assert views[0].owner(Piece(p.store, p.key, p.etag, 4096, 10)) == views[0].owner(p)


def test_a_member_joining_or_leaving_moves_only_its_share() -> None:
    three = owners(Fleet(A, [A, B, C]))
    four = owners(Fleet(A, [A, B, C, D]))
    moved = [(x, y) for x, y in zip(three, four, strict=True) if x != y]
    assert all(y == D for _, y in moved)  # only to the newcomer
    assert abs(len(moved) / len(PIECES) - 1 / 4) < 0.03
    two = owners(Fleet(A, [A, B]))  # C died
    changed = [(x, y) for x, y in zip(three, two, strict=True) if x != y]
    assert all(x == C for x, _ in changed)  # only C's objects found new owners
    assert len(changed) == three.count(C)


async def test_members_from_dns_are_refreshed_and_a_failure_keeps_the_last() -> None:
    answers: list[Sequence[str] | OSError] = [
        ["10.0.0.1:2049", "10.0.0.2:2049"],
        OSError("Name or service not known"),
        [],
        ["10.0.0.1:2049", "10.0.0.2:2049", "10.0.0.3:2049"],
    ]

    async def resolver(host: str, port: int) -> Sequence[str]:
        assert (host, port) == ("gw.nfsgw.svc", 2049)
        a = answers.pop(0)
        if isinstance(a, OSError):
            raise a
        return a

    f = Fleet(A, dns="gw.nfsgw.svc:2049", resolver=resolver)
    assert f.members == (A,)
    assert await f.refresh() and f.members == (A, B)
    assert not await f.refresh() and f.members == (A, B) and f.resolve_failures == 1
    assert not await f.refresh() and f.members == (A, B) and f.resolve_failures == 2
    assert await f.refresh() and f.members == (A, B, C)


def test_self_is_always_a_member_and_names_are_canonical() -> None:
    f = Fleet("[fd00::1]:2049", ["[fd00::2]:2049"])
    assert f.members == ("[fd00::1]:2049", "[fd00::2]:2049")
    assert parse_member("[::1]:2049") == ("::1", 2049)
    for bad in ("host", "host:", ":2049", "h:0", "h:99999", "h :1"):
        with pytest.raises(ValueError):
            parse_member(bad)


def test_fleet_and_shared_tier_settings_from_file_and_flags(tmp_path: Path) -> None:
    path = tmp_path / "nfsgw.toml"
    path.write_text(
        '[cache]\nshared = "s3://nfsgw-shared/imagenet/"\nshared_endpoint_url = "http://10.0.9.1:8333"\n'
        f'[fleet]\nmembers = ["{A}", "{B}"]\nself = "{A}"\n'
        '[[export]]\npath = "/d"\nbackend = "file:///tmp"\n'
    )
    cfg, _ = load_config(path)
    assert cfg.cache.data.shared.url == "s3://nfsgw-shared/imagenet/"
    assert cfg.cache.data.shared.endpoint_url == "http://10.0.9.1:8333"
    assert cfg.fleet.members == (A, B) and cfg.fleet.self_ == A and cfg.fleet.enabled
    flags = Overrides({("fleet", "members"): ([C, D], "--fleet-member")})
    cfg, _ = load_config(path, flags)
    assert cfg.fleet.members == (C, D)
    path.write_text('[cache]\nshared = "file:///x"\n[fleet]\nmembers = ["nohost"]\n')
    with pytest.raises(ConfigErrors) as e:
        load_config(path)
    text = str(e.value.issues)
    assert "shared" in text and "members" in text


def test_check_config_warns_about_a_fleet_that_cannot_work(tmp_path: Path) -> None:
    path = tmp_path / "nfsgw.toml"
    export = '[[export]]\npath = "/d"\nbackend = "file:///tmp"\n'

    def warned(text: str) -> list[str]:
        path.write_text(text + export)
        return [str(w) for w in load_config(path)[1]]

    shared = '[cache]\nshared = "s3://b/p/"\n'
    assert any("without a shared tier" in w for w in warned(f'[fleet]\nmembers = ["{A}"]\n'))
    wild = warned(f'[server]\nlisten = "0.0.0.0"\n{shared}[fleet]\nmembers = ["{A}", "{B}"]\n')
    assert any("self" in w and "0.0.0.0" in w for w in wild), wild
    out = warned(f'{shared}[fleet]\nmembers = ["{A}", "{B}"]\nself = "{C}"\n')
    assert any("not among them" in w for w in out), out
    assert not [
        w
        for w in warned(f'{shared}[fleet]\nmembers = ["{A}", "{B}"]\nself = "{B}"\n')
        if "fleet" in w
    ]
