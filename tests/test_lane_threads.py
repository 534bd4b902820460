"""`benchmarks/lane_threads.py`: a usage error is one line and exit code 2; the timing itself
is a benchmark (its figures are in results/board/README.md), not a test."""

from __future__ import annotations

import pytest
from scripts import load_script


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["--lanes", "0"], "--lanes must be an integer of at least 1, got 0"),
        (["--iterations", "0"], "--iterations must be an integer of at least 1, got 0"),
        (["--intra", "-1"], "--intra must be an integer of at least 0, got -1"),
        (["--data", "nowhere.npz"], "--data: no file nowhere.npz"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(
    argv: list[str], line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stop:
        load_script("lane_threads").main(argv)
    assert stop.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert ": error: " in error and line in error
