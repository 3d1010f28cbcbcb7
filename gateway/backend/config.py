"""The S3 backend's settings, the ``[s3]`` table of ``nfsgw.toml``: where and how to reach
the store (``S3Config``), its retries and timeouts (``RetryPolicy``) and which bodies it
verifies (``ChecksumPolicy``), both inlined in ``[s3]``.
Each key is declared once, here (``gateway.settings``).

Must not: open connections or read credentials (``credentials.py``, off the loop).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Literal

from gateway.settings import INLINE, boolean, choice, int_in, optional_string, seconds, setting, url

AddressingStyle = Literal["auto", "path", "virtual"]


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Retries and timeouts for one backend call. ``deadline_s`` bounds the whole call,
    including backoff sleeps; each attempt is bounded by ``request_timeout_s`` (connect
    included) and ``connect_timeout_s`` for the TCP/TLS connect alone."""

    max_attempts: int = field(
        default=5,
        metadata=setting(int_in(1, 100), "retries of 5xx, throttling and connection errors"),
    )
    deadline_s: float = field(
        default=30.0, metadata=setting(seconds(0.001), "one call including retries")
    )
    request_timeout_s: float = field(default=20.0, metadata=setting(seconds(0.001), "one attempt"))
    connect_timeout_s: float = 3.0
    base_delay_s: float = 0.05
    max_delay_s: float = 2.0

    def backoff(self, attempt: int) -> float:
        """Full jitter: uniform in [0, min(cap, base * 2**(attempt-1)))."""
        return random.uniform(0.0, min(self.max_delay_s, self.base_delay_s * (1 << (attempt - 1))))


@dataclass(frozen=True, slots=True)
class ChecksumPolicy:
    """Which whole-object GET bodies the S3 store verifies (``checksums.body_checksum``); a
    body that fails is retried like a short one, then the read fails (NFS3ERR_IO), never
    served. Ranged reads of part of an object are not verifiable (docs/reliability.md). Costs
    per 110 kB GET against ~230 µs of CPU without (``benchmarks/s3_checksum_cpu.py``,
    docs/benchmarks.md):

    - ``stored``: ask for the checksums the store keeps (``x-amz-checksum-mode: ENABLED``)
      and verify a full-object CRC64NVME, CRC32C or CRC32 (+~3 µs each with the compiled
      CRCs, ``gateway._checksums``), SHA-1 or SHA-256 (~+60 µs); and send a CRC32 with every
      single-request upload, so what nfsgw writes is checked by the store on the way in and
      by nfsgw on every whole-object read after. On by default. Without the compiled CRCs
      (not built, or ``NFSGW_PURE_PYTHON=1``) CRC32C and CRC64NVME are left to
      ``python_crcs``.
    - ``md5``: a single-part object's MD5 ETag when no stored checksum came (+140 µs, +49
      to +63 %: more than the few percent a default may cost). Off by default.
    - ``python_crcs`` (key ``verify_crc32c``, its name from when CRC32C was the only slow
      one): a stored CRC32C or CRC64NVME also when it costs milliseconds (computed in Python,
      ~7 ms per 110 kB, in a thread: the compiled CRCs missing) or with ``stored`` off.
      Off by default."""

    stored: bool = field(
        default=True,
        metadata=setting(
            boolean,
            "verify whole-object reads against the CRC64NVME/CRC32C/CRC32/SHA-1/SHA-256 the "
            "store keeps; send a CRC32 with uploads",
            key="verify_checksums",
        ),
    )
    md5: bool = field(
        default=False,
        metadata=setting(
            boolean,
            "verify whole-object reads of single-part objects against their MD5 ETag",
            key="verify_md5",
        ),
    )
    python_crcs: bool = field(
        default=False,
        metadata=setting(
            boolean,
            "verify against a stored CRC32C/CRC64NVME also without the compiled CRCs "
            "(then computed in Python: ~7 ms per 110 kB) or with verify_checksums off",
            key="verify_crc32c",
        ),
    )


@dataclass(frozen=True, slots=True)
class S3Config:
    """``[s3]``: the keyword arguments ``open_store`` gets for every ``s3://`` export.
    ``region`` None follows the AWS chain (``credentials.resolve_region``)."""

    endpoint_url: str | None = field(
        default=None,
        metadata=setting(
            url, "S3 endpoint", flag="--s3-endpoint-url", default_text="AWS for the region"
        ),
    )
    region: str | None = field(
        default=None,
        metadata=setting(
            optional_string,
            "S3 region used for signing",
            flag="--s3-region",
            default_text="AWS_REGION, AWS_DEFAULT_REGION, else the profile's region",
        ),
    )
    addressing_style: AddressingStyle = field(
        default="auto",
        metadata=setting(
            choice(("auto", "path", "virtual")),
            "bucket addressing; auto: path with an endpoint URL",
            flag="--s3-addressing-style",
        ),
    )
    profile: str | None = field(
        default=None,
        metadata=setting(
            optional_string, "AWS shared-config profile for credentials", flag="--s3-profile"
        ),
    )
    anonymous: bool = field(
        default=False, metadata=setting(boolean, "unsigned requests (public buckets)")
    )
    max_connections: int = field(
        default=96,
        metadata=setting(
            int_in(1, 4096), "concurrent backend connections", flag="--s3-max-connections"
        ),
    )
    """Above the data layer's GET slots (``max_inflight_fetches``, 72), so listings and
    HEADs never wait for a connection behind a full set of fetches."""
    lean_http: bool = field(
        default=True,
        metadata=setting(
            boolean,
            "GET, HEAD and LIST over the lean HTTP/1.1 wire (gateway/backend/http1.py); false: "
            "over aiohttp, as NFSGW_S3_LEAN_HTTP=0 does",
        ),
    )
    max_error_body: int = field(
        default=64 << 10,
        metadata=setting(
            int_in(1024, 64 << 20),
            "longest error reply body (bytes) read from the store; a reply claiming more fails "
            "at once, before it is received",
        ),
    )
    """Every other body is bounded by what was asked (a range, the object's size, a LIST
    page): ``gateway.backend.s3``."""
    retry: RetryPolicy = field(default_factory=RetryPolicy, metadata=INLINE)
    checksums: ChecksumPolicy = field(default_factory=ChecksumPolicy, metadata=INLINE)
