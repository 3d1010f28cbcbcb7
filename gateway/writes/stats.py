"""The write path's counters and gauges, read by ``gateway.ops.metrics`` at scrape time.

Owns: ``WriteStats``. Must not: compute anything (the write modules update the fields).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class WriteStats:
    """Counters (monotonic) and gauges (``staged_files``, ``spool_bytes``)."""

    writes: int = 0
    bytes_staged: int = 0
    commits: int = 0
    puts: int = 0
    multipart_uploads: int = 0
    parts_streamed: int = 0
    parts_uploaded: int = 0
    parts_reuploaded: int = 0
    base_fetches: int = 0
    metadata_heads: int = 0
    rebases: int = 0
    jukebox: int = 0
    background_commits: int = 0
    commit_errors: int = 0
    orphan_uploads_aborted: int = 0
    staged_files: int = 0  # gauge
    spool_bytes: int = 0  # gauge
