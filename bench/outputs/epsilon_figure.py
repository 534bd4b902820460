"""The figure of a run's epsilon audit (``epsilon_audit.csv``, `leakbench.run.epsilon_audit`):
measured privacy beside promised privacy.

One panel per defense family the run sweeps over a numeric parameter (the parameter on the x
axis, log scale when it spans a decade): the measured lower bounds on epsilon (distribution-free,
and Gaussian-DP where the defense's score is Gaussian), dp-accounting's epsilons of one update
where the defense has a guarantee (its Renyi-DP accountant and the exact PLD value), and the most
the distribution-free bound can show in the audit's trials (each panel its own: a defense
audited with several canaries per round has more trials, and a higher ceiling). A last panel
gives every configuration's bound as a bar, with its ceiling marked, so the defenses without a
sweep are on the figure too.
"""

from __future__ import annotations

import math

import pandas as pd
from matplotlib.figure import Figure

from leakbench.outputs.naming import defense_label
from leakbench.outputs.plotting import (
    TWO_COLUMNS,
    FigureSkipped,
    defense_color,
    log_axis,
    strength,
)

FILE = "epsilon_audit.csv"


def epsilon_audit(audit: pd.DataFrame) -> Figure:
    """The figure (module docstring) of an ``epsilon_audit.csv`` table."""
    if audit.empty:
        raise FigureSkipped("the epsilon audit has no rows")
    swept = []
    for name, group in audit.groupby("defense", sort=False):
        key, values = strength(group["defense_params"])
        if values is not None:
            swept.append((name, key, group.assign(x=values).sort_values("x")))
    rows_top = math.ceil(len(swept) / 2)
    bar_height = 0.6 + 0.16 * len(audit)
    fig = Figure(figsize=(TWO_COLUMNS, 2.3 * rows_top + bar_height))
    grid = fig.add_gridspec(rows_top + 1, 2, height_ratios=[2.3] * rows_top + [bar_height])
    for i, (name, key, rows) in enumerate(swept):
        ax = fig.add_subplot(grid[i // 2, i % 2])
        color = defense_color(str(name))
        ax.plot(rows["x"], rows["epsilon_audit"], marker="o", color=color, label="measured")
        # The ceiling is the panel's own: more canaries per round give more trials, a higher one.
        cap = float(rows["epsilon_audit_cap"].max())
        top = cap
        gaussian = _present(rows, "epsilon_audit_gdp")
        if not gaussian.empty:
            ax.plot(
                gaussian["x"], gaussian["epsilon_audit_gdp"], marker="D", color=color,
                linestyle="-.", label="measured, Gaussian-DP",
            )  # fmt: skip
            top = max(top, float(gaussian["epsilon_audit_gdp"].max()))
        for column, marker, style, label in (
            ("epsilon_update", "s", "--", "accountant (RDP)"),
            ("epsilon_exact", "^", ":", "exact (PLD)"),
        ):
            promised = _present(rows, column)
            if not promised.empty:
                ax.plot(
                    promised["x"], promised[column], marker=marker, linestyle=style,
                    color="0.3", label=label,
                )  # fmt: skip
                top = max(top, float(promised[column].max()))
        ax.axhline(cap, color="0.5", linestyle=":", linewidth=0.8, label="most the rounds show")
        if log_axis(rows["x"]):
            ax.set_xscale("log")
        ax.set_xlabel(f"{name}: {key}")
        ax.set_ylabel("epsilon")
        ax.set_ylim(0.0, top * 1.1)
        ax.grid(alpha=0.25, linewidth=0.5)
        ax.legend(fontsize="x-small", frameon=False)
    ax = fig.add_subplot(grid[rows_top, :])
    labels = [
        defense_label(d, p) for d, p in zip(audit["defense"], audit["defense_params"], strict=True)
    ]
    positions = list(range(len(audit)))
    ax.barh(
        positions, audit["epsilon_audit"], color=[defense_color(str(d)) for d in audit["defense"]]
    )
    ax.scatter(
        audit["epsilon_update"], positions, marker="|", color="0.2", s=60, label="accountant (RDP)"
    )
    for column, marker, label in (
        ("epsilon_exact", "^", "exact (PLD)"),
        ("epsilon_audit_gdp", "D", "measured, Gaussian-DP"),
    ):
        if column in audit:
            ax.scatter(audit[column], positions, marker=marker, color="0.2", s=14, label=label)
    ax.scatter(
        audit["epsilon_audit_cap"], positions, marker="|", color="0.6", s=60,
        label="most the rounds show",
    )  # fmt: skip
    ax.set_yticks(positions)
    ax.set_yticklabels(labels, fontsize="x-small")
    ax.invert_yaxis()
    ax.set_xlabel("measured epsilon (distribution-free lower bound, bars)")
    ax.legend(
        fontsize="x-small", frameon=False, loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=2
    )
    fig.tight_layout()
    return fig


def _present(rows: pd.DataFrame, column: str) -> pd.DataFrame:
    """The rows with a value in ``column`` (none when a table of an older run lacks it)."""
    if column not in rows:
        return rows.iloc[:0]
    return rows.dropna(subset=[column])
