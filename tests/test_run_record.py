"""`leakbench.core.environment.write_run_record`: a benchmark script's outputs record the engine and
the command that made them, and outputs of the same folder keep each other's commands."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from leakbench.core.environment import cli_executable, script_command, write_run_record
from leakbench.core.versions import ENGINE_VERSION


def test_records_engine_and_command_and_keeps_other_outputs(tmp_path: Path) -> None:
    folder = tmp_path / "batch_size"
    write_run_record(folder, "a.csv", "python make_a.py --x 1")
    first = json.loads((folder / "run.json").read_text())
    assert first["engine_version"] == ENGINE_VERSION
    assert first["commands"] == {"a.csv": "python make_a.py --x 1"}
    write_run_record(folder, "b.csv", "python make_b.py")
    write_run_record(folder, "a.csv", "python make_a.py --x 2")
    record = json.loads((folder / "run.json").read_text())
    assert record["commands"] == {"a.csv": "python make_a.py --x 2", "b.csv": "python make_b.py"}
    assert {"date", "tensorflow", "platform"} <= set(record)


def test_script_command_names_the_script_from_the_repository_root() -> None:
    command = script_command("/anywhere/benchmarks/ig_speed.py", ["--csv", "out.csv"])
    assert command == "PYTHONSAFEPATH=1 python benchmarks/ig_speed.py --csv out.csv"
    assert script_command("ig_speed.py", []) == "PYTHONSAFEPATH=1 python benchmarks/ig_speed.py"


def test_cli_executable_is_the_command_beside_this_interpreter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A benchmark started as `.venv/bin/python benchmarks/...` without the venv on PATH must
    # still start the venv's `leakbench` (the board driver failed on that with a traceback).
    (tmp_path / "leakbench").write_text("#!/bin/sh\n")
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    assert cli_executable() == str(tmp_path / "leakbench")
    monkeypatch.setattr(sys, "executable", str(tmp_path / "elsewhere" / "python"))
    assert cli_executable() == "leakbench"
