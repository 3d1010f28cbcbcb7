"""The pack format (documented for users in docs/packs.md): shards that are plain
POSIX tar archives, and one index naming, for every packed object, where its bytes are.

Owns: the layout of a pack under its prefix, the tar member header, the index's text form
(writing and parsing, with every check a damaged or foreign index fails), and ``PackIndex``,
the loaded index: sorted keys in one blob, numbers in arrays. Must not: talk to a store (the
packer, ``gateway.pack.packer``, and the serving side, ``gateway.pack.store``, do).

Layout under ``DST`` (``s3://bucket/prefix``)::

    DST/shard-000000.tar ...   POSIX tar (pax headers), members in key order
    DST/parts/shard-000000.tsv the index lines of one finished shard (resuming reads these)
    DST/index.tsv.gz           the whole index: gzip of the lines below
    DST/unpacked.tsv.gz        the keys under the source the index does not hold (dir/
                               markers, objects left out or added), listed when the pack
                               was finished: listings from the index add them

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

import operator
import tarfile
from array import array
from bisect import bisect_left
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass
from itertools import accumulate
from typing import Final, TypeAlias

__all__ = [
    "BLOCK",
    "END_OF_ARCHIVE",
    "INDEX_NAME",
    "UNPACKED_NAME",
    "Unpacked",
    "format_unpacked",
    "parse_unpacked",
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
UNPACKED_NAME: Final = "unpacked.tsv.gz"
UNPACKED_MAGIC: Final = "nfsgw-unpacked"
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


def format_index(source: str, shards: list[Shard], members: Collection[Member]) -> Iterator[str]:
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


Columns5: TypeAlias = "tuple[array[int], array[int], array[int], array[int], array[int]]"
"""Sizes, mtimes, shard numbers, data offsets, CRCs: one value per member."""


class PackIndex:
    """A loaded index: every member, found by path (a hash table: sorted 64-bit hashes of the
    keys and their rows), in key order for listings (binary search over the keys' UTF-8
    bytes, one blob), with what listings need (sizes, mtimes, ETags).

    Memory per member: its path's UTF-8 bytes, 16 bytes of ETag (an MD5 hex string, which S3
    ETags of single-part uploads are; other ETags are kept as strings) and 60 bytes of arrays
    (blob offset, size, mtime, shard, data offset, CRC, hash, row)."""

    def __init__(
        self,
        source: str,
        shards: list[Shard],
        keys: list[bytes],
        columns: Columns5,
        etags: bytes,
        odd: dict[int, str],
        *,
        quoted: bool = False,
    ) -> None:
        self.source = source
        self.shards = {s.no: s for s in shards}
        self.n = n = len(keys)
        self.sizes, self.mtimes, self.shard_of, self.data_at, self.crcs = columns
        self._etags = etags
        self._odd = odd
        self._quoted = quoted
        self._blob = b"".join(keys)
        self._offs = array("Q", [0])
        self._offs.extend(accumulate(map(len, keys)))
        hashes = list(map(hash, keys))
        order = sorted(range(n), key=hashes.__getitem__)
        self._hashes = array("q", map(hashes.__getitem__, order))
        self._rows = array("I", order)

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
        h = self._etags[16 * i : 16 * i + 16].hex()
        return f'"{h}"' if self._quoted else h

    def find(self, path: str) -> int:
        """The row of ``path``, or -1."""
        key = path.encode("utf-8", "surrogateescape")
        h = hash(key)
        hashes, rows = self._hashes, self._rows
        j = bisect_left(hashes, h)
        while j < self.n and hashes[j] == h:
            if self.key(rows[j]) == key:
                return rows[j]
            j += 1
        return -1

    def lower_bound(self, key: bytes) -> int:
        """The first row whose key is >= ``key``."""
        return bisect_left(range(self.n), key, key=self.key)

    def nbytes(self) -> int:
        """Bytes the index holds (arrays and blob; the odd ETags roughly)."""
        arrays = (
            self._offs, self.sizes, self.mtimes, self.shard_of, self.data_at, self.crcs,
            self._hashes, self._rows,
        )  # fmt: skip
        return (
            len(self._blob)
            + len(self._etags)
            + sum(a.itemsize * len(a) for a in arrays)
            + 100 * len(self._odd)
        )


def _md5(etag: str, quoted: bool) -> bytes | None:
    """The 16 bytes of an MD5 hex ETag in the index's form (quoted or bare), else None."""
    if quoted:
        if len(etag) != 34 or etag[0] != '"' or etag[-1] != '"':
            return None
        etag = etag[1:-1]
    if len(etag) != 32 or etag != etag.lower():
        return None
    try:
        return bytes.fromhex(etag)
    except ValueError:
        return None


CHUNK_LINES: Final = 65_536
"""Index records parsed at a time (bounds the parse's transient memory)."""


def parse_index(text: bytes | Iterable[str]) -> PackIndex:
    """The index from its text (bytes, or lines); ``PackError`` on anything wrong (module
    docstring). Column by column, in chunks: 1.28M records in a few seconds."""
    if not isinstance(text, bytes):
        text = "".join(text).encode("utf-8", "surrogateescape")
    lines = text.split(b"\n")
    if lines and not lines[-1]:
        lines.pop()
    head = lines[0].decode("utf-8", "replace").split("\t") if lines else []
    if len(head) != 5 or head[0] != MAGIC:
        raise PackError("not an nfsgw pack index (bad first line)")
    if head[1] != str(VERSION):
        raise PackError(f"pack index version {head[1]!r}; this nfsgw reads version {VERSION}")
    try:
        entries, nshards = int(head[3]), int(head[4])
    except ValueError as e:
        raise PackError(f"bad index header: {e}") from e
    if len(lines) < 2 + nshards or not lines[-1].startswith(b"end\t"):
        raise PackError("index truncated (no end line)")
    if lines[-1] != b"end\t%d" % entries or len(lines) - 2 - nshards != entries:
        raise PackError(f"index has {len(lines) - 2 - nshards} entries, its header says {entries}")
    shards: list[Shard] = []
    for raw in lines[1 : 1 + nshards]:
        f = raw.decode("utf-8", "replace").split("\t")
        if len(f) != 4 or f[0] != "S":
            raise PackError("index damaged in its shard table")
        try:
            shards.append(Shard(int(f[1]), f[2], int(f[3])))
        except ValueError as e:
            raise PackError(f"bad shard line: {e}") from e
    body = lines[1 + nshards : -1]
    del lines
    keys: list[bytes] = []
    cols: Columns5 = (array("q"), array("q"), array("I"), array("Q"), array("I"))
    etags = bytearray()
    odd: dict[int, str] = {}
    form: list[bool | None] = [None]  # quoted ETags?
    for lo in range(0, len(body), CHUNK_LINES):
        _chunk(body[lo : lo + CHUNK_LINES], lo, keys, cols, etags, odd, form)
    if any(map(operator.ge, keys, keys[1:])):
        i = next(i for i in range(1, len(keys)) if keys[i - 1] >= keys[i])
        raise PackError(f"index not sorted at {keys[i]!r}")
    sizes = {s.no: s.size for s in shards}
    for i, (size, shard, off) in enumerate(zip(cols[0], cols[2], cols[3], strict=True)):
        end = sizes.get(shard)
        if end is None or size < 0 or off + size > end:
            raise PackError(f"{keys[i]!r}: outside its shard {shard}")
    return PackIndex(head[2], shards, keys, cols, bytes(etags), odd, quoted=bool(form[0]))


def _chunk(
    lines: list[bytes],
    base: int,
    keys: list[bytes],
    cols: Columns5,
    etags: bytearray,
    odd: dict[int, str],
    form: list[bool | None],
) -> None:
    fields = b"\t".join(lines).split(b"\t")
    if len(fields) != 7 * len(lines):
        bad = next(ln for ln in lines if ln.count(b"\t") != 6)
        nf = bad.count(b"\t") + 1
        raise PackError(f"index line with {nf} fields: {bad[:200]!r}")
    paths = fields[0::7]
    if any(b"%" in p for p in paths):
        paths = [_unescape(p.decode("utf-8", "surrogateescape")).encode(
            "utf-8", "surrogateescape") if b"%" in p else p for p in paths]  # fmt: skip
    keys.extend(paths)
    try:
        for col, k in zip(cols, (1, 2, 4, 5), strict=False):
            col.extend(map(int, fields[k::7]))
        cols[4].extend(int(c, 16) for c in fields[6::7])
    except (ValueError, OverflowError) as e:
        raise PackError(f"index record does not parse: {e}") from e
    tags = fields[3::7]
    quoted = form[0]
    if quoted is None:  # the index's ETags are quoted or bare as its source listed them
        quoted = form[0] = tags[0][:1] == b'"'
    if quoted:
        joined = b"".join(t[1:33] for t in tags)
        same = all(len(t) == 34 and t[0] == t[33] == 0x22 for t in tags)
    else:
        joined = b"".join(tags)
        same = all(len(t) == 32 for t in tags)
    if same and len(joined) == 32 * len(tags) and joined == joined.lower():
        try:
            etags += bytes.fromhex(joined.decode("ascii"))
            return
        except (ValueError, UnicodeDecodeError):
            pass
    for i, t in enumerate(tags):
        tag = t.decode("utf-8", "replace")
        raw = _md5(tag, quoted)
        if raw is None:  # kept as it is: a multipart ETag, or another form
            odd[base + i] = tag
            raw = bytes(16)
        etags += raw


@dataclass(frozen=True, slots=True)
class Unpacked:
    """A key under the source that is not in the pack, as the packer last listed it."""

    path: str  # relative to the source prefix ("a/" for a directory marker)
    size: int
    mtime_ns: int
    etag: str


def format_unpacked(items: list[Unpacked]) -> Iterator[str]:
    """``unpacked.tsv.gz``'s text: a header, one line per key in key order, an end line."""
    yield f"{UNPACKED_MAGIC}\t{VERSION}\t{len(items)}\n"
    for u in items:
        yield f"{_escape(u.path)}\t{u.size}\t{u.mtime_ns}\t{u.etag}\n"
    yield f"end\t{len(items)}\n"


def parse_unpacked(text: bytes) -> list[Unpacked]:
    """The keys of ``unpacked.tsv.gz``'s text (``PackError`` if it is damaged)."""
    lines = text.decode("utf-8", "surrogateescape").split("\n")
    if lines and not lines[-1]:
        lines.pop()
    head = lines[0].split("\t") if lines else []
    if len(head) != 3 or head[0] != UNPACKED_MAGIC or head[1] != str(VERSION):
        raise PackError("unpacked keys: not an nfsgw list of this version")
    if lines[-1] != f"end\t{head[2]}" or len(lines) - 2 != int(head[2]):
        raise PackError("unpacked keys: truncated")
    out: list[Unpacked] = []
    for line in lines[1:-1]:
        f = line.split("\t")
        if len(f) != 4:
            raise PackError(f"unpacked keys: bad line {line[:200]!r}")
        try:
            out.append(Unpacked(_unescape(f[0]), int(f[1]), int(f[2]), f[3]))
        except ValueError as e:
            raise PackError(f"unpacked keys: bad line {line[:200]!r}") from e
    return out
