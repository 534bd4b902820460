"""The numbers of the generated passages on the measured privacy (epsilon audit) (templates in
`passages/`, filled by `benchmarks/readme_numbers.py`)."""

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


def _mu_text(row: pd.Series) -> str:
    """The effective mu of a row: its estimate, or its lower bound where no error was seen."""
    if math.isfinite(row["mu_estimate"]):
        return f"mu {row['mu_estimate']:.3g}"
    return f"no error seen: mu at least {row['mu_audit']:.3g}"


def _plain(value: float) -> str:
    """Three significant digits, without an exponent: 0.231, 23.1, 2,307."""
    return f"{value:,.0f}" if value >= 1000 else f"{value:.3g}"


def _at_cap(row: pd.Series) -> bool:
    return bool(row["epsilon_audit"] >= row["epsilon_audit_cap"] - 0.05)


@block("epsilon-audit-findings")
def epsilon_audit_findings(results: Results) -> dict[str, Any]:
    """What the committed epsilon audit shows, from its epsilon_audit.csv."""
    audit = results.csv(f"{AUDIT_RUN}/epsilon_audit.csv")
    claim(not (audit["audit"] == "failed").any(), "a committed audit failed")
    rounds = int(audit["rounds"].iloc[0])
    guaranteed = audit[audit["epsilon_exact"].notna()]
    free = audit[audit["epsilon_exact"].isna()]
    claim(not guaranteed.empty and not free.empty, "no guaranteed or no free configuration")
    corrected = set(guaranteed["epsilon_audit_confidence"].round(6))
    confidence = set(free["epsilon_audit_confidence"].round(6))
    claim(len(corrected) == 1 and len(confidence) == 1, "mixed confidences in the audit")
    none = one(audit, defense="none")
    claim(_at_cap(none), "none is below the ceiling")
    cap = float(none["epsilon_audit_cap"])
    several = audit[audit["canaries"] > 1]
    canaries = set(several["canaries"])
    claim(len(canaries) == 1, "the configurations with several canaries differ in how many")
    claim(set(several["defense"]) == {"gaussian", "dpsgd"}, "several canaries beyond noise")
    dp = _audit_rows(results, "dpsgd", "noise_multiplier")
    norm = json.loads(dp["defense_params"].iloc[0])["norm"]
    claim((dp["epsilon_audit_gdp"] <= dp["epsilon_exact"]).all(), "a GDP bound above exact")
    dp_parts = [
        f"z = {row['_x']:g}: {row['epsilon_audit_gdp']:.2f} of {row['epsilon_exact']:.2f} "
        f"({row['epsilon_audit_gdp'] / row['epsilon_exact']:.0%}; distribution-free "
        f"{row['epsilon_audit']:.2f}, RDP {row['epsilon_update']:.2f})"
        for _, row in dp.iterrows()
    ]
    gauss = _audit_rows(results, "gaussian", "sigma")
    bounds = list(gauss["epsilon_audit"])
    falls = all(a >= b for a, b in zip(bounds, bounds[1:], strict=False))
    claim(falls, "the Gaussian bound does not fall")
    claim(not gauss[~gauss.apply(_at_cap, axis=1)].empty, "every Gaussian sigma is at the ceiling")
    claim((gauss["bound_of"] == "canary").all(), "a Gaussian bound is said to be the defense's")
    gauss_parts = [
        f"sigma {row['_x']:g}: {row['epsilon_audit']:.2f} distribution-free, "
        f"{row['epsilon_audit_gdp']:.2f} Gaussian-DP ({_mu_text(row)}; canary mu "
        f"{_plain(row['canary_mu'])})"
        for _, row in gauss.iterrows()
    ]
    return {
        **_batch_parts(audit),
        "configurations": len(audit),
        "rounds": count(rounds),
        "canaries": count(int(canaries.pop())),
        "several": len(several),
        "guaranteed": len(guaranteed),
        "corrected": f"{corrected.pop():.4g}",
        "confidence": f"{confidence.pop():g}",
        "delta": sci(float(audit["delta"].iloc[0])),
        "cap": f"{cap:.2f}",
        "norm": f"{norm:g}",
        "dp": "; ".join(dp_parts),
        "canary_norm": f"{audit['canary_norm'].iloc[0]:.2f}",
        "slots": int(gauss["batch_size"].iloc[0]) + 1,
        "gaussian": "; ".join(gauss_parts),
        "seconds": f"{float(audit['seconds'].sum()):.0f}",
    }


def _gdp_text(row: pd.Series) -> str:
    gdp = row["epsilon_audit_gdp"]
    return "" if pd.isna(gdp) else f" (Gaussian-DP {gdp:.2f})"


def _batch_parts(audit: pd.DataFrame) -> dict[str, Any]:
    """The fields on the defenses that depend on the batch (audited on several) and on the
    ones at the ceiling."""
    spread = audit[audit["batches"] > 1]
    claim(not spread.empty, "no configuration audited on several batches")
    counts = set(spread["batches"])
    claim(len(counts) == 1, "the configurations on several batches differ in how many")
    one_batch = set(audit[audit["batches"] == 1]["defense"])
    claim(
        one_batch <= {"none", "gaussian", "laplace", "dpsgd"},
        "a data-dependent defense on one batch",
    )
    others = audit[~audit["defense"].isin(["none", "gaussian", "dpsgd"])]
    capped = [defense_label(r["defense"], r["defense_params"]) for _, r in others.iterrows()
              if _at_cap(r)]  # fmt: skip
    below = [
        f"{defense_label(r['defense'], r['defense_params'])} {r['epsilon_audit']:.2f}"
        + (
            ""
            if pd.isna(r["epsilon_audit_gdp"])
            else f" (Gaussian-DP {r['epsilon_audit_gdp']:.2f})"
        )
        for _, r in others.iterrows()
        if not _at_cap(r)
    ]
    return {
        "spread": len(spread),
        "batches": int(counts.pop()),
        "per_batch": count(int(spread["rounds"].iloc[0]) // int(spread["batches"].iloc[0])),
        "capped": listing(capped),
        "below": listing(below) if below else "none",
    }


def _labels(rows: pd.DataFrame) -> str:
    """The configurations of ``rows`` as prose; those of one defense that sweeps one parameter
    as that parameter's values: "gaussian sigma=0.3, 1, 3 and 10"."""
    params = [json.loads(text) for text in rows["defense_params"]]
    keys = {tuple(p) for p in params}
    if rows["defense"].nunique() == 1 and len(keys) == 1 and len(next(iter(keys))) == 1:
        (key,) = next(iter(keys))
        values = listing([f"{p[key]:g}" for p in params])
        return f"{rows['defense'].iloc[0]} {key}={values}"
    return listing([defense_label(r["defense"], r["defense_params"]) for _, r in rows.iterrows()])


@span("epsilon-audit-readme")
def epsilon_audit_readme(results: Results) -> dict[str, Any]:
    """The README's line on the epsilon audit: DP-SGD at z = 1 against its accountant, and
    which configurations without a guarantee measure below the ceiling of their own audit
    (one canary or several: each audit has its own ceiling, so none is compared with another's)."""
    audit = results.csv(f"{AUDIT_RUN}/epsilon_audit.csv")
    dp = _audit_rows(results, "dpsgd", "noise_multiplier")
    row = dp[dp["_x"] == 1.0].iloc[0]
    none = one(audit, defense="none")
    free = audit[audit["epsilon_exact"].isna()]
    at_cap = free.apply(_at_cap, axis=1)
    below = free[~at_cap]
    claim(not below.empty and at_cap.any(), "every configuration without a guarantee alike")
    caps = sorted(set(free["epsilon_audit_cap"].round(2)))
    several = free[free["canaries"] > 1]
    claim(len(caps) == 2 and len(set(several["canaries"])) == 1, "not two ceilings")
    return {
        "gdp": f"{row['epsilon_audit_gdp']:.2f}",
        "measured": f"{row['epsilon_audit']:.2f}",
        "exact": f"{row['epsilon_exact']:.2f}",
        "accountant": f"{row['epsilon_update']:.2f}",
        "below": _labels(below),
        "none": f"{none['epsilon_audit_cap']:.2f}",
        "cap": f"{float(several['epsilon_audit_cap'].iloc[0]):.2f}",
        "canaries": f"{int(several['canaries'].iloc[0])} canaries",
        "at": count(int(at_cap.sum())),
        "rounds": count(int(row["rounds"])),
    }
