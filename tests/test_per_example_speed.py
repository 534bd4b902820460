"""benchmarks/per_example_speed.py: both ways give the same per-example gradients, one row per
case, and a bad count is refused."""

from __future__ import annotations

import pytest
from scripts import load_script

speed = load_script("per_example_speed")


def test_every_case_prints_a_row_and_the_two_ways_agree(capsys) -> None:
    assert speed.main(["--batch", "2", "--calls", "1"]) == 0
    rows = capsys.readouterr().out.splitlines()[2:]
    assert [row.split()[:3] for row in rows] == [
        [name, "x".join(map(str, shape)), data] for name, shape, data in speed.CASES
    ]
    assert all(float(row.split()[-1]) < 1e-4 for row in rows)  # max |vectorised - XLA|


def test_a_count_below_one_is_refused() -> None:
    with pytest.raises(SystemExit) as stop:
        speed.main(["--batch", "0"])
    assert stop.value.code == 2
