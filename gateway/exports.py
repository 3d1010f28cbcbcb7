"""An export as the layers see it: its settings, object store, namespace index and key prefix,
and a client's mount record. A plain record: no policy, no wire types.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.backend.base import ObjectStore
from gateway.namespace import Namespace
from gateway.ops.config import ExportConfig


@dataclass(slots=True)
class Export:
    id: int
    cfg: ExportConfig
    store: ObjectStore
    ns: Namespace
    prefix: str
    root_handle: bytes = b""

    @property
    def fsid(self) -> int:
        return self.id


@dataclass(slots=True)
class Mount:
    host: str
    path: str
