"""The numbers of the generated passages on the BatchNorm prior (templates in `passages/`, filled
by `benchmarks/readme_numbers.py`)."""

from __future__ import annotations

import json
from typing import Any

import pandas as pd
from passages import (
    NUMBER_WORDS,
    Results,
    acc,
    block,
    claim,
    span,
)
from scipy import stats


def _prior_weight(attack_params: str) -> float | None:
    priors = json.loads(attack_params).get("priors", [])
    weights = [prior["weight"] for prior in priors if prior["name"] == "bn_statistics"]
    return weights[0] if weights else None


@span("bn-prior-setup")
def bn_prior_setup(results: Results) -> dict[str, Any]:
    measured = results.csv("bn_prior/measured/leaderboard.csv")
    trials = results.csv("bn_prior/measured/trials.csv")
    sweep = results.csv("bn_prior/weights/leaderboard.csv").copy()
    sweep["weight"] = sweep["attack_params"].map(_prior_weight)
    chosen = sweep.loc[sweep["psnr_mean"].idxmax(), "weight"]
    claim(
        {_prior_weight(text) for text in measured["attack_params"]} == {None, chosen},
        "the measured run does not use the weight the sweep chose",
    )
    tried = sweep[sweep["weight"].notna()].sort_values("weight")
    claim(len(tried) == 4, "the weight sweep no longer has four weights")
    without = sweep[sweep["weight"].isna()]["psnr_mean"].iloc[0]
    batches = trials.groupby(["attack_params", "seed", "batch_index"]).ngroups // len(measured)
    weights = [f"{weight:g}" for weight in tried["weight"]]
    db = [f"{psnr:.2f}" for psnr in tried["psnr_mean"]]
    seeds = trials["seed"].unique()
    sweep_seeds = results.csv("bn_prior/weights/trials.csv")["seed"].unique()
    claim(len(seeds) == 1 and len(sweep_seeds) == 1, "the prior's runs use several seeds")
    values = {
        "batches": NUMBER_WORDS[batches],
        "batch_size": trials["batch_size"].iloc[0],
        "seed": seeds[0],
        "chosen": f"{chosen:g}",
        "sweep_seed": sweep_seeds[0],
        "without": f"{without:.2f}",
    }
    for i, (weight, psnr) in enumerate(zip(weights, db, strict=True), start=1):
        values[f"weight_{i}"], values[f"db_{i}"] = weight, psnr
    return values


def _bn_prior_cells(results: Results) -> tuple[pd.Series, pd.Series]:
    board = results.csv("bn_prior/measured/leaderboard.csv")
    with_prior = board["attack_params"].map(_prior_weight).notna()
    return board[~with_prior].iloc[0], board[with_prior].iloc[0]


def _bn_prior_gain(results: Results) -> tuple[pd.Series, Any]:
    """Per image: PSNR with the prior minus without, and the paired t-test of the two."""
    trials = results.csv("bn_prior/measured/trials.csv").copy()
    trials["prior"] = trials["attack_params"].map(_prior_weight).notna()
    image = ["seed", "batch_index", "image_index"]
    plain = trials[~trials["prior"]].set_index(image)["psnr"]
    helped = trials[trials["prior"]].set_index(image)["psnr"]
    plain, helped = plain.align(helped)
    claim(not plain.isna().any() and not helped.isna().any(), "the two attacks saw other images")
    return helped - plain, stats.ttest_rel(helped, plain)


@block("bn-prior", refill=False)
def bn_prior(results: Results) -> dict[str, Any]:
    without, prior = _bn_prior_cells(results)
    gain, test = _bn_prior_gain(results)

    values = {"better": (gain > 0).sum(), "images": len(gain)}
    values.update(gain=f"{gain.mean():+.2f}", p=f"{test.pvalue:.2f}")
    for name, row in (("plain", without), ("prior", prior)):
        values[f"{name}_psnr"] = f"{row['psnr_mean']:.2f}"
        values[f"{name}_ci"] = f"{row['psnr_ci95']:.2f}"
        values[f"{name}_ssim"] = f"{row['ssim_mean']:.3f}"
        values[f"{name}_labels"] = acc(row["label_acc"])
    return values


@span("bn-prior-findings")
def bn_prior_findings(results: Results) -> dict[str, Any]:
    without, prior = _bn_prior_cells(results)
    gain, test = _bn_prior_gain(results)
    claim(test.pvalue >= 0.05, "the prior's effect is now significant: say how much it helps")
    claim(
        without["success_rate"] == 0 and prior["success_rate"] == 0,
        "an attack reconstructs an image of these batches",
    )
    around = {f"{row['psnr_mean']:.0f}" for row in (without, prior)}
    claim(len(around) == 1, "the two attacks' PSNRs are no longer about the same")
    return {"gain": f"{gain.mean():+.2f}", "p": f"{test.pvalue:.2f}", "db": around.pop()}
