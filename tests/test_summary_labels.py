"""The printed leaderboard's labels: cut in the middle, and never two rows that read the same."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from leakbench.outputs.summary import PRINT_WIDTH, cut, distinct_cuts, headline_table

DEFAULT = Path(__file__).resolve().parents[1] / "results" / "default" / "leaderboard.csv"


def test_cut_keeps_the_name_and_the_values() -> None:
    assert cut("gaussian sigma=0.01", 24) == "gaussian sigma=0.01"
    # 33 characters into 24: 12 of the start, "~", the last 11
    assert cut("dpsgd noise_multiplier=0.5 norm=1", 24) == "dpsgd noise_~=0.5 norm=1"
    assert cut("dpsgd noise_multiplier=1 norm=1", 24) == "dpsgd noise_~er=1 norm=1"
    assert len(cut("x" * 50, 17)) == 17


def test_labels_that_still_collide_are_given_in_full() -> None:
    header = ["verdict", "defense"]
    full = [{1: "chain a=1 b=2 c=3"}, {1: "chain a=9 b=2 c=3"}, {1: "none"}]
    rows = [header, ["holds", "chain~c=3"], ["holds", "chain~c=3"], ["broken", "none"]]
    out = distinct_cuts(rows, header, full)
    assert [r[1] for r in out[1:]] == ["chain a=1 b=2 c=3", "chain a=9 b=2 c=3", "none"]
    # the same label twice (one setting, two rows) is not a collision
    same = [{1: "chain a=1 b=2 c=3"}, {1: "chain a=1 b=2 c=3"}, {1: "none"}]
    assert distinct_cuts(rows, header, same) == rows


def test_no_two_rows_of_the_default_run_read_the_same() -> None:
    board = pd.read_csv(DEFAULT)
    lines = headline_table(board).splitlines()
    table = lines[1 : 1 + int(board["strongest"].astype(bool).sum())]
    labels = [line[16:42].strip() for line in table]
    assert len(set(labels)) == len(labels)
    assert all(len(line) <= PRINT_WIDTH for line in table)
