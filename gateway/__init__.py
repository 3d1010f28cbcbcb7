"""nfsgw: the NFSv3 gateway server."""

from __future__ import annotations

import functools


@functools.cache
def version() -> str:
    """The installed distribution's version (``nfsgw --version``, ``/v1/stats``); "unknown"
    when the package runs from a tree that was never installed."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("nfsgw")
    except PackageNotFoundError:
        return "unknown"
