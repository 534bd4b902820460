"""Leakage against batch size: label accuracy and PSNR for batches of 1 to 64 CIFAR-10 images.

For each batch size B in 1, 2, 4, ..., 64 it runs one ordinary leakbench run (`run_benchmark`) on
real CIFAR-10 test images from ``../shared/data`` with the `convnet` at its seeded
initialisation, no defense, labels unknown: `ig` reconstructs the batch after recovering its
labels from the gradient (`leakbench.attacks.labels.recover_labels`), and every image is scored
after Hungarian matching. Each run directory lands under ``--out`` (resumable: rerun the same
command), and one CSV row per batch size is written to ``--csv``.

    PYTHONSAFEPATH=1 python benchmarks/batch_size.py --data-root ../shared/data \\
        --out runs/batch-size --csv results/batch_size/batch_size.csv

With ``--label-batches N`` it measures label recovery alone (no image search, seconds per
size) over N batches per size, into ``<csv stem>_labels.csv``.

The attack budget is small on purpose (``--iterations``, default 200 Adam steps): the CPU cost
of `ig` on the convnet grows with the batch (one problem per program), and the curve's point is
how leakage falls with B at a fixed budget, stated beside every number.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd

from leakbench.components.metrics import mean_ci95
from leakbench.core.environment import script_command, write_run_record
from leakbench.run.config import parse_config
from leakbench.run.runner import run_benchmark

SIZES = (1, 2, 4, 8, 16, 32, 64)


def config(data: Path, batch: int, batches: int, iterations: int) -> str:
    return f"""
name = "batch-size-{batch}"
dataset = "npz:{data / "cifar10" / "cifar10-test.npz"}"
model = "convnet"
images = {batch * batches}
batch_size = {batch}
seeds = [0]

[[attack]]
name = "ig"
iterations = {iterations}

[[defense]]
name = "none"

[training]
enabled = false
"""


def label_curve(data: Path, sizes: list[int], batches: int) -> pd.DataFrame:
    """Label recovery alone (no image search), over ``batches`` batches per size: the gradient of
    each batch on the seed-0 convnet, `recover_labels`, label accuracy as a multiset."""
    import numpy as np
    import tensorflow as tf

    from leakbench.attacks.labels import recover_labels
    from leakbench.components.forward import model_gradients
    from leakbench.components.metrics import label_accuracy
    from leakbench.components.models import build_model
    from leakbench.core.seeds import private_indices
    from leakbench.datasets import load_dataset

    dataset = load_dataset(f"npz:{data / 'cifar10' / 'cifar10-test.npz'}")
    model = build_model("convnet", dataset.input_shape, dataset.num_classes, seed=0)
    rows = []
    for size in sizes:
        order = private_indices(len(dataset.test), size * batches, seed=1)
        scores = []
        for b in range(batches):
            index = order[b * size : (b + 1) * size]
            x, y = dataset.test.x[index], dataset.test.y[index]
            grads = model_gradients(model, tf.constant(x), tf.one_hot(y, dataset.num_classes))
            found = recover_labels(model, grads, size, dataset.num_classes)
            scores.append(label_accuracy(y, found))
        mean, ci, n = mean_ci95(np.asarray(scores))
        rows.append({"batch_size": size, "batches": n, "label_acc": mean, "label_acc_ci95": ci})
        print(pd.DataFrame(rows[-1:]).to_string(index=False, header=len(rows) == 1), flush=True)
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-root", type=Path, default=Path("../shared/data"))
    parser.add_argument("--out", type=Path, default=Path("runs/batch-size"))
    parser.add_argument("--csv", type=Path, default=Path("results/batch_size/batch_size.csv"))
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--batches", type=int, default=1, help="batches per batch size")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)))
    parser.add_argument(
        "--label-batches",
        type=int,
        default=0,
        help="only label recovery, over this many batches per size (written beside --csv)",
    )
    args = parser.parse_args(argv)
    if not (args.data_root / "cifar10" / "cifar10-test.npz").exists():
        print(f"batch_size: {args.data_root}/cifar10/cifar10-test.npz is absent", file=sys.stderr)
        return 2
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.label_batches:
        frame = label_curve(args.data_root, sizes, args.label_batches)
        args.csv.parent.mkdir(parents=True, exist_ok=True)
        labels_csv = args.csv.with_name(args.csv.stem + "_labels.csv")
        frame.to_csv(labels_csv, index=False)
        _record(args.csv.parent, labels_csv.name, argv)
        return 0
    rows = []
    for batch in sizes:
        start = time.perf_counter()
        spec = parse_config(config(args.data_root, batch, args.batches, args.iterations))
        trials = run_benchmark(spec, args.out / f"b{batch}", progress=False).trials
        psnr, psnr_ci, n = mean_ci95(trials["psnr"].to_numpy())
        per_batch = trials.drop_duplicates(["seed", "batch_index"])
        rows.append(
            {
                "batch_size": batch,
                "images": n,
                "label_acc": float(per_batch["label_acc"].mean()),
                "psnr_mean": psnr,
                "psnr_ci95": psnr_ci,
                "psnr_median": float(trials["psnr"].median()),
                "success_rate": float((trials["mse"] <= 1e-3).mean()),
                "model": spec.model,
                "attack": "ig",
                "iterations": args.iterations,
                "seconds": time.perf_counter() - start,
            }
        )
        print(pd.DataFrame(rows[-1:]).to_string(index=False, header=len(rows) == 1), flush=True)
        args.csv.parent.mkdir(parents=True, exist_ok=True)
        pd.DataFrame(rows).to_csv(args.csv, index=False)
    _record(args.csv.parent, args.csv.name, argv)
    return 0


def _record(folder: Path, outputs: str, argv: list[str] | None) -> None:
    """What made ``outputs``, the engine version included (tests/test_committed_results.py)."""
    write_run_record(folder, outputs, script_command(__file__, argv))


if __name__ == "__main__":
    sys.exit(main())
