"""The write path's settings: spool, multipart parts, idle flush, rename bounds."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final

MiB: Final = 1 << 20
S3_MAX_PARTS: Final = 10_000
S3_MIN_PART: Final = 5 * MiB


@dataclass(frozen=True, slots=True)
class WriteConfig:
    spool_dir: Path
    spool_bytes: int = 2 << 30
    part_size: int = 8 * MiB
    max_staged_files: int = 1024
    flush_idle_s: float = 30.0
    rename_max_entries: int = 1000
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

    @classmethod
    def from_server(cls, cfg: object) -> WriteConfig:
        """From a ``ServerConfig``: its write knobs where it has them, else the defaults."""
        state_dir = Path(getattr(cfg, "state_dir", "/var/lib/nfsgw"))
        spool_dir = getattr(cfg, "spool_dir", None) or state_dir / "spool"
        kw: dict[str, int | float] = {}
        for ours, theirs in _SERVER_KNOBS.items():
            v = getattr(cfg, theirs, None)
            if isinstance(v, int | float):
                kw[ours] = v
        return cls(Path(spool_dir), **kw)  # type: ignore[arg-type]


# WriteConfig field -> ServerConfig field
_SERVER_KNOBS: Final = {
    "spool_bytes": "spool_bytes",
    "part_size": "write_part_size",
    "flush_idle_s": "write_flush_idle_s",
    "rename_max_entries": "rename_max_entries",
}
