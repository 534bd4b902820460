"""Paper figures of a run directory, drawn from its CSVs and ``arrays/``.

Every figure is a function ``(Run) -> matplotlib.figure.Figure`` that draws without pyplot (no
global state, any backend) and raises `FigureSkipped` when the run has no data for it:

1. `privacy_utility`: test accuracy (mean over the trained models, with its 95% CI over seeds)
   against the PSNR of the strongest attack (mean with 95% CI), one line per defense family
   across its strengths, the Pareto front marked.
2. `reconstruction_grid`: the private images in the first row, below them the strongest attack's
   reconstructions under each defense configuration, each labelled with its PSNR.
3. `convergence`: gradient-matching loss against iteration (median over trials), one panel per
   attack, one line per defense configuration.
4. `leakage`: PSNR, SSIM and label accuracy against defense strength, one row of panels per
   defense family, one line per attack; the undefended value as a dotted reference. Secure
   aggregation (runs whose server saw the mean of K > 1 clients' updates) is a family with K as
   its strength.
"""

from __future__ import annotations

import dataclasses
import sys
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import LogLocator, MaxNLocator, NullFormatter

from leakbench.core.errors import DataError
from leakbench.core.files import atomic_file
from leakbench.outputs import epsilon_figure
from leakbench.outputs.arrays import CellArrays, load_cell
from leakbench.outputs.naming import attack_label, defense_label
from leakbench.outputs.paper_tables import load_leaderboard
from leakbench.outputs.plotting import (
    LINESTYLES,
    MARKERS,
    OKABE_ITO,
    ONE_COLUMN,
    TWO_COLUMNS,
    FigureSkipped,
    defense_color,
    defense_marker,
    legend_below,
    log_axis,
    paper_style,
    place_labels,
    renderer_of,
    strength,
)
from leakbench.outputs.tables import run_modality

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


@dataclasses.dataclass(frozen=True)
class Run:
    """What the figures read from a run directory.

    ``clients`` is the run's ``threat_model.clients`` (from its ``config.toml``; 1 when it says
    nothing): K > 1 means the server saw only the mean of K clients' updates (secure
    aggregation). ``others`` are further runs (``leakbench figures --with``) whose leaderboard
    rows join the leakage figure, e.g. the same config at other K.
    """

    path: Path
    leaderboard: pd.DataFrame
    trials: pd.DataFrame
    utility: pd.DataFrame
    clients: int = 1
    others: tuple[Run, ...] = ()
    # The run's ``success_mse`` (from its ``config.toml``; 1e-3 when it says nothing).
    success_mse: float = 1e-3

    def heads(self) -> pd.DataFrame:
        """The headline row (strongest attack) of each defense configuration, in order."""
        return self.leaderboard[self.leaderboard["strongest"].astype(bool)]

    def cell_arrays(self, row: pd.Series) -> CellArrays | None:
        return load_cell(self.path, row)

    def cell_trials(self, row: pd.Series) -> pd.DataFrame:
        keys = ["dataset", "model", "attack", "attack_params", "defense", "defense_params"]
        mask = (self.trials[keys] == row[keys]).all(axis=1)
        return self.trials[mask]

    def strength_board(self) -> pd.DataFrame:
        """The leaderboard rows of this run and of ``others``, each with its run's ``clients``."""
        boards = [run.leaderboard.assign(clients=run.clients) for run in (self, *self.others)]
        return pd.concat(boards, ignore_index=True)


def load_run(run_dir: str | Path, others: Sequence[str | Path] = ()) -> Run:
    """Reads a run directory's tables (and those of ``others``, see `Run`); a directory without
    them is a `DataError`."""
    path = Path(run_dir)
    board = load_leaderboard(path)
    tables = {}
    for name in ("trials", "utility"):
        file = path / f"{name}.csv"
        if not file.is_file():
            raise DataError(f"{run_dir} holds no {name}.csv; give the --out of `leakbench run`")
        tables[name] = pd.read_csv(file)
    return Run(
        path,
        board,
        tables["trials"],
        tables["utility"],
        clients=_clients(path),
        others=tuple(load_run(other) for other in others),
        success_mse=_success_mse(path),
    )


def _config(path: Path) -> dict:
    """The run directory's ``config.toml`` as a table (empty without one)."""
    config = path / "config.toml"
    if not config.is_file():
        return {}
    try:
        return tomllib.loads(config.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
        raise DataError(f"{config} cannot be read as TOML ({err})") from None


def _clients(path: Path) -> int:
    """The ``threat_model.clients`` of the run directory's ``config.toml`` (1 without one)."""
    clients = _config(path).get("threat_model", {}).get("clients", 1)
    if isinstance(clients, bool) or not isinstance(clients, int) or clients < 1:
        raise DataError(
            f"{path / 'config.toml'}: threat_model.clients must be an integer >= 1, got {clients!r}"
        )
    return clients


def _success_mse(path: Path) -> float:
    """The ``success_mse`` of the run directory's ``config.toml`` (1e-3 without one)."""
    value = _config(path).get("success_mse", 1e-3)
    return float(value) if isinstance(value, (int, float)) else 1e-3


def _families(frame: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Rows grouped by defense family, in order of first appearance."""
    return {name: group for name, group in frame.groupby("defense", sort=False)}


def point_labels(group: pd.DataFrame) -> list[tuple[float, float, str]]:
    """``(privacy, accuracy, text)`` labels of a family's points in the privacy-utility figure:
    the swept strength's value (``"0.01"``; the legend names the family, the README and the
    leaderboard its parameter) for a family of several configurations, nothing for a family of
    one (its legend entry names it)."""
    if len(group) < 2:
        return []
    _, values = strength(group["defense_params"])
    texts = (
        [f"{v:g}" for v in values]
        if values is not None
        else [
            defense_label(d, p)
            for d, p in zip(group["defense"], group["defense_params"], strict=True)
        ]
    )
    return list(
        zip(
            privacy_axis(group)[0],
            group["test_accuracy"].astype(float),
            texts,
            strict=True,
        )
    )


def privacy_axis(group: pd.DataFrame) -> tuple[pd.Series, np.ndarray | None, str]:
    """The privacy axis of the privacy-utility figure for headline rows: the share of images
    leaked over the attack suite (the verdict's measure, ``suite_leaked`` of ``suite_n``), with
    its exact 95% interval as error bars, in percent; a leaderboard written before the suite
    existed shows its strongest attack's share, and one before shares existed the mean PSNR
    with its interval."""
    if "suite_n" in group and group["suite_n"].notna().all() and len(group):
        share = 100 * group["suite_leaked"].astype(float) / group["suite_n"].astype(float)
        low = share - 100 * group["suite_low"].astype(float)
        high = 100 * group["suite_high"].astype(float) - share
        errors = np.vstack([low.to_numpy(), high.to_numpy()])
        return share, errors, "images leaked over the attack suite (%), lower is more private"
    if "leaked_rate" in group and group["leaked_rate"].notna().any():
        share = 100 * group["leaked_rate"].astype(float)
        low = share - 100 * group["leaked_low"].astype(float)
        high = 100 * group["leaked_high"].astype(float) - share
        errors = np.vstack([low.to_numpy(), high.to_numpy()])
        return share, errors, "images leaked by the strongest attack (%), lower is more private"
    errors = clipped_errors(group["psnr_mean"], group["psnr_ci95"], "psnr_mean")
    return (
        group["psnr_mean"].astype(float),
        errors,
        "PSNR of the strongest attack (dB), lower is more private",
    )


def privacy_utility(run: Run) -> Figure:
    """Test accuracy against the share of images the strongest attack leaked (`privacy_axis`),
    one line per defense family, each point of a swept family labelled with its strength
    (`point_labels`); error bars (exact 95% intervals over images, Student-t over training
    seeds) stop at the ends of each axis' range (`clipped_errors`)."""
    heads = run.heads()
    if heads.empty or heads["test_accuracy"].isna().all():
        raise FigureSkipped("the run trained no models ([training] enabled = false)")
    families = {n: g[g["test_accuracy"].notna()] for n, g in _families(heads).items()}
    families = {n: g for n, g in families.items() if not g.empty}
    # Below the axes, the legend's rows (two columns) add to the figure's height.
    rows = -(-(len(families) + 1) // 2)
    fig = Figure(figsize=(ONE_COLUMN, 2.4 + 0.11 * rows))
    ax = fig.add_subplot()
    labels: list[tuple[float, float, str, str]] = []
    bars: list[np.ndarray] = []
    for name, group in families.items():
        x, xerr, xlabel = privacy_axis(group)
        drawn = ax.errorbar(
            x,
            group["test_accuracy"],
            xerr=xerr,
            # Over the trained models (seeds); none for one model, or a leaderboard without it.
            yerr=clipped_errors(
                group["test_accuracy"], group["test_accuracy_ci95"], "test_accuracy"
            ),
            color=defense_color(name),
            marker=defense_marker(name),
            linestyle="-" if len(group) > 1 else "none",
            capsize=1.5,
            elinewidth=0.6,
            label=name,
        )
        labels += [(x, y, text, defense_color(name)) for x, y, text in point_labels(group)]
        bars += [segment for lines in drawn.lines[2] for segment in lines.get_segments()]
    front = heads[heads["pareto"].astype(bool)]
    front = front.assign(_x=privacy_axis(front)[0]).sort_values("_x")
    if not front.empty:
        ax.plot(
            front["_x"],
            front["test_accuracy"],
            color="0.5",
            linestyle=(0, (4, 2)),
            drawstyle="steps-post",
            marker="o",
            markersize=7,
            markerfacecolor="none",
            linewidth=0.8,
            label="Pareto front",
            zorder=0,
        )
    ax.set_xlabel(privacy_axis(heads)[2])
    ax.set_ylabel("test accuracy")
    legend_below(ax, ncol=2)
    ax.grid(alpha=0.25, linewidth=0.5)
    fig.tight_layout()
    # The strengths last, on the final layout: each where it covers no other text or marker.
    points = [(x, y) for g in families.values() for x, y in zip(privacy_axis(g)[0],
              g["test_accuracy"].astype(float), strict=True)]  # fmt: skip
    place_labels(ax, labels, avoid=points, bars=bars)
    return fig


# The key of the grid's image titles, in a strip of its own above the grid.
GRID_KEY = (
    "title: PSNR (dB), then the flags of a leaked image: R recovered exactly,\n"
    "I identified among the distractors, V recognisable, M leaked by another reconstruction\n"
    "of its batch (the batch's matching); leaked images red and framed; (I): identified,\n"
    "but no more often in its cell than chance explains, so not counted"
)
GRID_KEY_INCHES = 0.5


def reconstruction_grid(run: Run, images: int = 6) -> Figure:
    """Originals on top, then each defense configuration's strongest-attack reconstructions (the
    attack that leaked most images): the first ``images`` of the cell's images, each titled
    with its PSNR and its leakage flags (`image_flags`; red and framed when the tables count it as
    leaked, `_counted_leak`; bracketed when they do not; M when they count it for another
    reconstruction of its batch, `leakbench.run.identification`), the
    row labelled with the defense, its verdict and the attack; a note in the corner when the
    cell has more images."""
    heads = run.heads()
    loaded = [(row, run.cell_arrays(row)) for _, row in heads.iterrows()]
    cells = [(row, arrays) for row, arrays in loaded if arrays is not None]
    if not cells:
        raise FigureSkipped("the run kept no reconstructions (arrays/ is missing)")
    first = cells[0][1]
    shown = list(zip(first.seed, first.batch_index, first.position, strict=True))[:images]
    columns = len(shown)
    height = 0.1 + 0.5 * (len(cells) + 1) * 6 / max(columns, 6)
    fig = Figure(figsize=(ONE_COLUMN, height + GRID_KEY_INCHES))
    axes = fig.subplots(len(cells) + 1, columns, squeeze=False)
    top = 1.0 - GRID_KEY_INCHES / (height + GRID_KEY_INCHES)
    fig.subplots_adjust(left=0.3, right=1.0, top=top, bottom=0.0, wspace=0.05, hspace=0.45)
    fig.text(1.0, 1.0, GRID_KEY, ha="right", va="top", fontsize=4.5, linespacing=1.3)
    for j, key in enumerate(shown):
        _show(axes[0, j], first.original[_find(first, key)])
    axes[0, 0].set_ylabel("original", rotation=0, ha="right", va="center", fontsize=5)
    total = len(first.seed)
    if total > columns:  # say that the grid is a subset
        fig.text(0.0, top, f"the first {columns} of {total} images", va="bottom", fontsize=4.5)
    for i, (row, arrays) in enumerate(cells, start=1):
        trials = run.cell_trials(row).set_index(["seed", "batch_index", "position"])
        for j, key in enumerate(shown):
            ax = axes[i, j]
            at = _find(arrays, key)
            if at is None:
                ax.set_axis_off()
                continue
            _show(ax, arrays.reconstruction[at])
            scores = trials.loc[key]
            flags = image_flags(scores, run.success_mse)
            leaked = _counted_leak(scores, flags)
            if flags and not leaked:  # flagged, but the tables do not count it (the key)
                flags = f"({flags})"
            elif leaked and not flags:  # a batch: another reconstruction leaks this original
                flags = "M"
            ax.set_title(
                f"{float(scores['psnr']):.1f} dB" if not flags else f"{scores['psnr']:.0f} {flags}",
                pad=1.5,
                fontsize=5,
                color="#b2182b" if leaked else "black",
            )
            if leaked:  # a leaked image gets a red frame
                for spine in ax.spines.values():
                    spine.set_visible(True)
                    spine.set_color("#b2182b")
                    spine.set_linewidth(1.0)
        label = defense_label(row["defense"], row["defense_params"])
        verdict = str(row.get("verdict", "") or "")
        axes[i, 0].set_ylabel(
            f"{label}"
            + (f" [{verdict}]" if verdict else "")
            + f"\n{attack_label(row['attack'], row['attack_params'])}",
            rotation=0,
            ha="right",
            va="center",
            fontsize=5,
        )
    return fig


def image_flags(scores: pd.Series, success_mse: float) -> str:
    """The leakage flags of one image row as letters: R recovered exactly, I identified among
    the distractors, V recognisable (visible); empty when none holds."""
    letters = ""
    if float(scores["mse"]) <= success_mse:
        letters += "R"
    if scores.get("identified", np.nan) == 1:
        letters += "I"
    if scores.get("recognisable", np.nan) == 1:
        letters += "V"
    return letters


def _counted_leak(scores: pd.Series, flags: str) -> bool:
    """Whether the tables count this image row as leaked: its ``leaked`` column, which drops an
    identification that its cell's hits do not lift above chance
    (`leakbench.outputs.leak_flags.with_leak_flags`); its flags where a row has no such column.
    The grid frames what the verdict counts, so a frame never contradicts a ``holds``."""
    value = float(scores.get("leaked", np.nan))
    return bool(flags) if value != value else value == 1


def _find(arrays: CellArrays, key: tuple[int, int, int]) -> int | None:
    hits = np.flatnonzero(
        (arrays.seed == key[0]) & (arrays.batch_index == key[1]) & (arrays.position == key[2])
    )
    return int(hits[0]) if len(hits) else None


def _show(ax: matplotlib.axes.Axes, image: np.ndarray) -> None:
    if image.shape[-1] == 1:
        ax.imshow(image[..., 0], cmap="gray", vmin=0, vmax=255, interpolation="nearest")
    else:
        ax.imshow(image, interpolation="nearest")
    ax.set_xticks([])
    ax.set_yticks([])
    for spine in ax.spines.values():
        spine.set_visible(False)


def convergence(run: Run) -> Figure:
    """Median gradient-matching loss against iteration, as small multiples: a panel per (attack,
    defense family), four panels a row, a line per configuration of the family and the
    undefended cell's line (grey, dotted) for reference.

    A trial that stopped early keeps its last loss for the later iterations (what the attacker
    had reached by then), so the median never jumps when a trial drops out; a curve ends, with
    a dot, where the cell's last trial stopped. Losses are drawn on a log scale, floored at
    1e-12.
    """
    board = run.leaderboard
    attacks = list(dict.fromkeys(zip(board["attack"], board["attack_params"], strict=True)))
    families = list(dict.fromkeys(board["defense"]))
    shown = [f for f in families if f != "none"] or ["none"]
    panels = []
    for attack in attacks:
        rows = board[(board["attack"] == attack[0]) & (board["attack_params"] == attack[1])]
        curves: dict[str, list[tuple[pd.Series, CellArrays]]] = {}
        for _, row in rows.iterrows():
            arrays = run.cell_arrays(row)
            if arrays is not None and arrays.loss.size:
                curves.setdefault(row["defense"], []).append((row, arrays))
        reference = curves.get("none", [])[:1]
        for family in shown:
            if family in curves:
                extra = reference if family != "none" else []
                panels.append((attack, family, curves[family], extra))
    if not panels:
        raise FigureSkipped("the run kept no loss histories (arrays/ is missing)")
    columns = min(len(panels), 4)
    rows_needed = -(-len(panels) // columns)
    # Each panel's legend hangs below it (one entry a line), so a row is as tall as its panel
    # and its longest legend.
    entries = [len(lines) + len(reference) for _, _, lines, reference in panels]
    heights = [max(entries[r * columns : (r + 1) * columns]) for r in range(rows_needed)]
    height = 0.2 + sum(1.55 + 0.075 * n for n in heights)
    fig = Figure(figsize=(TWO_COLUMNS if columns > 2 else ONE_COLUMN, height))
    axes = fig.subplots(rows_needed, columns, squeeze=False).ravel()
    for ax, (attack, family, lines, reference) in zip(axes, panels, strict=False):
        for index, (row, arrays) in enumerate(lines):
            _loss_curve(ax, arrays, color=defense_color(family),
                        linestyle=LINESTYLES[index % len(LINESTYLES)],
                        label=defense_label(family, row["defense_params"]))  # fmt: skip
        for _, arrays in reference:
            _loss_curve(ax, arrays, color="0.55", linestyle=":", label="none")
        _loss_axes(ax)
        # Wrapped to the panel's width: a long attack label would run into its neighbour's.
        title = textwrap.fill(f"{family} | {attack_label(*attack)}", width=34)
        ax.set_title(title, fontsize=6)
        legend_below(ax, fontsize=4.5, handlelength=2.4)
    for ax in axes[len(panels) :]:
        ax.set_axis_off()
    fig.tight_layout(h_pad=0.6, w_pad=0.8)
    return fig


def _loss_axes(ax: matplotlib.axes.Axes) -> None:
    """A loss panel's axes: log losses between whole decades (so at least two labelled ticks,
    and no crowded labels of minor ticks), at most five labelled decades, at most five
    iteration ticks."""
    ax.set_yscale("log")
    low, high = (np.log10(v) for v in ax.dataLim.intervaly)
    if np.isfinite(low) and np.isfinite(high):
        # A tenth of a decade of air, so a curve never lies on the frame.
        bottom, top = np.floor(low - 0.1), np.ceil(high + 0.1)
        ax.set_ylim(10**bottom, 10**top)
    ax.yaxis.set_major_locator(LogLocator(numticks=5))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.xaxis.set_major_locator(MaxNLocator(nbins=4, integer=True, min_n_ticks=2))
    ax.set_xlabel("iteration")
    ax.set_ylabel("gradient-matching loss")


def _loss_curve(
    ax: matplotlib.axes.Axes, arrays: CellArrays, *, color: str, linestyle: str, label: str
) -> None:
    """A cell's median loss curve, ended by a dot at its last trial's last iteration."""
    curve = np.median(_forward_fill(arrays.loss), axis=0)
    ax.plot(
        np.arange(1, len(curve) + 1),
        np.maximum(curve, 1e-12),
        color=color,
        linestyle=linestyle,
        marker="o",
        markevery=[len(curve) - 1],
        markersize=2,
        label=label,
    )


def _forward_fill(loss: np.ndarray) -> np.ndarray:
    """Each row's NaN padding replaced by its last finite value (all-NaN rows stay NaN)."""
    out = np.array(loss, dtype=np.float64)
    for row in out:
        finite = np.flatnonzero(np.isfinite(row))
        if len(finite):
            row[finite[-1] + 1 :] = row[finite[-1]]
    return out


METRICS = [
    ("psnr_mean", "psnr_ci95", "PSNR (dB)"),
    ("ssim_mean", "ssim_ci95", "SSIM"),
    ("label_acc", None, "label accuracy"),
]
# Drawn as a fourth column when any row of the board has it (LPIPS weights installed).
LPIPS_METRIC = ("lpips_mean", "lpips_ci95", "LPIPS")
# The range each plotted quantity can take: PSNR of images in [0, 1] with the MSE floored at
# 1e-10 lies in [0, 100] dB, SSIM in [-1, 1], accuracies in [0, 1], LPIPS from 0 up. Error bars
# stop at its ends.
RANGES = {
    "psnr_mean": (0.0, 100.0),
    "ssim_mean": (-1.0, 1.0),
    "lpips_mean": (0.0, float("inf")),
    "label_acc": (0.0, 1.0),
    "test_accuracy": (0.0, 1.0),
}


def leakage_metrics(board: pd.DataFrame) -> list[tuple[str, str | None, str]]:
    """The leakage figure's columns: `METRICS`, and LPIPS when the board has any."""
    if "lpips_mean" in board and board["lpips_mean"].notna().any():
        return [*METRICS, LPIPS_METRIC]
    return list(METRICS)


def clipped_errors(values: pd.Series, halfwidths: pd.Series, metric: str) -> np.ndarray:
    """Asymmetric error bars ``[below, above]`` (shape [2, n]) of ``values +- halfwidths``,
    each side cut where the interval leaves the metric's range (`RANGES`): a mean of 100 dB
    gets no bar above it. A missing half-width draws no bar."""
    low, high = RANGES[metric]
    v = values.to_numpy(dtype=float)
    h = halfwidths.fillna(0.0).to_numpy(dtype=float)
    return np.stack([np.clip(np.minimum(h, v - low), 0.0, None),
                     np.clip(np.minimum(h, high - v), 0.0, None)])  # fmt: skip


# The family of the undefended runs whose server saw only the mean of K clients' updates.
SECURE_AGGREGATION = "secure aggregation"


@dataclasses.dataclass(frozen=True)
class StrengthPanel:
    """One row of panels of the leakage figure.

    Attributes:
        label: The x axis label, ``"family: parameter"``.
        rows: Leaderboard rows (every attack's) with an added column ``x``, their position.
        ticks: None when ``x`` is a strength value; otherwise ``x`` only numbers the
            configurations, and this maps each x to its tick label.
    """

    label: str
    rows: pd.DataFrame
    ticks: dict[float, str] | None = None


def strength_panels(board: pd.DataFrame) -> list[StrengthPanel]:
    """The leakage figure's data: one panel per defense family swept over a numeric parameter,
    then one shared by the families with one configuration (or no numeric sweep).

    ``board`` is leaderboard rows with a ``clients`` column (`Run.strength_board`; 1 when
    missing). Rows of K > 1 clients are under secure aggregation: the undefended ones (``none``)
    form the family `SECURE_AGGREGATION`, with K as its strength and the undefended rows of
    one client as K = 1; a defense under aggregation is a family of its own, ``"name, K
    clients"``. The undefended rows of one client are the figure's reference line instead.
    """
    if "clients" not in board:
        board = board.assign(clients=1)
    clients = board["clients"].astype(int)
    family = [
        name if k == 1 else f"{name}, {k} clients"
        for name, k in zip(board["defense"], clients, strict=True)
    ]
    board = board.assign(family=family)
    panels, single = [], []
    for name, group in board[board["defense"] != "none"].groupby("family", sort=False):
        configs = list(dict.fromkeys(group["defense_params"]))
        parameter, values = strength(pd.Series(configs))
        if values is None:
            single.append(group)
            continue
        x_of = dict(zip(configs, values, strict=True))
        panels.append(
            StrengthPanel(f"{name}: {parameter}", group.assign(x=group["defense_params"].map(x_of)))
        )
    undefended = board[board["defense"] == "none"]
    if (undefended["clients"] > 1).any():
        rows = undefended.assign(x=undefended["clients"].astype(float))
        panels.append(StrengthPanel(f"{SECURE_AGGREGATION}: clients", rows))
    if single:
        group = pd.concat(single)
        keys = list(dict.fromkeys(zip(group["family"], group["defense_params"], strict=True)))
        x_of = {key: float(i) for i, key in enumerate(keys)}
        x = [x_of[k] for k in zip(group["family"], group["defense_params"], strict=True)]
        ticks = {
            x_of[(name, params)]: _tick(name, params, defense)
            for (name, params), defense in zip(
                keys, group.drop_duplicates(["family", "defense_params"])["defense"], strict=True
            )
        }
        panels.append(StrengthPanel("defense", group.assign(x=x), ticks))
    return panels


def _tick(family: str, params: str, defense: str) -> str:
    """A configuration's tick label: the defense with its parameters, and its clients."""
    label = defense_label(defense, params)
    return label if family == defense else f"{label}, {family.rsplit(', ', 1)[1]}"


def leakage(run: Run) -> Figure:
    """PSNR, SSIM, label accuracy and LPIPS (when scored) against defense strength, per family
    and attack.

    A family swept over a numeric parameter gets a row of panels with that parameter on the x
    axis (log scale when it spans a decade or more, `log_axis`); error bars stop at the ends of
    each metric's range (`clipped_errors`); the families with one configuration
    (or no numeric sweep) share one last row, one x position per configuration. Secure
    aggregation (runs of K > 1 clients, this one or ``run.others``) is a family with K on the x
    axis (`strength_panels`).
    """
    board = run.strength_board()
    panels = strength_panels(board)
    if not panels:
        raise FigureSkipped("the run has no defense besides none")
    attacks = list(dict.fromkeys(zip(board["attack"], board["attack_params"], strict=True)))
    heads = board[
        (board["defense"] == "none") & board["strongest"].astype(bool) & (board["clients"] == 1)
    ]
    metrics = leakage_metrics(board)
    fig = Figure(figsize=(TWO_COLUMNS, 0.5 + 1.5 * len(panels)))
    axes = fig.subplots(len(panels), len(metrics), squeeze=False)
    for i, panel in enumerate(panels):
        for j, (metric, ci, label) in enumerate(metrics):
            ax = axes[i, j]
            for a, attack in enumerate(attacks):
                rows = panel.rows
                mine = rows[(rows["attack"] == attack[0]) & (rows["attack_params"] == attack[1])]
                if mine.empty:
                    continue
                mine = mine.sort_values("x")
                ax.errorbar(
                    mine["x"],
                    mine[metric],
                    yerr=None if ci is None else clipped_errors(mine[metric], mine[ci], metric),
                    color=OKABE_ITO[a % len(OKABE_ITO)],
                    marker=MARKERS[a % len(MARKERS)],
                    # Its own line style and a marker size per attack, so that coinciding
                    # attacks (idlg on dlg) stay visible.
                    markersize=max(2, 5 - a),
                    linestyle=LINESTYLES[a % len(LINESTYLES)] if panel.ticks is None else "none",
                    capsize=1.5,
                    elinewidth=0.6,
                    label=attack_label(*attack),
                )
            if not heads.empty:
                ax.axhline(
                    float(heads[metric].iloc[0]),
                    color="0.4",
                    linestyle=":",
                    linewidth=0.8,
                    label="no defense (strongest attack)",
                )
            values = panel.rows["x"]
            if panel.ticks is not None:
                ax.set_xticks(list(panel.ticks))
                # Upright labels of several words would overlap their neighbours: vertical.
                ax.set_xticklabels(list(panel.ticks.values()), rotation=90, ha="center")
                ax.set_xlim(-0.5, len(panel.ticks) - 0.5)
            elif log_axis(values):
                ax.set_xscale("log")
            if metric in ("ssim_mean", "label_acc"):
                ax.set_ylim(min(0.0, ax.get_ylim()[0]), 1.05)
            else:
                ax.set_ylim(0.0, max(ax.get_ylim()[1], 1.0 if metric == "psnr_mean" else 0.1))
            ax.set_xlabel(panel.label)
            ax.set_ylabel(label)
            ax.grid(alpha=0.25, linewidth=0.5)
    _legend_on_top(fig)
    return fig


# The least height of a panel's frame in the leakage figure, in inches.
_PANEL_INCHES = 1.25


def _legend_on_top(fig: Figure) -> None:
    """One legend above the panels naming every attack of any panel once (a joined run's
    attack may appear in one panel only); the panels start below it, however many rows it has.
    The figure grows where its rows of panels (read off the axes' grid), each `_PANEL_INCHES`
    tall plus what its row's tick and axis labels take (long vertical defense names), and the
    legend need more height than it has, so that a layout pass can place them all without
    overlap."""
    legend: dict[str, Any] = {}
    for ax in fig.axes:
        for handle, text in zip(*ax.get_legend_handles_labels(), strict=True):
            legend.setdefault(text, handle)
    # Four columns of short labels, fewer of long ones: the legend stays within the figure.
    longest = max((len(text) for text in legend), default=0)
    columns = 4 if longest <= 26 else 3 if longest <= 36 else 2
    key = fig.legend(
        list(legend.values()), list(legend), loc="upper center",
        ncol=max(1, min(len(legend), columns)), frameon=False,
    )  # fmt: skip
    renderer = renderer_of(fig)
    tall = key.get_window_extent(renderer).height / fig.dpi + 0.05
    specs = [ax.get_subplotspec() for ax in fig.axes]
    rows = max((spec.get_gridspec().nrows for spec in specs if spec is not None), default=1)
    labels = [0.0] * rows  # per row of panels: the most its labels reach beyond a frame
    for ax, spec in zip(fig.axes, specs, strict=True):
        row = spec.rowspan.start if spec is not None else 0
        drawn = ax.get_tightbbox(renderer)
        if drawn is not None:
            reach = drawn.height - ax.get_window_extent(renderer).height
            labels[row] = max(labels[row], reach / fig.dpi)
    fig.set_figheight(max(fig.get_figheight(), tall + rows * _PANEL_INCHES + sum(labels)))
    fig.tight_layout(rect=(0, 0, 1, 1 - tall / fig.get_figheight()))


FIGURES: dict[str, Callable[[Run], Figure]] = {
    "privacy_utility": privacy_utility,
    "reconstructions": reconstruction_grid,
    "convergence": convergence,
    "leakage": leakage,
}


def write_figures(
    run_dir: str | Path,
    out: str | Path | None = None,
    formats: tuple[str, ...] = ("pdf", "png"),
    others: Sequence[str | Path] = (),
) -> tuple[list[Path], dict[str, str]]:
    """Draws every figure of `FIGURES` into ``out`` (default ``run_dir/figures``); the
    leaderboards of the ``others`` run directories join the leakage figure (`Run`). A run with
    an epsilon audit gets its figure too (`audit_figures`); a text run has only that one
    (nothing is written without it).

    Returns:
        The files written, and for each figure skipped the reason.
    """
    path = Path(run_dir)
    figures: dict[str, Callable[[Any], Figure]] = audit_figures(path)
    run = None
    if run_modality(path) != "text":
        run = load_run(run_dir, others)
        figures = {**FIGURES, **figures}
    elif not figures:
        return [], {}
    folder = Path(out) if out is not None else path / "figures"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise DataError(f"--out {folder} is not a writable directory: {err.strerror}") from None
    written, skipped = [], {}
    with paper_style():
        for name, draw in figures.items():
            try:
                fig = draw(run)
            except FigureSkipped as why:
                skipped[name] = str(why)
                continue
            for fmt in formats:
                target = folder / f"{name}.{fmt}"
                # PDFs carry no creation date, so redrawing an unchanged run gives equal files.
                metadata = {"CreationDate": None} if fmt == "pdf" else {"Software": None}
                with atomic_file(target, "wb") as handle:  # never half a figure
                    fig.savefig(handle, format=fmt, metadata=metadata)
                written.append(target)
    return written, skipped


def audit_figures(run_dir: Path) -> dict[str, Callable[[Any], Figure]]:
    """The epsilon audit's figure of the run in ``run_dir`` (`leakbench.outputs.epsilon_figure`;
    none without an audit), one per batch size when it audited several (``epsilon_audit_b4``,
    a text run's)."""
    if not (run_dir / epsilon_figure.FILE).is_file():
        return {}
    audit = pd.read_csv(run_dir / epsilon_figure.FILE)
    sizes = list(dict.fromkeys(audit["batch_size"]))

    def draw(rows: pd.DataFrame) -> Callable[[Any], Figure]:
        return lambda _: epsilon_figure.epsilon_audit(rows)

    if len(sizes) < 2:
        return {"epsilon_audit": draw(audit)}
    at = audit["batch_size"]
    return {f"epsilon_audit_b{b}": draw(audit[at == b].reset_index(drop=True)) for b in sizes}
