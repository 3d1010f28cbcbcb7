"""NFSv3 (RFC 1813) types and codecs: every procedure's arguments and results.

Owns: the wire form of NFS program 100003 version 3. Must not: do I/O, read clocks, or import
anything outside nfsproto.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Final

PROGRAM: Final = 100003
VERSION: Final = 3

NFS3_FHSIZE: Final = 64
NFS3_COOKIEVERFSIZE: Final = 8
NFS3_CREATEVERFSIZE: Final = 8
NFS3_WRITEVERFSIZE: Final = 8


class NfsStat3(IntEnum):
    """RFC 1813 §2.6 nfsstat3."""

    NFS3_OK = 0
    NFS3ERR_PERM = 1
    NFS3ERR_NOENT = 2
    NFS3ERR_IO = 5
    NFS3ERR_NXIO = 6
    NFS3ERR_ACCES = 13
    NFS3ERR_EXIST = 17
    NFS3ERR_XDEV = 18
    NFS3ERR_NODEV = 19
    NFS3ERR_NOTDIR = 20
    NFS3ERR_ISDIR = 21
    NFS3ERR_INVAL = 22
    NFS3ERR_FBIG = 27
    NFS3ERR_NOSPC = 28
    NFS3ERR_ROFS = 30
    NFS3ERR_MLINK = 31
    NFS3ERR_NAMETOOLONG = 63
    NFS3ERR_NOTEMPTY = 66
    NFS3ERR_DQUOT = 69
    NFS3ERR_STALE = 70
    NFS3ERR_REMOTE = 71
    NFS3ERR_BADHANDLE = 10001
    NFS3ERR_NOT_SYNC = 10002
    NFS3ERR_BAD_COOKIE = 10003
    NFS3ERR_NOTSUPP = 10004
    NFS3ERR_TOOSMALL = 10005
    NFS3ERR_SERVERFAULT = 10006
    NFS3ERR_BADTYPE = 10007
    NFS3ERR_JUKEBOX = 10008


class Ftype3(IntEnum):
    NF3REG = 1
    NF3DIR = 2
    NF3BLK = 3
    NF3CHR = 4
    NF3LNK = 5
    NF3SOCK = 6
    NF3FIFO = 7
