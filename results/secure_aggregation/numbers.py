"""The numbers of the generated passages on the secure-aggregation runs (k2, k4, k8) (templates in
`passages/`, filled by `benchmarks/readme_numbers.py`)."""

from __future__ import annotations

from typing import Any

import pandas as pd
from passages import (
    ReadmeError,
    Results,
    claim,
    decibels,
    default_trials,
    pct,
    select,
    span,
)

from leakbench.outputs.verdicts import verdict

AGGREGATED = ("k2", "k4", "k8")


def _aggregated(results: Results, run: str) -> tuple[int, pd.Series]:
    """The number of clients of a secure-aggregation run and its DLG row against `none` (the
    standard suite adds its other families beside it)."""
    path = f"secure_aggregation/{run}"
    board = select(results.csv(f"{path}/leaderboard.csv"), attack="dlg", defense="none")
    if len(board) != 1:
        raise ReadmeError(f"results/{path}: expected one DLG cell against none, found {len(board)}")
    return results.config(path)["threat_model"]["clients"], board.iloc[0]


@span("secure-aggregation-setup")
def secure_aggregation_setup(results: Results) -> dict[str, Any]:
    attacked = set(select(default_trials(results), attack="idlg", defense="none")["image_index"])
    sizes, counts = set(), set()
    for run in AGGREGATED:
        path = f"secure_aggregation/{run}"
        trials = results.csv(f"{path}/trials.csv")
        claim(set(trials["image_index"]) <= attacked, f"{path} attacks other digits")
        sizes.add(results.config(path)["batch_size"])
        counts.add(trials["image_index"].nunique())
    claim(sizes == {1}, "a secure-aggregation client holds more than one digit")
    claim(len(counts) == 1, "the secure-aggregation runs attack different numbers of digits")
    return {"attacked": counts.pop(), "digits": len(attacked)}


@span("secure-aggregation")
def secure_aggregation(results: Results) -> dict[str, Any]:
    cells = [_aggregated(results, run) for run in AGGREGATED]
    # Each run attacks `none` only, so its row is the unranked `baseline`: the claim is that the
    # verdicts' own rule would call the leak `broken` (verdicts.verdict on the suite's union).
    claim(
        all(verdict(int(row["suite_leaked"]), int(row["suite_n"])) == "broken" for _, row in cells),
        "averaging protects some K",
    )
    claim(all(row["label_acc"] == 1 for _, row in cells), "DLG misses a label under aggregation")
    values = {}
    for key, (clients, row) in zip(AGGREGATED, cells, strict=True):
        values[key] = clients
        values[f"{key}_share"] = pct(row["success_rate"])
        values[f"{key}_db"] = decibels(row["psnr_mean"])
    return values
