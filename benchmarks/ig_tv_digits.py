"""`ig`'s total-variation weight on digits: the defaults (the reference's CIFAR-10 setting)
against smaller weights, on MNIST test images with the DLG LeNet.

The reference's weight is set for natural images; this measures what it does to handwritten
digits, whose strokes have sharp edges: `ig` at its defaults and with ``tv`` changed alone, on
the same images (a seeded draw of leakbench's MNIST test split), labels known, one image at a
time, the `lenet` at its seed-0 initialisation. Writes ``mnist_tv.csv`` (one row per image and
weight) and ``mnist_tv.md`` under ``--out``:

    PYTHONSAFEPATH=1 python benchmarks/ig_tv_digits.py --data-root ../shared/data \\
        --out results/ig_reference
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import tensorflow as tf

from leakbench.attacks import AttackTarget, make_attack
from leakbench.components import metrics
from leakbench.components.forward import model_gradients
from leakbench.components.models import build_model
from leakbench.core.seeds import private_indices
from leakbench.datasets import load_dataset

# None: the default weight.
WEIGHTS = (None, 1e-2, 1e-4, 0.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-root", type=Path, default=Path("../shared/data"))
    parser.add_argument("--out", type=Path, default=Path("results/ig_reference"))
    parser.add_argument("--images", type=int, default=8)
    parser.add_argument("--iterations", type=int, default=2000)
    args = parser.parse_args(argv)
    began = time.perf_counter()
    data = load_dataset(f"idx:{args.data_root / 'mnist'}")
    model = build_model("lenet", data.input_shape, data.num_classes, seed=0)
    indices = private_indices(len(data.test), args.images, seed=0)
    targets = []
    for i in indices:
        x, y = data.test.x[i : i + 1], data.test.y[i : i + 1]
        grads = model_gradients(model, tf.constant(x), tf.one_hot(y, data.num_classes))
        targets.append(AttackTarget(model, tuple(grads), data.input_shape, 1, 10, labels=y))
    rows = []
    for weight in WEIGHTS:
        changed = {} if weight is None else {"tv": weight}
        attack = make_attack("ig", iterations=args.iterations, **changed)
        recs = attack.attack_many(targets, list(range(len(targets))))
        for i, rec in zip(indices, recs, strict=True):
            mse = float(metrics.mse(data.test.x[i : i + 1], rec.images)[0])
            rows.append({"image_index": int(i), "tv": attack.tv, "mse": mse,
                         "psnr": float(metrics.psnr(np.array([mse]))[0])})  # fmt: skip
    frame = pd.DataFrame(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(args.out / "mnist_tv.csv", index=False, float_format="%.6g")
    lines = [
        "# `ig`'s total-variation weight on MNIST",
        "",
        f"Made by `benchmarks/ig_tv_digits.py` on {datetime.date.today().isoformat()} "
        f"({time.perf_counter() - began:.0f} s): {len(indices)} MNIST test images, `lenet` at "
        f"seed 0, labels known, {args.iterations:,} iterations, every other `ig` parameter at "
        "its default; recovered means MSE <= 1e-3.",
        "",
        "| `tv` | mean PSNR (95% CI) | recovered |",
        "| --- | --- | --- |",
    ]
    for tv, group in frame.groupby("tv", sort=False):
        mean, ci, n = metrics.mean_ci95(group["psnr"])
        label = f"{tv:g} (default)" if tv == make_attack("ig").tv else f"{tv:g}"
        lines.append(
            f"| {label} | {mean:.1f} dB (+-{ci:.1f}) | {int((group['mse'] <= 1e-3).sum())} of {n} |"
        )
    (args.out / "mnist_tv.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
