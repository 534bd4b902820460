"""The numbers of the generated passages on DP-SGD's training recipe (templates in `passages/`,
filled by `benchmarks/readme_numbers.py`)."""

from __future__ import annotations

import json
import math
from typing import Any

import pandas as pd
from passages import (
    PLAIN,
    ReadmeError,
    Results,
    acc_ci,
    block,
    claim,
    default_board,
    one,
    points,
    select,
)

DP_OLD = "old (adam 1e-3, batch 32, 30 epochs)"
DP_RUN = "dp, default run (sgd, batch 128, 10 epochs, rates 4, 8)"
DP_DEFAULTS = "dp, defaults (sgd, batch 128, 30 epochs, rates 2, 4, 8)"
DP_CONFIGS = ({"noise_multiplier": 0.5, "norm": 1.0}, {"noise_multiplier": 1.0, "norm": 1.0})


@block("dp-recipe")
def dp_recipe(results: Results) -> dict[str, Any]:
    summary = results.csv("dp_recipe/summary.csv")

    def cell(compared: str, params: dict) -> pd.Series:
        rows = summary[
            (summary["compared"] == compared)
            & summary["defense_params"].map(lambda text: json.loads(text) == params)
        ]
        if len(rows) != 1:
            raise ReadmeError(f"dp_recipe/summary.csv: no single row of {compared} {params}")
        return rows.iloc[0]

    def pair(compared: str) -> tuple[str, str]:
        rows = [cell(compared, params) for params in DP_CONFIGS]
        accuracies = " and ".join(acc_ci(r["test_accuracy"], r["test_accuracy_ci95"]) for r in rows)
        return accuracies, " and ".join(f"{r['epsilon']:.1f}" for r in rows)

    board = default_board(results)
    for params in DP_CONFIGS:
        ran = one(board, attack="idlg", defense="dpsgd", params=params, **PLAIN)
        claim(
            math.isclose(ran["test_accuracy"], cell(DP_RUN, params)["test_accuracy"]),
            "the DP recipe's models are no longer the default run's",
        )
    claim(summary["models"].nunique() == 1, "the recipes trained different numbers of models")
    claim(
        {json.dumps(p, sort_keys=True) for p in DP_CONFIGS}
        == {
            json.dumps(json.loads(t), sort_keys=True)
            for t in select(board, defense="dpsgd")["defense_params"]
        },
        "the default run's DP-SGD configurations changed",
    )
    old, run = cell(DP_OLD, DP_CONFIGS[1]), cell(DP_RUN, DP_CONFIGS[1])
    claim(
        run["epsilon"] > old["epsilon"],
        "at noise 1.0 the DP recipe no longer spends more privacy budget than the old one",
    )
    old_acc, old_eps = pair(DP_OLD)
    run_acc, run_eps = pair(DP_RUN)
    defaults_acc, defaults_eps = pair(DP_DEFAULTS)
    return dict(
        models=summary["models"].iloc[0],
        old_acc=old_acc,
        old_eps=old_eps,
        run_acc=run_acc,
        run_eps=run_eps,
        defaults_acc=defaults_acc,
        defaults_eps=defaults_eps,
        run_eps_10=f"{run['epsilon']:.1f}",
        old_eps_10=f"{old['epsilon']:.1f}",
        gain=points(run["test_accuracy"] - old["test_accuracy"], 0),
    )
