"""Where files this gateway renamed went, so a handle of the old name keeps working.

File handles name keys (DESIGN §3), and RENAME is copy + delete, so the handle of a renamed
file would be stale. The Linux client renames a file that is still open when it is removed
(its "silly rename" to ``.nfsXXXX``) and removes that name on the last close, but only if the
file's handle still works: a STALE answer in between makes it skip the removal and the
``.nfsXXXX`` object stays in the bucket. So the index follows a missing path through this map
(``Namespace.getattr``): the old handle reaches the file under its new name, as on a local file
system, where an open file survives a rename.

Owns: ``Moved``, old path -> new path (of files and directories: a path under a renamed
directory follows it), LRU, at most ``max_entries``, chains followed up to ``MAX_HOPS``. Must
not: decide whether a path exists (a name that exists again is its own file: the map is asked
only for a path that is gone).
"""

from __future__ import annotations

from typing import Final

from gateway.lru import Lru

MAX_HOPS: Final = 8


class Moved:
    def __init__(self, max_entries: int) -> None:
        self._to: Lru[str, str] = Lru(max_entries)

    def __len__(self) -> int:
        return len(self._to)

    def add(self, src: str, dst: str) -> None:
        """``src`` was renamed to ``dst``."""
        self._to.pop(dst, None)  # dst is a file of its own now
        if src == dst:
            return
        self._to.put(src, dst)

    def target(self, path: str) -> str | None:
        """Where ``path`` went (the end of its chain of renames; under a renamed directory,
        the same place under its new path), or None."""
        dst = self._to.get(path)
        if dst is None and self._to:
            head, sep, tail = path.rpartition("/")
            while sep:
                moved = self._to.get(head)
                if moved is not None:
                    dst = f"{moved}/{tail}"
                    break
                head, sep, rest = head.rpartition("/")
                tail = f"{rest}/{tail}"
        for _ in range(MAX_HOPS):
            if dst is None:
                return None
            nxt = self._to.get(dst)
            if nxt is None:
                return dst
            dst = nxt
        return None
