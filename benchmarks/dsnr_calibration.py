"""Measures the D-SNR of every layer kind of honest models of the zoo, from which the client's
thresholds (`leakbench.components.dsnr.KIND_THRESHOLDS`) are derived, and of the imprint block's
models beside them.

For each dataset, model, batch size and seed: the model at its seeded initialisation (or,
with ``--train-steps N``, after N steps of honest training on the training split,
`leakbench.client.training.train_steps` with the default ``[training]`` recipe), one batch of
the private split (a seeded draw), and the D-SNR a client computes on its undefended update:
one row per layer kind the model holds (`leakbench.components.dsnr.layer_kind`), with the
largest D-SNR of that kind's layers and its layer. Honest models set the thresholds; the
imprint model (`leakbench.attacks.imprint`, 128 bins) shows what the thresholds catch. Batches
of one have no D-SNR and are not measured.

    PYTHONSAFEPATH=1 python benchmarks/dsnr_calibration.py --out results/malicious/calibration.csv
    PYTHONSAFEPATH=1 python benchmarks/dsnr_calibration.py --datasets digits --servers honest \
        --train-steps 100 --seeds 20 --out results/malicious/trained.csv

Prints each row as it is measured and a summary: the largest honest D-SNR per kind and batch
size. The thresholds, and the false alarms and flags they give on held-out seeds, are derived
from these tables by `benchmarks/dsnr_families.py`.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import tensorflow as tf

from leakbench.attacks import make_attack
from leakbench.client.recipes import TrainingConfig
from leakbench.client.training import train_steps
from leakbench.components.dsnr import kind_dsnr, layer_dsnr
from leakbench.components.models import build_model
from leakbench.core.environment import script_command, write_run_record
from leakbench.datasets import load_dataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_outputs import write_rows  # noqa: E402

CIFAR = "npz:../shared/data/cifar10/cifar10-test.npz"
SETTINGS = {  # dataset -> models
    "digits": ("lenet", "mlp", "convnet", "resnet"),
    CIFAR: ("lenet", "convnet", "resnet18"),
}
BATCHES = (2, 4, 8, 16, 32, 64)
SERVERS = ("honest", "malicious")
# ``train_steps``: the honest training steps before the check (0: the initialisation; the
# tables written before the column existed hold initialised models only).
COLUMNS = ["dataset", "model", "server", "batch_size", "seed", "kind", "dsnr", "layer",
           "train_steps"]  # fmt: skip


def checked_model(data, model_name: str, seed: int, steps: int):
    """The honest model of ``seed``, after ``steps`` steps of honest training (none: its
    initialisation)."""
    model = build_model(model_name, data.input_shape, data.num_classes, seed=seed)
    if steps:
        train = (data.train.x, data.train.y)
        train_steps(model, steps, TrainingConfig(), train, num_classes=data.num_classes, seed=seed)
    return model


def measure(seeds: range, datasets: list[str], servers=SERVERS, steps: int = 0) -> list[list]:
    rows = []
    imprint = make_attack("imprint", bins=128)
    for name in datasets:
        data = load_dataset(name)
        for model_name in SETTINGS[name]:
            for seed in seeds:
                model = checked_model(data, model_name, seed, steps)
                models = {"honest": model}
                if "malicious" in servers:
                    models["malicious"] = imprint.malicious_model(model, data.train.x, seed)
                for batch in BATCHES:
                    pick = np.random.default_rng([seed, batch]).choice(len(data.test), batch, False)
                    x = tf.constant(data.test.x[pick])
                    y = tf.one_hot(data.test.y[pick], data.num_classes)
                    for server, checked in models.items():
                        start = time.perf_counter()
                        kinds = kind_dsnr(layer_dsnr(checked, x, y))
                        took = time.perf_counter() - start
                        for kind, (value, layer) in sorted(kinds.items()):
                            row = [name.split("/")[-1], model_name, server, batch, seed, kind,
                                   value, layer, steps]  # fmt: skip
                            rows.append(row)
                            print(*row, f"{took:.1f}s", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=5, help="model seeds per setting")
    parser.add_argument(
        "--first-seed", type=int, default=0,
        help="the first model seed (the thresholds come from seeds 0-4; later seeds are held out)",
    )  # fmt: skip
    parser.add_argument("--datasets", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--servers", nargs="+", default=list(SERVERS), choices=list(SERVERS))
    parser.add_argument(
        "--train-steps", type=int, default=0,
        help="honest training steps before the check (default 0: the initialisation)",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, default=Path("results/malicious/calibration.csv"))
    args = parser.parse_args(argv)
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    rows = measure(seeds, args.datasets, args.servers, args.train_steps)
    write_rows(args.out, COLUMNS, rows)
    write_run_record(args.out.parent, args.out.name, script_command(__file__, argv))
    frame = pd.DataFrame(rows, columns=COLUMNS)
    honest = frame[frame.server == "honest"]
    print("\nlargest honest D-SNR per kind and batch size:")
    print(honest.groupby(["kind", "batch_size"]).dsnr.max().unstack().to_string())
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
