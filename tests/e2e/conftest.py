"""Fixtures of the kernel-client e2e suite.

- ``guest`` (session): a ``tests.e2e.guest.Guest`` on the image built from Debian packages
  (cached under ``$NFSGW_E2E_CACHE``). Skipped, with the reason, where QEMU is missing or the
  packages cannot be had (``make test`` installs QEMU when run as root: ``deb-deps``).
- ``tree`` / ``tree_bucket`` (session): ``tests.e2e.tree.make_tree()`` uploaded once to a
  SeaweedFS bucket, read-only for every test (tests that change a bucket make their own).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from loadgen.seaweed import SeaweedServer
from tests.e2e.guest import Guest, GuestImage, ImageUnavailable, qemu_binary
from tests.e2e.tree import Tree, bucket_with, make_tree


@pytest.fixture(scope="session")
def guest() -> Guest:
    if qemu_binary() is None:
        pytest.skip("qemu-system-x86_64 not installed (make test installs it when run as root)")
    try:
        return Guest(GuestImage.ensure())
    except ImageUnavailable as e:
        pytest.skip(f"no guest image: {e}")


@pytest.fixture(scope="session")
def tree() -> Tree:
    return make_tree()


@pytest.fixture(scope="session")
def tree_bucket(seaweed: SeaweedServer, tree: Tree) -> Iterator[str]:
    with bucket_with(seaweed, tree) as name:
        yield name
