"""The pack format (issue 16; documented for users in docs/packs.md): shards that are plain
POSIX tar archives, and one index naming, for every packed object, where its bytes are.

Owns: the layout of a pack under its prefix, the tar member header, the index's text form
(writing and parsing, with every check a damaged or foreign index fails), and ``PackIndex``,
the loaded index: sorted keys in one blob, numbers in arrays. Must not: talk to a store (the
packer, ``gateway.pack.packer``, and the serving side, ``gateway.pack.store``, do).

Layout under ``DST`` (``s3://bucket/prefix``)::

    DST/shard-000000.tar ...   POSIX tar (pax headers), members in key order
    DST/parts/shard-000000.tsv the index lines of one finished shard (resuming reads these)
    DST/index.tsv.gz           the whole index: gzip of the lines below

Index text (UTF-8, one record per line, fields separated by TAB)::

    nfsgw-pack  1  <source url>  <entries>  <shards>
    S  <shard no>  <shard object name, relative to DST>  <shard bytes>
    ...
    <path>  <size>  <mtime_ns>  <etag>  <shard no>  <data offset>  <crc32 hex>
    ...
    end  <entries>

``path`` is the object's key relative to the source prefix, with ``%``, TAB, CR and LF
percent-encoded; entries are sorted by the UTF-8 bytes of their key (the order S3 lists in).
``data offset`` is where the member's bytes start in its shard (after its tar headers);
``crc32`` is the CRC-32 of those bytes, checked on every read of a whole member. A missing or
unknown header, a count that does not match, a line that does not parse, keys out of order, a
member outside its shard, or no ``end`` line: ``PackError``, and the pack is not used.
"""

from __future__ import annotations

import tarfile
from array import array
from bisect import bisect_left
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Final

__all__ = [
    "BLOCK",
    "END_OF_ARCHIVE",
    "INDEX_NAME",
    "PARTS_DIR",
    "VERSION",
    "Member",
    "PackError",
    "PackIndex",
    "Shard",
    "format_index",
    "member_header",
    "padding",
    "parse_index",
    "part_name",
    "part_lines",
    "shard_name",
]

VERSION: Final = 1
MAGIC: Final = "nfsgw-pack"
INDEX_NAME: Final = "index.tsv.gz"
PARTS_DIR: Final = "parts/"
BLOCK: Final = 512
END_OF_ARCHIVE: Final = bytes(2 * BLOCK)


class PackError(Exception):
    """The index (or a shard) is not a pack this version can serve."""


@dataclass(frozen=True, slots=True)
class Member:
    path: str  # relative to the source prefix
    size: int
    mtime_ns: int
    etag: str
    shard: int
    offset: int  # of the data in the shard
    crc32: int


@dataclass(frozen=True, slots=True)
class Shard:
    no: int
    name: str  # relative to the pack prefix
    size: int


def shard_name(no: int) -> str:
    return f"shard-{no:06d}.tar"


def part_name(no: int) -> str:
    return f"{PARTS_DIR}shard-{no:06d}.tsv"


def member_header(path: str, size: int, mtime_ns: int) -> bytes:
    """The tar header block(s) of a regular file member (pax extended header first when the
    name is long or not ASCII, so any tar reads it back)."""
    info = tarfile.TarInfo(path)
    info.size = size
    info.mtime = mtime_ns // 1_000_000_000
    info.mode = 0o644
    info.type = tarfile.REGTYPE
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


def padding(size: int) -> bytes:
    """Zeros that round a member's data up to a whole tar block."""
    return bytes(-size % BLOCK)


def _escape(path: str) -> str:
    if "%" in path or "\t" in path or "\n" in path or "\r" in path:
        path = path.replace("%", "%25").replace("\t", "%09").replace("\n", "%0A")
        path = path.replace("\r", "%0D")
    return path


def _unescape(field: str) -> str:
    if "%" not in field:
        return field
    out: list[str] = []
    i = 0
    while True:
        j = field.find("%", i)
        if j < 0:
            out.append(field[i:])
            return "".join(out)
        code = field[j + 1 : j + 3]
        if code not in ("25", "09", "0A", "0D"):
            raise PackError(f"bad escape %{code} in {field!r}")
        out.append(field[i:j])
        out.append(chr(int(code, 16)))
        i = j + 3


def part_lines(members: Iterable[Member]) -> Iterator[str]:
    """The index lines of ``members`` (a shard's part file, or the index's body)."""
    for m in members:
        yield (
            f"{_escape(m.path)}\t{m.size}\t{m.mtime_ns}\t{m.etag}\t{m.shard}\t{m.offset}\t"
            f"{m.crc32:08x}\n"
        )


def format_index(source: str, shards: list[Shard], members: list[Member]) -> Iterator[str]:
    """The whole index text (the caller gzips it)."""
    yield f"{MAGIC}\t{VERSION}\t{source}\t{len(members)}\t{len(shards)}\n"
    for s in shards:
        yield f"S\t{s.no}\t{s.name}\t{s.size}\n"
    yield from part_lines(members)
    yield f"end\t{len(members)}\n"


def parse_part(lines: Iterable[str]) -> list[Member]:
    """A part file's members (``PackError`` on a line that does not parse)."""
    return [_member(line) for line in lines if line.strip()]


def _member(line: str) -> Member:
    f = line.rstrip("\n").split("\t")
    if len(f) != 7:
        raise PackError(f"index line with {len(f)} fields: {line[:200]!r}")
    try:
        return Member(
            _unescape(f[0]), int(f[1]), int(f[2]), f[3], int(f[4]), int(f[5]), int(f[6], 16)
        )
    except ValueError as e:
        raise PackError(f"index line does not parse ({e}): {line[:200]!r}") from e


class PackIndex:
    """A loaded index: every member, looked up by path (binary search over the sorted keys'
    UTF-8 bytes, one blob), and what listings need (sizes, mtimes, ETags).

    Memory per member: its path's UTF-8 bytes plus 56 bytes of arrays (offset into the blob,
    size, mtime, shard, data offset, CRC) and its ETag (16 bytes when it is an MD5 hex
    string, which S3 ETags of single-part uploads are; the string otherwise)."""

    def __init__(self, source: str, shards: list[Shard], members: Iterable[Member]) -> None:
        self.source = source
        self.shards = {s.no: s for s in shards}
        blob = bytearray()
        offs = array("Q", [0])
        self.sizes = array("q")
        self.mtimes = array("q")
        self.shard_of = array("I")
        self.data_at = array("Q")
        self.crcs = array("I")
        hexes = bytearray()
        self._odd: dict[int, str] = {}
        prev = b""
        n = 0
        for m in members:
            key = m.path.encode("utf-8", "surrogateescape")
            if n and key <= prev:
                raise PackError(f"index not sorted at {m.path!r}")
            shard = self.shards.get(m.shard)
            if shard is None or m.offset + m.size > shard.size or m.size < 0:
                raise PackError(f"{m.path!r}: outside its shard {m.shard}")
            blob += key
            offs.append(len(blob))
            self.sizes.append(m.size)
            self.mtimes.append(m.mtime_ns)
            self.shard_of.append(m.shard)
            self.data_at.append(m.offset)
            self.crcs.append(m.crc32)
            raw = _md5(m.etag)
            if raw is None:
                self._odd[n] = m.etag
                raw = bytes(16)
            hexes += raw
            prev = key
            n += 1
        self.n = n
        self._blob = bytes(blob)
        self._offs = offs
        self._etags = bytes(hexes)

    def __len__(self) -> int:
        return self.n

    def key(self, i: int) -> bytes:
        return self._blob[self._offs[i] : self._offs[i + 1]]

    def path(self, i: int) -> str:
        return self.key(i).decode("utf-8", "surrogateescape")

    def etag(self, i: int) -> str:
        odd = self._odd.get(i)
        if odd is not None:
            return odd
        return '"' + self._etags[16 * i : 16 * i + 16].hex() + '"'

    def find(self, path: str) -> int:
        """The row of ``path``, or -1."""
        key = path.encode("utf-8", "surrogateescape")
        i = self.lower_bound(key)
        return i if i < self.n and self.key(i) == key else -1

    def lower_bound(self, key: bytes) -> int:
        """The first row whose key is >= ``key``."""
        return bisect_left(range(self.n), key, key=self.key)

    def nbytes(self) -> int:
        """Bytes the index holds (arrays and blob; the odd ETags roughly)."""
        arrays = (self._offs, self.sizes, self.mtimes, self.shard_of, self.data_at, self.crcs)
        return (
            len(self._blob)
            + len(self._etags)
            + sum(a.itemsize * len(a) for a in arrays)
            + 100 * len(self._odd)
        )


def _md5(etag: str) -> bytes | None:
    """The 16 bytes of a quoted or bare MD5 hex ETag, as listings quote it back ("...")."""
    e = etag[1:-1] if len(etag) == 34 and etag[0] == '"' == etag[-1] else etag
    if len(e) != 32:
        return None
    try:
        return bytes.fromhex(e) if e == e.lower() else None
    except ValueError:
        return None


def parse_index(lines: Iterable[str]) -> PackIndex:
    """The index from its text lines; ``PackError`` on anything wrong (module docstring)."""
    it = iter(lines)
    head = next(it, "").rstrip("\n").split("\t")
    if len(head) != 5 or head[0] != MAGIC:
        raise PackError("not an nfsgw pack index (bad first line)")
    if head[1] != str(VERSION):
        raise PackError(f"pack index version {head[1]!r}; this nfsgw reads version {VERSION}")
    try:
        entries, nshards = int(head[3]), int(head[4])
    except ValueError as e:
        raise PackError(f"bad index header: {e}") from e
    shards: list[Shard] = []
    for _ in range(nshards):
        f = next(it, "").rstrip("\n").split("\t")
        if len(f) != 4 or f[0] != "S":
            raise PackError("index truncated or damaged in its shard table")
        try:
            shards.append(Shard(int(f[1]), f[2], int(f[3])))
        except ValueError as e:
            raise PackError(f"bad shard line: {e}") from e
    tail: list[str] = []

    def body() -> Iterator[Member]:
        for line in it:
            if line.startswith("end\t"):
                tail.append(line)
                return
            yield _member(line)

    index = PackIndex(head[2], shards, body())
    if not tail:
        raise PackError(f"index truncated after {index.n} of {entries} entries (no end line)")
    if index.n != entries or tail[0].rstrip("\n") != f"end\t{entries}":
        raise PackError(f"index has {index.n} entries, its header says {entries}")
    return index
