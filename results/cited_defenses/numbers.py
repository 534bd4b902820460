"""The numbers of the generated passages on the defenses the literature cites (templates in
`passages/`, filled by `benchmarks/readme_numbers.py`)."""

from __future__ import annotations

import json
from typing import Any

import pandas as pd
from passages import (
    Results,
    acc,
    block,
    claim,
    decibels,
    listing,
    one,
    points,
    rate,
    recovered,
    span,
    table_row,
    trained_models,
)

CITED = "cited_defenses/soteria_precode"
MIXUP = "cited_defenses/mixup"
SOTERIA = ({"share": 0.4}, {"share": 0.8})
PRECODE = {"beta": 0.001, "size": 256}
MIXES = ({"alpha": 1.0, "mixed": 2}, {"alpha": 1.0, "mixed": 4})
FEATURES = {"match": "features", "noise": None}
LEARNED_NOISE = {"match": "features", "noise": "learn"}
PLAIN_DLG = {"match": "all", "noise": None, "mixing": None}
LEARNED_MIXING = {"mixing": "learn"}


def _cited(results: Results, run: str) -> pd.DataFrame:
    return results.csv(f"{run}/leaderboard.csv")


@span("cited-utility")
def cited_utility(results: Results) -> dict[str, Any]:
    epochs, rates, models = set(), set(), set()
    for run in (CITED, MIXUP):
        utility = results.csv(f"{run}/utility.csv")
        epochs |= set(utility["epochs"])
        rates |= set(utility["learning_rates"])
        models.add(trained_models(utility))
    claim(len(epochs) == len(rates) == len(models) == 1, "the cited runs train differently")
    nones = {
        (row["test_accuracy"], row["test_accuracy_ci95"])
        for row in (
            one(_cited(results, run), attack="dlg", defense="none", **PLAIN_DLG)
            for run in (CITED, MIXUP)
        )
    }
    claim(len(nones) == 1, "the cited runs' undefended models differ")
    accuracy, half_width = nones.pop()
    searched = listing([rate(value) for value in json.loads(rates.pop())])
    return {
        "epochs": epochs.pop(),
        "rates": searched,
        "seeds": models.pop(),
        "accuracy": acc(accuracy),
        "half_width": f"{100 * half_width:.1f}",
    }


def _cited_rows(results: Results) -> list[tuple[str, pd.Series, str, str]]:
    """Per row of the table: the defense's label, its `dlg` cell, and the texts of the paper's
    attack and of the adaptive one."""
    board, mixup = _cited(results, CITED), _cited(results, MIXUP)

    def found(row: pd.Series) -> str:
        return f"{decibels(row['psnr_mean'])} dB, {recovered(row)} of {row['n']}"

    def row(label: str, cells: pd.DataFrame, defense: str, params: dict, adaptive: dict) -> tuple:
        """The plain dlg's cell and what each adaptive variant (its wording -> its params)
        found, joined by semicolons."""
        dlg = one(cells, attack="dlg", defense=defense, params=params, **PLAIN_DLG)
        found_by = "; ".join(
            f"{words}: {found(one(cells, attack='dlg', defense=defense, params=params, **kw))}"
            for words, kw in adaptive.items()
        )
        return (label, dlg, found(dlg), found_by)

    features, noise = '`match = "features"`', 'with `noise = "learn"`'
    rows = [
        row(f"`soteria` share {p['share']}", board, "soteria", p, {features: FEATURES})
        for p in SOTERIA
    ]
    precode = {f"{features} alone": FEATURES, noise: LEARNED_NOISE}
    rows.append(row(f"`precode` size {PRECODE['size']}", board, "precode", PRECODE, precode))
    mixing = {'`mixing = "learn"`': LEARNED_MIXING}
    rows += [row(f"`mixup` {p['mixed']}", mixup, "mixup", p, mixing) for p in MIXES]
    return rows


@block("cited-defenses", refill=False)
def cited_defenses(results: Results) -> dict[str, Any]:
    lines = []
    for label, row, paper, adaptive in _cited_rows(results):
        lines.append(
            table_row(
                [
                    label,
                    f"{acc(row['test_accuracy'])} ({points(row['accuracy_drop'])})",
                    paper,
                    adaptive,
                    row["verdict"],
                ]
            )
        )
    return {"rows": "\n".join(lines)}


@block("cited-findings")
def cited_findings(results: Results) -> dict[str, Any]:
    board, mixup = _cited(results, CITED), _cited(results, MIXUP)
    none = one(board, attack="dlg", defense="none", **PLAIN_DLG)
    for params in SOTERIA:
        dlg = one(board, attack="dlg", defense="soteria", params=params, **PLAIN_DLG)
        adaptive = one(board, attack="dlg", defense="soteria", params=params, **FEATURES)
        claim(dlg["success_rate"] == 0, f"DLG recovers images under Soteria {params}")
        claim(
            abs(dlg["accuracy_drop"]) <= max(dlg["test_accuracy_ci95"], none["test_accuracy_ci95"]),
            f"Soteria {params} has a measurable cost",
        )
        claim(adaptive["success_rate"] == 1, f"the features attack misses images of {params}")
    dlg = one(board, attack="dlg", defense="precode", params=PRECODE, **PLAIN_DLG)
    alone = one(board, attack="dlg", defense="precode", params=PRECODE, **FEATURES)
    noise = one(board, attack="dlg", defense="precode", params=PRECODE, **LEARNED_NOISE)
    claim(dlg["success_rate"] == 0, "DLG recovers images under PRECODE")
    claim(alone["success_rate"] == 0, "the features attack alone now breaks PRECODE")
    claim(noise["success_rate"] == 1, "learning PRECODE's noise no longer recovers every image")
    pairs, fours = (
        one(mixup, attack="dlg", defense="mixup", params=params, **PLAIN_DLG) for params in MIXES
    )
    pairs_learned, fours_learned = (
        one(mixup, attack="dlg", defense="mixup", params=params, **LEARNED_MIXING)
        for params in MIXES
    )
    claim(pairs["success_rate"] == 0 and fours["success_rate"] == 0, "DLG recovers mixed images")
    claim(recovered(pairs_learned) > 0, "learning the mixing of pairs recovers no digit")
    claim(recovered(fours_learned) == 0, "learning the mixing of four recovers a digit exactly")
    return dict(
        alone_db=decibels(alone["psnr_mean"]),
        noise_n=noise["n"],
        precode_cost=points(dlg["accuracy_drop"]),
        pairs_db=decibels(pairs["psnr_mean"]),
        fours_db=decibels(fours["psnr_mean"]),
        pairs_found=recovered(pairs_learned),
        pairs_n=pairs_learned["n"],
        pairs_verdict=pairs_learned["verdict"],
        fours_leaked=round(fours_learned["leaked_rate"] * fours_learned["n"]),
        fours_n=fours_learned["n"],
        fours_verdict=fours_learned["verdict"],
        fours_cost=points(fours["accuracy_drop"]),
    )
