"""The start-up self-check of the compiled CRC engine (``checksums.self_check``): every engine
this CPU runs passes it; one that gives a wrong value is left for the next one
(VPCLMULQDQ -> PCLMULQDQ -> tables -> the Python reference), and the server says so in one
warning naming both and starts with the one that passed (``gateway_started`` names it). The
VPCLMULQDQ engine is the one in use on a CPU that has it, so every CRC test runs it there.

Also what a machine without the compiled CRCs is told: the start-up warning says that stored
CRC64NVME and CRC32C checksums are then no longer verified (test_setup.py: the install's).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from structlog.testing import capture_logs

from gateway import fastwire
from gateway.backend import checksums
from gateway.backend.checksums import Buffer
from gateway.exports import ExportConfig
from tests.harness.memory import MemoryGateway

EXPORTS = [ExportConfig("/data", "s3://bucket/ds/", read_only=True, secure_port=False)]
FILES = {"ds/a.bin": b"x" * 5000}


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.partition(":")[2].split())
    return set()


@pytest.fixture
def native(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """The compiled CRCs, put back as they were after the test (engine, refusals)."""
    if os.environ.get("NFSGW_PURE_PYTHON", "") not in ("", "0"):
        pytest.skip("NFSGW_PURE_PYTHON is set")
    c = checksums.compiled()
    if c is None:
        if os.environ.get("NFSGW_REQUIRE_NATIVE") == "1":
            pytest.fail("NFSGW_REQUIRE_NATIVE=1 but gateway._checksums is not built")
        pytest.skip("gateway._checksums is not built")
    engine = c.engine
    monkeypatch.setattr(checksums, "_refused", [])
    yield c
    checksums._refused.clear()  # the test's list (monkeypatch puts the module's back later)
    checksums.compiled.cache_clear()
    c.use_engine(engine)
    assert checksums.compiled() is c


def _break(monkeypatch: pytest.MonkeyPatch, *engines: str) -> None:
    """The self-check sees a wrong value from each of ``engines`` (one bit of crc64nvme over
    4 KiB and more: the longest vectors, where the widest loops run)."""
    real = checksums._computed

    def computed(c: ModuleType, algorithm: str, data: Buffer, crc: int) -> int:
        out = real(c, algorithm, data, crc)
        n = memoryview(data).nbytes
        if c.engine in engines and algorithm == "crc64nvme" and n >= 4096:
            out ^= 1 << 17
        return out

    monkeypatch.setattr(checksums, "_computed", computed)


def test_the_vectors_cover_every_loop() -> None:
    """Lengths either side of each loop's threshold, past 4 KiB, at several alignments."""
    lengths = checksums.CHECK_LENGTHS
    for edge in (8, 16, 128, 512, 1024, 4096):
        assert {edge - 1, edge, edge + 1} <= set(lengths), edge
    assert max(lengths) >= 8192
    assert [len(v) for v, _, _ in checksums._vectors()] == list(lengths)
    assert len(set(checksums.CHECK_OFFSETS)) >= 4 and max(checksums.CHECK_OFFSETS) % 8


def test_every_engine_this_cpu_runs_passes(native: ModuleType) -> None:
    for name in native.engines:
        native.use_engine(name)
        assert native.engine == name
        assert checksums._disagreement(native) is None, name
    assert native.engines[-1] == "tables"


def test_the_vpclmulqdq_engine_is_the_one_in_use_where_the_cpu_has_it(
    native: ModuleType,
) -> None:
    """Where the CPU has AVX-512F and VPCLMULQDQ the C picks that engine at import (unless
    told not to), so every CRC test in the suite runs it; elsewhere only the dispatch can be
    checked: what the CPU lacks is refused."""
    flags = _cpu_flags()
    has = {"avx512f", "vpclmulqdq", "pclmulqdq", "sse4_1"} <= flags
    if has:
        assert "vpclmulqdq" in native.engines
        if not os.environ.get("NFSGW_CHECKSUMS_NO_CLMUL") and not os.environ.get(
            "NFSGW_CHECKSUMS_NO_AVX512"
        ):
            assert native.engine == "vpclmulqdq"
            # And the self-check keeps it: no fallback on a sound build.
            assert checksums.self_check() == checksums.EngineCheck("vpclmulqdq")
    else:
        assert "vpclmulqdq" not in native.engines, "an engine the CPU cannot run"
        with pytest.raises(ValueError):
            native.use_engine("vpclmulqdq")


def test_use_engine_refuses_what_it_does_not_know(native: ModuleType) -> None:
    engine = native.engine
    with pytest.raises(ValueError):
        native.use_engine("sse9")
    with pytest.raises(TypeError):
        native.use_engine(1)
    assert native.engine == engine


def test_a_wrong_engine_is_left_for_the_next_one(
    native: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    engines = native.engines[native.engines.index(native.engine) :]
    if len(engines) < 2:
        pytest.skip("only the table engine here: the fallback to Python is tested below")
    _break(monkeypatch, engines[0])
    got = checksums.self_check()
    assert got.engine == engines[1] and got.failed == (engines[0],), got
    assert got.mismatch.startswith(f"{engines[0]}: crc64nvme of 4095 bytes") or (
        got.mismatch.startswith(f"{engines[0]}: crc64nvme of 4096 bytes")
    ), got.mismatch
    assert native.engine == engines[1]
    assert checksums.compiled() is native and checksums.fast_crcs()


def test_every_engine_wrong_leaves_the_reference(
    native: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    engines = native.engines[native.engines.index(native.engine) :]
    _break(monkeypatch, *engines)
    got = checksums.self_check()
    assert got.engine == "python" and got.failed == engines, got
    assert checksums.compiled() is None and not checksums.fast_crcs()
    assert checksums.compiled_missing()
    data = bytes(range(256)) * 20
    assert checksums.crc64nvme(data) == checksums.py_crc64nvme(data)
    # Asked again (a second server in the process): still the reference, said again.
    assert checksums.self_check() == checksums.EngineCheck("python", engines)


async def test_the_server_says_which_engine_and_the_fallback(
    tmp_path: Path, native: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sound engine: no warning, and ``gateway_started`` names it. A wrong one: one
    warning naming the failed engine and the one in use, which ``gateway_started`` names."""
    engine = native.engine
    with capture_logs() as logs:
        async with MemoryGateway.of(tmp_path / "a", EXPORTS, files=FILES):
            pass
    assert [x for x in logs if x["log_level"] == "warning"] == []
    assert [x["crc_engine"] for x in logs if x["event"] == "gateway_started"] == [engine]

    engines = native.engines[native.engines.index(engine) :]
    _break(monkeypatch, engines[0])
    want = engines[1] if len(engines) > 1 else "python"
    with capture_logs() as logs:
        async with MemoryGateway.of(tmp_path / "b", EXPORTS, files=FILES) as gw:
            fh = await gw.walk(await gw.mount(b"/data"), "a.bin")
            assert bytes((await gw.read(fh)).data) == FILES["ds/a.bin"]
    warnings = [x for x in logs if x["log_level"] == "warning"]
    assert [x["event"] for x in warnings] == ["checksum_engine_fallback"], warnings
    assert warnings[0]["failed"] == [engines[0]] and warnings[0]["engine"] == want
    assert engines[0] in warnings[0]["mismatch"]
    assert [x["crc_engine"] for x in logs if x["event"] == "gateway_started"] == [want]


# -- without the compiled modules (a machine without a C compiler) ----------------------------


@pytest.fixture
def uncompiled(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """As if the install had no C compiler: the compiled modules cannot be imported."""
    monkeypatch.delenv("NFSGW_PURE_PYTHON", raising=False)
    for name in ("gateway._fastwire", "gateway._checksums", "gateway._s3list"):
        monkeypatch.setitem(sys.modules, name, None)  # import raises ImportError
    fastwire.compiled.cache_clear()
    checksums.compiled.cache_clear()
    yield
    monkeypatch.undo()
    fastwire.compiled.cache_clear()
    checksums.compiled.cache_clear()


LOST = "stored CRC64NVME and CRC32C checksums are then not verified on whole-object reads"


async def test_without_a_compiler_one_warning_says_what_is_lost(
    tmp_path: Path, uncompiled: None
) -> None:
    assert checksums.compiled() is None and checksums.compiled_missing()
    with capture_logs() as logs:
        async with MemoryGateway.of(tmp_path, EXPORTS, files=FILES) as gw:
            fh = await gw.walk(await gw.mount(b"/data"), "a.bin")
            assert bytes((await gw.read(fh)).data) == FILES["ds/a.bin"]
    warnings = [x for x in logs if x["log_level"] == "warning"]
    assert [x["event"] for x in warnings] == ["fast_path_pure_python"], warnings
    reason = warnings[0]["reason"]
    assert "the extension is not built" in reason
    assert LOST in reason and "verify_crc32c" in reason, reason
    started = [x for x in logs if x["event"] == "gateway_started"]
    assert [(x["fast_path"], x["crc_engine"]) for x in started] == [("python", "python")]


async def test_without_a_compiler_and_the_fast_path_off_the_warning_is_the_servers(
    tmp_path: Path, uncompiled: None
) -> None:
    with capture_logs() as logs:
        async with MemoryGateway.of(tmp_path, EXPORTS, files=FILES, server_fast_path=False):
            pass
    warnings = [x for x in logs if x["log_level"] == "warning"]
    assert [x["event"] for x in warnings] == ["checksums_pure_python"], warnings
    assert LOST in warnings[0]["reason"]


async def test_pure_python_by_choice_is_not_warned_about(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``NFSGW_PURE_PYTHON=1`` is the operator's choice: no warning, the choice named."""
    monkeypatch.setenv("NFSGW_PURE_PYTHON", "1")
    fastwire.compiled.cache_clear()
    checksums.compiled.cache_clear()
    try:
        with capture_logs() as logs:
            async with MemoryGateway.of(tmp_path, EXPORTS, files=FILES):
                pass
    finally:
        monkeypatch.delenv("NFSGW_PURE_PYTHON")
        fastwire.compiled.cache_clear()
        checksums.compiled.cache_clear()
    assert [x for x in logs if x["log_level"] == "warning"] == []
    started = [x for x in logs if x["event"] == "gateway_started"]
    assert [(x["fast_path"], x["crc_engine"]) for x in started] == [("python", "python")]
