"""Export-relative paths, and which names the index can serve (DESIGN §3 "Object keys").

Owns: the path form every layer uses and the name rules listings are filtered by. Must not:
know about directories, entries or the backend.

- **Paths** are relative to the export: "" is the root, "a/b.jpg" a file; an object's key is
  the export prefix + path, a directory's listing prefix is key + "/".
- **Names that cannot be a path segment** (``bad_name``): empty (a key with ``a//b``), ``.`` or
  ``..``, containing '/' or NUL, over ``NAME_MAX`` UTF-8 bytes, or not UTF-8 (a lone
  surrogate). Listings skip such keys and count them (``NamespaceStats.skipped_keys``, plus the
  backend's ``ListPage.skipped``); a listing never fails because of a key.
- **Key order** (``key_order``): listings return keys in UTF-8 byte order, so "how far has a
  listing got" compares UTF-8 bytes, not ``str`` order.
"""

from __future__ import annotations

from nfsproto.limits import NAME_MAX as NAME_MAX  # re-exported: listing, index


def split_path(path: str) -> tuple[str, str]:
    """(parent, name) of a non-root path."""
    i = path.rfind("/")
    if i < 0:
        return "", path
    return path[:i], path[i + 1 :]


def join_path(dir_path: str, name: str) -> str:
    return f"{dir_path}/{name}" if dir_path else name


def bad_name(name: str) -> bool:
    """True if ``name`` cannot be one path segment of a file we serve."""
    if not name or name == "." or name == ".." or "/" in name or "\0" in name:
        return True
    if name.isascii():
        return len(name) > NAME_MAX
    try:
        return len(name.encode("utf-8")) > NAME_MAX
    except UnicodeEncodeError:
        return True


def key_order(s: str) -> bytes:
    """``s`` as a listing orders it (UTF-8 bytes; a lone surrogate kept, not an error)."""
    return s.encode("utf-8", "surrogatepass")
