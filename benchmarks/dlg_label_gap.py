"""Where DLG's label accuracy in iDLG Table 1 comes from: DLG on the same images, four ways.

`benchmarks/paper.py` attacks every image of iDLG Table 1 through one LeNet (seed 0) with
leakbench's `dlg`, which keeps the best finite iterate and retries from a fresh start when the
loss becomes non-finite. The paper's code (``iDLG.py`` of the authors' repository) instead draws
a new LeNet for every image, keeps the last iterate, scores the dummy example with
``log(softmax(logits))`` and has no guard against NaN. This script separates the two
differences on the images of a committed Table 1 run (their indices are read from its
``trials.csv``) by running DLG

* ``leakbench``, ``one network``: the Table 1 run itself (its DLG rows, not rerun);
* ``leakbench``, ``new network per image``: leakbench's `dlg` with the Table 1 settings on a
  LeNet drawn afresh for every image (the same U(-0.5, 0.5) initialisation, seed 1 + the image's
  position);
* ``paper code``, ``one network``: the paper's procedure in PyTorch
  (`torch_reference.dlg_attack` with ``log_of_softmax`` and the 1e-6 convergence test) on the
  seed-0 LeNet's weights;
* ``paper code``, ``new network per image``: the paper's procedure on the per-image networks.

Both implementations start from a standard normal image and label (PyTorch's draws are seeded
with the image's position). Per image it records whether the label is right, whether the
search ended non-finite, the MSE of the reconstruction clipped to [0, 1] and the evaluations;
per way the label accuracy with its exact (Clopper-Pearson) 95% interval.

    PYTHONSAFEPATH=1 python benchmarks/dlg_label_gap.py --data-root ../shared/data \\
        --run results/paper/table1-mnist --out results/paper/label-gap

writes ``<dataset>.csv`` (one row per image and way) and ``summary.csv`` under ``--out``
(rows of other datasets already there are kept) and the command in ``run.json``. PyTorch is
needed for the paper-code ways (``--ways leakbench-fresh`` runs without it). A fifth way,
``paper-best``, is the paper's procedure on the one network returning the point of lowest loss
instead of its last iterate, as leakbench does. Exits 2 on a usage error.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import tensorflow as tf  # noqa: E402
from scipy.stats import binomtest  # noqa: E402

from leakbench.attacks import AttackTarget, make_attack  # noqa: E402
from leakbench.components.forward import model_gradients  # noqa: E402
from leakbench.components.models import build_model  # noqa: E402
from leakbench.core.environment import script_command, write_run_record  # noqa: E402
from leakbench.core.errors import LeakbenchError  # noqa: E402
from leakbench.datasets import load_dataset  # noqa: E402
from leakbench.run.config import parse_config  # noqa: E402

SUCCESS_MSE = 1e-3
# iDLG.py: 300 calls of LBFGS.step (lr 1, PyTorch's 20 inner iterations), stop below 1e-6.
PAPER_STEPS = 300
PAPER_CONVERGED = 1e-6
# The ways run (beyond the Table 1 row, which is read): --ways name -> (implementation, network).
WAYS = {
    "leakbench-fresh": ("leakbench", "new network per image"),
    "paper": ("paper code", "one network"),
    "paper-fresh": ("paper code", "new network per image"),
    "paper-best": ("paper code, best iterate", "one network"),
}
IMAGE_COLUMNS = [
    "dataset",
    "implementation",
    "network",
    "network_seed",
    "position",
    "image_index",
    "label",
    "predicted_label",
    "label_right",
    "nonfinite",
    "mse",
    "evaluations",
    "seconds",
]


def clopper_pearson(successes: int, trials: int) -> tuple[float, float]:
    """The exact two-sided 95% interval of a binomial proportion."""
    interval = binomtest(successes, trials).proportion_ci(confidence_level=0.95, method="exact")
    return float(interval.low), float(interval.high)


def clipped_mse(reconstruction: np.ndarray, image: np.ndarray) -> float:
    value = float(np.mean((np.clip(reconstruction, 0.0, 1.0) - image) ** 2))
    return value if np.isfinite(value) else float("inf")


def table_rows(run: Path, dataset_name: str) -> pd.DataFrame:
    """The Table 1 run's DLG rows, one per image, in the run's order."""
    trials = pd.read_csv(run / "trials.csv")
    rows = trials[trials["attack"] == "dlg"].sort_values(["batch_index", "position"])
    if rows.empty:
        raise LeakbenchError(f"--run: {run / 'trials.csv'} has no dlg trials")
    out = pd.DataFrame({
        "dataset": dataset_name,
        "implementation": "leakbench",
        "network": "one network",
        "network_seed": rows["seed"].to_numpy(),
        "position": np.arange(len(rows)),
        "image_index": rows["image_index"].to_numpy(),
        "label": rows["label"].to_numpy(),
        "predicted_label": rows["predicted_label"].to_numpy(),
        "label_right": (rows["label"] == rows["predicted_label"]).to_numpy(),
        "nonfinite": (rows["status"] != "ok").to_numpy(),
        "mse": rows["mse"].to_numpy(),
        "evaluations": rows["evaluations"].to_numpy(),
        "seconds": rows["seconds"].to_numpy(),
    })  # fmt: skip
    return out


def leakbench_fresh(attack, dataset, images: pd.DataFrame, name: str) -> list[dict]:
    """leakbench's dlg on a new LeNet per image."""
    shape, classes = dataset.input_shape, dataset.num_classes
    rows = []
    for position, index in enumerate(images["image_index"]):
        x = dataset.test.x[index : index + 1]
        y = dataset.test.y[index : index + 1]
        model = build_model("lenet", shape, classes, seed=1 + position)
        grads = model_gradients(model, tf.constant(x), tf.one_hot(y, classes))
        target = AttackTarget(model, tuple(grads), shape, 1, classes)
        began = time.perf_counter()
        (record,) = attack.attack_many([target], [position], width=1)
        rows.append({
            "dataset": name, "implementation": "leakbench", "network": "new network per image",
            "network_seed": 1 + position, "position": position, "image_index": int(index),
            "label": int(y[0]), "predicted_label": int(record.labels[0]),
            "label_right": int(record.labels[0]) == int(y[0]),
            "nonfinite": record.status != "ok", "mse": clipped_mse(record.images[0], x[0]),
            "evaluations": record.evaluations, "seconds": time.perf_counter() - began,
        })  # fmt: skip
        print_progress(rows[-1], len(images))
    return rows


def paper_code(dataset, images: pd.DataFrame, name: str, way: str, threads: int) -> list[dict]:
    """The paper's procedure in PyTorch on the seed-0 LeNet or on a new one per image
    (``way``: ``paper``, ``paper-fresh`` or ``paper-best``, the last returning the point of
    lowest loss instead of the last iterate)."""
    implementation, network = WAYS[way]
    fresh = network == "new network per image"
    import torch
    import torch_reference  # benchmarks/ is on sys.path when this file is run as a script

    shape, classes = dataset.input_shape, dataset.num_classes
    size = int(np.prod(shape)) + classes

    def lenet_weights(seed: int) -> list[np.ndarray]:
        return [v.numpy() for v in build_model("lenet", shape, classes, seed).trainable_variables]

    seed_zero = lenet_weights(0)
    rows = []
    for position, index in enumerate(images["image_index"]):
        network_seed = 1 + position if fresh else 0
        weights = lenet_weights(network_seed) if fresh else seed_zero
        generator = torch.Generator().manual_seed(position)
        start = torch.randn(size, generator=generator).numpy()
        image, label = dataset.test.x[index], int(dataset.test.y[index])
        result = torch_reference.dlg_attack(
            weights, image, label, classes, start, steps=PAPER_STEPS, threads=threads,
            log_of_softmax=True, converge_below=PAPER_CONVERGED, keep_best=way == "paper-best",
        )  # fmt: skip
        rows.append({
            "dataset": name, "implementation": implementation, "network": network,
            "network_seed": network_seed, "position": position, "image_index": int(index),
            "label": label, "predicted_label": result.label, "label_right": result.label == label,
            "nonfinite": not np.isfinite(result.loss), "mse": clipped_mse(result.images, image),
            "evaluations": result.evaluations, "seconds": result.seconds,
        })  # fmt: skip
        print_progress(rows[-1], len(images))
    return rows


def print_progress(row: dict, total: int) -> None:
    print(
        f"  {row['implementation']}, {row['network']}: image {row['position'] + 1}/{total} "
        f"label {'right' if row['label_right'] else 'wrong'}"
        f"{', non-finite' if row['nonfinite'] else ''}, mse {row['mse']:.2e}, "
        f"{row['seconds']:.1f} s",
        flush=True,
    )


def summarise(frame: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for (dataset, implementation, network), group in frame.groupby(
        ["dataset", "implementation", "network"], sort=False
    ):
        right, n = int(group["label_right"].sum()), len(group)
        low, high = clopper_pearson(right, n)
        wrong = group[~group["label_right"].astype(bool)]
        rows.append({
            "dataset": dataset, "implementation": implementation, "network": network,
            "images": n, "labels_right": right, "label_accuracy": right / n,
            "ci_low": low, "ci_high": high,
            "nonfinite": int(group["nonfinite"].sum()),
            "wrong_and_nonfinite": int(wrong["nonfinite"].sum()),
            "wrong_and_failed": int((wrong["mse"] > SUCCESS_MSE).sum()),
            "recovered": float((group["mse"] <= SUCCESS_MSE).mean()),
            "seconds": float(group["seconds"].sum()),
        })  # fmt: skip
    return pd.DataFrame(rows)


def write_atomic(frame: pd.DataFrame, path: Path) -> None:
    partial = path.with_name(path.name + ".partial")
    frame.to_csv(partial, index=False)
    partial.replace(path)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-root", type=Path, default=Path("../shared/data"))
    parser.add_argument("--run", type=Path, default=Path("results/paper/table1-mnist"))
    parser.add_argument("--out", type=Path, default=Path("results/paper/label-gap"))
    parser.add_argument("--images", type=int, default=0, help="first N images (0: all)")
    parser.add_argument(
        "--ways",
        default=",".join(WAYS),
        help=f"comma-separated ways to run (default: all of {', '.join(WAYS)}); rows of ways "
        "not run now are kept from an earlier run's CSV",
    )
    parser.add_argument("--torch-threads", type=int, default=2)
    args = parser.parse_args(argv)
    if args.images < 0:
        parser.error(f"--images must be 0 (all) or a positive count, got {args.images}")
    args.ways = [w for w in args.ways.split(",") if w]
    unknown = sorted(set(args.ways) - set(WAYS))
    if unknown:
        parser.error(f"--ways: unknown way {unknown[0]!r}; allowed: {', '.join(WAYS)}")
    if args.torch_threads < 1:
        parser.error(f"--torch-threads must be at least 1, got {args.torch_threads}")
    for name in ("config.toml", "trials.csv"):
        if not (args.run / name).is_file():
            parser.error(f"--run must be a finished Table 1 run directory; it has no {name}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    config = parse_config((args.run / "config.toml").read_text(encoding="utf-8"))
    spec = config.dataset.replace("../shared/data", str(args.data_root))
    try:
        dataset = load_dataset(spec)
        table = table_rows(args.run, config.name)
    except LeakbenchError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.images:
        table = table.head(args.images)
    if not np.array_equal(dataset.test.y[table["image_index"]], table["label"]):
        print(f"error: --data-root: the labels of {spec} differ from the run's", file=sys.stderr)
        return 2
    (dlg,) = [a for a in config.attacks if a.name == "dlg"]
    attack = make_attack("dlg", **dlg.params)
    print(f"{config.name}: {len(table)} images, {dataset.num_classes} classes")
    rows = table.to_dict("records")
    for way in args.ways:
        if way == "leakbench-fresh":
            rows += leakbench_fresh(attack, dataset, table, config.name)
        else:
            rows += paper_code(dataset, table, config.name, way, args.torch_threads)
    frame = pd.DataFrame(rows, columns=IMAGE_COLUMNS)
    path = args.out / f"{config.name}.csv"
    if path.is_file():  # the ways not run now, as an earlier run left them
        earlier = pd.read_csv(path)
        ran = {("leakbench", "one network"), *(WAYS[way] for way in args.ways)}
        keep = [
            (i, n) not in ran
            for i, n in zip(earlier["implementation"], earlier["network"], strict=True)
        ]
        frame = pd.concat([frame, earlier[keep]], ignore_index=True)
        order = {way: k for k, way in enumerate([("leakbench", "one network"), *WAYS.values()])}
        rank = [
            order[(i, n)] for i, n in zip(frame["implementation"], frame["network"], strict=True)
        ]
        frame = frame.assign(_rank=rank).sort_values(["_rank", "position"], kind="stable")
        frame = frame.drop(columns="_rank")
    args.out.mkdir(parents=True, exist_ok=True)
    write_atomic(frame, path)
    summary = summarise(frame)
    old = args.out / "summary.csv"
    if old.is_file():
        kept = pd.read_csv(old)
        summary = pd.concat([kept[kept["dataset"] != config.name], summary], ignore_index=True)
    write_atomic(summary, old)
    write_run_record(args.out, f"{config.name}.csv", script_command(__file__, argv))
    print(summary[summary["dataset"] == config.name].to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
