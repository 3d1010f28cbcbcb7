"""The duplicate-request cache alone (``gateway.drc``): keys, hits, a replay joining the
original still running, bounds by entries, bytes and age, calls that run on when their caller
is cancelled, and ``close``. No sockets: the TCP replay scenario is in
tests/reliability/test_drc.py."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from gateway.clock import FakeClock
from gateway.drc import DRC_ENTRY_CHARGE_BYTES, DrcConfig, DrcKey, DuplicateRequestCache, identity
from nfsproto import mount3, nfs3, rpc
from nfsproto.nfs3 import Nfs3Proc

REMOVE = int(Nfs3Proc.REMOVE)
ROOT_ID = identity(rpc.AuthFlavor.AUTH_SYS, rpc.auth_sys(0, 0, [0], b"host").body)


def make(**kw: float) -> tuple[DuplicateRequestCache, FakeClock]:
    clock = FakeClock()
    return DuplicateRequestCache(DrcConfig(**kw), clock), clock  # type: ignore[arg-type]


def key_of(
    drc: DuplicateRequestCache, xid: int, args: bytes = b"args", host: str = "10.0.0.1"
) -> DrcKey:
    k = drc.key(host, xid, nfs3.PROGRAM, nfs3.VERSION, REMOVE, ROOT_ID, args)
    assert k is not None
    return k


class Runner:
    """An ``execute`` factory that counts runs per name and can hold them at a gate."""

    def __init__(self) -> None:
        self.runs: Counter[bytes] = Counter()
        self.gate: asyncio.Event | None = None
        self.started = asyncio.Event()

    def __call__(self, reply: bytes, keep: bool = True):  # type: ignore[no-untyped-def]
        async def execute() -> tuple[bytes, bool]:
            self.runs[reply] += 1
            self.started.set()
            if self.gate is not None:
                await self.gate.wait()
            return reply, keep

        return execute


def test_only_non_idempotent_nfs_procedures_have_keys() -> None:
    drc, _ = make()
    cached = {
        Nfs3Proc.SETATTR, Nfs3Proc.CREATE, Nfs3Proc.MKDIR, Nfs3Proc.SYMLINK, Nfs3Proc.MKNOD,
        Nfs3Proc.REMOVE, Nfs3Proc.RMDIR, Nfs3Proc.RENAME, Nfs3Proc.LINK,
    }  # fmt: skip
    for p in Nfs3Proc:
        k = drc.key("h", 1, nfs3.PROGRAM, nfs3.VERSION, int(p), ROOT_ID, b"x")
        assert (k is not None) == (p in cached), p
    assert drc.key("h", 1, mount3.PROGRAM, mount3.VERSION, 1, ROOT_ID, b"x") is None
    off, _ = make(max_entries=0)
    assert off.key("h", 1, nfs3.PROGRAM, nfs3.VERSION, REMOVE, ROOT_ID, b"x") is None


def test_key_covers_arguments_and_credential_but_not_the_auth_sys_stamp() -> None:
    drc, _ = make()
    base = key_of(drc, 7)
    assert key_of(drc, 7) == base
    assert key_of(drc, 7, b"other") != base
    assert key_of(drc, 8) != base
    assert key_of(drc, 7, host="10.0.0.2") != base
    other_user = identity(rpc.AuthFlavor.AUTH_SYS, rpc.auth_sys(1000, 1000, [], b"host").body)
    k2 = drc.key("10.0.0.1", 7, nfs3.PROGRAM, nfs3.VERSION, REMOVE, other_user, b"args")
    assert k2 != base
    a = rpc.unpack_auth_sys(rpc.auth_sys(0, 0, [0], b"host").body)
    a.stamp += 12345
    restamped = identity(rpc.AuthFlavor.AUTH_SYS, rpc.pack_auth_sys(a))
    assert restamped == ROOT_ID


async def test_a_retransmission_gets_the_first_reply_and_runs_nothing() -> None:
    drc, _ = make()
    run = Runner()
    k = key_of(drc, 1)
    assert await drc.run(k, run(b"first")) == b"first"
    assert await drc.run(k, run(b"second")) == b"first"
    assert run.runs == {b"first": 1}
    assert (drc.stats.hits, drc.stats.stored, drc.stats.entries) == (1, 1, 1)
    assert drc.stats.bytes == len(b"first") + DRC_ENTRY_CHARGE_BYTES


async def test_the_same_xid_with_other_arguments_runs() -> None:
    drc, _ = make()
    run = Runner()
    assert await drc.run(key_of(drc, 1, b"a"), run(b"ra")) == b"ra"
    assert await drc.run(key_of(drc, 1, b"b"), run(b"rb")) == b"rb"
    assert run.runs == {b"ra": 1, b"rb": 1}
    assert drc.stats.hits == 0


async def test_a_replay_while_the_original_runs_waits_for_its_reply() -> None:
    drc, _ = make()
    run = Runner()
    run.gate = asyncio.Event()
    k = key_of(drc, 1)
    first = asyncio.create_task(drc.run(k, run(b"orig")))
    await run.started.wait()
    second = asyncio.create_task(drc.run(k, run(b"replay")))
    await asyncio.sleep(0)
    assert drc.stats.waits == 1 and not second.done()
    run.gate.set()
    assert await first == b"orig"
    assert await second == b"orig"
    assert run.runs == {b"orig": 1}


async def test_the_original_runs_on_when_its_caller_is_cancelled() -> None:
    """A connection that closes cancels its call task; the mutation itself must finish, and
    the retransmission on the next connection gets its reply."""
    drc, _ = make()
    run = Runner()
    run.gate = asyncio.Event()
    k = key_of(drc, 1)
    caller = asyncio.create_task(drc.run(k, run(b"orig")))
    await run.started.wait()
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert drc.stats.running == 1
    replay = asyncio.create_task(drc.run(k, run(b"replay")))
    run.gate.set()
    assert await replay == b"orig"
    assert run.runs == {b"orig": 1}
    assert drc.stats.running == 0


async def test_replies_not_kept_are_answered_but_run_again() -> None:
    drc, _ = make()
    run = Runner()
    k = key_of(drc, 1)
    assert await drc.run(k, run(b"jukebox", keep=False)) == b"jukebox"
    assert await drc.run(k, run(b"jukebox", keep=False)) == b"jukebox"
    assert run.runs == {b"jukebox": 2}
    assert drc.stats.entries == 0 and drc.stats.stored == 0


async def test_a_flood_of_distinct_calls_stays_within_entries_and_bytes() -> None:
    drc, _ = make(max_entries=50, max_bytes=30 * (DRC_ENTRY_CHARGE_BYTES + 100))
    run = Runner()
    for xid in range(1000):
        await drc.run(key_of(drc, xid), run(bytes(100) + xid.to_bytes(4, "big")))
        assert drc.stats.entries <= 50
        assert drc.stats.bytes <= drc.config.max_bytes
    # The byte bound is the tighter one here: 30 entries of 104 + overhead bytes do not fit.
    assert drc.stats.entries == 29
    assert drc.stats.evicted_space == 1000 - 29
    # The newest are kept, the oldest went.
    assert await drc.run(key_of(drc, 999), run(b"again")) == bytes(100) + (999).to_bytes(4, "big")
    assert await drc.run(key_of(drc, 0), run(b"again")) == b"again"


async def test_entries_past_the_age_limit_are_dropped() -> None:
    drc, clock = make(max_age_s=60)
    run = Runner()
    k = key_of(drc, 1)
    await drc.run(k, run(b"old"))
    clock.advance(30)
    await drc.run(key_of(drc, 2), run(b"newer"))
    clock.advance(31)
    assert await drc.run(k, run(b"fresh")) == b"fresh"  # 61 s old: run again
    assert drc.stats.evicted_age == 1
    assert await drc.run(key_of(drc, 2), run(b"x")) == b"newer"  # 31 s old: kept


async def test_running_calls_count_and_the_excess_runs_uncached() -> None:
    drc, _ = make(max_entries=2)
    run = Runner()
    run.gate = asyncio.Event()
    held = [asyncio.create_task(drc.run(key_of(drc, x), run(b"held"))) for x in (1, 2)]
    await asyncio.sleep(0)
    assert drc.stats.running == 2
    run.gate.set()  # the third call is not held: it runs in the caller and is not kept
    assert await drc.run(key_of(drc, 3), run(b"third")) == b"third"
    assert drc.stats.bypassed == 1
    assert await asyncio.gather(*held) == [b"held", b"held"]
    assert await drc.run(key_of(drc, 3), run(b"third-again")) == b"third-again"
    assert drc.stats.entries <= 2


async def test_entries_stay_bounded_while_calls_run() -> None:
    drc, _ = make(max_entries=4)
    run = Runner()
    for xid in range(4):
        await drc.run(key_of(drc, xid), run(b"done"))
    run.gate = asyncio.Event()
    held = [asyncio.create_task(drc.run(key_of(drc, 100 + x), run(b"held"))) for x in range(3)]
    await asyncio.sleep(0)
    assert drc.stats.running == 3 and drc.stats.entries == 4
    run.gate.set()
    await asyncio.gather(*held)
    assert drc.stats.entries == 4 and drc.stats.running == 0


async def test_close_cancels_calls_that_do_not_finish_in_time() -> None:
    drc, _ = make()
    run = Runner()
    run.gate = asyncio.Event()  # never set
    k = key_of(drc, 1)
    caller = asyncio.create_task(drc.run(k, run(b"stuck")))
    await run.started.wait()
    await drc.close(0.01)
    assert await caller is None  # no reply: the call was cancelled at shutdown
    assert drc.stats.entries == 0 and drc.stats.running == 0
