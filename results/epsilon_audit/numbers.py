"""The numbers of the generated passages on the measured privacy (epsilon audit) (templates in
`passages/`, filled by `benchmarks/readme_numbers.py`)."""

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
    one,
    sci,
    select,
    span,
)

from leakbench.outputs.naming import defense_label

AUDIT_RUN = "epsilon_audit/digits-lenet"


def _audit_rows(results: Results, defense: str, key: str) -> pd.DataFrame:
    """A committed audit's rows of one defense, ordered by the parameter it sweeps."""
    rows = select(results.csv(f"{AUDIT_RUN}/epsilon_audit.csv"), defense=defense)
    claim(not rows.empty, f"no {defense} rows in the committed epsilon audit")
    order = rows["defense_params"].map(lambda text: json.loads(text)[key])
    return rows.assign(_x=order).sort_values("_x")


def _at_cap(row: pd.Series) -> bool:
    return bool(row["epsilon_audit"] >= row["epsilon_audit_cap"] - 0.05)


@block("epsilon-audit-findings")
def epsilon_audit_findings(results: Results) -> dict[str, Any]:
    """What the committed epsilon audit shows, from its epsilon_audit.csv."""
    audit = results.csv(f"{AUDIT_RUN}/epsilon_audit.csv")
    claim(not (audit["audit"] == "failed").any(), "a committed audit failed")
    rounds = int(audit["rounds"].iloc[0])
    cap = float(audit["epsilon_audit_cap"].max())
    confidence = float(audit["epsilon_audit_confidence"].iloc[0])
    none = one(audit, defense="none")
    claim(_at_cap(none), "none is below the ceiling")
    dp = _audit_rows(results, "dpsgd", "noise_multiplier")
    norm = json.loads(dp["defense_params"].iloc[0])["norm"]
    dp_parts = [
        f"z = {row['_x']:g}: {row['epsilon_audit']:.2f} against {row['epsilon_update']:.2f} "
        f"({row['epsilon_update'] / row['epsilon_audit']:.1f} times less)"
        for _, row in dp.iterrows()
    ]
    at_one = dp[dp["_x"] == 1.0]
    claim(len(at_one) == 1, "no DP-SGD at noise multiplier 1 in the committed audit")
    gauss = _audit_rows(results, "gaussian", "sigma")
    bounds = list(gauss["epsilon_audit"])
    falls = all(a >= b for a, b in zip(bounds, bounds[1:], strict=False))
    claim(falls, "the Gaussian bound does not fall")
    first_below = gauss[~gauss.apply(_at_cap, axis=1)]
    claim(not first_below.empty, "every Gaussian sigma is at the ceiling")
    gauss_parts = [
        f"sigma {row['_x']:g}: {row['epsilon_audit']:.2f}" for _, row in gauss.iterrows()
    ]
    capped = [
        defense_label(row["defense"], row["defense_params"])
        for _, row in audit.iterrows()
        if row["defense"] not in ("none", "gaussian", "dpsgd") and _at_cap(row)
    ]
    below = [
        defense_label(row["defense"], row["defense_params"])
        for _, row in audit.iterrows()
        if row["defense"] not in ("none", "gaussian", "dpsgd") and not _at_cap(row)
    ]
    claim(not below, "a defense other than noise and DP-SGD is below the ceiling")
    seconds = float(audit["seconds"].sum())
    delta = sci(float(audit["delta"].iloc[0]))
    norm_text = f"{audit['canary_norm'].iloc[0]:.2f}"
    return {
        "configurations": len(audit),
        "rounds": count(rounds),
        "confidence": f"{confidence:g}",
        "delta": delta,
        "cap": f"{cap:.2f}",
        "norm": f"{norm:g}",
        "dp": "; ".join(dp_parts),
        "canary_norm": norm_text,
        "gaussian": "; ".join(gauss_parts),
        "capped": listing(capped),
        "seconds": f"{seconds:.0f}",
    }


@span("epsilon-audit-readme")
def epsilon_audit_readme(results: Results) -> dict[str, Any]:
    """The README's line on the epsilon audit."""
    dp = _audit_rows(results, "dpsgd", "noise_multiplier")
    row = dp[dp["_x"] == 1.0].iloc[0]
    none = one(results.csv(f"{AUDIT_RUN}/epsilon_audit.csv"), defense="none")
    return {
        "measured": f"{row['epsilon_audit']:.2f}",
        "accountant": f"{row['epsilon_update']:.2f}",
        "none": f"{none['epsilon_audit']:.2f}",
        "rounds": count(int(row["rounds"])),
    }
