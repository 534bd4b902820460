"""House rules that only a test keeps, read from the source with `ast` (nothing of leakbench is
imported): no function longer than `MAX_LINES`, and no circle between modules.

A function's length runs from its ``def`` line to its last line (``end_lineno``), docstring and
comments included, decorators excluded; a method or a nested function is measured on its own,
and also counts in the function around it. A function that must stay long is named in
`LONG_FUNCTIONS` with the reason, and the test fails when it is no longer long, so the list
only shrinks. A circle counts every import (`import_graph.imports_of`): one hidden inside a
function is a circle all the same.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from import_graph import FOLDERS, ROOT, cycles, graph, modules

MAX_LINES = 80
# "module:qualname" -> why it may be longer than MAX_LINES.
LONG_FUNCTIONS: dict[str, str] = {}
# The folders (repository paths) that hold no module named for a modality (issue 64): a
# modality is a plug-in of one pipeline, not a copy of its modules; text attacks live in
# attacks/text/, not in attacks/text_*.py; a modality's run part is one pipeline module
# (run/text.py).
NO_MODALITY_PREFIX = ("attacks", "bench/run", "bench/client", "bench/outputs")
MODALITY_PREFIX = "text_"


def function_lengths(root: Path = ROOT) -> dict[str, int]:
    """``"module:qualname"`` -> length in lines, of every function and method under ``root``."""
    lengths = {}
    for name, module in modules(root).items():
        stack: list[tuple[ast.AST, str]] = [(module.tree(), "")]
        while stack:
            node, prefix = stack.pop()
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    qualname = prefix + child.name
                    lengths[f"{name}:{qualname}"] = child.end_lineno - child.lineno + 1
                    stack.append((child, qualname + ".<locals>."))
                elif isinstance(child, ast.ClassDef):
                    stack.append((child, prefix + child.name + "."))
                else:
                    stack.append((child, prefix))
    return lengths


def long_functions(root: Path = ROOT, limit: int = MAX_LINES) -> dict[str, int]:
    """The functions under ``root`` longer than ``limit`` lines, with their lengths."""
    return {name: n for name, n in function_lengths(root).items() if n > limit}


def circles(root: Path = ROOT) -> list[str]:
    """The import circles of the package under ``root``, one readable line each."""
    return [" -> ".join(path) for path in cycles(graph(root))]


def prefixed_modules(root: Path = ROOT, folders: tuple[str, ...] = NO_MODALITY_PREFIX) -> list[str]:
    """The modules (a file, or a package folder) directly in ``folders`` under ``root`` whose
    name starts with `MODALITY_PREFIX`, as repository paths."""
    found = []
    for folder in folders:
        for path in sorted((root / folder).iterdir()):
            module = path.suffix == ".py" or (path / "__init__.py").is_file()
            if module and path.name.startswith(MODALITY_PREFIX):
                found.append(path.relative_to(root).as_posix())
    return found


def test_no_function_is_longer_than_the_limit() -> None:
    found = {name: n for name, n in long_functions().items() if name not in LONG_FUNCTIONS}
    assert not found, "\n".join(
        f"{name} has {n} lines (at most {MAX_LINES}): extract well-named helpers"
        for name, n in sorted(found.items())
    )


def test_every_escape_is_still_long() -> None:
    long = long_functions()
    stale = [name for name in LONG_FUNCTIONS if name not in long]
    assert not stale, f"no longer over {MAX_LINES} lines, remove from LONG_FUNCTIONS: {stale}"


def test_no_circle_between_modules() -> None:
    found = circles()
    assert not found, "import circles (move the shared code where it belongs):\n" + "\n".join(found)


def _tree(root: Path, files: dict[str, str]) -> Path:
    for folder in FOLDERS:
        (root / folder).mkdir(parents=True, exist_ok=True)
        (root / folder / "__init__.py").touch()
    for path, source in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(source, encoding="utf-8")
    return root


def _function(name: str, lines: int, indent: str = "") -> str:
    """Source of a function of exactly ``lines`` lines (its ``def`` line included)."""
    body = "".join(f"{indent}    x{i} = {i}\n" for i in range(lines - 1))
    return f"{indent}def {name}():\n{body}"


def test_a_planted_81_line_function_is_flagged(tmp_path: Path) -> None:
    source = (
        "import functools\n\n\n@functools.cache\n"  # a decorator does not count
        + _function("short", MAX_LINES)
        + "\n\nclass Box:\n"
        + _function("long", MAX_LINES + 1, indent="    ")
    )
    root = _tree(tmp_path, {"bench/core/planted.py": source})
    assert long_functions(root) == {"leakbench.core.planted:Box.long": MAX_LINES + 1}
    assert function_lengths(root)["leakbench.core.planted:short"] == MAX_LINES


@pytest.mark.parametrize(
    "second",
    [
        "from leakbench.core import first\n",
        "def later():\n    from leakbench.core.first import VALUE\n    return VALUE\n",
        "import typing\nif typing.TYPE_CHECKING:\n    from leakbench.core import first\n",
        'TABLE = {"one": "leakbench.core.first:VALUE"}\n',
    ],
)
def test_a_planted_circle_is_flagged(tmp_path: Path, second: str) -> None:
    root = _tree(
        tmp_path,
        {
            "bench/core/first.py": "from leakbench.core.second import OTHER\nVALUE = 1\n",
            "bench/core/second.py": second + "OTHER = 2\n",
            "bench/core/alone.py": "from leakbench.core import first\n",
        },
    )
    assert circles(root) == [
        "leakbench.core.first -> leakbench.core.second -> leakbench.core.first"
    ]


def test_a_planted_tree_without_circles_passes(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "bench/core/first.py": "VALUE = 1\n",
            "bench/core/second.py": "from leakbench.core.first import VALUE\n",
        },
    )
    assert circles(root) == []


def test_no_module_is_named_for_a_modality() -> None:
    found = prefixed_modules()
    assert not found, (
        f"modules named {MODALITY_PREFIX}* in {', '.join(NO_MODALITY_PREFIX)} (a modality's "
        "part goes in its own folder, e.g. attacks/text/, or in the shared module): "
        + ", ".join(found)
    )


def test_a_planted_text_module_is_flagged(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "attacks/text_thing.py": "",
            "attacks/text_pack/__init__.py": "",
            "attacks/text/base.py": "",
            "attacks/context_text.py": "",
            "bench/run/text_later.py": "",
            "bench/run/text.py": "",  # a modality's pipeline module (run/text.py) is allowed
            "bench/client/text_step.py": "",
            "bench/outputs/text_page.py": "",
            "bench/core/text_thing.py": "",  # a folder not in the rule
        },
    )
    assert prefixed_modules(root) == [
        "attacks/text_pack",
        "attacks/text_thing.py",
        "bench/run/text_later.py",
        "bench/client/text_step.py",
        "bench/outputs/text_page.py",
    ]
