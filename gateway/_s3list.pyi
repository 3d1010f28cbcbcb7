"""Types of ``gateway._s3list``, the C twin of ``gateway.backend.s3wire.parse_list_reference``:
the same values for the same page, or None for a page it does not fully understand."""

from collections.abc import Callable

from gateway.backend.base import ObjectInfo

def parse(
    body: bytes, info_type: type[ObjectInfo], date_ns: Callable[[str], int], /
) -> tuple[list[ObjectInfo], list[str], str | None, bool, int] | None: ...
