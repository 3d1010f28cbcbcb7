"""Size limits shared by the protocol codecs and the gateway, one definition each.

Owns: constants only (RFC 1813 and the limits this implementation chose where the RFC leaves a
type unbounded). Must not: import anything of the project (the codecs and the gateway import
it). ``gateway.namespace`` may import this module and no other of ``nfsproto``: the index
serves only names a client can send, in handles of the protocol's size.
"""

from __future__ import annotations

from typing import Final

NFS3_FHSIZE: Final = 64
"""Bytes of an NFSv3 file handle at most (RFC 1813 §2.4 ``NFS3_FHSIZE``; MOUNT's ``FHSIZE3``)."""

NAME_MAX: Final = 255
"""Bytes of one file name at most: the filename3 decoding limit (RFC 1813 leaves it unbounded),
PATHCONF's ``name_max``, and the names the index serves (longer keys are skipped)."""

MNTPATHLEN: Final = 1024
"""Bytes of a MOUNT dirpath at most (RFC 1813 Appendix I)."""

MNTNAMLEN: Final = 255
"""Bytes of a MOUNT name (host or group) at most (RFC 1813 Appendix I)."""
