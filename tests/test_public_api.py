"""The public API: the names of ``leakbench`` and of its plugin packages, and the docs' use of it.

The public surface is every name in the ``__all__`` of ``leakbench`` (lazy, through its ``LAZY``
table), ``leakbench.attacks``, ``leakbench.defenses``, ``leakbench.datasets`` and
``leakbench.modalities``. The Python blocks of README.md and docs/*.md import only from it,
except where a page is about a module's own internals (``EXCEPTIONS``, with the reason).
"""

from __future__ import annotations

import ast
import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import leakbench

ROOT = Path(__file__).resolve().parents[1]
PUBLIC = ["leakbench", "leakbench.attacks", "leakbench.defenses", "leakbench.datasets"]
PUBLIC += ["leakbench.modalities"]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)\n```", re.S | re.M)

# Pages (by name) and the deep modules each may import, with the reason; ``None``: any module.
EXCEPTIONS: dict[str, tuple[set[str] | None, str]] = {
    "architecture.md": (None, "the page is about the modules and their floors"),
    "flower.md": (
        {"leakbench.integrations.flower", "leakbench.integrations.flower_checkpoints"},
        "the page documents the Flower integration module (the `flower` extra) itself",
    ),
    "text.md": (
        {"leakbench.attacks.text.bag_of_words", "leakbench.attacks.text.span"},
        "the page shows one text attack's own rule and class from its module",
    ),
}


def public_names() -> dict[str, set[str]]:
    """Each public module's ``__all__``."""
    return {name: set(importlib.import_module(name).__all__) for name in PUBLIC}


@pytest.mark.parametrize("module", PUBLIC)
def test_every_public_name_resolves(module: str) -> None:
    imported = importlib.import_module(module)
    assert len(set(imported.__all__)) == len(imported.__all__), "a name is listed twice"
    for name in imported.__all__:
        assert getattr(imported, name) is not None, f"{module}.{name}"


def test_the_root_exposes_the_lazy_table_and_what_a_user_needs() -> None:
    assert set(leakbench.__all__) == {"__version__", *leakbench.LAZY}
    assert set(leakbench.LAZY) <= set(dir(leakbench))
    needed = {"audit", "run_benchmark", "load_config", "RunSpec", "Attack", "TextAttack"}
    needed |= {"AttackTarget", "Defense", "function_defense", "make_attack", "make_defense"}
    needed |= {"ATTACKS", "DEFENSES", "DATASETS", "Dataset", "load_dataset", "MODELS"}
    needed |= {"build_model", "LeakbenchError", "ConfigError"}
    assert needed <= set(leakbench.LAZY)
    # One registry per kind (issue 64): a text entry has its modality there, no twin registry.
    assert not {"TEXT_MODELS", "TEXT_CORPORA", "TEXT_SOURCES"} & set(leakbench.LAZY)
    # A lazy name of the root is the same object as the one of its public package.
    assert leakbench.Attack is importlib.import_module("leakbench.attacks").Attack
    assert leakbench.make_defense is importlib.import_module("leakbench.defenses").make_defense


def test_importing_leakbench_does_not_import_tensorflow() -> None:
    code = "import sys, leakbench; leakbench.__version__; print('tensorflow' in sys.modules)"
    env = dict(os.environ, PYTHONSAFEPATH="1")
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "False"


def imports_of(code: str) -> list[tuple[str, str | None]]:
    """The (module, name) pairs that ``code`` imports from leakbench; name None: the module."""
    found: list[tuple[str, str | None]] = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            found += [(a.name, None) for a in node.names if a.name.split(".")[0] == "leakbench"]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "leakbench":
            found += [(node.module or "", a.name) for a in node.names]
    return found


def test_the_import_reader_sees_both_forms() -> None:
    code = "import leakbench\nfrom leakbench.attacks import ATTACKS\nimport numpy\n"
    assert imports_of(code) == [("leakbench", None), ("leakbench.attacks", "ATTACKS")]


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_the_docs_import_only_public_names(page: Path) -> None:
    allowed, _reason = EXCEPTIONS.get(page.name, (set(), ""))
    if allowed is None:
        return
    public = public_names()
    wrong = []
    for block in BLOCK.findall(page.read_text(encoding="utf-8")):
        for module, name in imports_of(block):
            if module in allowed:
                continue
            if module not in public or (name is not None and name not in public[module]):
                wrong.append(f"from {module} import {name}" if name else f"import {module}")
    assert not wrong, f"{page.name} imports outside the public API: {wrong}"
