"""Leakage against batch size: label accuracy and PSNR for batches of 1 to 64 CIFAR-10 images.

For each batch size B in 1, 2, 4, ..., 64 it runs one ordinary leakbench run (`run_benchmark`) on
real CIFAR-10 test images from ``../shared/data`` with the `convnet` at its seeded
initialisation, no defense, labels unknown: `ig` reconstructs the batch after recovering its
labels from the gradient (`leakbench.attacks.labels.recover_labels`), and every image is scored
after Hungarian matching. Each run directory lands under ``--out`` (resumable: rerun the same
command), and one CSV row per batch size is written to ``--csv``.

    PYTHONSAFEPATH=1 python benchmarks/batch_size.py --data-root ../shared/data \\
        --out runs/batch-size --csv results/batch_size/batch_size.csv

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

from leakbench.config import parse_config
from leakbench.metrics import mean_ci95
from leakbench.runner import run_benchmark

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-root", type=Path, default=Path("../shared/data"))
    parser.add_argument("--out", type=Path, default=Path("runs/batch-size"))
    parser.add_argument("--csv", type=Path, default=Path("results/batch_size/batch_size.csv"))
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--batches", type=int, default=1, help="batches per batch size")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)))
    args = parser.parse_args(argv)
    if not (args.data_root / "cifar10" / "cifar10-test.npz").exists():
        print(f"batch_size: {args.data_root}/cifar10/cifar10-test.npz is absent", file=sys.stderr)
        return 2
    rows = []
    for batch in (int(s) for s in args.sizes.split(",")):
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
