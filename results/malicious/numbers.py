"""The numbers of the generated passages on the malicious server (templates in `passages/`, filled
by `benchmarks/readme_numbers.py`)."""

from __future__ import annotations

import json
import math
from typing import Any

import pandas as pd
from passages import (
    Results,
    block,
    claim,
    count,
    decibels,
    listing,
    one,
    pct,
    select,
    span,
    table_row,
    whole_range,
)
from scipy import optimize, stats

from leakbench.components.leakage import exact_interval
from leakbench.outputs.naming import defense_label

MALICIOUS = "malicious/summary.csv"
KAPPA = 1e-3  # the prior of benchmarks/malicious_summary.py's accounting bound
# The summary's runs in the order the table lists them.
MALICIOUS_RUNS = (
    "digits-b1", "digits-b4", "digits-b16", "digits-b64", "digits-b256", "digits-k4",
    "digits-k16", "digits-k16-dlg", "digits-b64-dlg", "digits-b64-fedavg", "cifar10-convnet-b64",
    "cifar10-resnet18-b64", "cifar10-convnet-k4", "cifar10-convnet-k16", "cifar10-convnet-k16-dlg",
    "cifar10-lenet-b64",
    "sa-k2", "sa-k4", "sa-k8", "sa-k16",
)  # fmt: skip


def _malicious_row(
    results: Results, run: str, attack: str = "imprint", defense: str = "none", **params: Any
) -> pd.Series:
    frame = results.csv(MALICIOUS)
    return one(frame[frame["run"] == run], attack=attack, defense=defense, params=params)


def _count(row: pd.Series) -> int:
    return round(row["recovered"] * row["images"])


def _recovered(row: pd.Series) -> str:
    """ "k of n (low-high%)": the images recovered exactly and the 95% interval of the share."""
    interval = whole_range([100 * row["recovered_low"], 100 * row["recovered_high"]], "%")
    return f"{_count(row)} of {row['images']} ({interval})"


def _closed_form_interval(row: pd.Series) -> tuple[int, int]:
    """The binomial 95% interval of the count the closed form predicts."""
    low, high = stats.binom.interval(0.95, int(row["images"]), float(row["predicted"]))
    return int(low), int(high)


def _inside(row: pd.Series) -> str:
    """ "inside" or "outside" the closed form's binomial 95% interval, with the interval."""
    low, high = _closed_form_interval(row)
    where = "inside" if low <= _count(row) <= high else "outside"
    return f"{where} its binomial 95% interval ({low}-{high})"


def _optional_pct(value: float) -> str:
    return "–" if pd.isna(value) else pct(value)


@block("malicious-table", refill=False)
def malicious_table(results: Results) -> dict[str, Any]:
    """Every cell of the committed malicious-server runs and of the honest runs beside them."""
    frame = results.csv(MALICIOUS)
    lines = []
    for run in MALICIOUS_RUNS:
        rows = frame[frame["run"] == run]
        claim(not rows.empty, f"results/malicious/{run} is missing from the summary")
        for _, row in rows.iterrows():
            lines.append(table_row([
                f"`{run}`", row["model"], f"{row['clients']} x {row['batch_size']}",
                defense_label(row["defense"], row["defense_params"]), f"`{row['attack']}`",
                _recovered(row), _optional_pct(row["predicted"]), pct(row["psnr60"]),
                _optional_pct(row["flagged"]),
            ]))  # fmt: skip
    return {"rows": "\n".join(lines)}


def _share(row: pd.Series) -> str:
    return f"{pct(row['recovered'])} (closed form {pct(row['predicted'])})"


def _curve(results: Results, run: str, attack: str, defense: str, parameter: str) -> str:
    """ "value: share, ..." of one noise defense's sweep, weakest noise first."""
    frame = results.csv(MALICIOUS)
    rows = select(frame[frame["run"] == run], attack=attack, defense=defense)
    claim(not rows.empty, f"{run} has no {defense} rows for {attack}")
    points = sorted(
        (json.loads(text)[parameter], share)
        for text, share in zip(rows["defense_params"], rows["recovered"], strict=True)
    )
    return ", ".join(f"{value:g}: {pct(share)}" for value, share in points)


def _weighted_flags(rows: pd.DataFrame) -> tuple[float, int]:
    """The share of the trials of ``rows`` (summary cells) that the client flags, and how many
    trials there are; cells whose clients have nothing to check are left out."""
    rows = rows[rows["flagged"].notna()]
    trials = int(rows["trials"].sum())
    return float((rows["flagged"] * rows["trials"]).sum() / trials), trials


def _where_closed_form(rows: list[pd.Series]) -> tuple[list[str], list[str]]:
    """The batch sizes whose count lies inside the closed form's interval, and below it."""
    inside, below = [], []
    for row in rows:
        low, high = _closed_form_interval(row)
        claim(_count(row) <= high, f"batch {row['batch_size']} above its closed form")
        (inside if _count(row) >= low else below).append(str(row["batch_size"]))
    return inside, below


def _accounting(results: Results) -> dict[str, str]:
    """The DP-SGD accounting's reconstruction bound beside the measured shares, and its prior."""
    from leakbench.defenses.dpsgd import DPSGD

    frame = results.csv(MALICIOUS)
    dp = frame[frame["defense"] == "dpsgd"]
    claim(bool(dp["bound"].notna().all()), "a dpsgd cell has no accounting bound")
    claim(bool((dp["recovered_low"] <= dp["bound"]).all()), "a dpsgd share exceeds its bound")
    kappa = KAPPA

    def bound(z: float) -> float:
        return DPSGD(norm=1.0, noise_multiplier=z).reconstruction_bound(kappa)

    z_high = max(z for z in (0.05, 0.1, 0.15) if bound(z) >= 0.99)
    z_half = optimize.brentq(lambda z: bound(z) - 0.5, 0.1, 1.0, xtol=1e-3)
    imprint = dp[dp["attack"] == "imprint"]
    onsets = []  # per run, the weakest noise at which imprint reads nothing
    for _, rows in imprint.groupby("run"):
        noise = [json.loads(text)["noise_multiplier"] for text in rows["defense_params"]]
        shares = zip(noise, rows["recovered"], strict=True)
        onsets.append(min(z for z, share in shares if share == 0))
    zero = max(onsets)
    prior = results.csv("malicious/prior.csv")
    claim(bool((prior["near"] == 0).all()), "a public image is within MSE 1e-3 of a private one")
    claim(bool((prior["share_high"] < kappa).all()), "the prior is not generous")
    pairs = prior.drop_duplicates("dataset")
    named = {"digits": "digits"}
    prior_text = listing([
        f"{count(row['near'])} of the {count(row['pairs'])} (private, public) pairs of "
        f"{named.get(row['dataset'], 'CIFAR-10')} lie within MSE 1e-3 (95% upper bound "
        f"{row['share_high']:.1g})" for _, row in pairs.iterrows()
    ])  # fmt: skip
    norms = {("digits" if row["dataset"] == "digits" else "cifar"): row["norm_median"]
             for _, row in prior.iterrows()}  # fmt: skip
    floors = {name: math.sqrt(1e-3) / norm for name, norm in norms.items()}
    return {
        "digits_norm": f"{norms['digits']:.1f}",
        "cifar_norm": f"{norms['cifar']:.0f}",
        "digits_floor": f"{floors['digits']:.3f}",
        "cifar_floor": f"{floors['cifar']:.4f}",
        "kappa": f"{kappa:g}",
        "prior": prior_text,
        "zero": f"{zero:g}",
        "z_high": f"{z_high:g}",
        "bound_half": "50%",
        "z_half": f"{z_half:.2f}",
        "bound_one": pct(bound(1.0), 1),
        "gap": f"{z_half / zero:.0f}",
    }


@block("malicious-findings")
def malicious_findings(results: Results) -> dict[str, Any]:
    """What the committed malicious-server runs show, each claim derived from summary.csv."""
    convnet = _malicious_row(results, "cifar10-convnet-b64")
    resnet = _malicious_row(results, "cifar10-resnet18-b64")
    k16, k4 = (_malicious_row(results, f"cifar10-convnet-k{k}") for k in (16, 4))
    digits64 = _malicious_row(results, "digits-b64")
    digits_k16 = _malicious_row(results, "digits-k16")
    dlg_k16 = _malicious_row(results, "digits-k16-dlg", attack="dlg")
    dlg64 = _malicious_row(results, "digits-b64-dlg", attack="dlg")
    dlg_cifar = _malicious_row(results, "cifar10-convnet-k16-dlg", attack="dlg")
    dlg_trials = results.csv("malicious/cifar10-convnet-k16-dlg/trials.csv")
    claim(set(dlg_trials["stop_reason"]) == {"stalled"}, "the CIFAR-10 dlg did not stall")
    fedavg = _malicious_row(results, "digits-b64-fedavg")
    trap = _malicious_row(results, "digits-b64", attack="trap_weights")
    trap_cifar = _malicious_row(results, "cifar10-convnet-b64", attack="trap_weights")
    trap_fedavg = _malicious_row(results, "digits-b64-fedavg", attack="trap_weights")
    sweep = [_malicious_row(results, f"digits-b{b}") for b in (1, 4, 16, 64, 256)]
    inside, below = _where_closed_form(sweep)
    claim(
        all(_count(r) < _closed_form_interval(r)[0] for r in (trap, trap_cifar)),
        "trap_weights reaches its closed form",
    )
    claim(_count(dlg_k16) == 0 and _count(dlg64) == 0, "the honest dlg recovers images")
    claim(_count(dlg_cifar) == 0, "the honest dlg recovers CIFAR-10 images")
    exact = [row["psnr60"] / row["recovered"] for row in (convnet, resnet)]
    bounds = _accounting(results)
    for run in ("digits-b64", "cifar10-lenet-b64"):
        board = results.csv(f"malicious/{run}/leaderboard.csv")
        dp = board[(board["defense"] == "dpsgd") & board["strongest"].astype(bool)]
        claim(not (dp["verdict"] == "holds").any(), f"a DP-SGD cell of {run} holds")
    return dict(
        convnet=_recovered(convnet),
        resnet=_recovered(resnet),
        convnet_where=_inside(convnet),
        resnet_where=_inside(resnet),
        convnet_p=pct(convnet["predicted"]),
        exact=listing([pct(share) for share in exact]),
        k16=_recovered(k16),
        k16_where=_inside(k16),
        k4=_recovered(k4),
        digits_k16=_recovered(digits_k16),
        same="the same count as" if _count(digits_k16) == _count(digits64) else "against",
        digits64=_recovered(digits64),
        dlg_k16=_recovered(dlg_k16),
        dlg_k16_psnr=decibels(dlg_k16["psnr_median"]),
        dlg64=_recovered(dlg64),
        dlg_cifar=_recovered(dlg_cifar),
        dlg_cifar_psnr=decibels(dlg_cifar["psnr_median"]),
        dlg_cifar_iterations=count(dlg_trials["iterations"].max()),
        sweep=", ".join(f"{row['batch_size']}: {_share(row)}" for row in sweep),
        inside=listing(inside),
        below=listing(below),
        trap=_recovered(trap),
        trap_cifar=_recovered(trap_cifar),
        fedavg=_recovered(fedavg),
        trap_fedavg=_recovered(trap_fedavg),
        digits64_short=pct(digits64["recovered"]),
        trap_short=pct(trap["recovered"]),
        gauss_digits=_curve(results, "digits-b64", "imprint", "gaussian", "sigma"),
        gauss_cifar=_curve(results, "cifar10-convnet-b64", "imprint", "gaussian", "sigma"),
        dp_digits=_curve(results, "digits-b64", "imprint", "dpsgd", "noise_multiplier"),
        dp_cifar=_curve(results, "cifar10-lenet-b64", "imprint", "dpsgd", "noise_multiplier"),
        **bounds,
        **_detection(results),
    )


def _detection(results: Results) -> dict[str, Any]:
    """The findings' numbers on the client's D-SNR check: the share of malicious and honest
    models flagged, and the held-out false alarms of its calibrated thresholds."""
    frame = results.csv(MALICIOUS)
    malicious, trials = _weighted_flags(frame[(frame["attack"] != "dlg")])
    honest, honest_trials = _weighted_flags(frame[frame["attack"] == "dlg"])
    small = frame[(frame["attack"] != "dlg") & (frame["batch_size"] == 1)]
    calibration = results.csv("malicious/calibration.csv")
    calibrated = calibration[calibration["server"] == "honest"]
    claim(not calibrated["flagged"].any(), "the thresholds flag an honest calibration model")
    held = results.csv("malicious/held_out.csv")
    claim(set(held["seed"]).isdisjoint(calibration["seed"]), "held-out seeds were calibrated")
    checked = held[held["batch_size"] > 2]  # batches of 2 are never flagged (threshold inf)
    held_honest = checked[checked["server"] == "honest"]
    held_imprint = checked[checked["server"] == "malicious"]
    flagged_honest = int(held_honest["flagged"].sum())
    alarms = held_honest[held_honest["flagged"].astype(bool)]
    claim(alarms["model"].str.startswith("resnet").all(), "a held-out non-ResNet is flagged")
    per_batch = calibrated.groupby("batch_size").size()
    claim(per_batch.nunique() == 1, "the calibration has unequal models per batch size")
    per_batch_n = int(per_batch.iloc[0])
    interval = stats.binomtest(flagged_honest, len(held_honest)).proportion_ci(0.95)
    claim(interval.low <= 1 / (per_batch_n + 1), "held-out false alarms above the stated rate")
    held_high = interval.high
    return dict(
        malicious=pct(malicious),
        trials=count(trials),
        honest=pct(honest),
        honest_trials=count(honest_trials),
        calibrated=count(len(calibrated)),
        held_out=count(len(held_honest)),
        per_batch=count(per_batch_n),
        per_batch_plus=count(per_batch_n + 1),
        nominal=pct(1 / (per_batch_n + 1), 1),
        held_models=listing([f"`{m}` {n}" for m, n in alarms["model"].value_counts().items()]),
        held_flagged=count(flagged_honest),
        held_rate=pct(flagged_honest / len(held_honest), 1),
        held_high=pct(held_high, 1),
        held_malicious=pct(held_imprint["flagged"].mean()),
        held_malicious_n=count(len(held_imprint)),
        small_trials=count(small["trials"].sum()),
    )


@span("malicious-readme")
def malicious_readme(results: Results) -> dict[str, Any]:
    """The README's line on the malicious server."""
    resnet = _malicious_row(results, "cifar10-resnet18-b64")
    k16 = _malicious_row(results, "cifar10-convnet-k16")
    # The honest attack on the same setting: CIFAR-10, `convnet`, 16 clients.
    dlg = _malicious_row(results, "cifar10-convnet-k16-dlg", attack="dlg")
    claim(dlg["clients"] == k16["clients"], "the honest dlg run has other clients than imprint's")
    frame = results.csv(MALICIOUS)
    share, trials = _weighted_flags(frame[frame["attack"] != "dlg"])
    flagged = round(share * trials)
    low, high = exact_interval(flagged, trials)
    return {
        "resnet": _count(resnet),
        "resnet_images": resnet["images"],
        "k16": _count(k16),
        "k16_images": k16["images"],
        "dlg": _count(dlg),
        "dlg_images": dlg["images"],
        "flagged": flagged,
        "trials": trials,
        "low": f"{100 * low:.1f}",
        "high": f"{100 * high:.1f}",
    }
