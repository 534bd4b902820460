"""The per-image leak flags of trial rows: ``recognisable`` and ``leaked``, from the scores and
``identified`` (`leakbench.components.leakage`), as every table reads them."""

from __future__ import annotations

import pandas as pd

from leakbench.components.leakage import beyond_chance, chance, leaked_flags, recognisable

# The columns that name one cell of a run: an attack configuration against a defense
# configuration on one dataset and model.
CELL_COLUMNS = ["dataset", "model", "attack", "attack_params", "defense", "defense_params"]


def with_leak_flags(trials: pd.DataFrame, success_mse: float) -> pd.DataFrame:
    """``trials`` with the per-image flags ``recognisable`` and ``leaked`` computed from the
    scores and ``identified`` (`leakbench.components.leakage`); rows without ``identified`` (an
    auditor's, or a run exported before the flags existed) keep it unknown (NaN, counted as not
    identified). A cell's identifications count towards ``leaked`` only when there are more
    than chance explains (`leakbench.components.leakage.beyond_chance`): one image of 32 picked out
    of 1,000 by a reconstruction of pure noise is not a leak."""
    frame = trials.copy()
    for column in ("identified", "distractors", "lpips"):  # unknown in older or hand-made rows
        if column not in frame:
            frame[column] = float("nan")
    frame["recognisable"] = recognisable(frame["lpips"], frame["psnr"]).astype(float)
    counted = frame["identified"].copy()
    for _, group in frame.groupby(CELL_COLUMNS, sort=False):
        hits = int((group["identified"] == 1).sum())
        distractors = group["distractors"].iloc[0]
        if hits and distractors == distractors:
            if not beyond_chance(hits, len(group), chance(int(distractors))):
                counted.loc[group.index] = 0.0
    frame["leaked"] = leaked_flags(
        frame["mse"], counted, frame["recognisable"], success_mse
    ).astype(float)
    return frame
