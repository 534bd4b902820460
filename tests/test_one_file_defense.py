"""Adding a defense is one file: a defense in a temporary package, registered by importing it
or through an entry point, reaches the contract tests, ``leakbench list`` and the docs' table.

The entry point is faked as pip lays an installed package out (the package and its
``*.dist-info`` with ``entry_points.txt``) in a folder put on ``PYTHONPATH`` of fresh
processes; nothing is installed into this environment.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from leakbench.defenses import DEFENSES
from leakbench.defenses.table import built_in_names, defense_table, table_in

ROOT = Path(__file__).resolve().parents[1]

# The whole defense: one module, nothing else edited.
DEFENSE = '''\
"""A defense in its own file: every gradient tensor scaled by a third."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import tensorflow as tf

from leakbench.core.params import Number, param
from leakbench.defenses import DEFENSES, AdaptiveSetting, Defense, Sample


@DEFENSES.register("third")
@dataclasses.dataclass(frozen=True)
class Third(Defense):
    """Scales every gradient tensor by ``factor`` (a test fixture).

    Reference:
        None; a fixture of leakbench's one-file test.
    """

    name: ClassVar[str] = "third"
    summary: ClassVar[str] = "every tensor scaled by `factor`"
    samples: ClassVar[tuple[Sample, ...]] = (Sample({"factor": 0.5}),)
    adaptive: ClassVar[tuple[AdaptiveSetting, ...]] = (AdaptiveSetting({"loss": "cosine"}),)

    factor: float = param(1 / 3, Number(0.0, 1.0), doc="the scale")

    def __call__(self, grads, *, seed):
        del seed
        return [g * tf.cast(self.factor, g.dtype) for g in grads]
'''
# A defense that forgot its samples: the contract test says so.
UNSAMPLED = '''\
"""A defense without contract-test samples."""

import dataclasses
from typing import ClassVar

from leakbench.defenses import DEFENSES, Defense


@DEFENSES.register("unsampled")
@dataclasses.dataclass(frozen=True)
class Unsampled(Defense):
    """Shares the gradient as it is.

    Reference:
        None.
    """

    name: ClassVar[str] = "unsampled"

    def __call__(self, grads, *, seed):
        return list(grads)
'''


def _install(site: Path, package: str, code: str, entry_points: str) -> None:
    (site / package).mkdir()
    (site / package / "__init__.py").write_text(code, encoding="utf-8")
    info = site / f"{package}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {package}\nVersion: 0.1\n", encoding="utf-8"
    )
    (info / "entry_points.txt").write_text(entry_points, encoding="utf-8")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("site")
    _install(root, "lb_third", DEFENSE, "[leakbench.defenses]\nthird = lb_third:Third\n")
    _install(root, "lb_unsampled", UNSAMPLED, "[leakbench.defenses]\nunsampled = lb_unsampled\n")
    return root


def _run(site: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONSAFEPATH="1", PYTHONPATH=str(site), TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.run(
        [sys.executable, *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )


@pytest.fixture
def imported(site: Path) -> Iterator[None]:
    """The defense registered in this process by importing its module."""
    sys.path.insert(0, str(site))
    try:
        importlib.import_module("lb_third")
        yield
    finally:
        sys.path.remove(str(site))
        sys.modules.pop("lb_third", None)
        DEFENSES.unregister("third")


def test_the_docs_table_is_rendered_from_the_registry() -> None:
    page = (ROOT / "docs" / "defenses.md").read_text(encoding="utf-8")
    assert table_in(page) == defense_table(built_in_names()), (
        "docs/defenses.md's defense table is stale: python -m leakbench.defenses.table "
        "docs/defenses.md"
    )


def test_an_imported_defense_reaches_the_table_and_the_samples(imported: None) -> None:
    assert "| `third` | `factor` (0.333333) | every tensor scaled by `factor` |" in (
        defense_table()
    )
    assert "third" not in built_in_names()
    assert dict(DEFENSES.get("third").samples[0].params) == {"factor": 0.5}


def test_an_entry_point_defense_reaches_list_and_the_contract_tests(site: Path) -> None:
    listed = _run(site, "-m", "leakbench.cli", "list")
    assert listed.returncode == 0, listed.stderr
    assert "  third " in listed.stdout.split("defenses:\n", 1)[1]

    tests = ["tests/test_defenses.py", "tests/test_per_example.py"]
    proc = _run(site, "-m", "pytest", "-p", "no:cacheprovider", "-n", "0", "-v", "-rf",
                *tests, "-k", "third or unsampled")  # fmt: skip
    results = [line for line in proc.stdout.splitlines() if "::" in line and "[" in line]
    third = [line for line in results if "[third" in line]
    # The new defense is collected by both files and passes the whole contract ...
    assert {line.split("::")[0] for line in third} == set(tests), proc.stdout[-3000:]
    assert all(" PASSED" in line for line in third), proc.stdout[-3000:]
    # ... and the one without samples fails, saying why.
    assert any("unsampled" in line and " FAILED" in line for line in results)
    assert "defense 'unsampled' declares no samples" in proc.stdout, proc.stdout[-3000:]
