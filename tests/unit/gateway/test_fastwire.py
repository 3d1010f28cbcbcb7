"""``gateway._fastwire`` (C) against its Python twins, byte for byte.

``parse_call``: valid GETATTR/LOOKUP/ACCESS/READ calls built with nfsproto (AUTH_NONE,
AUTH_SYS and arbitrary credential bodies), every prefix of them, flipped bytes, words
overwritten with edge values (oversized lengths), bytes added, random bytes: the C and the
Python give the same tuple (same types) or both None, for bytes, bytearray and memoryview
input. Both also agree with the ordinary decoder (``rpc.unpack_call`` and the procedure's
``unpack_args``) on valid calls, and accept the golden calls of the Linux client. The reply
builders and ``pad``: the same bytes, or the same exception class and message, for random
arguments including wrong sizes, out-of-range and non-integer values. ``RecordReader``:
random streams of records in random fragments, fed in random pieces, against
``nfsproto.rpc.RecordReader``: the same records (bytes and type: a memoryview slice or a
bytearray), ``pending_bytes`` and errors.

The C tests skip when the extension is not built, unless ``NFSGW_REQUIRE_NATIVE=1`` (what
``make test`` sets where gcc exists): then they fail, so CI cannot lose the extension quietly.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway import fastwire
from nfsproto import nfs3, rpc
from nfsproto.nfs3 import Diropargs3
from nfsproto.xdr import Reader, Writer

try:
    from gateway import _fastwire  # type: ignore[attr-defined,unused-ignore]
except ImportError:
    _fastwire = None

REQUIRE_NATIVE = os.environ.get("NFSGW_REQUIRE_NATIVE") == "1"
DATA = Path(__file__).resolve().parents[2] / "data"
PROCS = (fastwire.GETATTR, fastwire.LOOKUP, fastwire.ACCESS, fastwire.READ)
AS_BUFFERS: tuple[Callable[[bytes], Any], ...] = (bytes, bytearray, memoryview)


def need_native() -> ModuleType:
    if _fastwire is None:
        if REQUIRE_NATIVE:
            pytest.fail(
                "NFSGW_REQUIRE_NATIVE=1 but gateway._fastwire is not built: its build failed, or"
                " the venv predates gcc (touch gateway/_fastwire.c && make venv)"
            )
        pytest.skip("gateway._fastwire is not built (pip install -e . with a C compiler)")
    return _fastwire


@pytest.fixture(scope="module")
def native() -> ModuleType:
    return need_native()


@pytest.fixture(params=["python", "native"])
def wire(request: pytest.FixtureRequest) -> ModuleType:
    return fastwire if request.param == "python" else need_native()


# --------------------------------------------------------------------------- calls

u32 = st.integers(0, 2**32 - 1)
u64 = st.integers(0, 2**64 - 1)
creds = st.one_of(
    st.just(rpc.NULL_AUTH),
    st.builds(
        rpc.auth_sys,
        uid=u32,
        gid=u32,
        gids=st.lists(u32, max_size=16),
        machine=st.binary(max_size=255),
        stamp=u32,
    ),
    # parse_call does not read the body: any bytes of any allowed length
    st.builds(rpc.OpaqueAuth, st.sampled_from([0, 1]), st.binary(max_size=400)),
)


@st.composite
def calls(draw: st.DrawFn) -> bytes:
    proc = draw(st.sampled_from(PROCS))
    fh = draw(st.binary(max_size=64))
    args: Any
    if proc == fastwire.GETATTR:
        args = nfs3.Getattr3Args(fh)
    elif proc == fastwire.ACCESS:
        args = nfs3.Access3Args(fh, draw(u32))
    elif proc == fastwire.READ:
        args = nfs3.Read3Args(fh, draw(u64), draw(u32))
    else:
        args = nfs3.Lookup3Args(Diropargs3(fh, draw(st.binary(min_size=1, max_size=255))))
    w = Writer()
    rpc.pack_call(w, draw(u32), nfs3.PROGRAM, nfs3.VERSION, proc, draw(creds))
    nfs3.PROCS[proc].pack_args(w, args)
    return w.getvalue()


# Values a length or a discriminant may be forged to.
EDGES = (0, 1, 2, 3, 4, 5, 63, 64, 65, 255, 256, 399, 400, 401, 100003, 0x7FFFFFFF, 2**32 - 1)


def typed(call: object) -> object:
    """A call tuple with each item's type, so 0 and False, bytes and bytearray differ."""
    return None if call is None else [(type(v), v) for v in call]  # type: ignore[attr-defined]


def check_same(native: ModuleType, record: bytes) -> object:
    """parse_call of ``record`` as each buffer type: the C's is the Python's."""
    want = typed(fastwire.parse_call(record))
    for as_buffer in AS_BUFFERS:
        assert typed(native.parse_call(as_buffer(record))) == want, (as_buffer, record.hex())
    return want


def decoded(record: bytes) -> tuple[object, ...]:
    """The fast-path tuple of a valid call, from the ordinary decoder."""
    r = Reader(record)
    h = rpc.unpack_call(r)
    start = r.pos
    args = nfs3.PROCS[h.proc].unpack_args(r)
    r.done()
    cred = struct.pack(">2I", h.cred.flavor, len(h.cred.body)) + h.cred.body
    if isinstance(args, nfs3.Getattr3Args):
        return (h.xid, h.proc, cred, args.object, 0, 0)
    if isinstance(args, nfs3.Access3Args):
        return (h.xid, h.proc, cred, args.object, args.access, 0)
    if isinstance(args, nfs3.Read3Args):
        return (h.xid, h.proc, cred, args.file, args.offset, args.count)
    assert isinstance(args, nfs3.Lookup3Args)
    return (h.xid, h.proc, cred, args.what.dir, args.what.name, record[start:])


@settings(max_examples=200, deadline=None)
@given(calls())
def test_valid_calls_parse_as_the_ordinary_decoder_reads_them(record: bytes) -> None:
    assert fastwire.parse_call(record) == decoded(record)
    if _fastwire is not None or REQUIRE_NATIVE:
        assert check_same(need_native(), record) == typed(decoded(record))


@pytest.mark.parametrize("stem", ["getattr", "lookup", "access", "read"])
def test_golden_calls_of_the_linux_client_are_accepted(wire: ModuleType, stem: str) -> None:
    record = (DATA / f"{stem}_call.bin").read_bytes()
    got = wire.parse_call(record)
    assert got is not None
    assert got == decoded(record)
    assert got[1] == getattr(fastwire, stem.upper())
    assert got[2][:4] == b"\0\0\0\1"  # the kernel's AUTH_SYS


@settings(max_examples=60, deadline=None)
@given(calls())
def test_every_prefix_is_declined_by_both(native: ModuleType, record: bytes) -> None:
    for n in range(len(record)):
        assert check_same(native, record[:n]) is None


@settings(max_examples=400, deadline=None)
@given(calls(), st.lists(st.tuples(st.integers(0), st.integers(1, 255)), min_size=1, max_size=3))
def test_flipped_bytes(native: ModuleType, record: bytes, flips: list[tuple[int, int]]) -> None:
    b = bytearray(record)
    for at, xor in flips:
        b[at % len(b)] ^= xor
    check_same(native, bytes(b))


@settings(max_examples=40, deadline=None)
@given(calls())
def test_forged_words(native: ModuleType, record: bytes) -> None:
    """Every word (a length, a flavour, a procedure...) set to each edge value and to its own
    value plus and minus one."""
    for at in range(0, len(record) - 3, 4):
        (word,) = struct.unpack_from(">I", record, at)
        for value in {*EDGES, (word + 1) % 2**32, (word - 1) % 2**32}:
            check_same(native, record[:at] + struct.pack(">I", value) + record[at + 4 :])


@settings(max_examples=300, deadline=None)
@given(calls(), st.integers(0), st.one_of(st.sampled_from(EDGES), u32))
def test_forged_unaligned_words(native: ModuleType, record: bytes, at: int, value: int) -> None:
    at %= len(record) - 3
    check_same(native, record[:at] + struct.pack(">I", value) + record[at + 4 :])


def sized(draw: st.DrawFn, limit: int, over: bool) -> bytes:
    """Bytes of a length at or under ``limit`` (near 0 or the limit, often), or just over it."""
    if over:
        n = draw(st.integers(limit + 1, limit + 4))
    else:
        n = draw(st.one_of(st.integers(0, 3), st.integers(limit - 3, limit), st.integers(0, limit)))
    return draw(st.binary(min_size=n, max_size=n))


def opaque(body: bytes, pad: bytes = b"") -> bytes:
    """XDR opaque by hand (any length; ``pad`` in the padding, else zeros)."""
    fill = -len(body) & 3
    return struct.pack(">I", len(body)) + body + (pad[:fill] + bytes(fill))[:fill]


FIELDS = ("mtype", "rpcvers", "prog", "vers", "proc", "flavor", "cred", "verf_flavor", "verf")
FAULTS = ("none",) * 6 + FIELDS + ("fh", "name", "pad", "args")


@st.composite
def edge_calls(draw: st.DrawFn) -> bytes:
    """Calls assembled by hand, with lengths at or around their limits (0, 400, 64, 255) and
    at most one field wrong (about a third are good calls): a message type, RPC version,
    program, version or procedure; a credential flavour or length, a verifier, a handle or
    name length, non-zero padding, arguments of the wrong size."""
    fault = draw(st.sampled_from(FAULTS))

    def pick(good: list[int], bad: list[int], field: str) -> int:
        return draw(st.sampled_from(bad if fault == field else good))

    proc = pick(list(PROCS), [0, 2, 5, 7, 21, 2**32 - 1], "proc")
    head = struct.pack(
        ">6I",
        draw(u32),
        pick([0], [1, 2], "mtype"),
        pick([2], [1, 3], "rpcvers"),
        pick([nfs3.PROGRAM], [100005, 100000, nfs3.PROGRAM + 1], "prog"),
        pick([3], [2, 4], "vers"),
        proc,
    )
    pad = draw(st.sampled_from([b"\1", b"\0\0\1", b"\0\1\0"])) if fault == "pad" else b""
    cred = struct.pack(">I", pick([0, 1], [2, 3, 6, 2**32 - 1], "flavor"))
    cred += opaque(sized(draw, 400, fault == "cred"), pad)
    verf = struct.pack(">I", pick([0], [1, 6], "verf_flavor"))
    verf += opaque(draw(st.sampled_from([b"v", b"verifier"])) if fault == "verf" else b"")
    fh = opaque(sized(draw, 64, fault == "fh"), pad)
    if fault == "args":
        args = draw(st.binary(max_size=20))
    elif proc == fastwire.LOOKUP:
        name = sized(draw, 255, fault == "name")
        args = opaque(name if name or fault == "name" else b"n", pad)
    else:
        size = {fastwire.ACCESS: 4, fastwire.READ: 12}.get(proc, 0)
        args = draw(st.binary(min_size=size, max_size=size))
    if fault == "name" and draw(st.booleans()):  # the other wrong length: none
        args = opaque(b"")
    return head + cred + verf + fh + args


@settings(max_examples=1500, deadline=None)
@given(edge_calls())
def test_calls_at_the_limits(native: ModuleType, record: bytes) -> None:
    check_same(native, record)


@settings(max_examples=200, deadline=None)
@given(calls(), st.binary(min_size=1, max_size=12))
def test_trailing_bytes_are_declined(native: ModuleType, record: bytes, extra: bytes) -> None:
    assert check_same(native, record + extra) is None
    assert check_same(native, record + b"\0" * len(extra)) is None


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(PROCS), st.integers(0, 2), st.binary(max_size=600))
def test_random_bytes_after_a_good_header(
    native: ModuleType, proc: int, flavor: int, tail: bytes
) -> None:
    head = struct.pack(">7I", 7, 0, 2, nfs3.PROGRAM, 3, proc, flavor)
    check_same(native, head + tail)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes(native: ModuleType, record: bytes) -> None:
    check_same(native, record)


def test_odd_arguments_of_parse_call(native: ModuleType) -> None:
    record = (DATA / "getattr_call.bin").read_bytes()
    assert native.parse_call(record=record) == fastwire.parse_call(record=record)
    assert native.parse_call(memoryview(b"x" + record)[1:]) == fastwire.parse_call(record)
    with pytest.raises(TypeError):
        native.parse_call("not bytes")
    with pytest.raises(TypeError):
        native.parse_call()
    with pytest.raises(TypeError):
        native.parse_call(record, record)
    with pytest.raises(BufferError):  # documented: callers pass contiguous buffers
        native.parse_call(memoryview(record * 2)[::2])


# --------------------------------------------------------------------------- replies


class BadBool:
    def __bool__(self) -> bool:
        raise RuntimeError("no truth")


ints = st.one_of(
    u32,
    st.integers(-(2**70), 2**70),
    st.sampled_from([-1, 2**32 - 1, 2**32, 2**64 - 1, 2**64, 0x7FFFFF00, 0x7FFFFF01]),
)
numbers = st.one_of(ints, ints, ints, st.sampled_from([True, False, 1.5, 3.0, -1.0, "1", None]))
attrs = st.one_of(st.binary(min_size=84, max_size=84), st.binary(max_size=100))
handles = st.one_of(st.binary(max_size=64), st.binary(max_size=80))
eofs = st.sampled_from([True, False, 0, 1, None, "", "x", 2.5, BadBool()])
buffers = st.sampled_from(AS_BUFFERS)


def outcome(fn: Callable[..., object], *args: object) -> object:
    try:
        return ("ok", fn(*args))
    except Exception as e:
        return ("error", type(e), str(e))


def same_outcome(native: ModuleType, name: str, *args: object) -> None:
    want = outcome(getattr(fastwire, name), *args)
    got = outcome(getattr(native, name), *args)
    assert got == want, (name, args)
    if want[0] == "ok":
        assert type(got[1]) is bytes  # type: ignore[index]


@settings(max_examples=300, deadline=None)
@given(numbers, attrs, buffers)
def test_reply_getattr(native: ModuleType, xid: object, attr: bytes, buf: Any) -> None:
    same_outcome(native, "reply_getattr", xid, buf(attr))


@settings(max_examples=300, deadline=None)
@given(numbers, attrs, numbers, buffers)
def test_reply_access(native: ModuleType, xid: object, attr: bytes, acc: object, buf: Any) -> None:
    same_outcome(native, "reply_access", xid, buf(attr), acc)


@settings(max_examples=400, deadline=None)
@given(numbers, handles, attrs, attrs, buffers)
def test_reply_lookup(
    native: ModuleType, xid: object, fh: bytes, attr: bytes, dir_attr: bytes, buf: Any
) -> None:
    same_outcome(native, "reply_lookup", xid, buf(fh), buf(attr), buf(dir_attr))


@settings(max_examples=300, deadline=None)
@given(numbers, attrs, buffers)
def test_reply_lookup_noent(native: ModuleType, xid: object, attr: bytes, buf: Any) -> None:
    same_outcome(native, "reply_lookup_noent", xid, buf(attr))


@settings(max_examples=400, deadline=None)
@given(numbers, attrs, numbers, eofs, buffers)
def test_reply_read_head(
    native: ModuleType, xid: object, attr: bytes, count: object, eof: object, buf: Any
) -> None:
    same_outcome(native, "reply_read_head", xid, buf(attr), count, eof)


@settings(max_examples=300, deadline=None)
@given(numbers)
def test_pad(native: ModuleType, n: object) -> None:
    same_outcome(native, "pad", n)


EDGE_INTS = (0, 1, 2**31, 2**32 - 1, 2**32, -1, 2**64 - 1, 2**64, 0x7FFFFF00, 0x7FFFFF01, 1.0)


def test_replies_at_the_limits(native: ModuleType) -> None:
    """Every attribute and handle size from 0 to 100 bytes, integers at their limits."""
    ok = bytes(range(84))
    for n in range(101):
        b = bytes(range(n))
        for v in EDGE_INTS:
            same_outcome(native, "reply_getattr", v, b)
            same_outcome(native, "reply_access", 5, b, v)
            same_outcome(native, "reply_access", v, ok, 5)
            same_outcome(native, "reply_lookup", v, b, ok, ok)
            same_outcome(native, "reply_lookup", 5, ok[:64], b, ok)
            same_outcome(native, "reply_lookup", 5, b, ok, b)
            same_outcome(native, "reply_lookup_noent", v, b)
            same_outcome(native, "reply_read_head", v, b, n, True)
            same_outcome(native, "reply_read_head", 5, ok, v, n)
        same_outcome(native, "pad", n)


def test_replies_decode_with_nfsproto(native: ModuleType) -> None:
    """Not only the twin's bytes: what an NFS client decodes (a second opinion on both)."""
    attr = nfs3.fattr3_bytes(
        nfs3.Fattr3(
            nfs3.Ftype3.NF3REG, 0o644, 1, 0, 0, 5, 8, nfs3.Specdata3(0, 0), 1, 77,
            nfs3.NfsTime3(1, 2), nfs3.NfsTime3(3, 4), nfs3.NfsTime3(5, 6),
        )
    )  # fmt: skip

    def res(record: bytes, proc: int) -> Any:
        mark = struct.unpack_from(">I", record)[0]
        assert mark == rpc.LAST_FRAGMENT | (len(record) - 4)
        r = Reader(record, 4)
        h = rpc.unpack_reply(r)
        assert h.xid == 9 and h.accept_stat == rpc.AcceptStat.SUCCESS
        v = nfs3.PROCS[proc].unpack_res(r)
        r.done()
        return v

    got = res(native.reply_getattr(9, attr), fastwire.GETATTR)
    assert got.obj_attributes.fileid == 77
    got = res(native.reply_access(9, attr, 0x21), fastwire.ACCESS)
    assert got.access == 0x21 and got.obj_attributes.size == 5
    got = res(native.reply_lookup(9, b"hand", attr, attr), fastwire.LOOKUP)
    assert got.object == b"hand" and got.dir_attributes.fileid == 77
    got = res(native.reply_lookup_noent(9, attr), fastwire.LOOKUP)
    assert got.status == nfs3.NfsStat3.NFS3ERR_NOENT and got.dir_attributes.fileid == 77
    data = b"hello"
    head = native.reply_read_head(9, attr, len(data), True)
    got = res(head + data + native.pad(len(data)), fastwire.READ)
    assert bytes(got.data) == data and got.eof and got.count == 5


def test_keywords_and_constants(native: ModuleType) -> None:
    attr = bytes(84)
    kw = {"xid": 3, "attr": attr, "count": 10, "eof": False}
    assert native.reply_read_head(**kw) == fastwire.reply_read_head(**kw)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        native.reply_getattr(3, attr, xid=3)
    with pytest.raises(TypeError):
        native.reply_getattr(3, bogus=attr)
    with pytest.raises(TypeError):
        native.reply_getattr(3)
    for name in ("NFS_PROGRAM", "GETATTR", "LOOKUP", "ACCESS", "READ", "FATTR3_SIZE"):
        assert getattr(native, name) == getattr(fastwire, name)
    for name in ("NFS3ERR_NOENT", "MAX_AUTH", "MAX_FH", "MAX_NAME", "LAST_FRAGMENT"):
        assert getattr(native, name) == getattr(fastwire, name)


# --------------------------------------------------------------------------- RecordReader


@st.composite
def streams(draw: st.DrawFn) -> tuple[bytes, list[int]]:
    """Records in random fragments (empty ones too), maybe garbage after, and where the
    stream is cut into feeds."""
    out = bytearray()
    for rec in draw(st.lists(st.binary(max_size=300), max_size=8)):
        cuts = sorted(draw(st.lists(st.integers(0, len(rec)), max_size=3)))
        bounds = [0, *cuts, len(rec)]
        for i in range(len(bounds) - 1):
            last = rpc.LAST_FRAGMENT if i == len(bounds) - 2 else 0
            out += struct.pack(">I", last | (bounds[i + 1] - bounds[i]))
            out += rec[bounds[i] : bounds[i + 1]]
    out += draw(st.one_of(st.just(b""), st.binary(max_size=12)))
    cuts = sorted(draw(st.lists(st.integers(0, len(out)), max_size=10)))
    return bytes(out), cuts


def feed_outcome(reader: Any, data: Any) -> object:
    try:
        got = reader.feed(data)
    except Exception as e:
        return ("error", type(e), str(e), reader.pending_bytes())
    return ("ok", [(type(r), bytes(r)) for r in got], reader.pending_bytes())


@settings(max_examples=500, deadline=None)
@given(
    streams(),
    st.one_of(st.sampled_from([rpc.DEFAULT_MAX_RECORD, -1, 0, 1, 100, 300]), st.integers(-1, 800)),
    buffers,
)
def test_record_reader(
    native: ModuleType, stream: tuple[bytes, list[int]], max_record: int, buf: Any
) -> None:
    data, cuts = stream
    py = rpc.RecordReader(max_record)
    c = native.RecordReader(max_record, rpc.RecordError)
    assert c.max_record == max_record
    for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True):
        piece = data[a:b]
        # after an error too: the state it leaves is the Python's
        assert feed_outcome(c, buf(piece)) == feed_outcome(py, buf(piece))


def test_record_reader_slices_without_copying(native: ModuleType) -> None:
    data = bytearray(b"\x80\0\0\x03abc\0\0\0\x01x\x80\0\0\x01y")
    c = native.RecordReader(100, rpc.RecordError)
    whole, joined = c.feed(data)
    assert isinstance(whole, memoryview) and whole.obj is data and bytes(whole) == b"abc"
    assert isinstance(joined, bytearray) and joined == b"xy"
    mv = memoryview(data)
    assert c.feed(mv)[0].obj is data
    with pytest.raises(BufferError):  # the slices keep the bytearray exported
        data.append(0)


def test_record_reader_limits(native: ModuleType) -> None:
    c = native.RecordReader(10, rpc.RecordError)
    py = rpc.RecordReader(10)
    for r in (c, py):
        assert r.feed(b"\0\0\0\x06abcdef") == []
        r.max_record = 7  # lowered between feeds: the next mark is checked against it
    for r in (c, py):
        with pytest.raises(rpc.RecordError, match="record of at least 8 bytes exceeds the max"):
            r.feed(b"\x80\0\0\x02")
        assert r.pending_bytes() == 10
    assert native.RecordReader(max_record=5, error_class=KeyError).max_record == 5
    with pytest.raises(KeyError, match="at least 2147483647 bytes exceeds the maximum of 5"):
        native.RecordReader(5, KeyError).feed(b"\x7f\xff\xff\xff")
    with pytest.raises(TypeError):
        native.RecordReader(5, "not an exception")
    with pytest.raises(TypeError):
        native.RecordReader(5)
    with pytest.raises(TypeError):
        native.RecordReader(5, ValueError).feed("text")


# -- file mappings (the disk tier's entries, gateway.data.disk.entries) ----------------------


@pytest.mark.parametrize("size", [1, 4095, 4096, 4097, 110_000])
def test_a_mapping_gives_the_files_bytes_like_mmap_and_keeps_no_descriptor(
    native: ModuleType, tmp_path: Path, size: int
) -> None:
    import mmap

    data = os.urandom(size)
    path = tmp_path / "f"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        before = len(os.listdir("/proc/self/fd"))
        m = native.Mapping(fd, size)
        assert len(os.listdir("/proc/self/fd")) == before  # mmap.mmap keeps a dup'd one
        ref = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ)
    finally:
        os.close(fd)
    view = memoryview(m)[size // 3 :]
    del m  # the view keeps the mapping alive
    assert bytes(view) == ref[size // 3 :] == data[size // 3 :]
    assert view.readonly and len(memoryview(ref)) == size
    with pytest.raises(TypeError):
        view[0] = 1  # type: ignore[index]
    path.unlink()  # an unlinked entry stays readable through its mapping
    assert bytes(view) == data[size // 3 :]
    ref.close()


def test_a_mapping_refuses_what_would_fault(native: ModuleType, tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"abc")
    fd = os.open(path, os.O_RDONLY)
    try:
        for bad in ((fd, 4), (fd, 0), (fd, -5)):  # past the end: SIGBUS when read
            with pytest.raises(ValueError):
                native.Mapping(*bad)
        with pytest.raises(OSError):
            native.Mapping(10_000, 1)  # not an open descriptor
        dfd = os.open(tmp_path, os.O_RDONLY)
        with pytest.raises(ValueError):
            native.Mapping(dfd, 1)  # a directory
        os.close(dfd)
    finally:
        os.close(fd)


def test_map_file_twins_give_the_same_bytes(tmp_path: Path, monkeypatch: Any) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"0123456789" * 1000)
    fd = os.open(path, os.O_RDONLY)
    try:
        views = [bytes(memoryview(fastwire.map_file(fd, 10_000))[5:])]
        monkeypatch.setenv("NFSGW_PURE_PYTHON", "1")
        fastwire.compiled.cache_clear()
        assert fastwire.mapping_fds()
        views.append(bytes(memoryview(fastwire.map_file(fd, 10_000))[5:]))
    finally:
        os.close(fd)
        fastwire.compiled.cache_clear()
    assert views[0] == views[1] == (b"0123456789" * 1000)[5:]


def test_map_file_twins_map_a_range_from_a_page_offset(tmp_path: Path, monkeypatch: Any) -> None:
    """A range from a page-aligned offset: the same bytes from both twins; an unaligned
    offset is the kernel's EINVAL (OSError) and a range past the end a ValueError in both."""
    import mmap

    data = os.urandom(5 * mmap.PAGESIZE + 123)
    path = tmp_path / "f"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    got: list[bytes] = []
    try:
        for pure in ("", "1"):
            monkeypatch.setenv("NFSGW_PURE_PYTHON", pure)
            fastwire.compiled.cache_clear()
            got.append(
                bytes(memoryview(fastwire.map_file(fd, 2 * mmap.PAGESIZE + 7, 2 * mmap.PAGESIZE)))
            )
            with pytest.raises(OSError):
                fastwire.map_file(fd, 10, 100)
            with pytest.raises(ValueError):
                fastwire.map_file(fd, 3 * mmap.PAGESIZE + 124, 2 * mmap.PAGESIZE)
    finally:
        os.close(fd)
        fastwire.compiled.cache_clear()
    assert got[0] == got[1] == data[2 * mmap.PAGESIZE : 4 * mmap.PAGESIZE + 7]
