"""Compatibility name for the data layer (STYLE §1 lists ``datacache.py``); the code lives in
``gateway/data/``. Import from ``gateway.data``.
"""

from gateway.data import (
    ENTRY_OVERHEAD,
    BlockKey,
    DataCache,
    DataConfig,
    DataStats,
    ObjectReader,
)

__all__ = ["ENTRY_OVERHEAD", "BlockKey", "DataCache", "DataConfig", "DataStats", "ObjectReader"]
