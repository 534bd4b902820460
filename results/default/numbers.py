"""The numbers of the generated passages on the default run (templates in `passages/`, filled by
`benchmarks/readme_numbers.py`)."""

from __future__ import annotations

import json
import re
from typing import Any

import pandas as pd
from passages import (
    COSINE,
    DEFAULT,
    KEPT,
    NUMBER_WORDS,
    PLAIN,
    ReadmeError,
    Results,
    StaleClaim,
    block,
    claim,
    count,
    decibels,
    default_board,
    default_trials,
    default_utility,
    listing,
    one,
    points,
    rate,
    recovered,
    sci,
    select,
    span,
    trained_models,
)

from leakbench.outputs.summary import headline_table
from leakbench.outputs.verdicts import UNCONVERGED


def defense_name(defense: str, params: dict[str, Any], short: bool = False) -> str:
    """How the README's prose names a defense configuration of the default run; `short` leaves
    out what the item before it in a list, of the same defense, already said."""
    if defense == "dpsgd":
        noise = params["noise_multiplier"]
        return f"at {noise}" if short else f"DP-SGD at noise {noise}"
    if defense == "prune":
        share = f"{params['ratio']:.0%}"
        return share if short else f"pruning {share}"
    if defense == "gaussian":
        return f"Gaussian std {sci(params['sigma'])}"
    if defense == "laplace":
        return f"Laplace b = {sci(params['b'])}"
    if defense == "relative_noise":
        return f"`relative_noise` {params['sigma']}"
    if defense == "topk":
        return f"top-k at {params['fraction']:.0%}"
    if defense == "clip":
        return "clipping"
    if defense == "chain" and [step["name"] for step in params["steps"]] == ["clip", "gaussian"]:
        return "the clip-and-noise chain"
    if defense in ("int8", "fp16") and not params:
        return defense
    if defense == "none":
        return "`none`"
    raise StaleClaim(f"the README has no name for the defense {defense} {params}")


def configurations(board: pd.DataFrame) -> pd.DataFrame:
    """One row per defense configuration: its rank and verdict, its worst case (`worst`: the
    highest success rate of any attack), its share of images leaked over the suite (`leaked`,
    what the verdict reads: the per-image union, `k` of `n`), its strongest attack's mean PSNR
    (`psnr`) and its prose name (`name`)."""
    rows = []
    for (defense, params), cells in board.groupby(
        ["defense", "defense_params"], sort=False, dropna=False
    ):
        strongest = cells[cells["strongest"].astype(bool)]
        if len(strongest) != 1:
            raise ReadmeError(f"{defense} {params}: {len(strongest)} strongest attacks")
        rows.append(
            {
                "defense": defense,
                "params": json.loads(params),
                "rank": cells["rank"].iloc[0],
                "verdict": cells["verdict"].iloc[0],
                "note": cells["verdict_note"].iloc[0],
                "worst": cells["success_rate"].max(),
                "leaked": cells["suite_leaked"].iloc[0] / cells["suite_n"].iloc[0],
                "k": int(cells["suite_leaked"].iloc[0]),
                "psnr": strongest["psnr_mean"].iloc[0],
                "n": int(cells["suite_n"].iloc[0]),
                "name": defense_name(defense, json.loads(params)),
            }
        )
    table = pd.DataFrame(rows)
    claim(table["name"].is_unique, "two defense configurations have the same name in prose")
    return table


def names(configs: pd.DataFrame) -> list[str]:
    """Prose names in order, short where the one before is of the same defense."""
    out, before = [], None
    for _, config in configs.iterrows():
        same = config["defense"] == before and config["defense"] in ("dpsgd", "prune")
        out.append(defense_name(config["defense"], config["params"], short=same))
        before = config["defense"]
    return out


def _recipe(utility: pd.DataFrame, recipe: str) -> tuple[int, str]:
    """The epochs and the searched rates ("1e-2 and 3e-2") of one training recipe."""
    rows = utility[utility["recipe"] == recipe]
    claim(rows["epochs"].nunique() == 1, f"the {recipe} recipe trained for different epochs")
    claim(rows["learning_rates"].nunique() == 1, f"the {recipe} recipe searched different rates")
    rates = json.loads(rows["learning_rates"].iloc[0])
    return int(rows["epochs"].iloc[0]), listing([rate(value) for value in rates])


@span("default-setup")
def default_setup(results: Results) -> dict[str, Any]:
    board, utility = default_board(results), default_utility(results)
    attacks = {
        (
            row["attack"],
            json.loads(row["attack_params"]).get("match"),
            json.loads(row["attack_params"]).get("loss"),
        )
        for _, row in board.iterrows()
    }
    claim(
        # The suite's families and the adaptive variants the defenses declare.
        {
            ("dlg", "all", "l2"),
            ("idlg", "all", "l2"),
            ("ig", "all", None),
            ("idlg", "kept", "l2"),
            ("idlg", "all", "cosine"),
            ("idlg", "all", "l1"),
        }
        <= attacks,
        "the default run no longer attacks with the suite's families and adaptive variants",
    )
    claim(set(board["protocol"]) == {2}, "the default run no longer follows protocol 2")
    claim(board["suite_n"].nunique() == 1, "the default run's defenses met different images")
    claim(
        set(utility.loc[utility["recipe"] == "dp", "defense"]) == {"dpsgd"},
        "the DP recipe trained other defenses than DP-SGD",
    )
    epochs, rates = _recipe(utility, "default")
    dp_epochs, dp_rates = _recipe(utility, "dp")
    claim(dp_epochs == epochs, "the DP recipe trained for other epochs than every other defense")
    return {
        "images": int(board["suite_n"].iloc[0]),
        "configurations": len(configurations(board)),
        "seeds": trained_models(utility),
        "epochs": epochs,
        "rates": rates,
        "dp_rates": dp_rates,
    }


@span("default-size")
def default_size(results: Results) -> dict[str, Any]:
    trials, utility = default_trials(results), default_utility(results)
    searched = utility["learning_rates"].map(lambda text: len(json.loads(text)))
    claim(searched.nunique() == 1, "the default run's grids hold different numbers of rates")
    tried = utility["rates_tried"].map(lambda text: len(json.loads(text)))
    extensions = results.config(DEFAULT)["training"]["edge_extensions"]
    claim(((tried >= searched) & (tried <= searched + extensions)).all(), "a search tried too many")
    in_flight = results.config(DEFAULT)["parallel_trials"]
    return {
        "attacks": count(len(trials)),
        "in_flight": in_flight,
        "trainings": len(utility),
        "rates": searched.iloc[0],
        "extensions": extensions,
        "models": count(int(tried.sum())),
    }


@span("default-attack-seconds")
def default_attack_seconds(results: Results) -> dict[str, Any]:
    seconds = round(default_trials(results)["seconds"].sum())
    return {"time": f"{seconds // 60} min {seconds % 60} s" if seconds >= 60 else f"{seconds} s"}


@block("default-leaderboard", refill=False)
def default_leaderboard(results: Results) -> dict[str, Any]:
    return {"leaderboard": headline_table(default_board(results))}


@span("default-models")
def default_models(results: Results) -> dict[str, Any]:
    return {"seeds": trained_models(default_utility(results))}


@span("default-delta")
def default_delta(results: Results) -> dict[str, Any]:
    deltas = default_board(results)["delta"].dropna().unique()
    claim(len(deltas) == 1, "the default run's DP guarantees are at different deltas")
    return {"delta": sci(deltas[0])}


@block("default-findings")
def default_findings(results: Results) -> dict[str, Any]:
    board, trials, utility = (
        default_board(results),
        default_trials(results),
        default_utility(results),
    )
    configs = configurations(board).set_index("name", drop=False)

    def cell(attack: str, defense: str, params: dict, options: dict | None = None) -> pd.Series:
        return one(board, attack=attack, defense=defense, params=params, **(options or {}))

    def config(defense: str, params: dict) -> pd.Series:
        return configs.loc[defense_name(defense, params)]

    def count(defense: str, params: dict) -> str:
        row = config(defense, params)
        return f"{row['k']} of {row['n']}"

    def cost(defense: str, params: dict) -> str:
        return points(select(board, defense=defense, params=params)["accuracy_drop"].iloc[0])

    n = int(board["suite_n"].iloc[0])
    idlg = cell("idlg", "none", {}, PLAIN)
    claim(recovered(idlg) == n, "iDLG no longer recovers every image exactly without a defense")
    dlg = cell("dlg", "none", {}, PLAIN)
    plain = select(trials, attack="dlg", defense="none", params={}, **PLAIN)
    missed = plain[plain["mse"] > 1e-3]
    claim(len(missed) == n - recovered(dlg), "DLG's trials and its leaderboard row differ")
    claim((missed["converged"] == 0).all(), "the judge finds a missed DLG image converged")
    ig = cell("ig", "none", {}, {"match": "all"})
    claim(ig["leaked_rate"] == 0 and not ig["vouched"], "ig now breaks the undefended digits")
    claim(select(board, attack="ig").shape[0] == len(select(board, attack="ig", defense="none")),
          "ig met a defense although it did not break none")  # fmt: skip
    g2, g1 = {"sigma": 0.01}, {"sigma": 0.1}
    claim((select(board, defense="gaussian", params=g2)["success_rate"] == 0).all(),
          "an attack recovers images exactly under Gaussian noise of std 1e-2")  # fmt: skip
    p5, p9, tk = {"ratio": 0.5}, {"ratio": 0.9}, {"fraction": 0.1}
    clip = {"norm": 0.1}
    dp10, dp05 = {"noise_multiplier": 1.0, "norm": 1.0}, {"noise_multiplier": 0.5, "norm": 1.0}
    dp = [config("dpsgd", p) for p in (dp10, dp05)]
    claim(all(row["verdict"] == UNCONVERGED for row in dp), "DP-SGD is no longer inconclusive")
    dp_models = utility[utility["defense"] == "dpsgd"]
    claim(set(dp_models["optimizer"]) == {"sgd"}, "the DP recipe no longer trains with SGD")
    return dict(
        **_verdicts(configs, trials, n),
        n=n,
        dlg=recovered(dlg),
        missed=NUMBER_WORDS[len(missed)],
        losses=listing([f"{loss:.2f}" for loss in missed["loss"]]),
        ig_db=decibels(ig["psnr_mean"]),
        g2_db=decibels(select(board, defense="gaussian", params=g2)["psnr_mean"].max()),
        g2=count("gaussian", g2),
        g2_cost=cost("gaussian", g2),
        g1=count("gaussian", g1),
        g1_v=config("gaussian", g1)["verdict"],
        g1_cost=cost("gaussian", g1),
        p9_plain=f"{recovered(cell('idlg', 'prune', p9, PLAIN))} of {n}",
        tk_plain=f"{recovered(cell('idlg', 'topk', tk, PLAIN))} of {n}",
        p5_kept=f"{recovered(cell('idlg', 'prune', p5, KEPT))} of {n}",
        p9_kept=f"{recovered(cell('idlg', 'prune', p9, KEPT))} of {n}",
        tk_kept=f"{recovered(cell('idlg', 'topk', tk, KEPT))} of {n}",
        clip_plain=f"{recovered(cell('idlg', 'clip', clip, PLAIN))} of {n}",
        clip_cos=f"{recovered(cell('idlg', 'clip', clip, COSINE))} of {n}",
        dp10=count("dpsgd", dp10),
        dp05=count("dpsgd", dp05),
        dp_attacks=NUMBER_WORDS[len(select(board, defense="dpsgd", params=dp10))],
        dp10_cost=cost("dpsgd", dp10),
        dp05_cost=cost("dpsgd", dp05),
        dp10_eps=f"{select(board, defense='dpsgd', params=dp10)['epsilon'].iloc[0]:.1f}",
        dp05_eps=f"{select(board, defense='dpsgd', params=dp05)['epsilon'].iloc[0]:.1f}",
    )


def _unproven(note: str) -> int:
    """The images without convergence evidence that an inconclusive verdict's note names."""
    found = re.search(r"; (\d+) of \d+ images without convergence evidence", note)
    claim(found is not None, f"an inconclusive note no longer counts its images: {note}")
    return int(found.group(1)) if found else 0


def _verdicts(configs: pd.DataFrame, trials: pd.DataFrame, n: int) -> dict[str, Any]:
    """The findings' numbers on the judge's escalations and on the verdicts of `n` images."""
    escalated = trials[trials["escalations"] > 0].drop_duplicates(["seed", "batch_index", "attack",
                                                                    "attack_params", "defense",
                                                                    "defense_params"])  # fmt: skip
    unsure = configs[configs["verdict"] == UNCONVERGED]
    leaks = configs[configs["verdict"] == "leaks"]
    broken = configs[configs["verdict"] == "broken"]
    claim(
        set(configs["verdict"]) == {UNCONVERGED, "leaks", "broken", "baseline"},
        "the default run's verdicts are no longer inconclusive, leaks, broken and the baseline",
    )
    claim((unsure["k"] == 0).all(), "an inconclusive configuration of the default run leaked")
    claim(len(leaks) == 1 and leaks["defense"].iloc[0] == "chain", "the chain no longer leaks")
    unproven = [_unproven(note) for note in unsure["note"]]
    return dict(
        esc=len(escalated),
        esc_conv=int((escalated["converged"] == 1).sum()),
        unsure=NUMBER_WORDS[len(unsure)],
        unsure_names=listing(names(unsure)),
        unproven=f"{min(unproven)} to {max(unproven)}",
        chain=f"{leaks['k'].iloc[0]} of {n}",
        broken=len(broken),
    )
