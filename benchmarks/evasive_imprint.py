"""A malicious server that hides from the client's D-SNR check: detection and recovery.

For the plain imprint block (`imprint`, 128 bins) and the hidden one (`hidden_imprint`, 128
bins, every unit firing for the share ``crowd`` of the public images) at several crowds, on
digits with one model of the zoo (default `lenet`) and one client of 64 examples: for each
model seed, the model at its seeded initialisation behind the server's block (built from the
training split, the public one), a seeded batch of the test split (the private one, as in
`benchmarks/dsnr_calibration.py`), the client's undefended update, the attack on it and the
client's D-SNR check (every layer against its kind's threshold,
`leakbench.components.dsnr.detect`). Reported per attack: the share of trials the check flags,
the share of images recovered exactly (MSE <= 1e-3 after Hungarian matching,
`leakbench.components.metrics.match`) beside the closed form, each with a 95% Clopper-Pearson
interval (the images' interval treats them as independent; they are not quite, as the
examples of one batch share their bins), and the median and largest D-SNR of the server's
block (a dense layer) beside the dense threshold.

    PYTHONSAFEPATH=1 python benchmarks/evasive_imprint.py

Writes results/malicious/evasive.csv and results/malicious/evasive.md.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import tensorflow as tf
from scipy import stats

from leakbench.attacks import AttackTarget, make_attack
from leakbench.attacks.hidden_imprint import hidden_singleton_share
from leakbench.attacks.imprint import singleton_share
from leakbench.components.dsnr import DENSE, judge_layers, layer_dsnr, threshold
from leakbench.components.forward import model_gradients
from leakbench.components.metrics import match, mse
from leakbench.components.models import build_model
from leakbench.components.stem import STEM
from leakbench.core.environment import script_command, write_run_record
from leakbench.datasets import load_dataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_outputs import write_rows  # noqa: E402

RESULTS = Path("results/malicious")
BINS = 128
CROWDS = (0.05, 0.1, 0.25, 0.5, 0.75, 0.9)
EXACT_MSE = 1e-3
COLUMNS = [
    "dataset", "model", "attack", "crowd", "batch_size", "trials", "threshold", "flagged",
    "flagged_low", "flagged_high", "images", "recovered", "recovered_low", "recovered_high",
    "closed_form", "dsnr_median", "dsnr_max",
]  # fmt: skip


def attacks(crowds: tuple[float, ...]) -> list[tuple[float, object]]:
    """The plain block (crowd NaN) and the hidden one at every crowd."""
    plain = [(math.nan, make_attack("imprint", bins=BINS))]
    return plain + [(c, make_attack("hidden_imprint", bins=BINS, crowd=c)) for c in crowds]


def trial(attack, model, data, seed: int, batch: int) -> tuple[bool, float, float]:
    """One trial: whether the client's check flags the shipped model, the D-SNR of the
    server's block, and the images recovered exactly."""
    shipped = attack.malicious_model(model, data.train.x, seed)
    pick = np.random.default_rng([seed, batch]).choice(len(data.test), batch, replace=False)
    x, y = data.test.x[pick], data.test.y[pick]
    targets = tf.one_hot(y, data.num_classes)
    grads = model_gradients(shipped, tf.constant(x), targets)
    target = AttackTarget(shipped, tuple(grads), data.input_shape, batch, data.num_classes)
    rec = attack(target, seed=seed)
    errors = mse(x, rec.images[match(x, rec.images)])
    layers = layer_dsnr(shipped, tf.constant(x), targets)
    flagged = judge_layers(layers, batch).flagged
    return flagged, layers[STEM][0], float(np.sum(errors <= EXACT_MSE))


def interval(hits: int, trials: int) -> tuple[float, float]:
    ci = stats.binomtest(int(hits), int(trials)).proportion_ci(0.95, method="exact")
    return float(ci.low), float(ci.high)


def summary_row(model_name: str, attack, crowd: float, batch: int, flags, dsnr, hits) -> list:
    """One row of `COLUMNS` from the trials' flags, the block's D-SNR and exact counts."""
    dsnr, hits = np.asarray(dsnr), np.asarray(hits)
    flagged, images, recovered = int(np.sum(flags)), batch * len(dsnr), int(hits.sum())
    if math.isnan(crowd):
        closed = singleton_share(BINS, batch)
    else:
        closed = hidden_singleton_share(BINS, crowd, batch)
    return [
        "digits", model_name, attack.name, crowd, batch, len(dsnr), threshold(batch, DENSE),
        flagged, *interval(flagged, len(dsnr)), images, recovered, *interval(recovered, images),
        closed, float(np.median(dsnr)), float(np.max(dsnr)),
    ]  # fmt: skip


def measure(model_name: str, seeds: range, batch: int, crowds: tuple[float, ...]) -> list[list]:
    data = load_dataset("digits")
    rows = []
    for crowd, attack in attacks(crowds):
        flags, dsnr, hits = [], [], []
        start = time.perf_counter()
        for seed in seeds:
            model = build_model(model_name, data.input_shape, data.num_classes, seed=seed)
            flagged, value, exact = trial(attack, model, data, seed, batch)
            flags.append(flagged)
            dsnr.append(value)
            hits.append(exact)
        rows.append(summary_row(model_name, attack, crowd, batch, flags, dsnr, hits))
        print(*rows[-1], f"{time.perf_counter() - start:.0f}s", flush=True)
    return rows


def percent(value: float) -> str:
    return f"{100 * value:.0f}%"


def markdown(table: pd.DataFrame, command: str) -> str:
    """results/malicious/evasive.md: the table and the command that wrote it."""
    lines = [
        "# A server that hides from the D-SNR check",
        "",
        "Written by `benchmarks/evasive_imprint.py` (do not edit by hand):",
        "",
        f"    {command}",
        "",
        "| attack | crowd | trials | flagged (95% CI) | recovered exactly (95% CI) | "
        "closed form | block's D-SNR median (max) against the dense threshold |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in table.itertuples():
        crowd = "–" if math.isnan(row.crowd) else f"{row.crowd:g}"
        lines.append(
            f"| `{row.attack}` | {crowd} | {row.trials} | {row.flagged} of {row.trials} "
            f"({percent(row.flagged_low)}-{percent(row.flagged_high)}) | {row.recovered} of "
            f"{row.images} ({percent(row.recovered_low)}-{percent(row.recovered_high)}) | "
            f"{percent(row.closed_form)} | {row.dsnr_median:.3g} ({row.dsnr_max:.3g}) against "
            f"{row.threshold:g} |"
        )
    first = table.iloc[0]
    lines += [
        "",
        f"Digits, `{first.model}` at its seeded initialisation, one client of "
        f"{first.batch_size} examples, {BINS} bins, one trial per model seed. Images recovered "
        f"exactly: MSE <= {EXACT_MSE:g} after Hungarian matching.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="lenet", help="the zoo's model (default lenet)")
    parser.add_argument("--seeds", type=int, default=20, help="model seeds (trials) per attack")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--crowds", type=float, nargs="+", default=list(CROWDS))
    parser.add_argument("--out", type=Path, default=RESULTS / "evasive.csv")
    args = parser.parse_args(argv)
    rows = measure(args.model, range(args.seeds), args.batch_size, tuple(args.crowds))
    write_rows(args.out, COLUMNS, rows)
    command = script_command(__file__, argv)
    notes = args.out.with_suffix(".md")
    notes.write_text(markdown(pd.DataFrame(rows, columns=COLUMNS), command), encoding="utf-8")
    write_run_record(args.out.parent, f"{args.out.name}, {notes.name}", command)
    print(f"wrote {args.out} and {notes}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
