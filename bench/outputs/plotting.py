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
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.legend import Legend
from matplotlib.text import Annotation
from matplotlib.transforms import Bbox, ScaledTranslation

if TYPE_CHECKING:
    from matplotlib.backend_bases import RendererBase
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


def renderer_of(fig: Figure) -> RendererBase:
    """A renderer that measures ``fig``'s text as its PNG will draw it: the figure gets an Agg
    canvas (no pyplot, no global state) unless it has one already."""
    canvas = fig.canvas
    if not isinstance(canvas, FigureCanvasAgg):
        canvas = FigureCanvasAgg(fig)
    return canvas.get_renderer()


def below_axis_points() -> float:
    """How far below an axes' bottom edge its tick labels and x label reach, in points, from the
    current style: tick, pad, a line of tick labels, the label pad and a line of label text (a
    line being 1.4 times its font size), plus 2 points of air."""
    rc = matplotlib.rcParams
    tick_font = matplotlib.font_manager.FontProperties(size=rc["xtick.labelsize"])
    label_font = matplotlib.font_manager.FontProperties(size=rc["axes.labelsize"])
    return float(
        rc["xtick.major.size"] + rc["xtick.major.pad"] + 1.4 * tick_font.get_size_in_points()
        + rc["axes.labelpad"] + 1.4 * label_font.get_size_in_points() + 2.0
    )  # fmt: skip


def legend_below(ax: Axes, **kwargs: Any) -> Legend:
    """The axes' legend hung below its x label (`below_axis_points`), centred and frameless: it
    covers no data, no tick label and no neighbour's title; a layout pass (``tight_layout``)
    counts it as part of the axes and makes room for it."""
    shift = ScaledTranslation(0.0, -below_axis_points() / 72.0, ax.figure.dpi_scale_trans)
    options: dict[str, Any] = {"loc": "upper center", "frameon": False, **kwargs}
    return ax.legend(bbox_to_anchor=(0.5, 0.0), bbox_transform=ax.transAxes + shift, **options)


# Where a point's label may go, tried in order: nearest first, then further out on 8 bearings
# (offsets in points; the text leans away from the point).
_BEARINGS = [(1, 1), (1, -1), (-1, 1), (-1, -1), (1, 0), (-1, 0), (0, 1), (0, -1)]
_RADII = [3.0, 7.0, 11.0, 16.0, 22.0, 30.0]
# From this offset on, a thin line joins the label to its point.
_LEADER_FROM = 10.0


def _offsets() -> list[tuple[float, float, str, str]]:
    """The candidate placements: ``(dx, dy, ha, va)``."""
    names = {1: ("left", "bottom"), 0: ("center", "center"), -1: ("right", "top")}
    return [(r * dx, r * dy, names[dx][0], names[dy][1]) for r in _RADII for dx, dy in _BEARINGS]


def _overlap(box: Bbox, others: list[Bbox]) -> float:
    """The area ``box`` shares with ``others`` (display units squared)."""
    total = 0.0
    for other in others:
        w = min(box.x1, other.x1) - max(box.x0, other.x0)
        h = min(box.y1, other.y1) - max(box.y0, other.y0)
        total += max(w, 0.0) * max(h, 0.0)
    return total


def _obstacles(ax: Axes, renderer: RendererBase) -> list[Bbox]:
    """What a label must not cover: the axes' tick labels, axis labels, title and legend."""
    fig = ax.figure
    if isinstance(fig, Figure):
        fig.draw_without_rendering()  # ticks and texts at their final places
    texts = [*ax.get_xticklabels(), *ax.get_yticklabels(), ax.xaxis.label, ax.yaxis.label,
             ax.title]  # fmt: skip
    boxes = [t.get_window_extent(renderer) for t in texts if t.get_visible() and t.get_text()]
    legend = ax.get_legend()
    if legend is not None:
        boxes.append(legend.get_window_extent(renderer))
    return boxes


def _free_offset(
    ax: Axes, renderer: RendererBase, point: tuple[float, float], text: str,
    taken: list[Bbox], style: dict[str, Any],
) -> tuple[float, float, str, str]:  # fmt: skip
    """The first placement of `_offsets` (nearest first) where the label covers nothing of
    ``taken`` and stays inside the axes; the least covered one when none is free."""
    frame = ax.get_window_extent(renderer)
    best: tuple[float, tuple[float, float, str, str]] | None = None
    for dx, dy, ha, va in _offsets():
        note = ax.annotate(text, point, xytext=(dx, dy), textcoords="offset points", ha=ha,
                           va=va, **style)  # fmt: skip
        box = note.get_window_extent(renderer)
        note.remove()
        inside = frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0
        cost = _overlap(box, taken) + (0.0 if inside and box.y1 <= frame.y1 else 1e9)
        if cost == 0.0:
            return dx, dy, ha, va
        if best is None or cost < best[0]:
            best = (cost, (dx, dy, ha, va))
    return best[1] if best is not None else _offsets()[0]


def place_labels(
    ax: Axes,
    labels: Sequence[tuple[float, float, str, str]],
    avoid: Sequence[tuple[float, float]] = (),
    fontsize: float = 4.5,
    bars: Sequence[np.ndarray] = (),
) -> list[Annotation]:
    """Annotates points ``(x, y, text, colour)`` so that no label covers another, a tick label,
    an axis label, the legend or a marker, and each stays inside the axes (`_free_offset`); a
    label placed `_LEADER_FROM` points or more from its point gets a thin line to it. The points
    of ``avoid`` (data coordinates: every marker) are kept clear as well, and so are the
    segments of ``bars`` (each ``[[x0, y0], [x1, y1]]`` in data coordinates, level or upright:
    error bars, whose box is the segment itself). Call it once the figure's layout is final:
    placements are measured in display space."""
    renderer = renderer_of(ax.figure)  # type: ignore[arg-type]
    taken = _obstacles(ax, renderer)
    half = 2.5 * ax.figure.dpi / 72.0  # a marker's half width in display units
    for x, y in [*avoid, *((lx, ly) for lx, ly, _, _ in labels)]:
        cx, cy = ax.transData.transform((x, y))
        if np.isfinite(cx) and np.isfinite(cy):
            taken.append(Bbox([[cx - half, cy - half], [cx + half, cy + half]]))
    pad = 0.75 * ax.figure.dpi / 72.0  # a bar's half width, with a little room
    for segment in bars:
        ends = ax.transData.transform(np.asarray(segment, dtype=float))
        if np.isfinite(ends).all():
            low, high = ends.min(axis=0) - pad, ends.max(axis=0) + pad
            taken.append(Bbox([low, high]))
    placed = []
    for x, y, text, color in labels:
        style: dict[str, Any] = {"fontsize": fontsize, "color": color}
        dx, dy, ha, va = _free_offset(ax, renderer, (x, y), text, taken, style)
        leader: dict[str, Any] | None = None
        if max(abs(dx), abs(dy)) >= _LEADER_FROM:
            leader = {"arrowstyle": "-", "lw": 0.3, "color": color, "shrinkA": 0, "shrinkB": 2}
        note = ax.annotate(text, (x, y), xytext=(dx, dy), textcoords="offset points", ha=ha,
                           va=va, arrowprops=leader, **style)  # fmt: skip
        taken.append(note.get_window_extent(renderer))
        placed.append(note)
    return placed
