"""`benchmarks/cosine_precision.py`: a usage error is one line and exit code 2; its comparison
itself is a benchmark (figures in results/cosine_precision/), not a test."""

from __future__ import annotations

from pathlib import Path

import pytest
from scripts import load_script


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["--out", "x", "--images", "0"], "--images must be an integer of at least 1, got 0"),
        (["--out", "x", "--data-root", "nowhere"], "--data-root: no nowhere/mnist"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(
    argv: list[str], line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stop:
        load_script("cosine_precision").main(argv)
    assert stop.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert ": error: " in error and line in error
    assert not Path("x").exists()
