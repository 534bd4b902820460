"""What every figure of a run shares: page widths, the type style, the colours and markers of
defenses and attacks, the signal that a figure has no data, and the strength axis of a defense
family (`figures`, `epsilon_figure`).

Style: vector text in PDFs (TrueType fonts), 7-point type at one column width (3.4 in; the
leakage figure is two columns wide), Paul Tol's colour-blind-safe "muted" palette with a fixed
colour per built-in defense family (the same in every figure and every run) and Okabe-Ito colours
for attacks; markers differ too, so the figures read in greyscale.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import matplotlib
import pandas as pd

if TYPE_CHECKING:
    from matplotlib.typing import RcKeyType

ONE_COLUMN = 3.4  # inches: one column of a two-column paper
TWO_COLUMNS = 7.0

# Paul Tol's "muted" scheme (colour-blind safe), one fixed colour per built-in family.
DEFENSE_COLORS = {
    "none": "#000000",
    "gaussian": "#332288",
    "laplace": "#88CCEE",
    "clip": "#44AA99",
    "dpsgd": "#117733",
    "prune": "#999933",
    "topk": "#DDCC77",
    "fp16": "#CC6677",
    "int8": "#882255",
    "chain": "#AA4499",
}
# Okabe-Ito (colour-blind safe): plugin defenses (by a stable hash of the name) and attacks.
OKABE_ITO = ["#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7"]
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "<", ">", "*"]
LINESTYLES = ["-", "--", ":", "-."]

STYLE: dict[RcKeyType, Any] = {
    "font.size": 7,
    "axes.titlesize": 7,
    "axes.labelsize": 7,
    "legend.fontsize": 6,
    "xtick.labelsize": 6,
    "ytick.labelsize": 6,
    "lines.linewidth": 1.0,
    "lines.markersize": 3.5,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "pdf.fonttype": 42,  # TrueType: text stays text in the PDF
    "ps.fonttype": 42,
    "savefig.dpi": 300,
    "savefig.bbox": "tight",
    "savefig.pad_inches": 0.02,
}


class FigureSkipped(Exception):
    """A figure the run has no data for; the message says what is missing."""


def defense_color(name: str) -> str:
    """The colour of a defense family: fixed for built-ins, a stable pick for plugins."""
    if name in DEFENSE_COLORS:
        return DEFENSE_COLORS[name]
    digest = int(hashlib.sha256(name.encode()).hexdigest(), 16)
    return OKABE_ITO[digest % len(OKABE_ITO)]


def defense_marker(name: str) -> str:
    names = list(DEFENSE_COLORS)
    index = names.index(name) if name in names else len(names)
    return MARKERS[index % len(MARKERS)]


@contextlib.contextmanager
def paper_style() -> Iterator[None]:
    with matplotlib.rc_context(STYLE):
        yield


def log_axis(values: pd.Series) -> bool:
    """Whether a swept parameter gets a log axis: all positive and spanning a decade or more
    (one rule, whatever the number of values)."""
    return bool(values.min() > 0 and values.max() / values.min() >= 10)


def strength(params: pd.Series) -> tuple[str, list[float] | None]:
    """The parameter a family sweeps and its values, from the configurations' JSON params.

    The swept parameter is the first (sorted) numeric one whose value varies; when none varies
    (one configuration, or a chain) the values are None and configurations are placed in order.
    """
    parsed = [json.loads(p) for p in params]
    keys = sorted({k for p in parsed for k in p})
    for key in keys:
        values = [p.get(key) for p in parsed]
        numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
        if numeric and len(set(values)) > 1:
            return key, [float(v) for v in values]
    return "configuration", None
