"""The module paths of leakbench 0.1 (every module directly under ``leakbench``) still import,
as the very module objects of the floors they moved to (CHANGELOG.md, 0.2.0)."""

from __future__ import annotations

import importlib

import pytest

import leakbench


@pytest.mark.parametrize(("old", "new"), sorted(leakbench.MOVED.items()))
def test_an_old_path_is_the_moved_module(old: str, new: str) -> None:
    if new == "leakbench.integrations.flower":
        pytest.importorskip("flwr", reason="the flower extra is not installed")
    assert importlib.import_module(old) is importlib.import_module(new)


def test_the_documented_entry_points_keep_their_paths() -> None:
    from leakbench.client import observer
    from leakbench.client.update import observer as moved_observer
    from leakbench.config import parse_config
    from leakbench.run.config import parse_config as moved_parse_config
    from leakbench.run.runner import run_benchmark
    from leakbench.runner import run_benchmark as old_run_benchmark

    assert observer is moved_observer
    assert parse_config is moved_parse_config
    assert run_benchmark is old_run_benchmark


def test_an_unknown_flat_path_is_still_an_import_error() -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("leakbench.no_such_module")
