"""The S3 region chain (``credentials.resolve_region``) and ``S3Store`` resolving a region
it was not given: env vars and a temporary shared config file, no network."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from gateway.backend import credentials, open_store
from gateway.backend.credentials import resolve_region
from gateway.backend.s3 import S3Store

CONFIG = """\
[default]
region = eu-west-3

[profile other]
region = ap-south-1

[profile noregion]
output = json
"""


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def info(self, event: str, **kw: Any) -> None:
        self.events.append((event, kw))


@pytest.fixture
def aws_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No region or profile in the environment; shared files under tmp_path."""
    for var in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE", "AWS_DEFAULT_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    config = tmp_path / "config"
    config.write_text(CONFIG)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    return config


def test_explicit_region_wins(aws_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_REGION", "us-west-2")
    assert resolve_region("eu-central-1", "other") == "eu-central-1"


def test_env_vars_in_order(aws_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_DEFAULT_REGION", "ca-central-1")
    assert resolve_region(None, "other") == "ca-central-1"
    monkeypatch.setenv("AWS_REGION", "us-west-2")
    assert resolve_region(None, "other") == "us-west-2"
    monkeypatch.setenv("AWS_REGION", "")  # empty is unset
    assert resolve_region(None, None) == "ca-central-1"


def test_profile_region_from_shared_config(aws_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_region(None, None) == "eu-west-3"  # the default profile
    assert resolve_region(None, "other") == "ap-south-1"
    monkeypatch.setenv("AWS_PROFILE", "other")
    assert resolve_region(None, None) == "ap-south-1"
    assert resolve_region(None, "default") == "eu-west-3"  # the configured profile wins


def test_profile_only_in_credentials_file(
    aws_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "credentials").write_text(
        "[creds-only]\naws_access_key_id = AK\naws_secret_access_key = SK\n"
    )
    rec = Recorder()
    monkeypatch.setattr(credentials, "log", rec)
    assert resolve_region(None, "creds-only") == "us-east-1"
    assert [e for e, _ in rec.events] == ["s3_region_defaulted"]


def test_empty_chain_falls_back_and_logs(aws_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rec = Recorder()
    monkeypatch.setattr(credentials, "log", rec)
    assert resolve_region(None, "noregion") == "us-east-1"
    monkeypatch.setenv("AWS_CONFIG_FILE", str(aws_env.parent / "missing"))
    assert resolve_region(None, None) == "us-east-1"
    assert [e for e, _ in rec.events] == ["s3_region_defaulted"] * 2
    assert rec.events[0][1]["profile"] == "noregion" and rec.events[0][1]["region"] == "us-east-1"


def test_found_region_is_not_logged(aws_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rec = Recorder()
    monkeypatch.setattr(credentials, "log", rec)
    resolve_region(None, "other")
    monkeypatch.setenv("AWS_REGION", "us-west-2")
    resolve_region(None, None)
    assert rec.events == []


def test_unknown_profile_is_an_error(aws_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="nope"):
        resolve_region(None, "nope")
    monkeypatch.setenv("AWS_PROFILE", "gone")
    with pytest.raises(ValueError, match="gone"):
        resolve_region(None, None)
    monkeypatch.setenv("AWS_REGION", "us-west-2")  # env vars come first: no file lookup
    assert resolve_region(None, None) == "us-west-2"


async def _setup_host(store: S3Store) -> tuple[str | None, str]:
    try:
        await store._setup()  # creates the session and signer; sends nothing
        return store.region, store._host
    finally:
        await store.close()


def test_store_without_region_follows_the_chain(
    aws_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = S3Store("bkt", access_key="a", secret_key="b", profile="other")
    assert store.region is None
    assert asyncio.run(_setup_host(store)) == ("ap-south-1", "bkt.s3.ap-south-1.amazonaws.com")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "sa-east-1")
    opened = open_store("s3://bkt/p", access_key="a", secret_key="b")
    assert isinstance(opened, S3Store) and opened.region is None
    assert asyncio.run(_setup_host(opened)) == ("sa-east-1", "bkt.s3.sa-east-1.amazonaws.com")
    given = open_store("s3://bkt/p?region=eu-north-1", access_key="a", secret_key="b")
    assert isinstance(given, S3Store) and given.region == "eu-north-1"


def test_store_with_unknown_profile_fails_as_backend_error(aws_env: Path) -> None:
    from gateway.backend.base import BackendError

    store = S3Store("bkt", access_key="a", secret_key="b", profile="nope")
    with pytest.raises(BackendError, match="nope"):
        asyncio.run(_setup_host(store))


def _refreshable(expires_in_s: float, tokens: list[str]) -> Any:
    """botocore's own refreshable credentials (its public constructor), expiring in
    ``expires_in_s``; each refresh appends a token and gives an hour."""
    import datetime

    from botocore.credentials import RefreshableCredentials

    def metadata(seconds: float) -> dict[str, str]:
        tokens.append(f"T{len(tokens)}")
        at = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=seconds)
        return {
            "access_key": "AK",
            "secret_key": "SK",
            "token": tokens[-1],
            "expiry_time": at.isoformat(),
        }

    return RefreshableCredentials.create_from_metadata(
        metadata(expires_in_s), lambda: metadata(3600), "test"
    )


def test_expiry_comes_from_the_public_api() -> None:
    """``_expiry_of`` finds the expiry to the second with ``refresh_needed`` alone: none for
    static keys, a look again after the horizon for far ones, ``now`` once expired."""
    import time

    from botocore.credentials import Credentials as BotoCredentials

    now = time.time()
    assert credentials._expiry_of(BotoCredentials("AK", "SK"), now) is None
    for seconds in (59.5, 600, 3600, 12 * 3600):
        got = credentials._expiry_of(_refreshable(seconds, []), now)
        assert got is not None and now + seconds - 2 <= got <= now + seconds
    far = credentials._expiry_of(_refreshable(48 * 3600, []), now)
    assert far == now + credentials._HORIZON_S
    assert credentials._expiry_of(_refreshable(-5, []), now) == now


class Provider:
    """Refreshable credentials as the cache sees them (botocore's public methods); a load
    counts and gives a new token, valid ``valid_s`` from then."""

    def __init__(self, valid_s: float) -> None:
        self.valid_s = valid_s
        self.loads = 0
        self.expiry = 0.0

    def refresh_needed(self, refresh_in: float) -> bool:
        import time

        return self.expiry - time.time() < refresh_in

    def get_frozen_credentials(self) -> Any:
        import time
        from types import SimpleNamespace

        self.loads += 1
        self.expiry = time.time() + self.valid_s
        return SimpleNamespace(access_key="AK", secret_key="SK", token=f"T{self.loads}")


async def test_cache_refreshes_by_the_expiry_it_derives() -> None:
    """Far from expiry: cached; inside the advisory window: served while a background refresh
    runs; inside the mandatory one: callers wait for the refresh."""
    for valid_s, served, loads in ((3600, "T1", 1), (600, "T1", 2), (60, "T2", 2)):
        cache = credentials.CredentialCache()
        cache._provider = provider = Provider(valid_s)
        first = await cache.get()
        assert first is not None and first.token == "T1"
        got = await cache.get()
        assert got is not None and got.token == served
        await asyncio.sleep(0.2)  # a background refresh, if started, finishes
        assert provider.loads == loads, valid_s
        await cache.close()
    # botocore's own: an hour left, nothing to do.
    tokens: list[str] = []
    cache = credentials.CredentialCache()
    cache._provider = _refreshable(3600, tokens)
    assert (await cache.get()) is (await cache.get())
    assert tokens == ["T0"]
    await cache.close()
