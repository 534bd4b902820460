"""The floors of the package, read from the table under "## Floors" in ``docs/architecture.md``,
and the imports that go against them (`layer_violations`).

The table's "folders" column names each floor's folders (``bench/core/``) and single modules
(``bench/cli.py``), in backquotes, lowest floor first. A module's floor is the one of the
longest folder that holds it; the package root (``bench/__init__.py``) holds only itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from import_graph import FOLDERS, PACKAGE, ROOT, graph, under

DOC = ROOT / "docs" / "architecture.md"
# Inside the components floor: a defense sees gradient tensors only, and a dataset sees files.
FORBIDDEN = {
    "leakbench.defenses": (
        "leakbench.components.models",
        "leakbench.components.forward",
        "leakbench.components.bottleneck",
        "leakbench.components.per_example",
        "leakbench.attacks",
        "leakbench.datasets",
    ),  # fmt: skip
    "leakbench.datasets": (
        "leakbench.components.models",
        "leakbench.components.forward",
        "leakbench.attacks",
        "leakbench.defenses",
    ),
}


@dataclass(frozen=True)
class Floor:
    """One row of the table: the floor's name and the dotted names of what it holds (a name
    stands for everything in it, except the package root, which stands for itself)."""

    name: str
    holds: tuple[str, ...]


def dotted(path: str) -> str:
    """The import name of a folder (``attacks/priors/``) or module (``bench/cli.py``)."""
    parts = path.strip("/").removesuffix(".py").split("/")
    for depth in range(len(parts), 0, -1):
        folder = "/".join(parts[:depth])
        if folder in FOLDERS:
            name = ".".join([FOLDERS[folder], *parts[depth:]])
            return name.removesuffix(".__init__")
    raise ValueError(f"{path} is in no package folder ({', '.join(FOLDERS)})")


def read_floors(doc: Path = DOC) -> list[Floor]:
    """The floors of the table under "## Floors" in ``doc``, lowest first."""
    text = doc.read_text(encoding="utf-8").split("\n## Floors\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in text.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in rows[0].strip("|").split("|")]
    floors = []
    for row in rows[2:]:  # after the header and its rule
        cells = dict(zip(header, (c.strip() for c in row.strip("|").split("|")), strict=True))
        paths = [p for p in re.findall(r"`([^`]+)`", cells["folders"]) if "/" in p]
        floors.append(Floor(cells["floor"], tuple(dotted(p) for p in paths)))
    return floors


def layer_of(module: str, floors: list[Floor]) -> int:
    """The index in ``floors`` of the floor whose longest name holds ``module``."""
    best, found = -1, None
    for index, floor in enumerate(floors):
        for name in floor.holds:
            covers = module == name if name == PACKAGE else under(module, name)
            if covers and len(name) > best:
                best, found = len(name), index
    if found is None:
        raise LookupError(
            f"{module} is in no floor: move it into a floor's folder, or make its folder a "
            "floor in the table of docs/architecture.md (## Floors)"
        )
    return found


def violations(module: str, imported: set[str], floors: list[Floor]) -> list[str]:
    """The imports of ``module`` that go against the floors, as readable lines."""
    own = layer_of(module, floors)
    bad = []
    for target in sorted(imported):
        layer = layer_of(target, floors)
        if layer > own:
            bad.append(
                f"{module} ({floors[own].name}) imports {target} ({floors[layer].name}), "
                "a higher floor"
            )
        for prefix, banned in FORBIDDEN.items():
            if under(module, prefix) and any(under(target, b) for b in banned):
                bad.append(f"{module} imports {target}, which {prefix} must not depend on")
    return bad


def layer_violations(root: Path = ROOT, floors: list[Floor] | None = None) -> list[str]:
    """Every import of the package under ``root`` that goes against ``floors`` (default: the
    table of ``docs/architecture.md``)."""
    floors = read_floors() if floors is None else floors
    found = []
    for module, imported in graph(root).items():
        found += violations(module, imported, floors)
    return found
