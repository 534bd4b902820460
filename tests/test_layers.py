"""The layering of the package, read from the source (AST; nothing is imported or run).

The package is built in floors, and a floor is a folder: a module's floor is the folder it
lives in, and a module imports only modules of its own floor or of lower ones. The floors are
read from the table under "## Floors" in ``docs/architecture.md`` (`floors.read_floors`), so
the design and the test cannot drift apart. What counts as an import (statements at any depth,
modules named in strings, the package root's lazy names) is `import_graph.imports_of`. A module
placed directly in ``bench/`` (other than the package root and the CLI on top) or a new folder
that is no floor fails the test, so where a module lives stays a decision.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from floors import dotted, layer_of, layer_violations, read_floors
from import_graph import FOLDERS, PACKAGE, ROOT, graph, lazy_table, modules, under

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

FLOORS = read_floors()
MODULES = modules()


def test_the_floor_table_names_folders_that_exist() -> None:
    assert [floor.name for floor in FLOORS][:1] == ["core"], "the table must start at core"
    for floor in FLOORS:
        assert floor.holds, f"floor {floor.name} names no folder"
        for name in floor.holds:
            assert name in MODULES, f"floor {floor.name}: {name} is no module or package"


def test_every_module_is_placed_in_a_layer() -> None:
    for module in MODULES:
        layer_of(module, FLOORS)


def test_every_folder_of_the_package_is_a_floor_or_inside_one() -> None:
    held = {name for floor in FLOORS for name in floor.holds} - {PACKAGE}
    for module in MODULES.values():
        if module.is_package and module.name != PACKAGE:
            assert any(under(module.name, name) for name in held), module.name


def test_a_module_outside_the_floors_is_refused() -> None:
    with pytest.raises(LookupError, match="leakbench.helpers is in no floor"):
        layer_of("leakbench.helpers", FLOORS)


def test_no_module_imports_a_higher_layer() -> None:
    found = layer_violations()
    assert not found, "\n".join(found)


def test_the_package_root_imports_nothing_of_leakbench() -> None:
    # Python runs the root before any module of the package; its lazy table is no import.
    assert graph()[PACKAGE] == set()


def test_the_lazy_names_point_at_modules() -> None:
    lazy = lazy_table(MODULES)
    assert lazy, "the package root's LAZY table was not found"
    for name, module in lazy.items():
        assert module in MODULES, f"leakbench.{name}: {module} is no module"


def test_the_declared_entry_points_name_modules() -> None:
    # A higher floor declares itself to a lower one here (the Ray backend), not in code.
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    declared = [v for group in project["entry-points"].values() for v in group.values()]
    assert declared
    for value in declared:
        assert value.partition(":")[0] in MODULES, value


def test_folder_paths_become_import_names() -> None:
    assert dotted("bench/core/") == "leakbench.core"
    assert dotted("attacks/priors/") == "leakbench.attacks.priors"
    assert dotted("bench/cli.py") == "leakbench.cli"
    assert dotted("bench/__init__.py") == PACKAGE


def _plant(root: Path, files: dict[str, str]) -> Path:
    """A package tree under ``root``: every package folder with an ``__init__``, and ``files``
    (path -> source)."""
    for folder in FOLDERS:
        (root / folder).mkdir(parents=True, exist_ok=True)
        (root / folder / "__init__.py").touch()
    for path, source in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        for parent in (root / path).parents:
            if parent == root:
                break
            (parent / "__init__.py").touch()
        (root / path).write_text(source, encoding="utf-8")
    return root


@pytest.mark.parametrize(
    ("source", "needle"),
    [
        # An upward import at the top, one inside a function, one in a string, and a
        # defense that reaches for the model zoo.
        ("from leakbench.run.runner import run\n", "higher floor"),
        ("def f():\n    import leakbench.run.runner\n", "higher floor"),
        ('BACKENDS = {"fast": "leakbench.run.runner:Fast"}\n', "higher floor"),
        ("import importlib\nimportlib.import_module('leakbench.run.runner')\n", "higher floor"),
        ("from leakbench import audit\n", "imports leakbench.run.runner (run)"),
        ("from leakbench.components.models import build_model\n", "must not depend on"),
    ],
)
def test_the_checker_flags_a_planted_violation(tmp_path: Path, source: str, needle: str) -> None:
    root = _plant(
        tmp_path,
        {
            "bench/__init__.py": 'LAZY = {"audit": "leakbench.run.runner"}\n',
            "bench/run/runner.py": "def run():\n    pass\n",
            "bench/components/models.py": "def build_model():\n    pass\n",
            "defenses/planted.py": source,
        },
    )
    found = layer_violations(root, FLOORS)
    assert len(found) == 1 and needle in found[0], found
    assert found[0].startswith("leakbench.defenses.planted")


def test_the_checker_passes_a_planted_downward_import(tmp_path: Path) -> None:
    root = _plant(
        tmp_path,
        {
            "bench/core/low.py": "X = 1\n",
            "bench/run/high.py": 'from leakbench.core import low\nNAME = "leakbench.core.low:X"\n',
        },
    )
    assert layer_violations(root, FLOORS) == []
