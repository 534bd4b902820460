"""The printed leaderboard's labels: wrapped at their spaces, never cut."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from leakbench.outputs.naming import defense_label
from leakbench.outputs.summary import PRINT_WIDTH, headline_table, wrap_cell

DEFAULT = Path(__file__).resolve().parents[1] / "results" / "default" / "leaderboard.csv"


def test_a_cell_wraps_at_its_spaces_and_keeps_long_words_whole() -> None:
    assert wrap_cell("gaussian sigma=0.01", 24) == ["gaussian sigma=0.01"]
    assert wrap_cell("dpsgd noise_multiplier=0.5 norm=1", 24) == [
        "dpsgd",
        "noise_multiplier=0.5",
        "norm=1",
    ]
    assert wrap_cell("x" * 30, 10) == ["x" * 30]  # a word longer than the cell is whole
    assert wrap_cell("digits/lenet", 8) == ["digits/", "lenet"]


def test_the_default_run_prints_every_defense_in_full_within_the_width() -> None:
    # Each row's defense column, its continuation lines joined, reads the defense's whole
    # label; no line passes the width and no "~" stands for a cut part.
    board = pd.read_csv(DEFAULT)
    lines = headline_table(board).splitlines()
    start = lines[0].index("defense")
    end = lines[0].index("strongest")
    rows: list[list[str]] = []
    for line in lines[1:]:
        if line.startswith(" "):
            part = line[start:end].strip()
            rows[-1] += [part] if part else []
        elif ":" in line.split()[0]:
            break  # the verdicts in words below the table
        else:
            rows.append([line[start:end].strip()])
    heads = board[board["strongest"].astype(bool)]
    expected = {
        defense_label(d, p) for d, p in zip(heads.defense, heads.defense_params, strict=True)
    }
    assert {" ".join(parts) for parts in rows} == expected and len(rows) == len(heads)
    assert all(len(line) <= PRINT_WIDTH for line in lines)
    assert not any("~" in line for line in lines)
