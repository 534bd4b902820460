"""The package's modules and the imports between them, read from the source with `ast`.

Nothing of leakbench is imported or run. Every reader takes the folder that holds the package
folders (`FOLDERS`), so the house-rule tests (`test_layers.py`, `test_house_rules.py`) check
the real package and a planted one in a temporary folder with the same functions.

An import is any of:

* an ``import`` or ``from ... import`` statement, at any nesting level (inside a function, under
  ``if TYPE_CHECKING:``); ``from package import name`` imports the module ``package.name`` when
  that is a module, else ``package``;
* a string constant ``"leakbench.MODULE:ATTRIBUTE"`` (the entry-point notation, by which the
  package names a module it imports only when chosen), or a
  string given to ``import_module``;
* a name of the package root's lazy table (``LAZY`` in ``bench/__init__.py``), taken as
  ``from leakbench import NAME`` or ``leakbench.NAME``: an import of the module the table names.
  The table itself is the package's facade, not an import of the root: the root's body imports
  nothing of leakbench.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "leakbench"
# Folder -> import name (pyproject.toml's package-dir).
FOLDERS = {
    "bench": "leakbench",
    "attacks": "leakbench.attacks",
    "defenses": "leakbench.defenses",
    "datasets": "leakbench.datasets",
}


@dataclass(frozen=True)
class Module:
    """One module of the package: its dotted name, its file and whether it is a package."""

    name: str
    path: Path
    is_package: bool

    def tree(self) -> ast.Module:
        return ast.parse(self.path.read_text(encoding="utf-8"), filename=str(self.path))


def under(module: str, prefix: str) -> bool:
    """Whether ``module`` is ``prefix`` or inside it."""
    return module == prefix or module.startswith(prefix + ".")


def modules(root: Path = ROOT) -> dict[str, Module]:
    """Every module of the package folders under ``root``, by dotted name."""
    found = {}
    for folder, name in FOLDERS.items():
        for path in sorted((root / folder).rglob("*.py")):
            parts = path.relative_to(root / folder).with_suffix("").parts
            is_package = parts[-1] == "__init__"
            dotted = ".".join([name, *(parts[:-1] if is_package else parts)])
            found[dotted] = Module(dotted, path, is_package)
    return found


def lazy_table(known: dict[str, Module]) -> dict[str, str]:
    """The package root's ``LAZY`` table: attribute name -> the module that defines it."""
    root = known.get(PACKAGE)
    if root is None:
        return {}
    for node in root.tree().body:
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "LAZY" for t in node.targets)
            and isinstance(node.value, ast.Dict)
        ):
            return {
                ast.literal_eval(key): ast.literal_eval(value).partition(":")[0]
                for key, value in zip(node.value.keys, node.value.values, strict=True)
                if key is not None
            }
    return {}


def _from_target(node: ast.ImportFrom, module: Module) -> str:
    if not node.level:
        return node.module or ""
    package = module.name if module.is_package else module.name.rpartition(".")[0]
    base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
    return f"{base}.{node.module}" if node.module else base


def _string_import(node: ast.AST, known: dict[str, Module]) -> str | None:
    """The module a string constant names as an import, if it is one."""
    if isinstance(node, ast.Call):
        func = node.func
        called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if called == "import_module" and node.args and isinstance(node.args[0], ast.Constant):
            name = node.args[0].value
            return name if isinstance(name, str) and name in known else None
        return None
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and ":" in node.value:
        name, _, attribute = node.value.partition(":")
        if name in known and attribute.replace(".", "").isidentifier():
            return name
    return None


def imports_of(
    module: Module, known: dict[str, Module], lazy: dict[str, str], tree: ast.Module | None = None
) -> set[str]:
    """The modules of the package that ``module`` imports (see the module docstring)."""
    found = set()
    tree = module.tree() if tree is None else tree
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if under(a.name, PACKAGE)}
        elif isinstance(node, ast.ImportFrom):
            target = _from_target(node, module)
            if not under(target, PACKAGE):
                continue
            for alias in node.names:
                inner = f"{target}.{alias.name}"
                if inner in known:
                    found.add(inner)
                elif target == PACKAGE and alias.name in lazy:
                    found.add(lazy[alias.name])
                else:
                    found.add(target)
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == PACKAGE
            and node.attr in lazy
        ):
            found.add(lazy[node.attr])
        elif module.name != PACKAGE and (named := _string_import(node, known)):
            found.add(named)
    return found


def graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the modules of the package it imports, for every module under ``root``."""
    known = modules(root)
    lazy = lazy_table(known)
    return {name: imports_of(module, known, lazy) - {name} for name, module in known.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of ``edges``: one per strongly connected group of two or more
    modules, each as a closed path through it (``a -> b -> a``), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def visit(node: str) -> None:
        # Tarjan's algorithm; the package's graph is shallow enough for recursion.
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.add(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(group)

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return sorted(_closed_path(group, edges) for group in groups)


def _closed_path(group: set[str], edges: dict[str, set[str]]) -> list[str]:
    """A path from the group's first module back to it, inside the group (breadth first)."""
    start = min(group)
    came: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(edges.get(node, set()) & group):
                if nxt == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if nxt not in came:
                    came[nxt] = node
                    following.append(nxt)
        frontier = following
    raise AssertionError(f"no circle through {start}")
