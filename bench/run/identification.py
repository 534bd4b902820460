"""The per-image leakage flags of a run's trial rows (`leakbench.components.leakage`), from its
arrays.

`add_flags` gives every row of ``trials.csv`` its ``identified``, ``recognisable`` and
``leaked`` flags and the ``distractors`` its identification was judged against. Identification
reads the 8-bit originals and reconstructions of the run directory's ``arrays/``
(`leakbench.outputs.arrays`), so a run exported by `leakbench.run.rundir` and a committed run
directory re-flagged by `flag_run_dir` (e.g. after a change of the rules) get the same flags
from the same files. Rows of a cell without arrays keep NaN for ``identified``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd

from leakbench.components.leakage import distractor_pool, embed, identified
from leakbench.core.errors import DataError
from leakbench.datasets import Dataset, load_dataset
from leakbench.outputs.arrays import CellArrays, load_cell, row_positions
from leakbench.outputs.tables import (
    CELL_COLUMNS,
    LEADERBOARD_COLUMNS,
    TRIAL_COLUMNS,
    leaderboard,
    with_leak_flags,
    write_csv,
)
from leakbench.run.config import load_config

FLAG_COLUMNS = ("identified", "recognisable", "leaked", "distractors")


def add_flags(
    frame: pd.DataFrame,
    run_dir: str | Path,
    dataset: Dataset,
    private_split: str,
    variant: str | None,
    success_mse: float,
) -> pd.DataFrame:
    """``frame`` (trial rows in ``trials.csv`` order) with the flag columns set.

    ``recognisable`` and ``leaked`` are `leakbench.outputs.tables.with_leak_flags`'s, the
    leaderboard's own; an unknown ``identified`` (no arrays) counts as not identified there.
    """
    frame = frame.copy()
    for column in FLAG_COLUMNS:
        frame[column] = np.nan
    if frame.empty:
        return frame
    pool = distractor_pool(dataset, private_split)
    for group, _, _, flags in identified_cells(frame, run_dir, pool, variant):
        frame.loc[group.index, "identified"] = flags.astype(float)
    frame["distractors"] = float(len(pool))
    return with_leak_flags(frame, success_mse)


def identified_cells(
    frame: pd.DataFrame, run_dir: str | Path, pool: np.ndarray, variant: str | None
) -> Iterator[tuple[pd.DataFrame, CellArrays, list[int], np.ndarray]]:
    """Each cell of ``frame`` whose arrays ``run_dir`` holds: its rows, its arrays, the rows'
    positions in them and the rows' identification flags against the distractor ``pool``
    (`leakbench.components.leakage.identified`). Cells without arrays, or with arrays of
    another export, are passed over."""
    pool_embedding = embed(pool, variant)
    for _, group in frame.groupby(CELL_COLUMNS, sort=False):
        cell = load_cell(run_dir, group.iloc[0])
        if cell is None:
            continue
        at = row_positions(cell, group)
        if at is None:
            continue
        originals, reconstructions = cell.original[at], cell.reconstruction[at]
        yield group, cell, at, identified(originals, reconstructions, pool, variant, pool_embedding)


def rescore_run_dir(run_dir: str | Path) -> pd.DataFrame:
    """Rewrites a run directory's ``trials.csv`` (flag columns) and ``leaderboard.csv`` under
    this version's rules, from its ``config.toml``, ``trials.csv``, ``utility.csv`` and
    ``arrays/`` (no attack runs again; the store is not needed), and returns the leaderboard.
    For committed runs and runs made before the per-image flags existed."""
    path = Path(run_dir)
    for name in ("config.toml", "trials.csv", "utility.csv"):
        if not (path / name).is_file():
            raise DataError(f"{path} holds no {name}; give the --out of `leakbench run`")
    spec = load_config(path / "config.toml")
    dataset = load_dataset(spec.dataset, spec.image_size)
    trials = pd.read_csv(path / "trials.csv")
    utility = pd.read_csv(path / "utility.csv")
    trials = add_flags(
        trials, path, dataset, spec.threat_model.private_split, spec.lpips, spec.success_mse
    )
    board = leaderboard(trials, spec.success_mse, utility, spec.max_accuracy_drop)
    write_csv(trials, path / "trials.csv", TRIAL_COLUMNS)
    write_csv(board, path / "leaderboard.csv", LEADERBOARD_COLUMNS)
    return board
