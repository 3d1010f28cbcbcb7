"""The disk tier's on-disk format: the layout's names, an entry's identity and name, a
bundle's table and an entry's header, and what a file is charged against the budget.

Owns: the layout ``<cache_dir>/v2/<2 hex>/<32 hex>`` (the name is the BLAKE2b-128 of the
entry's identity) and ``<cache_dir>/v2/locks/`` (``LOCKS``: the fetch claims' stripes, the
owner's and the guests' lock files), the bundle format (below), the encoding and checking of a
table and a header, and the charge of a file (whole 4 KiB blocks). Must not: do I/O or keep
state (bytes in, bytes out: ``entries`` reads and writes bundles, ``directory`` scans them).

Names are identities. An entry holds bytes ``[start, start + length)`` of one object version;
its name is ``v2/<2 hex>/<32 hex>``, the BLAKE2b-128 of (store name, key, ETag, start, length).
Any worker computes the same name, so what one wrote every other finds with one ``open``; a
replaced object has a new ETag, hence a new name: an old version is never served (it ages out).
A change of ``block_size`` changes the ranges, hence the names.

Bundles (layout v2). The file behind an entry's name is a *bundle*: one inode holding up to
``MAX_BUNDLE_ENTRIES`` entries, each of them a hard link to it. Creating, renaming and
evicting an inode costs a filesystem far more CPU than appending to one (ext4 without a
journal scans for recently deleted inodes on every allocation: 180-270 us per 110 kB entry
file here, 47 us per entry in bundles of 64), so entries are published in batches, one inode
per batch. A bundle is:

* a table at its start, within its first 4 KiB page: magic ``NFGB``, format version (2),
  entry count (u16), then per entry the 16 bytes of its name (the BLAKE2b-128), its offset
  and its length in bytes (u64 each), then a CRC-32 of all of it (``encode_table``:
  ``table_bytes(n)`` = 12 + 32 n bytes, so at most ``MAX_BUNDLE_ENTRIES`` = 127 entries);
* its entries, in the entry format: a 36-byte header (magic ``NFGC``, format version,
  identity length, start, length, CRC-32 of the body, CRC-32 of the header and identity:
  ``encode_header``), the identity bytes, then the body. The first entry starts right after
  the table (a bundle of one entry, a warm-up's, is then no bigger on disk than the entry
  alone would be, and the table's page is read anyway), each later one at a 4 KiB-aligned
  offset (its pages are its own).
"""

from __future__ import annotations

import hashlib
import struct
import zlib
from dataclasses import dataclass
from typing import Final

__all__ = [
    "FS_BLOCK",
    "GUESTS_LOCK",
    "HEADER",
    "LAYOUT",
    "LOCKS",
    "LOCK_STRIPES",
    "MAX_BUNDLE_ENTRIES",
    "OWNER_LOCK",
    "SUBDIRS",
    "TABLE_BYTES",
    "DiskKey",
    "bundle_charge",
    "charge_of",
    "check_header",
    "disk_key",
    "encode_header",
    "encode_table",
    "find_in_table",
    "table_bytes",
    "table_charge",
]

LAYOUT: Final = "v2"
MAGIC: Final = b"NFGC"
FORMAT_VERSION: Final = 1
# magic, format version, flags, identity length, start, length, body CRC-32, header CRC-32
HEADER: Final = struct.Struct("<4sHHIQQII")
BUNDLE_MAGIC: Final = b"NFGB"
BUNDLE_VERSION: Final = 2
_TABLE_HEAD: Final = struct.Struct("<4sHH")  # magic, format version, entry count
_TABLE_ROW: Final = struct.Struct("<16sQQ")  # name, offset, entry bytes
_CRC: Final = struct.Struct("<I")
FS_BLOCK: Final = 4096
TABLE_BYTES: Final = FS_BLOCK  # the page holding a bundle's table (what a reader reads first)
MAX_BUNDLE_ENTRIES: Final = (TABLE_BYTES - _TABLE_HEAD.size - _CRC.size) // _TABLE_ROW.size
SUBDIRS: Final = tuple(f"{i:02x}" for i in range(256))
LOCKS: Final = "locks"  # under the layout directory: the fetch claims' lock files
LOCK_STRIPES: Final = 4096  # lock files (3 hex digits of the entry name)
OWNER_LOCK: Final = "owner"  # under LOCKS: held by the directory's first unshared user
GUESTS_LOCK: Final = "guests"  # under LOCKS: held shared by every other unshared user


def charge_of(file_bytes: int) -> int:
    """What a file of ``file_bytes`` is charged against the budget (whole 4 KiB blocks)."""
    return -(-file_bytes // FS_BLOCK) * FS_BLOCK


def table_bytes(entries: int) -> int:
    """The length of a bundle's table of ``entries`` rows."""
    return _TABLE_HEAD.size + entries * _TABLE_ROW.size + _CRC.size


def table_charge(first_entry_bytes: int, entries: int) -> int:
    """What a bundle of ``entries`` costs beyond its entries' own charges (``DiskKey.charge``):
    its table, in the first entry's last page when it fits there, else one more page."""
    return charge_of(table_bytes(entries) + first_entry_bytes) - charge_of(first_entry_bytes)


def bundle_charge(keys: list[DiskKey]) -> int:
    """What a bundle of ``keys`` is charged: its entries' charges and its table's."""
    return table_charge(keys[0].file_bytes, len(keys)) + sum(k.charge for k in keys)


@dataclass(frozen=True, slots=True)
class DiskKey:
    """One entry: bytes ``[start, start + length)`` of the object version ``ident``."""

    name: str
    ident: bytes
    start: int
    length: int

    @property
    def file_bytes(self) -> int:
        """The entry's bytes in its bundle (header, identity, body)."""
        return HEADER.size + len(self.ident) + self.length

    @property
    def charge(self) -> int:
        """Its share of a bundle: its bytes rounded up to 4 KiB (later entries are 4 KiB
        aligned; the table is charged to the bundle: ``table_charge``)."""
        return charge_of(self.file_bytes)

    @property
    def hash64(self) -> int:
        return int(self.name[:16], 16)


def disk_key(store: str, key: str, etag: str, start: int, length: int) -> DiskKey:
    ident = f"{store}\0{key}\0{etag}".encode("utf-8", "surrogatepass")
    h = hashlib.blake2b(ident, digest_size=16)
    h.update(struct.pack("<QQ", start, length))
    return DiskKey(h.hexdigest(), ident, start, length)


def encode_header(k: DiskKey, body_crc: int) -> bytes:
    fixed = HEADER.pack(MAGIC, FORMAT_VERSION, 0, len(k.ident), k.start, k.length, body_crc, 0)
    hcrc = zlib.crc32(k.ident, zlib.crc32(fixed[:-4]))
    return fixed[:-4] + struct.pack("<I", hcrc) + k.ident


def encode_table(rows: list[tuple[str, int, int]]) -> bytes:
    """A bundle's table for entries (name, offset, entry bytes): ``table_bytes(len(rows))``."""
    if not 0 < len(rows) <= MAX_BUNDLE_ENTRIES:
        raise ValueError(f"a bundle holds 1 to {MAX_BUNDLE_ENTRIES} entries")
    parts = [_TABLE_HEAD.pack(BUNDLE_MAGIC, BUNDLE_VERSION, len(rows))]
    parts += [_TABLE_ROW.pack(bytes.fromhex(n), off, nb) for n, off, nb in rows]
    table = b"".join(parts)
    return table + _CRC.pack(zlib.crc32(table))


def find_in_table(page: bytes, name: str) -> tuple[str, int, int]:
    """("", offset, entry bytes) of ``name`` in the table at the start of ``page`` (a
    bundle's first bytes), else (why, 0, 0); the offset is past the table. Never raises:
    any bytes are a table or a reason."""
    if len(page) < table_bytes(1):
        return "short table", 0, 0
    magic, version, count = _TABLE_HEAD.unpack_from(page)
    if magic != BUNDLE_MAGIC or version != BUNDLE_VERSION:
        return "not a bundle of this format", 0, 0
    end = table_bytes(count) - _CRC.size
    if not 0 < count <= MAX_BUNDLE_ENTRIES or end + _CRC.size > len(page):
        return "entry count", 0, 0
    if zlib.crc32(memoryview(page)[:end]) != _CRC.unpack_from(page, end)[0]:
        return "table checksum", 0, 0
    want = bytes.fromhex(name)
    pos = page.find(want, _TABLE_HEAD.size, end)
    while pos >= 0 and (pos - _TABLE_HEAD.size) % _TABLE_ROW.size:
        pos = page.find(want, pos + 1, end)  # a match across two rows' fields
    if pos < 0:
        return "not in its bundle", 0, 0
    _, off, nbytes = _TABLE_ROW.unpack_from(page, pos)
    if off < end + _CRC.size:
        return f"entry at {off}, inside the table", 0, 0
    return "", off, nbytes


def check_header(head: bytes, k: DiskKey) -> tuple[str, int]:
    """("", body CRC) when ``head`` is a valid header of ``k``, else (why, 0)."""
    if len(head) != HEADER.size + len(k.ident):
        return "short header", 0
    magic, version, _, ilen, start, length, body_crc, hcrc = HEADER.unpack_from(head)
    if magic != MAGIC or version != FORMAT_VERSION:
        return "not an entry of this format", 0
    if zlib.crc32(head[HEADER.size :], zlib.crc32(head[: HEADER.size - 4])) != hcrc:
        return "header checksum", 0
    if (
        ilen != len(k.ident)
        or head[HEADER.size :] != k.ident
        or (start, length)
        != (
            k.start,
            k.length,
        )
    ):
        return "another entry's identity", 0
    return "", body_crc
