"""The per-image leak flags of trial rows: ``recognisable`` and ``leaked``, from the scores,
``identified``, the measured null ``identified_null`` and the batch matching ``leak_matched``
(`leakbench.components.leakage`), as every table reads them."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd

from leakbench.attacks import ATTACKS, Attack
from leakbench.attacks.suite import PROTOCOL, expected
from leakbench.components.leakage import (
    CHANCE_ALPHA,
    beyond_chance,
    identification_chance,
    leaked_flags,
    recognisable,
)
from leakbench.core.errors import LeakbenchError
from leakbench.defenses import Defense, make_defense

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


def configuration_alphas(frame: pd.DataFrame) -> pd.Series:
    """Per row: the level its cell's identification test is held to under protocol 2,
    `CHANCE_ALPHA` divided by the number of attacks the protocol's suite sends against the
    row's defense configuration (`suite_size`). The family of tests a verdict rests on is that
    configuration's own attacks (each over its images), so what else shares the run never
    moves the level, and neither does an attack added or dropped (the count is the protocol's,
    not the run's): adding an attack can add a leak, never take one away."""
    alphas = pd.Series(CHANCE_ALPHA, index=frame.index, dtype=float)
    if frame.empty:
        return alphas
    keys = [c for c in ("dataset", "model", "defense", "defense_params") if c in frame]
    for _, group in frame.groupby(keys, sort=False):
        alphas.loc[group.index] = CHANCE_ALPHA / suite_size(group)
    return alphas


def suite_size(group: pd.DataFrame) -> int:
    """How many attack configurations protocol 2's suite sends against the defense
    configuration of ``group`` (its trial rows): `protocol_suite`'s, at least one; for a
    defense this installation does not know, the cells that ran."""
    defense = defense_of(group.iloc[0])
    if defense is None:
        return max(group.groupby(["attack", "attack_params"], sort=False).ngroups, 1)
    batch = int(group["batch_size"].iloc[0]) if "batch_size" in group else 1
    return max(len(protocol_suite(defense, batch, server_of(group["attack"]))), 1)


def protocol_suite(defense: Defense, batch: int, server: str) -> list[Attack]:
    """The attacks the protocol sends against ``defense`` at clients of ``batch`` examples
    (`leakbench.attacks.suite.expected`). Under a malicious server a defense other than
    ``none`` expects the honest suite as well: the server may run every honest attack on the
    update it receives, and only that suite brings the image prior (ig) and the defense's own
    adaptive settings."""
    attacks = expected(defense, batch, server)
    if server == "malicious" and defense.name != "none":
        attacks += expected(defense, batch, "honest")
    return attacks


def server_of(attacks: Iterable[Any]) -> str:
    """``malicious`` where one of the named ``attacks`` is a malicious server's, else
    ``honest``."""
    for name in attacks:
        if getattr(ATTACKS.peek(str(name)), "server", "honest") == "malicious":
            return "malicious"
    return "honest"


def defense_of(row: pd.Series) -> Defense | None:
    """The defense configuration a trial row names, None where this installation cannot build
    it (a plugin's that is not installed, or parameters it refuses)."""
    try:
        return make_defense(str(row["defense"]), **json.loads(str(row["defense_params"])))
    except (LeakbenchError, ValueError, TypeError):
        return None


def run_alpha(frame: pd.DataFrame) -> float:
    """The level each cell's identification test is held to under protocol 1: `CHANCE_ALPHA`
    divided by the number of cells of the run (a Bonferroni correction over the whole run,
    which let the other defenses of a run move a verdict: issue 67, finding 2)."""
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


def identification_alphas(frame: pd.DataFrame, protocol: int) -> pd.Series:
    """Per row, the level of its cell's identification test: protocol 2's per defense
    configuration (`configuration_alphas`), earlier protocols' per run (`run_alpha`)."""
    if protocol >= 2 or protocol == 0:
        return configuration_alphas(frame)
    return pd.Series(run_alpha(frame), index=frame.index, dtype=float)


def with_leak_flags(
    trials: pd.DataFrame, success_mse: float, protocol: int = PROTOCOL
) -> pd.DataFrame:
    """``trials`` with the per-image flags ``recognisable`` and ``leaked`` computed from the
    scores and ``identified`` (`leakbench.components.leakage`); rows without ``identified`` (an
    auditor's, or a run exported before the flags existed) keep it unknown (NaN, counted as not
    identified). A cell's identifications count towards ``leaked`` only when there are more
    than chance explains (`identifications_count`): one image of 32 picked out of 1,000 by a
    reconstruction of pure noise is not a leak, nor are as many as a reconstruction of the
    recovered label alone gets (the measured null, ``identified_null``); the test's level is
    corrected for the number of tests a verdict rests on (`identification_alphas`).

    Under protocol 2 (and a run of listed attacks) an image is ``recognisable`` where its
    arrays say so (``over_null``, `leakbench.run.identification.label_floors`): beyond what a
    label-only guess reaches on the dataset's public images (its null bounds) and beyond its
    own label-only null, on the same measure; a row without arrays keeps protocol 1's
    thresholds.

    Where a row has ``leak_matched`` (its batch's maximum-cardinality matching of the leak
    graph, `leakbench.run.identification`) that is its ``leaked``; elsewhere (no arrays, or a
    row written before the column existed) ``leaked`` is the row's own flags."""
    frame = trials.copy()
    for column in (
        "identified", "distractors", "lpips", "identified_null", "leak_matched", "over_null",
    ):  # fmt: skip
        if column not in frame:  # unknown in older or hand-made rows
            frame[column] = float("nan")
    shown = recognisable(frame["lpips"], frame["psnr"])
    if protocol != 1:
        # From the arrays: beyond the dataset's null bounds and the row's own null. A row
        # without arrays (NaN) keeps protocol 1's thresholds.
        over = frame["over_null"].to_numpy(np.float64)
        shown = np.where(np.isnan(over), shown, over == 1)
    frame["recognisable"] = shown.astype(float)
    counted = frame["identified"].copy()
    alphas = identification_alphas(frame, protocol)
    for _, group in frame.groupby(CELL_COLUMNS, sort=False):
        if not identifications_count(group, float(alphas.loc[group.index[0]])):
            counted.loc[group.index] = 0.0
    own = leaked_flags(frame["mse"], counted, frame["recognisable"], success_mse)
    matched = frame["leak_matched"].to_numpy(np.float64)
    frame["leaked"] = np.where(np.isnan(matched), own, matched == 1).astype(float)
    return frame
