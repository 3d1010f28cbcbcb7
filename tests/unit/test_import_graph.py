"""No import cycle among ``gateway/`` modules, nor among ``nfsproto/`` or ``loadgen/`` ones,
counting every import: module level, function-local and ``if TYPE_CHECKING:`` ones alike; and
the layer rules the modules' docstrings state ("must not import", docs/architecture.md
"Layers") hold: a cycle or a layer crossed makes the layers unreadable, and nothing else
catches an import added inside a function.

Each ``<package>/**/*.py`` is parsed with ``ast`` (nothing is imported). ``import a.b.c`` and
``from a.b import c`` resolve to the module ``a.b.c`` when it exists, else to ``a.b`` (a package
counts as its ``__init__``); relative imports resolve against the importing module's package.
The implicit import of a parent package (``gateway.namespace`` before ``gateway.namespace.index``)
is not an edge: a package's ``__init__`` re-exporting its submodules is not a cycle.
Run as a script to print the graph's cycles (or nothing)."""

from __future__ import annotations

import ast
import itertools
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "gateway"


def module_files(root: Path = ROOT, package: str = PACKAGE) -> dict[str, Path]:
    """Dotted module name -> file; a package is named by its ``__init__.py``."""
    out: dict[str, Path] = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _imports(tree: ast.AST, name: str, is_package: bool) -> Iterator[tuple[list[str], int]]:
    """(candidate dotted names, line) of everything ``tree`` imports, anywhere in it: the first
    candidate that is a project module is the edge (``from X import n``: ``X.n``, else ``X``)."""
    here = name if is_package else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield [alias.name], node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = here.split(".")
                base = ".".join(parts[: len(parts) - (node.level - 1)])
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            for alias in node.names:
                yield [f"{target}.{alias.name}", target], node.lineno


def import_graph(root: Path = ROOT, package: str = PACKAGE) -> dict[str, dict[str, int]]:
    """module -> {imported project module: first line importing it}."""
    files = module_files(root, package)
    graph: dict[str, dict[str, int]] = {m: {} for m in files}
    for mod, path in files.items():
        tree = ast.parse(path.read_text(), str(path))
        for candidates, line in _imports(tree, mod, path.name == "__init__.py"):
            resolved = next((c for c in candidates if c in files), None)
            if resolved is not None and resolved != mod:
                old = graph[mod].get(resolved)
                graph[mod][resolved] = line if old is None else min(old, line)
    return graph


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """One cycle (a -> ... -> a) per strongly connected component with more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    sccs: list[list[str]] = []
    counter = 0

    def connect(v: str) -> None:  # Tarjan, recursive: the graph is small
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                sccs.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return [_one_cycle(graph, set(c)) for c in sccs]


def _one_cycle(graph: dict[str, dict[str, int]], comp: set[str]) -> list[str]:
    """A shortest cycle through the component's first module (breadth-first)."""
    start = min(comp)
    prev: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v]):
                if w not in comp:
                    continue
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(prev[path[-1]])
                    return [*reversed(path), start]
                if w not in prev:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    return sorted(comp)


def describe(graph: dict[str, dict[str, int]], cycle: list[str], package: str = PACKAGE) -> str:
    files = module_files(ROOT, package)
    steps = [
        f"{a} ({files[a].relative_to(ROOT)}:{graph[a][b]}) -> {b}"
        for a, b in itertools.pairwise(cycle)
    ]
    return "\n  ".join(steps)


def test_resolution_counts_local_type_checking_and_relative_imports(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from pkg.sub.b import B\n")
    (pkg / "a.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from pkg.sub import B\n"
        "def f():\n    import pkg.c\n"
    )
    (pkg / "sub" / "b.py").write_text("from .. import a\nB = 1\n")
    (pkg / "c.py").write_text("from pkg import sub\n")
    g = import_graph(tmp_path, "pkg")
    assert g["pkg.a"] == {"pkg.sub": 3, "pkg.c": 5}
    assert g["pkg.sub"] == {"pkg.sub.b": 1}
    assert g["pkg.sub.b"] == {"pkg.a": 1}
    assert g["pkg.c"] == {"pkg.sub": 1}
    assert [sorted(c) for c in cycles(g)] == [sorted(["pkg.a", "pkg.sub", "pkg.sub.b", "pkg.a"])]


@pytest.mark.parametrize("package", ["gateway", "nfsproto", "loadgen"])
def test_no_import_cycles(package: str) -> None:
    graph = import_graph(ROOT, package)
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n".join(
        "- " + " -> ".join(c) + "\n  " + describe(graph, c, package) for c in found
    )


def imported_names(root: Path = ROOT, package: str = PACKAGE) -> dict[str, dict[str, int]]:
    """module -> {every dotted name it imports, project or not: first line}. ``from X import n``
    counts as ``X.n`` (a rule on ``X`` matches it too)."""
    out: dict[str, dict[str, int]] = {}
    for mod, path in module_files(root, package).items():
        tree = ast.parse(path.read_text(), str(path))
        names = out[mod] = {}
        for candidates, line in _imports(tree, mod, path.name == "__init__.py"):
            names.setdefault(candidates[0], line)
    return out


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


# (importing modules, names they must not import, names allowed despite that). Each row is a
# rule some module docstring states; docs/architecture.md "Layers" lists them for a reader.
LAYER_RULES: list[tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = [
    # sans-I/O codecs: nothing of the project
    (("nfsproto",), ("gateway", "loadgen", "tests", "asyncio", "socket"), ()),
    # object stores know nothing of NFS nor of the layers that use them
    (
        ("gateway.backend",),
        (
            "nfsproto",
            "gateway.namespace",
            "gateway.data",
            "gateway.writes",
            "gateway.handlers",
            "gateway.ops",
            "gateway.pack",
            "gateway.exports",
            "gateway.registry",
            "gateway.dispatch",
            "gateway.transport",
            "gateway.fastpath",
        ),
        (),
    ),
    (("gateway.handlers",), ("botocore", "boto3", "aiohttp"), ()),
    (("gateway.writes",), ("nfsproto",), ()),
    # the index: no write path, no exports, no wire types (the protocol's limits only)
    (
        ("gateway.namespace",),
        ("gateway.writes", "gateway.exports", "nfsproto"),
        ("nfsproto.limits",),
    ),
    (("gateway.settings",), ("gateway",), ()),
    (("gateway.data.stats",), ("prometheus_client",), ()),
    (
        (
            "gateway.ops.metrics",
            "gateway.ops.metricdefs",
            "gateway.ops.admin",
            "gateway.ops.adminhttp",
            "gateway.ops.fanout",
            "gateway.ops.workers",
            "gateway.ops.build",
        ),
        ("gateway.ops.server",),
        (),
    ),
    (("gateway.ops.metrics", "gateway.ops.metricdefs"), ("gateway.ops.admin",), ()),
    (("gateway",), ("loadgen", "tests"), ()),
]


@pytest.mark.parametrize("package", ["gateway", "nfsproto"])
def test_layer_rules(package: str) -> None:
    broken = []
    for mod, names in sorted(imported_names(ROOT, package).items()):
        for importers, banned, allowed in LAYER_RULES:
            if not any(_under(mod, i) for i in importers):
                continue
            for name, line in sorted(names.items()):
                if any(_under(name, b) for b in banned) and not any(
                    _under(name, a) for a in allowed
                ):
                    path = module_files(ROOT, package)[mod].relative_to(ROOT)
                    broken.append(f"{path}:{line}: {mod} imports {name}")
    assert not broken, "layer rules broken:\n" + "\n".join(broken)


def test_layer_rules_see_local_imports(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from botocore.client import Config\n")
    assert imported_names(tmp_path, "pkg")["pkg.a"] == {"botocore.client.Config": 2}


if __name__ == "__main__":
    status = 0
    for pkg in sys.argv[1:] or [PACKAGE]:
        g = import_graph(ROOT, pkg)
        for c in cycles(g):
            status = 1
            print(" -> ".join(c))
            print("  " + describe(g, c, pkg))
    sys.exit(status)
