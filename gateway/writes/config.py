"""The write path's settings, the ``[writes]`` table of ``nfsgw.toml`` (each key declared
once, here: ``gateway.settings``): spool, multipart parts, idle flush, rename bounds; and the
S3 multipart limits they are checked against.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from gateway.settings import abs_path, int_in, seconds, setting, size

MiB: Final = 1 << 20
S3_MAX_PARTS: Final = 10_000
S3_MIN_PART: Final = 5 * MiB
S3_MAX_PART: Final = 5 << 30


@dataclass(frozen=True, slots=True)
class WriteConfig:
    spool_dir: Path = field(
        default=Path("spool"),
        metadata=setting(abs_path, "where WRITE data is staged before it is uploaded"),
    )
    """A relative path is under the state directory (the composition root resolves it)."""
    spool_bytes: int = field(
        default=2 << 30,
        metadata=setting(size(1 * MiB), "staged bytes at most; past it NFS3ERR_JUKEBOX"),
    )
    part_size: int = field(
        default=8 * MiB,
        metadata=setting(size(S3_MIN_PART, S3_MAX_PART), "multipart part size"),
    )
    max_staged_files: int = 1024
    flush_idle_s: float = field(
        default=30.0,
        metadata=setting(seconds(0.001), "idle staged data is uploaded without a COMMIT"),
    )
    rename_max_entries: int = field(
        default=1000,
        metadata=setting(int_in(1, 10_000_000), "objects a directory RENAME copies at most"),
    )
    io_threads: int = 4
    upload_concurrency: int = 4
    copy_concurrency: int = 8
    metadata_memory_entries: int = 16384

    def __post_init__(self) -> None:
        if self.part_size < S3_MIN_PART:
            raise ValueError(f"part_size must be at least {S3_MIN_PART} bytes (S3's minimum)")

    @property
    def max_file_size(self) -> int:
        return self.part_size * S3_MAX_PARTS
