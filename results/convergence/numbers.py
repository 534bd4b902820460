"""The numbers of the generated passages on convergence on CIFAR-10 (templates in `passages/`,
filled by `benchmarks/readme_numbers.py`)."""

from __future__ import annotations

import json
from typing import Any

from passages import (
    Results,
    block,
    claim,
    count,
    decibels,
    default_trials,
    one,
    pct,
    recovered,
    span,
    table_row,
)

CONVERGENCE = "convergence/cifar10-defaults"
STOP_REASONS = ("stalled", "converged", "budget", "schedule", "diverged", "error")


@block("convergence", refill=False)
def convergence(results: Results) -> dict[str, Any]:
    board = results.csv(f"{CONVERGENCE}/leaderboard.csv")
    trials = results.csv(f"{CONVERGENCE}/trials.csv")
    lines = []
    for attack in ("dlg", "idlg"):
        row = one(board, attack=attack)
        runs = trials[trials["attack"] == attack]
        reasons = runs["stop_reason"].value_counts()
        lines.append(
            table_row(
                [
                    f"`{attack}`",
                    f"{recovered(row)} of {row['n']} ({pct(row['success_rate'])})",
                    f"{decibels(row['psnr_mean'])} dB (+-{row['psnr_ci95']:.1f})",
                    pct(row["label_acc"]),
                    f"{count(runs['iterations_used'].median())} "
                    f"({count(runs['iterations_used'].max())})",
                    ", ".join(f"{reasons[r]} {r}" for r in STOP_REASONS if r in reasons),
                    f"{row['seconds_mean']:.1f}",
                ]
            )
        )
    return {"rows": "\n".join(lines)}


@span("convergence-old-budget")
def convergence_old_budget(results: Results) -> dict[str, Any]:
    speed = results.csv("perf/attack_speed.csv")
    old = speed[
        (speed["dataset"] == "cifar10")
        & (speed["implementation"] == "leakbench")
        & (speed["budget"] == "default-300")
        & (speed["width"] == 1)
    ].iloc[0]
    found = "none" if old["successes"] == 0 else str(old["successes"])
    return {"found": found, "attacks": old["attacks"]}


@block("convergence-digits")
def convergence_digits(results: Results) -> dict[str, Any]:
    trials = default_trials(results)
    lbfgs = trials[trials["attack"].isin(["dlg", "idlg"])]
    caps = lbfgs["attack_params"].map(lambda text: json.loads(text)["iterations"])
    claim(caps.nunique() == 1, "the default run's L-BFGS attacks have different caps")
    first = lbfgs[lbfgs["escalations"] == 0]
    claim((first["iterations_used"] < caps[first.index]).all(),
          "an unescalated default trial reached its iteration cap")  # fmt: skip
    per_defense = first.groupby("defense")["iterations_used"].mean()
    judged = lbfgs.drop_duplicates(["seed", "batch_index", "attack", "attack_params", "defense",
                                    "defense_params"])  # fmt: skip
    return dict(
        low=f"{round(per_defense.min(), -1):.0f}",
        high=f"{round(per_defense.max(), -1):.0f}",
        unconverged=int((judged["converged"] == 0).sum()),
        trials=count(len(judged)),
        cap=count(caps.iloc[0]),
    )
