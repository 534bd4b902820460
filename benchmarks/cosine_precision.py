"""The cosine loss near a match: what its float32 precision does to an attack.

Up to engine 7 the ``cosine`` matching loss was computed as ``1 - dot / (|a| |b|)``; since
engine 8 it is half the squared distance of the unit-length gradients, equal in exact
arithmetic (`leakbench.attacks.engine.losses.cosine_distance`). This script registers the old
form as the loss ``cosine_textbook`` and runs ``idlg`` with each form, its defaults otherwise
(L-BFGS to its own convergence or stall test, cap 10,000 iterations), on the first ``--images``
test images of MNIST and of CIFAR-10 (the DLG LeNet at its seed-0 initialisation, no defense,
one image per update: the board cells' setting). It writes one row per trial to
``OUT/cosine_precision.csv`` and prints, per dataset and form, the median PSNR, the images
recovered (MSE at most 1e-3) and the median final loss and iterations. Run from the project
root, where ``../shared/data`` holds MNIST and CIFAR-10::

    PYTHONSAFEPATH=1 python benchmarks/cosine_precision.py --out results/cosine_precision
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

DATA = Path("../shared/data")
DATASETS = {
    "mnist": ("idx:{root}/mnist", "mnist"),
    "cifar10": ("npz:{root}/cifar10/cifar10-test.npz", "cifar10/cifar10-test.npz"),
}
CONFIG = """\
name = "cosine-precision-{name}"
dataset = "{dataset}"
model = "lenet"
images = {images}
batch_size = 1
seeds = [0]
suite = "listed"

[[attack]]
name = "idlg"
loss = "cosine_textbook"

[[attack]]
name = "idlg"
loss = "cosine"

[[defense]]
name = "none"

[training]
enabled = false
"""
# The two forms as the CSV names them.
FORMS = {"cosine_textbook": "1 - dot / norms", "cosine": "unit vectors"}
COLUMNS = ["dataset", "form", "image_index", "psnr", "mse", "loss", "iterations", "stop_reason"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=8, help="test images per dataset (>= 1)")
    parser.add_argument("--data-root", type=Path, default=DATA, help="MNIST and CIFAR-10 here")
    parser.add_argument("--out", type=Path, required=True, help="folder for the CSV")
    args = parser.parse_args(argv)
    if args.images < 1:
        parser.error(f"--images must be an integer of at least 1, got {args.images}")
    for _, path in DATASETS.values():
        if not (args.data_root / path).exists():
            parser.error(f"--data-root: no {args.data_root / path} (MNIST and CIFAR-10 needed)")
    # Imported once the arguments are known good: a usage error starts no TensorFlow.
    import pandas as pd
    import tensorflow as tf

    from leakbench.attacks.engine.losses import LOSSES
    from leakbench.cli import main as leakbench
    from leakbench.core.environment import script_command, write_run_record
    from leakbench.outputs.tables import write_csv

    def total(tensors: list[tf.Tensor]) -> tf.Tensor:
        """Each problem's sum over all tensors ([N, ...] tensors -> [N])."""
        return tf.add_n([tf.reduce_sum(t, axis=list(range(1, len(t.shape)))) for t in tensors])

    def cosine_textbook(dummy: list[tf.Tensor], observed: list[tf.Tensor]) -> tf.Tensor:
        """Engine 7's form: one minus the dot product over the product of the norms."""
        dot = total([d * o for d, o in zip(dummy, observed, strict=True)])
        squares = total([tf.square(d) for d in dummy]) * total([tf.square(o) for o in observed])
        return 1.0 - dot / (tf.sqrt(squares) + 1e-12)

    LOSSES.register("cosine_textbook")(cosine_textbook)
    frames = []
    with tempfile.TemporaryDirectory() as scratch:
        for name, (dataset, _) in DATASETS.items():
            config = Path(scratch) / f"{name}.toml"
            text = CONFIG.format(
                # Absolute: a relative path in a config is read against the config's folder.
                name=name,
                dataset=dataset.format(root=args.data_root.resolve()),
                images=args.images,
            )
            config.write_text(text, encoding="utf-8")
            out = Path(scratch) / name
            code = leakbench(["run", str(config), "--out", str(out), "--quiet"])
            if code:
                return code
            trials = pd.read_csv(out / "trials.csv")
            losses = trials["attack_params"].map(lambda p: json.loads(p)["loss"])
            trials = trials.assign(dataset=name, form=losses.map(FORMS))
            frames.append(trials[COLUMNS])
    rows = pd.concat(frames, ignore_index=True)
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv(rows, args.out / "cosine_precision.csv", COLUMNS)
    write_run_record(args.out, "cosine_precision.csv", script_command(__file__, argv))
    summary = rows.groupby(["dataset", "form"], sort=False).agg(
        images=("psnr", "size"),
        recovered=("mse", lambda m: int((m <= 1e-3).sum())),
        median_psnr=("psnr", "median"),
        median_loss=("loss", "median"),
        median_iterations=("iterations", "median"),
    )
    print(summary.to_string(float_format=lambda v: f"{v:.3g}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
