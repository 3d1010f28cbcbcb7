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
