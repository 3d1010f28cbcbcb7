"""The documents a user and a contributor rely on say what the code does: the flag table of
docs/operations.md lists exactly the parser's flags, and the repository's documents link and
name only files that exist inside it."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from gateway.ops.cli import build_parser
from gateway.ops.config import flags

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", REPO / "tests" / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def _subparser(name: str) -> argparse.ArgumentParser:
    p = build_parser()
    sub = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
    parser = sub.choices[name]
    assert isinstance(parser, argparse.ArgumentParser)
    return parser


def _flag_rows() -> dict[str, str]:
    """flag -> its "sets" column, from docs/operations.md "Command-line flags"."""
    text = (REPO / "docs" / "operations.md").read_text(encoding="utf-8")
    section = text.split("### Command-line flags\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(--[a-z0-9-]+)[^`]*` \|([^|]*)\|", section, flags=re.M)
    return {flag: sets.strip().strip("`") for flag, sets in rows}


def test_flag_table_lists_every_serve_flag() -> None:
    parser_flags = {
        o
        for a in _subparser("serve")._actions
        if a.help != argparse.SUPPRESS
        for o in a.option_strings
        if o.startswith("--") and o != "--help"
    }
    assert set(_flag_rows()) == parser_flags


def test_flag_table_says_which_key_each_flag_sets() -> None:
    rows = _flag_rows()
    for f in flags():
        key = f.entry.key
        want = f"[[export]] {key} (every export)" if f.table == "export" else f"{f.table}.{key}"
        assert rows[f.name] == want, f.name


def test_documents_point_only_inside_the_repository() -> None:
    """The design and the style are documented inside the repository (a newcomer has only
    the clone), and every link between documents stays inside it and resolves."""
    for doc in DOCS:
        if not doc.exists():
            continue
        text = doc.read_text(encoding="utf-8")
        for outside in ("DESIGN.md", "STYLE.md"):
            assert outside not in text, f"{doc.name} points to {outside} outside the repository"
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if "://" in target:
                continue
            path = (doc.parent / target).resolve()
            assert path.is_relative_to(REPO), f"{doc.name}: {target} leaves the repository"
            assert path.exists(), f"{doc.name}: broken link {target}"


def test_architecture_names_modules_that_exist() -> None:
    text = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    roots = "gateway|nfsproto|loadgen|tests|benchmarks|contrib"
    named = set(re.findall(rf"`((?:{roots})/[\w./-]+)`", text))
    assert named, "the page names the modules it describes"
    missing = sorted(p for p in named if not (REPO / p.rstrip("/")).exists())
    assert not missing, missing
    for question in ("## The flow of a READ", "## The flow of a LOOKUP", "## Where to change what"):
        assert question in text
