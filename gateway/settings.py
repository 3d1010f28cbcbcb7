"""Declaring configuration settings, once per key, on the dataclass of the layer that owns it.

A *section type* is a frozen dataclass whose fields are the keys of one TOML table of
``nfsgw.toml`` (``WriteConfig`` is ``[writes]``, ``ExportConfig`` is ``[[export]]``). A field
that is a setting says everything about its key in one place::

    part_size: int = field(
        default=8 * MiB,
        metadata=setting(size(S3_MIN_PART, S3_MAX_PART), "multipart part size"),
    )

its default (the field's), the converter that validates a TOML or command-line value (bounds,
messages, fix hints), the help text, the TOML key when it differs from the field name, the
command-line flag if any, and what a reload does with a change. A field declared with
``INLINE`` embeds another section type's settings in the same table (``[s3]`` holds the
``RetryPolicy`` keys). Fields without metadata are tunables no file sets.

``gateway.ops.configfile`` walks these declarations (``entries``, ``build``) to parse the
file and report unknown keys; ``gateway.ops.config`` to build the command line and decide
what a reload applies.

Must not: read files, know which tables exist, or import other gateway modules (every layer
imports this one).
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import functools
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Generic, Literal, TypeVar, cast

T = TypeVar("T")

MiB: Final = 1 << 20

Reload = Literal["restart", "live", "rebuild"]
"""What a reload does with a changed value: ``restart`` keeps the running value and logs it as
needing a restart; ``live`` applies it; ``rebuild`` (export keys) gives the export a fresh
store and index."""


class Invalid(ValueError):
    """A value a converter refuses: what is wrong and how to fix it."""

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class InvalidItems(Invalid):
    """Problems with elements of an array value: ``items`` are (index, problem)."""

    def __init__(self, items: list[tuple[int, Invalid]]) -> None:
        super().__init__(items[0][1].message, items[0][1].hint)
        self.items = items


@dataclass(frozen=True, slots=True)
class Conv(Generic[T]):
    """A converter: ``parse`` turns a TOML (or already typed command-line) value into the
    field's value or raises ``Invalid``; ``cli`` is the argparse ``type`` of its flag,
    ``choices`` its argparse choices; ``show`` renders a value for help texts; ``many``: a
    list, whose flag is repeated (one item each: argparse's ``append``)."""

    parse: Callable[[object], T]
    cli: Callable[[str], object] = str
    choices: tuple[str, ...] | None = None
    show: Callable[[T], str] = str
    many: bool = False


@dataclass(frozen=True, slots=True)
class Setting:
    conv: Conv[Any]
    help: str
    key: str | None = None  # the TOML key when it is not the field's name
    flag: str | None = None  # e.g. "--max-record"; a boolean's flag sets the opposite default
    reload: Reload = "restart"
    metavar: str | None = None
    default_text: str | None = None  # the default in words, when it is computed


_SETTING: Final = "nfsgw.setting"
_INLINE: Final = "nfsgw.inline"
INLINE: Final[Mapping[str, bool]] = {_INLINE: True}
"""``field(default_factory=Section, metadata=INLINE)``: that section's keys in this table."""


def setting(
    conv: Conv[Any],
    help: str,
    *,
    key: str | None = None,
    flag: str | None = None,
    reload: Reload = "restart",
    metavar: str | None = None,
    default_text: str | None = None,
) -> Mapping[str, Setting]:
    """Field metadata that makes the field a configuration key (see the module docstring)."""
    return {_SETTING: Setting(conv, help, key, flag, reload, metavar, default_text)}


@dataclass(frozen=True, slots=True)
class Entry:
    """One key of a section type: ``path`` is the attribute path from the section object
    (longer than one for keys of an inlined section)."""

    key: str
    path: tuple[str, ...]
    setting: Setting
    field: dataclasses.Field[Any]

    def default(self) -> object:
        f = self.field
        if f.default_factory is not dataclasses.MISSING:
            return f.default_factory()
        return None if f.default is dataclasses.MISSING else f.default

    def describe_default(self) -> str:
        """The default for help texts (" 4M", or ": in words" when computed, with the value
        here); "" when there is none."""
        s = self.setting
        value = self.default()
        if s.default_text is not None:
            if self.field.default_factory is not dataclasses.MISSING:
                return f": {s.default_text}, here {s.conv.show(value)}"
            return f": {s.default_text}"
        return "" if value is None else f" {s.conv.show(value)}"

    def get(self, section: object) -> Any:
        return functools.reduce(getattr, self.path, section)

    def replace(self, section: T, value: object) -> T:
        """``section`` with this key set to ``value`` (a frozen copy)."""
        return _replace_at(section, self.path, value)


def _replace_at(obj: T, path: tuple[str, ...], value: object) -> T:
    head, *rest = path
    new = _replace_at(getattr(obj, head), tuple(rest), value) if rest else value
    return dataclasses.replace(obj, **{head: new})  # type: ignore[type-var]


@functools.cache
def entries(cls: type) -> dict[str, Entry]:
    """TOML key -> ``Entry`` for a section type, inlined sections included, in field order."""
    out: dict[str, Entry] = {}
    for f in dataclasses.fields(cls):
        if f.metadata.get(_INLINE):
            assert callable(f.default_factory), f"{cls.__name__}.{f.name}: inline needs a factory"
            for key, e in entries(f.default_factory).items():  # type: ignore[arg-type]
                out[key] = Entry(key, (f.name, *e.path), e.setting, e.field)
        elif (s := f.metadata.get(_SETTING)) is not None:
            key = s.key or f.name
            assert key not in out, f"{cls.__name__}: key {key!r} declared twice"
            out[key] = Entry(key, (f.name,), s, f)
    return out


def build(cls: type[T], values: Mapping[str, object]) -> T:
    """A section object from converted values by TOML key; keys not given keep their
    defaults. Raises what the section's ``__post_init__`` raises (``ValueError``)."""
    known = entries(cast(type, cls))
    by_path = {known[k].path: v for k, v in values.items()}
    return _construct(cls, by_path, ())


def _construct(
    cls: type[T], by_path: Mapping[tuple[str, ...], object], prefix: tuple[str, ...]
) -> T:
    kw: dict[str, object] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        path = (*prefix, f.name)
        if f.metadata.get(_INLINE):
            kw[f.name] = _construct(f.default_factory, by_path, path)  # type: ignore[arg-type]
        elif path in by_path:
            kw[f.name] = by_path[path]
    return cls(**kw)


def changed(cls: type, old: object, new: object) -> list[Entry]:
    """The keys whose values differ between two objects of section type ``cls``."""
    return [e for e in entries(cls).values() if e.get(old) != e.get(new)]


# ============================================================================ converters


def tname(v: object) -> str:
    return {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "an array",
        dict: "a table",
    }.get(type(v), type(v).__name__)


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)?\s*$", re.I)
_UNITS: Final = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str) -> int:
    """'8G', '512M', '1.5g', '4096' -> bytes (binary multiples); ``ValueError`` otherwise."""
    m = _SIZE.match(text)
    if not m:
        raise ValueError(f"not a size: {text!r} (use e.g. 512M, 8G)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def show_size(n: int) -> str:
    """4194304 -> '4M', 4259840 -> '4160K' (exact, in the largest unit that divides it, when
    that is short); other sizes above 1 MiB are rounded to MiB: '6026M'."""
    for unit in ("T", "G", "M", "K"):
        mult = _UNITS[unit.lower()]
        if n and n % mult == 0 and n // mult < 10_000:
            return f"{n // mult}{unit}"
    return f"{round(n / MiB)}M" if n > MiB else str(n)


def _show_number(v: float) -> str:
    return f"{v:g}"


def _parse_bool(v: object) -> bool:
    if not isinstance(v, bool):
        raise Invalid(f"must be true or false, not {tname(v)} {v!r}", "write true or false")
    return v


boolean: Final = Conv(_parse_bool)


def int_in(lo: int, hi: int) -> Conv[int]:
    def parse(v: object) -> int:
        if isinstance(v, bool) or not isinstance(v, int):
            raise Invalid(f"must be an integer, not {tname(v)} {v!r}", f"an integer {lo}..{hi}")
        if not lo <= v <= hi:
            raise Invalid(f"{v} is out of range", f"use a value from {lo} to {hi}")
        return v

    return Conv(parse, cli=int)


def seconds(lo: float = 0.0) -> Conv[float]:
    def parse(v: object) -> float:
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise Invalid(f"must be a number of seconds, not {tname(v)} {v!r}", "e.g. 60 or 0.5")
        if v < lo or v != v or v == float("inf"):
            raise Invalid(f"{v} is out of range", f"a finite number of seconds >= {lo}")
        return float(v)

    return Conv(parse, cli=float, show=_show_number)


def _cli_size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def size(lo: int = 0, hi: int = 1 << 50) -> Conv[int]:
    def parse(v: object) -> int:
        if isinstance(v, bool):
            raise Invalid("must be a size, not a boolean", 'e.g. "512M", "8G" or bytes')
        if isinstance(v, int):
            n = v
        elif isinstance(v, str):
            try:
                n = parse_size(v)
            except ValueError:
                raise Invalid(f"not a size: {v!r}", 'e.g. "512M", "8G", "1.5G" or 4096') from None
        else:
            raise Invalid(f"must be a size, not {tname(v)}", 'e.g. "512M", "8G" or bytes')
        if not lo <= n <= hi:
            raise Invalid(f"{v!r} is out of range", f"a size from {lo} to {hi} bytes")
        return n

    return Conv(parse, cli=_cli_size, show=show_size)


def _parse_str(v: object) -> str:
    if not isinstance(v, str):
        raise Invalid(f"must be a string, not {tname(v)} {v!r}", 'put it in quotes: "..."')
    return v


string: Final = Conv(_parse_str)
optional_string: Final = Conv(lambda v: _parse_str(v) or None)
"""A string; the empty string means unset (None)."""


def choice(choices: Mapping[str, str] | tuple[str, ...], hint: str = "") -> Conv[Any]:
    """One of ``choices`` (a mapping: accepted spelling -> value)."""
    table = dict(choices) if isinstance(choices, Mapping) else {c: c for c in choices}

    def parse(v: object) -> str:
        s = _parse_str(v)
        if s not in table:
            close = difflib.get_close_matches(s, list(table), n=1, cutoff=0.6)
            fix = f"did you mean {close[0]!r}? " if close else ""
            raise Invalid(f"{s!r} is not allowed", fix + (hint or "use one of " + ", ".join(table)))
        return table[s]

    return Conv(parse, choices=None if isinstance(choices, Mapping) else tuple(choices))


def _parse_abs_path(v: object) -> Path:
    s = _parse_str(v)
    if not s.startswith("/"):
        raise Invalid(
            f"{s!r} is not an absolute path", "write it from the root, like /var/lib/nfsgw"
        )
    return Path(s)


abs_path: Final = Conv(
    _parse_abs_path,
    cli=lambda s: os.path.abspath(s) if s else s,  # relative to the command's cwd
)


def _parse_url(v: object) -> str | None:
    s = _parse_str(v)
    if not s:
        return None
    if not re.match(r"^https?://[^/\s]+(/\S*)?$", s):
        raise Invalid(f"{s!r} is not an http(s) URL", 'e.g. "https://s3.example.internal"')
    return s


url: Final = Conv(_parse_url)
"""An http(s) URL; the empty string means unset (None)."""
