"""Leakage over training: the same private examples attacked at each checkpoint of a model.

A config with ``[threat_model] checkpoints = [...]`` is a family of runs, one per checkpoint,
each an ordinary run directory under ``OUT/checkpoints/<label>/`` (resumable, with its own
leaderboard and verdicts). A numeric checkpoint c is the config with ``train_steps`` set to c
epochs (``checkpoint_unit = "epoch"``: c times the pre-attack recipe's steps per pass over the
training split, rounded) or c steps; a saved-model checkpoint is the config with ``model`` set
to it. The runs share the seeds, so they attack the same private examples; and a checkpoint
run's trial keys are those of the same config written by hand with that ``train_steps`` or
``model``.

Beside them, ``OUT/checkpoints.csv`` joins the leaderboards with the checkpoint (label,
progress, the steps trained, and the attacked model's test accuracy at the first seed), and
``OUT/figures/leakage_over_training.{pdf,png}`` draws, per defense, the share of images the
strongest attack leaked (the verdict's measure, with its 95% interval) against training
progress.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pandas as pd

from leakbench.client.recipes import TrainingConfig
from leakbench.client.training import evaluate
from leakbench.components.saved_models import model_sha256
from leakbench.core.files import atomic_file
from leakbench.datasets import Dataset
from leakbench.run.config import RunSpec, build_run

FOLDER = "checkpoints"
TABLE = "checkpoints.csv"
FIGURE = "leakage_over_training"
ACCURACY = "model_accuracy.json"
COLUMNS = ["checkpoint", "progress", "unit", "steps", "model_accuracy"]
# The [threat_model] keys of the whole family, not of one checkpoint's run.
FAMILY_KEYS = ("checkpoints", "checkpoint_unit")


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """One point of training: its label (the run directory's name), its progress in ``unit``s
    (the saved model's position for saved models), the steps trained, and its run's config."""

    label: str
    progress: float
    unit: str
    steps: int
    spec: RunSpec


def steps_per_epoch(training: TrainingConfig | None, dataset: Dataset) -> int:
    """The pre-attack training's steps per pass over the training split
    (`leakbench.client.training.train_steps`), by the run's ``training`` recipe (the default
    one without)."""
    recipe = (training or TrainingConfig()).default
    return max(1, len(dataset.train) // recipe.batch_size)


def expand(spec: RunSpec, dataset: Dataset) -> list[Checkpoint]:
    """The runs of a checkpoint config, in training order: each is built from the config's
    resolved document (`RunSpec.to_mapping`) with its ``model`` or ``train_steps``."""
    threat = spec.threat_model
    doc = spec.to_mapping()
    # The checkpoint keys are left out: each run attacks one model state.
    plain = {k: v for k, v in doc["threat_model"].items() if k not in FAMILY_KEYS}
    points = []
    for i, value in enumerate(threat.checkpoints):
        if isinstance(value, str):
            child = build_run({**doc, "model": value, "threat_model": plain})
            label = f"{i:02d}-{Path(value[len('keras:') :]).stem}"
            points.append(Checkpoint(label, float(i), "saved model", 0, child))
            continue
        if threat.checkpoint_unit == "epoch":
            steps = int(round(value * steps_per_epoch(spec.training, dataset)))
        else:
            steps = int(value)
        child = build_run({**doc, "threat_model": {**plain, "train_steps": steps}})
        label = f"{threat.checkpoint_unit}-{value:g}"
        points.append(Checkpoint(label, float(value), threat.checkpoint_unit, steps, child))
    return points


def model_accuracy(point: Checkpoint, dataset: Dataset, folder: Path) -> float:
    """The attacked model's test accuracy at the checkpoint (its first seed, inference mode),
    kept in the checkpoint's run directory (``folder/ACCURACY``) so that a resumed run does
    not train the model again to measure it."""
    from leakbench.run.execute import attacked_model

    spec, record = point.spec, folder / ACCURACY
    key = {
        "seed": spec.seeds[0],
        "steps": point.steps,
        "model": spec.model,
        "model_sha256": model_sha256(spec.model),  # None for a zoo model
    }
    if record.is_file():
        held = json.loads(record.read_text(encoding="utf-8"))
        if {k: held.get(k) for k in key} == key:
            return float(held["accuracy"])
    model = attacked_model(
        spec.model,
        dataset,
        spec.seeds[0],
        threat=spec.threat_model,
        training=spec.training,
    )
    accuracy = evaluate(model, dataset.test.x, dataset.test.y)
    with atomic_file(record) as handle:
        handle.write(json.dumps({**key, "accuracy": accuracy}, indent=2) + "\n")
    return accuracy


def joined(points: list[Checkpoint], boards: list[pd.DataFrame], accuracy: list[float]) -> Any:
    """The leaderboards of the checkpoint runs, one table, each row with its checkpoint."""
    frames = []
    for point, board, acc in zip(points, boards, accuracy, strict=True):
        head = pd.DataFrame(
            [[point.label, point.progress, point.unit, point.steps, acc]] * len(board),
            columns=COLUMNS,
        )
        frames.append(pd.concat([head, board.reset_index(drop=True)], axis=1))
    return pd.concat(frames, ignore_index=True)


def write_table(frame: pd.DataFrame, out: Path) -> Path:
    path = out / TABLE
    with atomic_file(path) as tmp:
        frame.to_csv(tmp, index=False)
    return path


def leakage_over_training(frame: pd.DataFrame) -> Any:
    """Per defense configuration, the share of images its strongest attack leaked (with the
    95% interval) and the median PSNR against training progress; the attacked model's test
    accuracy on the right axis of the first panel. The x axis marks the checkpoints themselves;
    one legend, below both panels, names every line."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure
    from matplotlib.ticker import FixedLocator, NullLocator

    from leakbench.outputs.naming import defense_label
    from leakbench.outputs.plotting import renderer_of

    strongest = frame[frame["strongest"].astype(bool)]
    unit = str(frame["unit"].iloc[0])
    fig = Figure(figsize=(7.0, 3.2))
    leak_ax, psnr_ax = fig.subplots(1, 2)
    groups = list(strongest.groupby(["defense", "defense_params"], sort=False))
    for k, ((defense, params), rows) in enumerate(groups):
        rows = rows.sort_values("progress")
        # Lines of equal leakage would hide each other: each defense is dodged a little.
        dodge = 1.0 + (k - (len(groups) - 1) / 2) * 0.03
        x = rows["progress"].to_numpy(dtype=float) * dodge
        share = rows["leaked_rate"].to_numpy(dtype=float)
        low = rows["leaked_low"].to_numpy(dtype=float)
        high = rows["leaked_high"].to_numpy(dtype=float)
        label = defense_label(defense, params)
        leak_ax.errorbar(x, share, yerr=[share - low, high - share], fmt="-o", capsize=2,
                         markersize=3, label=label)  # fmt: skip
        psnr_ax.plot(x, rows["psnr_median"].to_numpy(dtype=float), "-o", markersize=3, label=label)
    accuracy = frame.drop_duplicates("checkpoint").sort_values("progress")
    twin = leak_ax.twinx()
    twin.plot(accuracy["progress"], accuracy["model_accuracy"], ":", color="grey", linewidth=1.0,
              label="model's test accuracy (right axis)")  # fmt: skip
    twin.set_ylim(0, 1)
    twin.set_ylabel("model's test accuracy")
    xlabel = "saved model (training order)" if unit == "saved model" else f"training ({unit}s)"
    leak_ax.set_ylabel("images leaked (strongest attack)")
    leak_ax.set_ylim(-0.02, 1.02)
    psnr_ax.set_ylabel("median PSNR (dB)")
    progress = sorted({float(p) for p in frame["progress"]})
    for ax in (leak_ax, psnr_ax, twin):
        ax.set_xlabel(xlabel)
        if unit != "saved model":  # linear to 1, logarithmic beyond: early points spread out
            ax.set_xscale("symlog", linthresh=1.0, linscale=0.5)
        ax.set_xlim(-0.3, 1.3 * float(frame["progress"].max()) + 0.3)
        # A tick at each checkpoint, labelled as its progress ("0", "5", "100").
        ax.xaxis.set_major_locator(FixedLocator(progress))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xticklabels([f"{p:g}" for p in progress])
    for ax in (leak_ax, psnr_ax):
        ax.grid(alpha=0.25, linewidth=0.5)
    handles, labels = leak_ax.get_legend_handles_labels()
    extra, extra_labels = twin.get_legend_handles_labels()
    key = fig.legend([*handles, *extra], [*labels, *extra_labels], loc="lower center",
                     ncol=min(len(labels) + 1, 4), frameon=False, fontsize=8)  # fmt: skip
    # The panels sit above the legend, however many rows it has.
    tall = key.get_window_extent(renderer_of(fig)).height / fig.dpi + 0.05
    fig.tight_layout(rect=(0, tall / fig.get_figheight(), 1, 1))
    return fig


def write_figure(frame: pd.DataFrame, out: Path, folder: bool = True) -> list[Path]:
    """Writes the figure as PDF and PNG into ``out/figures`` (into ``out`` itself without
    ``folder``)."""
    folder_path = out / "figures" if folder else out
    folder_path.mkdir(parents=True, exist_ok=True)
    fig = leakage_over_training(frame)
    written = []
    for fmt in ("pdf", "png"):
        path = folder_path / f"{FIGURE}.{fmt}"
        with atomic_file(path, "wb") as tmp:
            fig.savefig(tmp, dpi=200, format=fmt,
                        metadata={"CreationDate": None} if fmt == "pdf" else None)  # fmt: skip
        written.append(path)
    return written
