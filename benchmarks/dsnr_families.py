"""The client's D-SNR threshold per layer kind, and the false alarms and imprint flags they give
per model family on held-apart seeds.

Reads `benchmarks/dsnr_calibration.py`'s tables (nothing is recomputed): one row per trial and
layer kind (dense, convolution, normalisation: `leakbench.components.dsnr.layer_kind`), the
kind's largest D-SNR. results/malicious/calibration.csv holds seeds 0-4 at their
initialisation, held_out.csv seeds 5-19, trained.csv seeds 0-19 on digits after 100 steps of
honest training (honest models only; 0-4 calibrate). For every kind and batch size:

* the threshold: the largest D-SNR of that kind in the honest models of the calibration seeds
  (0-4), over every model, dataset and training state, times the kind's margin, rounded up at
  two significant digits (infinite where one of them is infinite, and at two examples). A
  kind's margin is the smallest of `MARGINS` at which, at every batch size of 4 or more, no
  model of the zoo exceeds the threshold that the kind's other models give (leave one model
  out: a client's model is one the calibration never saw); a kind that one model alone holds
  leaves one trial out instead. It is chosen on the calibration seeds alone.

Then, for every model family of the zoo (the honest model, or the one behind the imprint block)
and batch size, a trial is flagged when any of its kinds exceeds that kind's threshold: the
held-out honest trials flagged (false alarms) and the held-out imprint trials flagged, each
with a 95% Clopper-Pearson interval.

    PYTHONSAFEPATH=1 python benchmarks/dsnr_families.py

Writes results/malicious/kinds.csv (the thresholds) and families.csv (their false alarms and
flags), and prints the table that `leakbench.components.dsnr.KIND_THRESHOLDS` holds. Where
the fresh tables exist (fresh.csv and fresh_trained.csv: seeds 20-34, measured after the rule
was chosen), fresh_families.csv holds the same counts on them.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from leakbench.core.environment import script_command, write_run_record

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_outputs import write_rows  # noqa: E402

RESULTS = Path("results/malicious")
TABLES = ("calibration.csv", "held_out.csv", "trained.csv")
# Seeds 20-34, measured after the rule above was chosen: the clean test of its thresholds.
FRESH_TABLES = ("fresh.csv", "fresh_trained.csv")
CALIBRATION_SEEDS = range(5)
# The smallest batch a client checks: at two examples it cannot tell (the threshold is infinite).
SMALLEST_CHECKED = 4
MARGINS = (1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 15.0, 20.0)
# One trial: one model (honest or behind the imprint block) checked on one batch.
TRIAL = ["dataset", "model", "server", "batch_size", "seed", "train_steps"]
KIND_COLUMNS = [
    "kind", "batch_size", "threshold", "margin", "calibration_trials", "calibration_max",
    "calibration_models",
]  # fmt: skip
COLUMNS = [
    "family", "batch_size", "honest_trials", "false_alarms", "false_alarm_rate",
    "false_alarm_low", "false_alarm_high", "trained_trials", "trained_false_alarms",
    "imprint_trials", "imprint_flagged", "imprint_rate", "imprint_low", "imprint_high",
]  # fmt: skip


def read_tables(folder: Path, names: tuple[str, ...] = TABLES) -> pd.DataFrame:
    """Every row of the tables ``names`` in ``folder``, with ``held_out`` (a seed outside the
    calibration's)."""
    frame = pd.concat([pd.read_csv(folder / name) for name in names], ignore_index=True)
    frame["held_out"] = ~frame["seed"].isin(list(CALIBRATION_SEEDS))
    return frame


def round_up(value: float) -> float:
    """``value`` rounded up at two significant digits (infinity stays)."""
    if not math.isfinite(value) or value <= 0:
        return value
    step = 10.0 ** (math.floor(math.log10(value)) - 1)
    return float(f"{math.ceil(value / step - 1e-9) * step:.6g}")


def leave_one_out_margin(groups: list[np.ndarray]) -> float:
    """The smallest margin of `MARGINS` at which no value of a group exceeds the margin times
    the largest of its group's other values (groups with an infinite value left out)."""
    ratios = [
        values[i] / np.delete(values, i).max()
        for values in groups
        if len(values) > 1 and np.isfinite(values).all()
        for i in range(len(values))
    ]
    worst = max(ratios, default=1.0)
    fitting = [margin for margin in MARGINS if margin >= worst]
    if not fitting:
        raise SystemExit(f"no margin of {MARGINS} covers a leave-one-out ratio of {worst:.2f}")
    return fitting[0]


def kind_margin(part: pd.DataFrame) -> float:
    """One kind's margin from its honest calibration trials ``part``: `leave_one_out_margin`
    over, per batch size of 4 or more, the largest D-SNR of each model of the zoo (each trial's
    where one model alone holds the kind)."""
    groups = []
    for _, group in part[part.batch_size >= SMALLEST_CHECKED].groupby("batch_size"):
        by_model = group.groupby("model").dsnr.max().to_numpy()
        groups.append(by_model if len(by_model) > 1 else group.dsnr.to_numpy())
    return leave_one_out_margin(groups)


def interval(hits: int, trials: int) -> tuple[float, float]:
    """The 95% Clopper-Pearson interval of ``hits`` in ``trials`` (NaN without trials)."""
    if trials == 0:
        return float("nan"), float("nan")
    ci = stats.binomtest(hits, trials).proportion_ci(0.95, method="exact")
    return float(ci.low), float(ci.high)


def kind_rows(frame: pd.DataFrame) -> list[list]:
    """One row of `KIND_COLUMNS` per layer kind and batch size, from the honest calibration
    trials."""
    honest = frame[(frame.server == "honest") & ~frame.held_out]
    rows = []
    for kind, part in honest.groupby("kind"):
        margin = kind_margin(part)
        for batch, group in part.groupby("batch_size"):
            top = float(group.dsnr.max())
            finite = np.isfinite(group.dsnr).all() and batch >= SMALLEST_CHECKED
            models = ", ".join(sorted(group.model.unique()))
            limit = round_up(top * margin) if finite else math.inf
            rows.append([kind, int(batch), limit, margin, len(group), top, models])
    return rows


def flagged_trials(frame: pd.DataFrame, limits: dict[tuple[str, int], float]) -> pd.DataFrame:
    """One row per trial: whether any of its kinds exceeds that kind's threshold (``limits``
    by kind and batch size; a kind without one takes the largest of the batch size's)."""
    largest = {b: max(v for (_, size), v in limits.items() if size == b) for _, b in limits}
    bound = [
        limits.get((kind, int(b)), largest[int(b)])
        for kind, b in zip(frame.kind, frame.batch_size, strict=True)
    ]
    frame = frame.assign(flagged=frame.dsnr.to_numpy() > np.asarray(bound))
    return frame.groupby([*TRIAL, "held_out"], as_index=False).flagged.any()


def family_rows(trials: pd.DataFrame) -> list[list]:
    """One row of `COLUMNS` per model family and batch size, over the held-out trials."""
    rows = []
    held = trials[trials.held_out]
    for (family, batch), group in held.groupby(["model", "batch_size"]):
        honest = group[group.server == "honest"]
        trained = honest[honest.train_steps > 0]
        imprint = group[group.server == "malicious"]
        alarms, caught = int(honest.flagged.sum()), int(imprint.flagged.sum())
        rows.append([
            family, int(batch), len(honest), alarms, alarms / len(honest),
            *interval(alarms, len(honest)), len(trained), int(trained.flagged.sum()),
            len(imprint), caught, caught / len(imprint) if len(imprint) else math.nan,
            *interval(caught, len(imprint)),
        ])  # fmt: skip
    return rows


def report(table: pd.DataFrame, name: str) -> None:
    """Prints the counts of `family_rows` and their sums over the batches a client checks."""
    shown = ["family", "batch_size", "honest_trials", "false_alarms", "false_alarm_high",
             "trained_false_alarms", "imprint_trials", "imprint_flagged",
             "imprint_low"]  # fmt: skip
    print(table[shown].to_string(index=False))
    checked = table[table.batch_size >= SMALLEST_CHECKED]
    print(
        f"{name}: {checked.false_alarms.sum()} false alarms in {checked.honest_trials.sum()} "
        f"honest trials; imprint flagged {checked.imprint_flagged.sum()} of "
        f"{checked.imprint_trials.sum()}"
    )


def code_table(table: pd.DataFrame) -> str:
    """`leakbench.components.dsnr.KIND_THRESHOLDS` as Python source."""
    lines = ["KIND_THRESHOLDS: dict[str, dict[int, float]] = {"]
    for kind, part in table.groupby("kind"):
        cells = ", ".join(
            f"{int(b)}: {'np.inf' if math.isinf(t) else repr(float(t))}"
            for b, t in zip(part.batch_size, part.threshold, strict=True)
        )
        lines.append(f'    "{kind}": {{{cells}}},')
    return "\n".join([*lines, "}"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=RESULTS, help="folder of the tables")
    parser.add_argument("--out", type=Path, default=RESULTS / "families.csv")
    args = parser.parse_args(argv)
    frame = read_tables(args.results)
    kinds = pd.DataFrame(kind_rows(frame), columns=KIND_COLUMNS)
    limits = {(row.kind, int(row.batch_size)): row.threshold for row in kinds.itertuples()}
    table = pd.DataFrame(family_rows(flagged_trials(frame, limits)), columns=COLUMNS)
    kinds_path = args.out.with_name("kinds.csv")
    write_rows(kinds_path, KIND_COLUMNS, kinds.values.tolist())
    write_rows(args.out, COLUMNS, table.values.tolist())
    outputs = f"{kinds_path.name}, {args.out.name}"
    if all((args.results / name).is_file() for name in FRESH_TABLES):
        fresh = family_rows(flagged_trials(read_tables(args.results, FRESH_TABLES), limits))
        fresh_path = args.out.with_name(f"fresh_{args.out.name}")
        write_rows(fresh_path, COLUMNS, fresh)
        outputs += f", {fresh_path.name}"
        report(pd.DataFrame(fresh, columns=COLUMNS), "fresh seeds 20-34")
    write_run_record(args.out.parent, outputs, script_command(__file__, argv))
    print(kinds.drop(columns="calibration_models").to_string(index=False))
    report(table, "held out: seeds 5-19")
    print(code_table(kinds))
    print(f"wrote {kinds_path} and {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
