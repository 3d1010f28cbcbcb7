"""Types of ``gateway._fastwire``, the C twin of ``gateway.fastwire`` (and of
``nfsproto.rpc.RecordReader``): the same names, signatures and results. Buffers are taken
as one contiguous run of bytes (a non-contiguous memoryview raises BufferError)."""

from typing import Final

from nfsproto.xdr import Buffer

NFS_PROGRAM: Final = 100003
GETATTR: Final = 1
LOOKUP: Final = 3
ACCESS: Final = 4
READ: Final = 6
FATTR3_SIZE: Final = 84
NFS3ERR_NOENT: Final = 2
MAX_AUTH: Final = 400
MAX_FH: Final = 64
MAX_NAME: Final = 255
LAST_FRAGMENT: Final = 0x80000000

Call = tuple[int, int, bytes, bytes, int | bytes, int | bytes]

def parse_call(record: Buffer) -> Call | None: ...
def reply_getattr(xid: int, attr: Buffer) -> bytes: ...
def reply_access(xid: int, attr: Buffer, access: int) -> bytes: ...
def reply_lookup(xid: int, fh: Buffer, attr: Buffer, dir_attr: Buffer) -> bytes: ...
def reply_lookup_noent(xid: int, dir_attr: Buffer) -> bytes: ...
def reply_read_head(xid: int, attr: Buffer, count: int, eof: bool) -> bytes: ...
def pad(n: int) -> bytes: ...

class RecordReader:
    """Reassembles RPC records from a TCP byte stream, as ``nfsproto.rpc.RecordReader``; a
    record over ``max_record`` raises ``error_class``."""

    max_record: int
    def __init__(self, max_record: int, error_class: type[Exception]) -> None: ...
    def pending_bytes(self) -> int: ...
    def feed(self, data: Buffer, /) -> list[Buffer]: ...

class Mapping:
    """The first ``size`` bytes of the file open on ``fd``, mapped read-only and shared, as
    a read-only buffer (no file descriptor kept)."""

    def __init__(self, fd: int, size: int) -> None: ...
    def __len__(self) -> int: ...
    def __buffer__(self, flags: int, /) -> memoryview: ...
