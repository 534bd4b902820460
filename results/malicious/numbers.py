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
from leakbench.defenses.dpsgd import DPSGD
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


def _honest(frame: pd.DataFrame) -> pd.Series:
    """The summary rows of the honest-server runs beside the malicious ones (``*-dlg``)."""
    return frame["run"].str.endswith("-dlg")


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
    dlg_trials = dlg_trials[dlg_trials["attack"] == "dlg"]
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
    """The findings' numbers on the client's D-SNR check: the committed runs' flags, the
    kind thresholds' held-out false alarms and imprint flags, and the server that hides from
    the check."""
    frame = results.csv(MALICIOUS)
    served = frame[~_honest(frame)]
    malicious, trials = _weighted_flags(served)
    honest, honest_trials = _weighted_flags(frame[_honest(frame)])
    small = served[served["batch_size"] == 1]
    checked = served[served["flagged"].notna()]
    missed = {
        (row["run"], row["attack"]): round((1 - row["flagged"]) * row["trials"])
        for _, row in checked.iterrows()
        if row["flagged"] < 1
    }
    return dict(
        malicious=pct(malicious),
        trials=count(trials),
        caught=count(trials - sum(missed.values())),
        missed_where=listing(
            [f"{n} `{a}` trial{'' if n == 1 else 's'} of `{r}`" for (r, a), n in missed.items()]
        )
        or "none",
        honest=pct(honest),
        honest_trials=count(honest_trials),
        small_trials=count(small["trials"].sum()),
        **_kind_alarms(results),
        **_evasive(results),
    )


def _kind_alarms(results: Results) -> dict[str, str]:
    """The kind thresholds' false alarms and imprint flags on held-out seeds (families.csv)."""
    table = results.csv("malicious/families.csv")
    checked = table[table["batch_size"] >= 4]
    worst = checked.loc[checked["false_alarm_rate"].idxmax()]
    claim(worst["false_alarm_rate"] <= 0.05, "a family raises more than 5% false alarms")
    alarms, honest_n = int(checked["false_alarms"].sum()), int(checked["honest_trials"].sum())
    caught, imprint_n = int(checked["imprint_flagged"].sum()), int(checked["imprint_trials"].sum())
    low = checked.loc[checked["imprint_rate"].idxmin()]
    claim(low["imprint_rate"] >= 0.9, "a family's imprint models are flagged below 90%")
    kinds = results.csv("malicious/kinds.csv")
    claim((kinds[kinds["batch_size"] == 2]["threshold"] == math.inf).all(), "2 is checked")
    fresh = results.csv("malicious/fresh_families.csv")
    fresh = fresh[fresh["batch_size"] >= 4]
    over = fresh[fresh["false_alarm_rate"] > 0.05]
    fresh_low = fresh.loc[fresh["imprint_rate"].idxmin()]
    return dict(
        fresh_alarms=count(int(fresh["false_alarms"].sum())),
        fresh_n=count(int(fresh["honest_trials"].sum())),
        fresh_over=listing(
            [
                f"{r['false_alarms']} of {r['honest_trials']} `{r['family']}` models at "
                f"{r['batch_size']} examples ({r['trained_false_alarms']} of them trained)"
                for _, r in over.iterrows()
            ]
        )
        or "none",
        fresh_imprint=count(int(fresh["imprint_flagged"].sum())),
        fresh_imprint_n=count(int(fresh["imprint_trials"].sum())),
        fresh_low=f"`{fresh_low['family']}` at {fresh_low['batch_size']} "
        f"({fresh_low['imprint_flagged']} of {fresh_low['imprint_trials']})",
        kind_alarms=count(alarms),
        kind_n=count(honest_n),
        kind_worst=f"{worst['false_alarms']} of {worst['honest_trials']}",
        kind_worst_where=f"`{worst['family']}` at {worst['batch_size']}",
        kind_imprint=count(caught),
        kind_imprint_n=count(imprint_n),
        kind_imprint_rate=pct(caught / imprint_n, 1),
        kind_low=f"`{low['family']}` at {low['batch_size']} ({pct(low['imprint_rate'])})",
    )


def _evasive(results: Results) -> dict[str, str]:
    """The hidden imprint server against the lenet client of 64 digits (evasive.csv)."""
    table = results.csv("malicious/evasive.csv")
    plain = one(table, attack="imprint")
    hidden = table[table["attack"] == "hidden_imprint"].sort_values("crowd")
    unseen = hidden[hidden["flagged"] == 0]
    claim(not unseen.empty and plain["flagged"] == plain["trials"], "nothing hides, or plain does")
    best = unseen.loc[unseen["recovered"].idxmax()]
    claim(best["recovered"] < plain["recovered"], "hiding costs the server nothing")

    def share(row: pd.Series) -> str:
        interval = whole_range([100 * row["recovered_low"], 100 * row["recovered_high"]], "%")
        return f"{row['recovered']} of {row['images']} ({interval})"

    return dict(
        evasive_trials=count(plain["trials"]),
        evasive_plain=share(plain),
        evasive_plain_flagged=f"{plain['flagged']} of {plain['trials']}",
        evasive_crowd=f"{best['crowd']:g}",
        evasive_hidden=share(best),
        evasive_hidden_high=pct(best["flagged_high"]),
        evasive_threshold=f"{best['threshold']:g}",
        evasive_dsnr=f"{best['dsnr_max']:.2f}",
    )


@block("malicious-kinds", refill=False)
def malicious_kinds(results: Results) -> dict[str, Any]:
    """The D-SNR threshold of each layer kind by batch size (kinds.csv)."""
    table = results.csv("malicious/kinds.csv")
    lines = []
    for kind, part in table.groupby("kind"):
        cells = [f"{t:g}" for t in part.sort_values("batch_size")["threshold"]]
        models = part["calibration_models"].iloc[0]
        lines.append(table_row([f"{kind}", f"{part['margin'].iloc[0]:g}", *cells, models]))
    sizes = sorted(table["batch_size"].unique())
    head = table_row(["kind", "margin", *[str(b) for b in sizes], "calibrated on"])
    rule = table_row(["---"] * (len(sizes) + 3))
    return {"rows": "\n".join([head, rule, *lines])}


@block("malicious-families", refill=False)
def malicious_families(results: Results) -> dict[str, Any]:
    """The kind thresholds' held-out false alarms and imprint flags per family (families.csv)."""
    table = results.csv("malicious/families.csv")
    lines = []
    for _, row in table[table["batch_size"] >= 4].iterrows():
        alarms = whole_range([100 * row["false_alarm_low"], 100 * row["false_alarm_high"]], "%")
        caught = whole_range([100 * row["imprint_low"], 100 * row["imprint_high"]], "%")
        lines.append(table_row([
            f"`{row['family']}`", str(row["batch_size"]),
            f"{row['false_alarms']} of {row['honest_trials']} ({alarms})",
            f"{row['trained_false_alarms']} of {row['trained_trials']}"
            if row["trained_trials"] else "–",
            f"{row['imprint_flagged']} of {row['imprint_trials']} ({caught})",
        ]))  # fmt: skip
    return {"rows": "\n".join(lines)}


@block("malicious-evasive", refill=False)
def malicious_evasive(results: Results) -> dict[str, Any]:
    """The hiding server's detection and recovery (evasive.csv)."""
    table = results.csv("malicious/evasive.csv")
    lines = []
    for _, row in table.iterrows():
        flagged = whole_range([100 * row["flagged_low"], 100 * row["flagged_high"]], "%")
        got = whole_range([100 * row["recovered_low"], 100 * row["recovered_high"]], "%")
        lines.append(table_row([
            f"`{row['attack']}`", "–" if pd.isna(row["crowd"]) else f"{row['crowd']:g}",
            f"{row['flagged']} of {row['trials']} ({flagged})",
            f"{row['recovered']} of {row['images']} ({got})", pct(row["closed_form"]),
            f"{row['dsnr_median']:.3g} ({row['dsnr_max']:.3g}) against {row['threshold']:g}",
        ]))  # fmt: skip
    return {"rows": "\n".join(lines)}


@span("malicious-readme")
def malicious_readme(results: Results) -> dict[str, Any]:
    """The README's line on the malicious server."""
    resnet = _malicious_row(results, "cifar10-resnet18-b64")
    k16 = _malicious_row(results, "cifar10-convnet-k16")
    # The honest attack on the same setting: CIFAR-10, `convnet`, 16 clients.
    dlg = _malicious_row(results, "cifar10-convnet-k16-dlg", attack="dlg")
    claim(dlg["clients"] == k16["clients"], "the honest dlg run has other clients than imprint's")
    served = results.csv(MALICIOUS)
    served = served[~_honest(served) & served["flagged"].notna()]
    trials = int(served["trials"].sum())
    flagged = round(float((served["flagged"] * served["trials"]).sum()))
    low, high = exact_interval(flagged, trials)
    hidden = results.csv("malicious/evasive.csv")
    hidden = hidden[(hidden["attack"] == "hidden_imprint") & (hidden["flagged"] == 0)]
    claim(not hidden.empty, "no hidden_imprint setting passes the check")
    best = hidden.loc[hidden["recovered"].idxmax()]
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
        "hidden": f"{best['recovered'] / best['images']:.0%}",
        "hidden_trials": best["trials"],
        "hidden_batch": best["batch_size"],
    }
