"""The garbage-collection watch (``gateway.ops.gcwatch``) counts real collections."""

from __future__ import annotations

import gc

from gateway.ops.gcwatch import GcWatch


def test_full_collections_and_their_time_are_counted() -> None:
    w = GcWatch()
    gc.disable()  # only the collections this test asks for
    w.install()
    try:
        junk = [[i] for i in range(100_000)]  # something for the collector to walk
        gc.collect()
        gc.collect(0)
        del junk
    finally:
        w.remove()
        gc.enable()
    s = w.stats
    assert s.full == 1  # the gen-0 one is not a full collection
    assert 0 < s.longest_s <= s.seconds
    gc.collect()
    assert w.stats.full == 1  # removed: no longer counted


def test_what_is_frozen_is_out_of_full_collections() -> None:
    from gateway.ops.gcwatch import freeze_long_lived

    table = {i: [i] for i in range(200_000)}  # a long-lived table, like the data cache's
    try:
        freeze_long_lived()
        assert gc.get_freeze_count() >= len(table)
        w = GcWatch()
        w.install()
        try:
            gc.collect()
        finally:
            w.remove()
        assert w.stats.full == 1
    finally:
        gc.unfreeze()
