"""Two facts every verdict row of an image run carries beside its images (issue 67): whether
the labels leak, and, for a defense with a guarantee, the most any attack may reconstruct.

**Labels.** An attack that recovers the label has learnt something private even when no image
leaks ("images hold, labels leak"). Per defense configuration the attack that gets most labels
right is reported (``label_right`` of ``label_n``, its exact 95% interval ``label_low`` -
``label_high``) against the chance of a guess, ``label_chance`` = 1 / classes; the labels
*leak* (``labels_leak``) when a one-sided binomial test puts that count beyond chance at level
`CHANCE_ALPHA` divided by the configuration's suite size (the correction identifications use,
`leakbench.outputs.leak_flags.suite_size`). Without the number of classes (a hand-made table)
the columns are empty.

**The DP ceiling.** A defense that declares ``reconstruction_bound`` (DP-SGD: reconstruction
robustness, Balle et al. 2022, Hayes et al. 2023) bounds the chance that any attack succeeds on
a given image given its chance without it. For identification that prior is a pool guess,
1 / (distractors + 1); ``dp_ceiling`` is the bound for the run's clients (their noise adds up)
and the noisy local steps each image takes part in. A cell whose identified share has its 95%
interval wholly above the ceiling contradicts the guarantee, and so does a label count above
the ceiling for a guess among the classes (the prior 1 / classes): the note calls either an
implementation or accounting bug.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd
from scipy.stats import binomtest

from leakbench.components.leakage import CHANCE_ALPHA, exact_interval
from leakbench.outputs.leak_flags import defense_of, suite_size
from leakbench.outputs.naming import attack_label

KEYS = ["dataset", "model", "defense", "defense_params"]
LABEL_COLUMNS = ["label_right", "label_n", "label_low", "label_high", "label_chance",
                 "labels_leak"]  # fmt: skip
GUARANTEE_COLUMNS = [*LABEL_COLUMNS, "dp_ceiling"]
# How the label part of a verdict note starts (the words list leaves it out).
LABEL_NOTE = "labels leak:"
# A text run's counterpart of the labels: batches whose bag of words an attack got exactly.
WORD_COLUMNS = ["words_exact", "words_n", "words_leak"]
WORD_NOTE = "words leak:"


def guarantee_columns(
    trials: pd.DataFrame, classes: int | None, clients: int = 1, releases: int = 1
) -> pd.DataFrame:
    """One row per defense configuration of ``trials`` (`KEYS`) with `GUARANTEE_COLUMNS` and
    ``note``: what the verdict note adds (labels that leak; the ceiling, and a share above
    it)."""
    rows = []
    for keys, group in trials.groupby(KEYS, sort=False):
        labels = _labels(group, classes)
        ceiling, breach = _ceiling(group, clients, releases)
        if ceiling == ceiling and labels["labels_leak"] is True:
            breach = breach or _label_breach(group, labels, clients, releases)
        notes = []
        if labels["labels_leak"] is True:
            notes.append(
                f"{LABEL_NOTE} {labels['label_right']}/{labels['label_n']} right by "
                f"{labels.pop('_by')} (95% CI {100 * labels['label_low']:.0f}-"
                f"{100 * labels['label_high']:.0f}%, chance {100 * labels['label_chance']:.0f}%)"
            )
        labels.pop("_by", None)
        if ceiling == ceiling:
            notes.append(f"DP ceiling {100 * ceiling:.2f}% identified per image")
        if breach:
            notes.append(breach)
        rows.append({**dict(zip(KEYS, keys, strict=True)), **labels, "dp_ceiling": ceiling,
                     "note": "; ".join(notes)})  # fmt: skip
    return pd.DataFrame(rows, columns=[*KEYS, *GUARANTEE_COLUMNS, "note"])


def word_columns(trials: pd.DataFrame, setting: list[str]) -> pd.DataFrame:
    """One row per text ``setting`` (dataset, model, batch size, defense) of ``trials`` with
    `WORD_COLUMNS` and ``note``: the attack whose reconstructions hold exactly the batch's bag
    of words (``bag_precision`` and ``bag_recall`` both 1) in the most batches, ``words_exact``
    of ``words_n``. Guessing a sentence's exact set of words from a vocabulary has no chance
    worth a test, so one such batch is a leak (``words_leak``): "sentences hold, words leak",
    as an image run's labels do. Rows without the bag scores give NaN."""
    rows = []
    for keys, group in trials.groupby(setting, sort=False):
        row: dict[str, Any] = {"words_exact": np.nan, "words_n": np.nan, "words_leak": np.nan}
        note = ""
        if {"bag_precision", "bag_recall", "seed", "batch_index"} <= set(group):
            best = _best_attack(group, _exact_bags)
            if best is not None:
                exact, n, by = best
                row = {"words_exact": exact, "words_n": n, "words_leak": exact > 0}
                if exact:
                    note = f"{WORD_NOTE} the exact bag of words of {exact}/{n} batches by {by}"
        rows.append({**dict(zip(setting, keys, strict=True)), **row, "note": note})
    return pd.DataFrame(rows, columns=[*setting, *WORD_COLUMNS, "note"])


def _best_attack(
    group: pd.DataFrame, count: Callable[[pd.DataFrame], tuple[int, int]]
) -> tuple[int, int, str] | None:
    """The attack of ``group`` with the largest share ``hits / n`` of ``count(cell)`` over its
    rows (the first listed among equals), as (hits, n, its label); None for no rows."""
    best: tuple[int, int, str] | None = None
    for (attack, params), cell in group.groupby(["attack", "attack_params"], sort=False):
        hits, n = count(cell)
        if best is None or hits / n > best[0] / best[1]:
            best = (hits, n, attack_label(str(attack), str(params)))
    return best


def _right_labels(cell: pd.DataFrame) -> tuple[int, int]:
    """Labels recovered right among a cell's rows, and the rows."""
    return int((cell["label"].astype(int) == cell["predicted_label"].astype(int)).sum()), len(cell)


def _exact_bags(cell: pd.DataFrame) -> tuple[int, int]:
    """A text cell's batches whose bag of words was rebuilt exactly, and its batches."""
    batches = cell.drop_duplicates(["seed", "batch_index"])
    exact = (batches["bag_precision"] == 1) & (batches["bag_recall"] == 1)
    return int(exact.sum()), len(batches)


def _labels(group: pd.DataFrame, classes: int | None) -> dict[str, Any]:
    """The label columns of one defense configuration (see the module docstring)."""
    empty: dict[str, Any] = {
        "label_right": np.nan, "label_n": np.nan, "label_low": np.nan, "label_high": np.nan,
        "label_chance": np.nan, "labels_leak": np.nan,
    }  # fmt: skip
    if not classes or not {"label", "predicted_label"} <= set(group):
        return empty
    best = _best_attack(group, _right_labels)
    if best is None:
        return empty
    right, n, by = best
    chance = 1.0 / classes
    low, high = exact_interval(right, n)
    level = CHANCE_ALPHA / suite_size(group)
    p = binomtest(right, n, chance, alternative="greater").pvalue if right else 1.0
    return {"label_right": right, "label_n": n, "label_low": low, "label_high": high,
            "label_chance": chance, "labels_leak": bool(p < level), "_by": by}  # fmt: skip


def _label_breach(group: pd.DataFrame, labels: dict[str, Any], clients: int, releases: int) -> str:
    """The note of labels recovered beyond the DP ceiling for a guess among the classes (the
    prior 1 / classes), empty when they are within it."""
    bound = getattr(defense_of(group.iloc[0]), "reconstruction_bound", None)
    if bound is None:
        return ""
    ceiling = float(bound(labels["label_chance"], clients, releases))
    if labels["label_low"] <= ceiling:
        return ""
    return (
        f"labels right {100 * labels['label_low']:.0f}% or more (95%), above the DP ceiling "
        f"{100 * ceiling:.0f}% for a guess among the classes: an implementation or accounting bug"
    )


def _ceiling(group: pd.DataFrame, clients: int, releases: int) -> tuple[float, str]:
    """The configuration's DP ceiling (NaN without a guarantee or a pool) and the note of a
    cell identified beyond it (empty if none)."""
    bound = getattr(defense_of(group.iloc[0]), "reconstruction_bound", None)
    pool = group["distractors"].iloc[0] if "distractors" in group else float("nan")
    if bound is None or pool != pool:
        return float("nan"), ""
    ceiling = float(bound(1.0 / (float(pool) + 1.0), clients=clients, releases=releases))
    if "identified" not in group:
        return ceiling, ""
    for (attack, params), cell in group.groupby(["attack", "attack_params"], sort=False):
        hits = int((cell["identified"] == 1).sum())
        low, high = exact_interval(hits, len(cell))
        if low > ceiling:
            return ceiling, (
                f"{attack_label(str(attack), str(params))} identifies {hits}/{len(cell)} "
                f"(95% CI {100 * low:.1f}-{100 * high:.1f}%) above the DP ceiling: an "
                "implementation or accounting bug"
            )
    return ceiling, ""
