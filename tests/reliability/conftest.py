"""Fixtures of the reliability suite: ``tree`` / ``tree_bucket`` (session), the e2e tree
(``tests.e2e.tree``) uploaded once to a SeaweedFS bucket that no test changes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from loadgen.seaweed import SeaweedServer
from tests.e2e.tree import Tree, bucket_with, make_tree


@pytest.fixture(scope="session")
def tree() -> Tree:
    return make_tree()


@pytest.fixture(scope="session")
def tree_bucket(seaweed: SeaweedServer, tree: Tree) -> Iterator[str]:
    with bucket_with(seaweed, tree) as name:
        yield name
