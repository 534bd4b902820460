"""The numbers of the generated passages on leakage over training (templates in `passages/`, filled
by `benchmarks/readme_numbers.py`)."""

from __future__ import annotations

import json
from typing import Any

import pandas as pd
from passages import (
    Results,
    block,
    claim,
    count,
    listing,
    pct,
    span,
    whole_range,
)

from leakbench.outputs.naming import defense_label

# An undefended model is the `baseline` row since protocol 1; older runs said `inconclusive`.
NO_LEAK_VERDICTS = ("inconclusive", "baseline")

CHECKPOINT_RUNS = {
    "digits-lenet": "Digits, `lenet`",
    "cifar10-lenet": "CIFAR-10, `lenet`",
    "cifar10-convnet": "CIFAR-10, `convnet`",
}


def _checkpoint_heads(results: Results, run: str) -> pd.DataFrame:
    """The strongest attack's row per checkpoint and defense of a committed checkpoint run."""
    frame = results.csv(f"checkpoints/{run}/checkpoints.csv")
    return frame[frame["strongest"].astype(bool)]


def _checkpoint_curve(heads: pd.DataFrame, defense: str) -> str:
    """ "epoch 0 (accuracy 10%): 100% leaked, 100% exact; ..." for one defense."""
    rows = heads[heads["defense"] == defense].sort_values("progress")
    claim(not rows.empty, f"no {defense} rows in a checkpoint run")
    return "; ".join(
        f"{row['progress']:g} ({pct(row['model_accuracy'])}): {pct(row['leaked_rate'])} leaked, "
        f"{pct(row['success_rate'])} exact"
        for _, row in rows.iterrows()
    )


def _trend(heads: pd.DataFrame, defense: str) -> tuple[float, float]:
    """The leaked share at the first and at the last checkpoint."""
    rows = heads[heads["defense"] == defense].sort_values("progress")
    return float(rows["leaked_rate"].iloc[0]), float(rows["leaked_rate"].iloc[-1])


@block("checkpoints-findings")
def checkpoints_findings(results: Results) -> dict[str, Any]:
    """What the committed leakage-over-training runs show, from their checkpoints.csv."""
    lines = []
    for run, label in CHECKPOINT_RUNS.items():
        heads = _checkpoint_heads(results, run)
        attacks = sorted(set(heads["attack"]))
        images = int(heads["n"].iloc[0])
        parts = [
            f"- **{label}** ({images} images; the strongest of {listing(attacks)} per defense; "
            "epochs: model accuracy, images leaked, recovered exactly). "
        ]
        for defense in dict.fromkeys(heads["defense"]):
            params = heads[heads["defense"] == defense]["defense_params"].iloc[0]
            parts.append(f"{defense_label(defense, params)}: {_checkpoint_curve(heads, defense)}. ")
        if (heads["leaked_rate"] == 0).all() and heads["verdict"].isin(NO_LEAK_VERDICTS).all():
            budget = float(heads["budget_share"].min())
            iterations = sorted({json.loads(t).get("iterations") for t in heads["attack_params"]})
            parts.append(
                "No checkpoint leaks an image: the attack leaks none even at the "
                "initialisation (median PSNR "
                f"{whole_range(list(heads['psnr_median']), ' dB')}), and {pct(budget)} of its "
                f"attacks ended on their budget of {listing([count(i) for i in iterations])} "
                "iterations, so this run cannot say where leakage concentrates: a stronger "
                "attack (more iterations and starts) is needed on this model."
            )
        lines.append("".join(parts).strip())
    peaks = []
    for run in ("digits-lenet", "cifar10-lenet"):
        rows = _checkpoint_heads(results, run)
        rows = rows[rows["defense"] == "none"].sort_values("progress")
        top = rows["leaked_rate"].max()
        at = [f"{v:g}" for v in rows[rows["leaked_rate"] == top]["progress"]]
        claim(max(float(v) for v in at) <= 5, f"{run}: leakage peaks after 5 epochs")
        final = rows.iloc[-1]
        budget = float(rows["budget_share"].max())
        peaks.append(
            f"{CHECKPOINT_RUNS[run]} leaks most ({pct(top)}) at epochs {listing(at)} and "
            f"{pct(final['leaked_rate'])} at the last checkpoint ({final['progress']:g} epochs, "
            f"{pct(final['model_accuracy'])} accuracy)"
            + (f"; there {pct(budget, 1)} of its attacks ended on their iteration budget"
               if budget > 0 else "")
        )  # fmt: skip
    digits_first, digits_last = _trend(_checkpoint_heads(results, "digits-lenet"), "none")
    claim(digits_last < digits_first, "digits leakage does not fall by the last checkpoint")
    return {"runs": "\n".join(lines), "peaks": "; ".join(peaks)}


@span("checkpoints-readme")
def checkpoints_readme(results: Results) -> dict[str, Any]:
    """The README's line on leakage over training."""
    digits = _checkpoint_heads(results, "digits-lenet")
    rows = digits[digits["defense"] == "none"].sort_values("progress")
    start, final = rows.iloc[0], rows.iloc[-1]

    def leaked(row: pd.Series) -> str:
        k, n = round(row["leaked_rate"] * row["n"]), int(row["n"])
        return f"{k} of {n} (95% CI {100 * row['leaked_low']:.0f}-{100 * row['leaked_high']:.0f}%)"

    return {
        "start": leaked(start),
        "final": leaked(final),
        "epochs": f"{final['progress']:g}",
        "accuracy": pct(final["model_accuracy"]),
    }
