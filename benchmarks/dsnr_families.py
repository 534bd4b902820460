"""The client's D-SNR thresholds per model family, and their false alarms on held-apart seeds.

Reads the honest and imprint D-SNR of `benchmarks/dsnr_calibration.py`'s tables (nothing is
recomputed): results/malicious/calibration.csv (seeds 0-4 at their initialisation),
held_out.csv (seeds 5-19) and trained.csv (seeds 0-19 on digits after 100 steps of honest
training; honest models only). A family is the zoo's model name, pooled over the datasets and
the training states it was measured in. For every family and batch size:

* the threshold: the largest D-SNR of the family's honest models of the calibration seeds
  (0-4) times a margin, rounded up at two significant digits (infinite where one of them is
  infinite, and at two examples, where honest models of three families reach infinity and the
  others spread over three orders of magnitude). The margin is the smallest of `MARGINS` at
  which no calibration model of a batch of 4 or more exceeds the threshold of its family's
  other calibration models (leave one out): chosen on the calibration seeds alone;
* the false alarms: honest models of seeds 5-19 above it, with a 95% Clopper-Pearson interval;
* the imprint models of seeds 5-19 above it (the detection rate), with its interval; and the
  same two counts under the pooled thresholds of the code (`leakbench.components.dsnr.THRESHOLDS`).

It also checks the committed malicious runs again (each run directory's detection.csv, whose
D-SNR does not depend on the threshold): per run and cell, the trials flagged as the run
recorded them (the pooled thresholds of its time) and against the family thresholds of the
code (`leakbench.components.dsnr.threshold` of the run's model), and how many of a malicious
server's trials those miss: what a rerun of the run would write.

    PYTHONSAFEPATH=1 python benchmarks/dsnr_families.py

Writes results/malicious/families.csv and rechecked.csv, and prints the table of thresholds
that `leakbench.components.dsnr.FAMILY_THRESHOLDS` holds.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

import numpy as np
import pandas as pd
from scipy import stats

from leakbench.components.dsnr import threshold
from leakbench.core.environment import script_command, write_run_record

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_outputs import write_rows  # noqa: E402

RESULTS = Path("results/malicious")
TABLES = ("calibration.csv", "held_out.csv", "trained.csv")
CALIBRATION_SEEDS = range(5)
# The smallest batch a client checks: at two examples it cannot tell (the threshold is infinite).
SMALLEST_CHECKED = 4
MARGINS = (1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 15.0, 20.0)
COLUMNS = [
    "family", "batch_size", "threshold", "calibration_models", "calibration_max",
    "honest_trials", "false_alarms", "false_alarm_rate", "false_alarm_low", "false_alarm_high",
    "trained_trials", "trained_false_alarms", "imprint_trials", "imprint_flagged",
    "imprint_rate", "imprint_low", "imprint_high", "pooled_threshold", "pooled_false_alarms",
    "pooled_imprint_flagged",
]  # fmt: skip


def read_tables(folder: Path) -> pd.DataFrame:
    """Every row of the calibration tables in ``folder``, with ``train_steps`` (0 in tables
    written before the column existed) and ``held_out`` (a seed outside the calibration's)."""
    parts = []
    for name in TABLES:
        path = folder / name
        if path.is_file():
            parts.append(pd.read_csv(path))
    frame = pd.concat(parts, ignore_index=True)
    frame["train_steps"] = frame.get("train_steps", 0)
    frame["train_steps"] = frame["train_steps"].fillna(0).astype(int)
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


def interval(hits: int, trials: int) -> tuple[float, float]:
    """The 95% Clopper-Pearson interval of ``hits`` in ``trials`` (NaN without trials)."""
    if trials == 0:
        return float("nan"), float("nan")
    ci = stats.binomtest(hits, trials).proportion_ci(0.95, method="exact")
    return float(ci.low), float(ci.high)


def family_rows(frame: pd.DataFrame, margin: float) -> list[list]:
    """One row of `COLUMNS` per family and batch size."""
    rows = []
    honest = frame[frame.server == "honest"]
    for (family, batch), group in honest.groupby(["model", "batch_size"]):
        calibration = group[~group.held_out].dsnr.to_numpy()
        top = float(calibration.max())
        finite = np.isfinite(calibration).all() and batch >= SMALLEST_CHECKED
        limit = round_up(top * margin) if finite else math.inf
        held = group[group.held_out]
        trained = held[held.train_steps > 0]
        imprint = frame[(frame.server == "malicious") & frame.held_out]
        imprint = imprint[(imprint.model == family) & (imprint.batch_size == batch)].dsnr
        alarms, caught = int((held.dsnr > limit).sum()), int((imprint > limit).sum())
        pooled = threshold(int(batch))
        rows.append([
            family, int(batch), limit, len(calibration), top, len(held), alarms,
            alarms / len(held), *interval(alarms, len(held)), len(trained),
            int((trained.dsnr > limit).sum()), len(imprint), caught,
            caught / len(imprint) if len(imprint) else math.nan, *interval(caught, len(imprint)),
            pooled, int((held.dsnr > pooled).sum()), int((imprint > pooled).sum()),
        ])  # fmt: skip
    return rows


RECHECKED_COLUMNS = [
    "run", "model", "attack", "defense", "defense_params", "clients", "batch_size", "trials",
    "recorded_flagged", "family_threshold", "family_flagged", "family_missed",
]  # fmt: skip


def rechecked(results: Path) -> list[list]:
    """Every committed run's detection cells against the code's family thresholds: one row of
    `RECHECKED_COLUMNS` per run and (attack, defense) cell whose clients could check."""
    rows = []
    for detection_path in sorted(results.glob("*/detection.csv")):
        run = detection_path.parent
        config = tomllib.loads((run / "config.toml").read_text(encoding="utf-8"))
        threat = config.get("threat_model", {})
        clients, malicious = int(threat.get("clients", 1)), threat.get("server") == "malicious"
        detection = pd.read_csv(detection_path)
        cells = ["model", "attack", "defense", "defense_params", "batch_size"]
        for (model, attack, defense, params, batch), cell in detection.groupby(cells):
            if cell.dsnr.isna().all():
                continue  # clients of one example: nothing to check
            size = int(batch) // clients
            limit = threshold(size, model)
            flagged = int((cell.dsnr > limit).sum())
            missed = len(cell) - flagged if malicious else 0
            rows.append([
                run.name, model, attack, defense, params, clients, size, len(cell),
                int(cell.flagged.astype(bool).sum()), limit, flagged, missed,
            ])  # fmt: skip
    return rows


def code_table(table: pd.DataFrame) -> str:
    """`leakbench.components.dsnr.FAMILY_THRESHOLDS` as Python source."""
    lines = ["FAMILY_THRESHOLDS: dict[str, dict[int, float]] = {"]
    for family, part in table.groupby("family"):
        cells = ", ".join(
            f"{int(b)}: {'np.inf' if math.isinf(t) else repr(float(t))}"
            for b, t in zip(part.batch_size, part.threshold, strict=True)
        )
        lines.append(f'    "{family}": {{{cells}}},')
    return "\n".join([*lines, "}"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=RESULTS, help="folder of the tables")
    parser.add_argument("--out", type=Path, default=RESULTS / "families.csv")
    args = parser.parse_args(argv)
    frame = read_tables(args.results)
    honest = frame[(frame.server == "honest") & ~frame.held_out]
    honest = honest[honest.batch_size >= SMALLEST_CHECKED]
    margin = leave_one_out_margin(
        [group.dsnr.to_numpy() for _, group in honest.groupby(["model", "batch_size"])]
    )
    rows = family_rows(frame, margin)
    write_rows(args.out, COLUMNS, rows)
    again = pd.DataFrame(rechecked(args.results), columns=RECHECKED_COLUMNS)
    again_path = args.out.with_name("rechecked.csv")
    write_rows(again_path, RECHECKED_COLUMNS, again.values.tolist())
    outputs = f"{args.out.name}, {again_path.name}"
    write_run_record(args.out.parent, outputs, script_command(__file__, argv))
    table = pd.DataFrame(rows, columns=COLUMNS)
    shown = ["family", "batch_size", "threshold", "honest_trials", "false_alarms",
             "false_alarm_high", "imprint_rate", "pooled_false_alarms"]  # fmt: skip
    print(f"margin {margin} (leave one out over the calibration seeds)")
    print(table[shown].to_string(index=False))
    checked = table[table.batch_size >= SMALLEST_CHECKED]
    print(
        f"held out: {checked.false_alarms.sum()} false alarms in {checked.honest_trials.sum()} "
        f"honest trials (pooled thresholds: {checked.pooled_false_alarms.sum()}); imprint "
        f"flagged {checked.imprint_flagged.sum()} of {checked.imprint_trials.sum()} (pooled: "
        f"{checked.pooled_imprint_flagged.sum()})"
    )
    print(code_table(table))
    changed = again[again.recorded_flagged != again.family_flagged]
    print(f"committed runs: {len(changed)} cells whose flags the family thresholds change")
    print(changed.drop(columns=["defense_params"]).to_string(index=False))
    print(f"wrote {args.out} and {again_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
