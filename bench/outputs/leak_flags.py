"""The per-image leak flags of trial rows: ``recognisable`` and ``leaked``, from the scores,
``identified``, the measured null ``identified_null`` and the batch matching ``leak_matched``
(`leakbench.components.leakage`), as every table reads them."""

from __future__ import annotations

import numpy as np
import pandas as pd

from leakbench.components.leakage import (
    CHANCE_ALPHA,
    beyond_chance,
    identification_chance,
    leaked_flags,
    recognisable,
)

# The columns that name one cell of a run: an attack configuration against a defense
# configuration on one dataset and model.
CELL_COLUMNS = ["dataset", "model", "attack", "attack_params", "defense", "defense_params"]


def cell_chance(group: pd.DataFrame) -> float:
    """The chance level one cell's identifications are tested against: its measured null rate
    (``identified_null``, where every row has it) floored at ``1 / (pool + 1)``
    (`leakbench.components.leakage.identification_chance`); NaN when the pool size is unknown."""
    distractors = group["distractors"].iloc[0] if "distractors" in group else float("nan")
    if distractors != distractors:
        return float("nan")
    null = None
    if "identified_null" in group and group["identified_null"].notna().all():
        null = float(group["identified_null"].iloc[0])
    return identification_chance(int(distractors), null)


def run_alpha(frame: pd.DataFrame) -> float:
    """The level each cell's identification test is held to: `CHANCE_ALPHA` divided by the
    number of cells of the run (a Bonferroni correction: with 54 cells, a single chance hit in
    one of them must not make a leak that the run as a whole would expect by luck)."""
    cells = frame.groupby(CELL_COLUMNS, sort=False).ngroups if len(frame) else 1
    return CHANCE_ALPHA / max(cells, 1)


def identifications_count(group: pd.DataFrame, alpha: float = CHANCE_ALPHA) -> bool:
    """Whether one cell's identifications count as leaks: more hits than its chance level
    (`cell_chance`) explains at level ``alpha`` (`leakbench.components.leakage.beyond_chance`;
    a run passes `run_alpha`). Rows that give flags but no pool size (written by hand) cannot be
    tested and count as given."""
    hits = int((group["identified"] == 1).sum()) if "identified" in group else 0
    if not hits:
        return False
    level = cell_chance(group)
    return level != level or beyond_chance(hits, len(group), level, alpha)


def with_leak_flags(trials: pd.DataFrame, success_mse: float) -> pd.DataFrame:
    """``trials`` with the per-image flags ``recognisable`` and ``leaked`` computed from the
    scores and ``identified`` (`leakbench.components.leakage`); rows without ``identified`` (an
    auditor's, or a run exported before the flags existed) keep it unknown (NaN, counted as not
    identified). A cell's identifications count towards ``leaked`` only when there are more
    than chance explains (`identifications_count`): one image of 32 picked out of 1,000 by a
    reconstruction of pure noise is not a leak, nor are as many as a reconstruction of the
    recovered label alone gets (the measured null, ``identified_null``); the test's level is
    corrected for the run's number of cells (`run_alpha`).

    Where a row has ``leak_matched`` (its batch's maximum-cardinality matching of the leak
    graph, `leakbench.run.identification`) that is its ``leaked``; elsewhere (no arrays, or a
    row written before the column existed) ``leaked`` is the row's own flags."""
    frame = trials.copy()
    for column in ("identified", "distractors", "lpips", "identified_null", "leak_matched"):
        if column not in frame:  # unknown in older or hand-made rows
            frame[column] = float("nan")
    frame["recognisable"] = recognisable(frame["lpips"], frame["psnr"]).astype(float)
    counted = frame["identified"].copy()
    alpha = run_alpha(frame)
    for _, group in frame.groupby(CELL_COLUMNS, sort=False):
        if not identifications_count(group, alpha):
            counted.loc[group.index] = 0.0
    own = leaked_flags(frame["mse"], counted, frame["recognisable"], success_mse)
    matched = frame["leak_matched"].to_numpy(np.float64)
    frame["leaked"] = np.where(np.isnan(matched), own, matched == 1).astype(float)
    return frame
