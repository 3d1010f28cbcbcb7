"""``gateway.lru.Lru``: at most ``max_entries``, the least recently put forgotten first."""

from __future__ import annotations

from gateway.lru import Lru


def test_put_keeps_the_most_recent_and_forgets_the_oldest() -> None:
    m: Lru[str, int] = Lru(2)
    m.put("a", 1)
    m.put("b", 2)
    m.put("a", 3)  # a is the most recent now: b goes first
    m.put("c", 4)
    assert list(m.items()) == [("a", 3), ("c", 4)]
    assert m.get("b") is None and len(m) == 2


def test_a_bound_of_zero_keeps_nothing() -> None:
    m: Lru[str, int] = Lru(0)
    m.put("a", 1)
    assert not m
