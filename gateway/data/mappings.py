"""What the memory tier holds besides plain ``bytes``: slices of another buffer (a pack
group's members, ``shared_buffer``) and file mappings of shared disk-tier entries
(``is_mapping``), with what a mapping holds resident (``mapped_size``) and how many of them
a process may hold (``mapping_limit``). ``gateway.data.cache``'s module docstring says how
each is charged.
"""

from __future__ import annotations

import mmap
import resource
from typing import TypeGuard

from gateway import fastwire

__all__ = ["is_mapping", "mapped_size", "mapping_limit", "shared_buffer"]


def shared_buffer(data: bytes | memoryview) -> bytes | None:
    """The ``bytes`` ``data`` is a proper slice of, or None."""
    if type(data) is memoryview and type(data.obj) is bytes and data.nbytes < len(data.obj):
        return data.obj
    return None


def mapping_limit() -> int:
    """How many mappings a cache may hold: half the kernel's per-process limit on memory
    areas (``vm.max_map_count``, 65,530 by default; the interpreter and its libraries use a
    few hundred), at most 32,768; with the Python twin's ``mmap.mmap`` also an eighth of the
    open-file limit (each of its mappings keeps two descriptors: ``fastwire.map_file``). A
    mapping the kernel refuses anyway is read as a copy."""
    try:
        with open("/proc/sys/vm/max_map_count", encoding="ascii") as f:
            limit = int(f.read())
    except (OSError, ValueError):
        limit = 65_530
    if fastwire.mapping_fds():  # two descriptors per mapping: an eighth of them
        limit = min(limit, resource.getrlimit(resource.RLIMIT_NOFILE)[0] // 4)
    return max(0, min(32_768, limit // 2))


def mapped_size(view: memoryview) -> int:
    """The pages behind ``view``, a slice of a file mapping (``is_mapping``): those its bytes
    span (at most its length plus a page), rounded up to whole pages, and no more than the
    whole mapping's (a disk-tier body is mapped from the page it starts in to its end:
    ``gateway.data.disk.entries._map``)."""
    span = min(memoryview(view.obj).nbytes, view.nbytes + mmap.PAGESIZE - 1)
    return -(-span // mmap.PAGESIZE) * mmap.PAGESIZE


def is_mapping(data: bytes | memoryview) -> TypeGuard[memoryview]:
    """Whether ``data`` is (a slice of) a file mapping: a shared disk-tier entry's pages."""
    return type(data) is memoryview and isinstance(data.obj, fastwire.mapping_types())
