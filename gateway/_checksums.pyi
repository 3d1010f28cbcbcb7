"""Types of ``gateway._checksums``, the C twin of the CRCs in ``gateway.backend.checksums``:
the same values for the same bytes. Buffers are taken as one contiguous run of bytes."""

from typing import Final

from nfsproto.xdr import Buffer

engine: Final[str]  # "vpclmulqdq" (AVX-512), "pclmul" (x86-64 carry-less multiply) or "tables"

def crc32(data: Buffer, crc: int = 0) -> int: ...
def crc32c(data: Buffer, crc: int = 0) -> int: ...
def crc64nvme(data: Buffer, crc: int = 0) -> int: ...
