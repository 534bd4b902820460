"""The layering of the package, read from the source (AST; nothing is imported or run).

The package is built in floors, and a floor is a folder: a module's floor is the folder it
lives in (the longest folder of `LAYERS` that holds it), and a module imports only modules of
its own floor or of lower ones. ``docs/architecture.md`` draws the same floors. A module placed
directly in ``bench/`` (other than ``__init__`` and the CLI on top) or a new folder that is no
floor fails the test, so where a module lives stays a decision.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Folder -> import name (pyproject.toml's package-dir).
FOLDERS = {
    "bench": "leakbench",
    "attacks": "leakbench.attacks",
    "defenses": "leakbench.defenses",
    "datasets": "leakbench.datasets",
}
# Lowest first: each floor and the folders (packages) that make it. A folder stands for
# everything in it, unless a deeper folder is a floor of its own.
LAYERS: list[tuple[str, list[str]]] = [
    # The package's own __init__ (the version and the aliases of the 0.1 module paths) imports
    # nothing of leakbench, so it sits below everything.
    ("core", ["leakbench", "leakbench.core"]),
    (
        "components",
        [
            "leakbench.components",
            "leakbench.defenses",
            "leakbench.datasets",
            "leakbench.attacks.priors",
        ],
    ),
    ("engine", ["leakbench.attacks.engine"]),
    ("attacks and the client", ["leakbench.attacks", "leakbench.client"]),
    ("outputs", ["leakbench.outputs"]),
    ("run", ["leakbench.run"]),
    ("integrations", ["leakbench.integrations"]),
    ("interface", ["leakbench.cli"]),
]
# Inside the components layer: a defense sees gradient tensors only, and a dataset sees files.
FORBIDDEN = {
    "leakbench.defenses": (
        "leakbench.components.models",
        "leakbench.components.bottleneck",
        "leakbench.components.per_example",
        "leakbench.attacks",
        "leakbench.datasets",
    ),  # fmt: skip
    "leakbench.datasets": (
        "leakbench.components.models",
        "leakbench.attacks",
        "leakbench.defenses",
    ),
}


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def layer_of(module: str) -> int:
    """The index in `LAYERS` of the longest folder that holds ``module`` (the package root
    ``leakbench`` holds only its own ``__init__``: any other module must live in a floor)."""
    best, found = -1, None
    for index, (_, names) in enumerate(LAYERS):
        for name in names:
            covers = module == name if name == "leakbench" else _under(module, name)
            if covers and len(name) > best:
                best, found = len(name), index
    if found is None:
        raise LookupError(
            f"{module} is in no floor: move it into a floor's folder (tests/test_layers.py "
            "LAYERS), or make its folder a floor there"
        )
    return found


def imports_of(source: str, module: str, is_package: bool) -> set[str]:
    """The leakbench modules that ``source`` (of ``module``) imports, at any nesting level
    (imports inside functions count: they are dependencies all the same)."""
    found = set()
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if _under(a.name, "leakbench")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative import
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            if not _under(target, "leakbench"):
                continue
            # `from leakbench import lanes` imports the module leakbench.lanes
            for alias in node.names:
                found.add(
                    f"{target}.{alias.name}" if _is_module(f"{target}.{alias.name}") else target
                )
    return found


def _modules() -> dict[str, tuple[Path, bool]]:
    modules = {}
    for folder, name in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            is_package = parts[-1] == "__init__"
            dotted = ".".join([name, *(parts[:-1] if is_package else parts)])
            modules[dotted] = (path, is_package)
    return modules


MODULES = _modules()


def _is_module(name: str) -> bool:
    return name in MODULES


def violations(module: str, imported: set[str]) -> list[str]:
    """The imports of ``module`` that go against the layering, as readable lines."""
    own = layer_of(module)
    bad = []
    for target in sorted(imported):
        layer = layer_of(target)
        if layer > own:
            bad.append(
                f"{module} ({LAYERS[own][0]}) imports {target} ({LAYERS[layer][0]}), a higher layer"
            )
        for prefix, banned in FORBIDDEN.items():
            if _under(module, prefix) and any(_under(target, b) for b in banned):
                bad.append(f"{module} imports {target}, which {prefix} must not depend on")
    return bad


def test_every_module_is_placed_in_a_layer() -> None:
    for module in MODULES:
        layer_of(module)


def test_every_folder_of_the_package_is_a_floor_or_inside_one() -> None:
    floors = {name for _, names in LAYERS for name in names}
    for module, (_, is_package) in MODULES.items():
        if is_package and module != "leakbench":
            assert any(_under(module, floor) for floor in floors - {"leakbench"}), module


def test_a_module_outside_the_floors_is_refused() -> None:
    with pytest.raises(LookupError, match="leakbench.helpers is in no floor"):
        layer_of("leakbench.helpers")


def test_no_module_imports_a_higher_layer() -> None:
    found = []
    for module, (path, is_package) in MODULES.items():
        found += violations(
            module, imports_of(path.read_text(encoding="utf-8"), module, is_package)
        )
    assert not found, "\n".join(found)


@pytest.mark.parametrize(
    ("module", "source", "needle"),
    [
        # The checker itself can fail: an upward import, a function-level one, and a defense
        # that reaches for the model zoo.
        (
            "leakbench.components.models",
            "from leakbench.run.runner import run_benchmark\n",
            "higher layer",
        ),
        ("leakbench.attacks.engine.lbfgs", "def f():\n    import leakbench.run.config\n", "higher"),
        (
            "leakbench.defenses.gaussian",
            "from leakbench.components.models import build_model\n",
            "must not",
        ),
    ],
)
def test_the_checker_reports_an_upward_import(module: str, source: str, needle: str) -> None:
    found = violations(module, imports_of(source, module, is_package=False))
    assert found and needle in found[0]
