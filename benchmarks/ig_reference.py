"""leakbench's `ig` at its defaults against a PyTorch implementation of Inverting Gradients.

Both attack the same real CIFAR-10 test images (a seeded draw from leakbench's test split of
``npz:<data-root>/cifar10/cifar10-test.npz``), one image at a time, labels known, against the
`convnet` (width 8) at its seed-0 initialisation with BatchNorm on the batch's statistics; the
PyTorch network holds the Keras weights (`torch_reference.convnet_gradients` checks the
gradients agree). Both run the same number of iterations from the same start:

- leakbench: ``make_attack("ig", iterations=N)``, every other parameter at its default (the
  reference's configuration in pixel units, see `leakbench.attacks.ig.InvertingGradients`);
- PyTorch: `torch_reference.ig_attack`, the reference's algorithm in its normalised units with
  its published settings (step 0.1, total variation 0.2 zero-padded, signed Adam, the box),
  started from ``(x0 - mean) / std`` where ``x0`` is leakbench's start for the same attempt
  (`InvertingGradients.start_points`: ``mean + std * N(0, 1)``), i.e. from the same N(0, 1)
  draw.

Every reconstruction is scored by leakbench's metrics (PSNR and SSIM after clipping to
[0, 1]); its matching loss is measured by leakbench's model too, so both sides are judged by one
yardstick. Writes ``per_image.csv``, ``run.json`` (what the README says of the run) and
``README.md`` under ``--out`` (``--readme-only`` rewrites the README from the other two):

    PYTHONSAFEPATH=1 python benchmarks/ig_reference.py --data-root ../shared/data \\
        --out results/ig_reference --images 10 --iterations 2000 --ablations

PyTorch is not a dependency of leakbench: install it for this script only.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import tensorflow as tf
from scipy import stats

from leakbench.attacks import AttackTarget, make_attack
from leakbench.attacks.engine.matching import cosine_distance
from leakbench.attacks.priors.tv import REFERENCE_MEAN, REFERENCE_STD
from leakbench.components import metrics
from leakbench.components.forward import model_gradients
from leakbench.components.models import build_model
from leakbench.core.seeds import attempt_draw, private_indices
from leakbench.core.versions import ENGINE_VERSION
from leakbench.datasets import load_dataset

MODEL, MODEL_SEED = "convnet", 0
# With --ablations, leakbench's `ig` also runs with one setting changed at a time (and with the
# defaults it had before they became the reference's), on the same images and attempt seeds.
ABLATIONS = {
    "tv_padding_none": {"tv_padding": "none"},
    "init_uniform": {"init": "uniform"},
    "previous_defaults": {"lr": 0.1, "tv": 1e-4, "tv_padding": "none", "init": "uniform"},
}


def matching_loss(model, observed: list[tf.Tensor], image: np.ndarray, label: int) -> float:
    """One minus the cosine similarity of the gradient of ``image`` (clipped to [0, 1]) with
    the observed one, by leakbench's model."""
    x = tf.constant(np.clip(image, 0.0, 1.0)[None], tf.float32)
    dummy = model_gradients(model, x, tf.one_hot([label], 10))
    rows = [g[None] for g in dummy], [o[None] for o in observed]
    return float(cosine_distance(*rows).numpy()[0])


def keras_relu_inputs(model, x: np.ndarray) -> list[np.ndarray]:
    """The input of every ReLU of the Keras convnet for one image (training mode, as every
    gradient here is computed), ``[h, w, channels]`` each, in the order of the network."""
    import keras

    seen, h = [], tf.constant(x[None])
    for layer in model.layers:
        if isinstance(layer, keras.layers.ReLU):
            seen.append(h.numpy()[0])
        h = layer(h, training=True)
    return seen


def gradient_check(model, x: np.ndarray, y: int) -> tuple[float, float, int]:
    """Largest absolute difference between the Keras and PyTorch gradients of one image, the
    largest absolute gradient entry, and how many ReLU gates (input above zero or not) differ
    between the two networks on it."""
    import torch_reference  # benchmarks/ is put on sys.path by main()

    keras_grads = model_gradients(model, tf.constant(x[None]), tf.one_hot([y], 10))
    weights = [v.numpy() for v in model.trainable_variables]
    torch_grads = torch_reference.convnet_gradients(weights, x, y, 10)
    laid_out = torch_reference.to_torch_layout([g.numpy() for g in keras_grads], x.shape)
    diff = max(float(np.max(np.abs(a - b))) for a, b in zip(torch_grads, laid_out, strict=True))
    theirs = torch_reference.convnet_relu_inputs(weights, x, 10)
    gates = sum(
        int(np.sum((a > 0) != (b > 0)))
        for a, b in zip(keras_relu_inputs(model, x), theirs, strict=True)
    )
    return diff, max(float(np.max(np.abs(b))) for b in laid_out), gates


def run(args: argparse.Namespace) -> pd.DataFrame:
    import torch_reference  # benchmarks/ is put on sys.path by main()

    dataset = load_dataset(f"npz:{args.data_root / 'cifar10' / 'cifar10-test.npz'}")
    shape = dataset.input_shape
    model = build_model(MODEL, shape, dataset.num_classes, seed=MODEL_SEED)
    weights = [v.numpy() for v in model.trainable_variables]
    indices = private_indices(len(dataset.test), args.images, seed=args.draw_seed)
    attack = make_attack("ig", iterations=args.iterations)
    mean = np.array(REFERENCE_MEAN, np.float32)
    std = np.array(REFERENCE_STD, np.float32)
    rows = []
    for n, index in enumerate(indices):
        x, y = dataset.test.x[index], int(dataset.test.y[index])
        observed = model_gradients(model, tf.constant(x[None]), tf.one_hot([y], 10))
        target = AttackTarget(model, tuple(observed), shape, 1, 10, labels=np.array([y]))
        seed = args.attack_seed + n
        start = attack.start_points([attempt_draw(seed, 1)], (1, *shape)).numpy()[0]
        began = time.perf_counter()
        ours = attack(target, seed=seed)
        ours_seconds = time.perf_counter() - began
        theirs = torch_reference.ig_attack(
            weights, x, y, 10, (start.reshape(shape) - mean) / std,
            iterations=args.iterations, threads=args.threads,
        )  # fmt: skip
        diff, scale, gates = gradient_check(model, x, y)
        ours_image, theirs_image = ours.images[0], theirs.images
        row = {
            "image_index": int(index),
            "label": y,
            "psnr_leakbench": float(metrics.psnr(metrics.mse(x[None], ours_image[None]))[0]),
            "psnr_torch": float(metrics.psnr(metrics.mse(x[None], theirs_image[None]))[0]),
            "ssim_leakbench": float(metrics.ssim(x[None], ours_image[None])[0]),
            "ssim_torch": float(metrics.ssim(x[None], theirs_image[None])[0]),
            "loss_leakbench": float(ours.loss),
            "loss_torch": theirs.loss,
            "matching_leakbench": matching_loss(model, observed, ours_image, y),
            "matching_torch": matching_loss(model, observed, theirs_image, y),
            "initial_loss_leakbench": float(ours.loss_history[0]),
            "initial_loss_torch": theirs.initial_loss,
            "seconds_leakbench": ours_seconds,
            "seconds_torch": theirs.seconds,
            "gradient_max_abs_diff": diff,
            "gradient_max_abs": scale,
            "relu_gates_differing": gates,
        }
        for name, changed in ABLATIONS.items() if args.ablations else ():
            began = time.perf_counter()
            other = make_attack("ig", iterations=args.iterations, **changed)(target, seed=seed)
            row[f"seconds_{name}"] = time.perf_counter() - began
            row[f"psnr_{name}"] = float(metrics.psnr(metrics.mse(x[None], other.images))[0])
        rows.append(row)
        print(
            f"{n + 1}/{len(indices)} image {index} label {y}: leakbench "
            f"{row['psnr_leakbench']:.2f} dB ({ours_seconds:.0f} s), torch "
            f"{row['psnr_torch']:.2f} dB ({theirs.seconds:.0f} s)",
            flush=True,
        )
    return pd.DataFrame(rows)


def summary(frame: pd.DataFrame) -> dict[str, float]:
    out = {}
    for side in ("leakbench", "torch"):
        out[f"{side}_mean"], out[f"{side}_ci"], _ = metrics.mean_ci95(frame[f"psnr_{side}"])
        out[f"{side}_ssim"] = float(frame[f"ssim_{side}"].mean())
    difference = frame["psnr_leakbench"] - frame["psnr_torch"]
    out["diff_mean"], out["diff_ci"], _ = metrics.mean_ci95(difference)
    out["p_value"] = float(stats.ttest_rel(frame["psnr_leakbench"], frame["psnr_torch"]).pvalue)
    out["wins"] = int((difference > 0).sum())
    out["accepted"] = bool(out["leakbench_mean"] >= out["torch_mean"] - out["torch_ci"])
    return out


def ablation_lines(frame: pd.DataFrame) -> str:
    """A table of the ablations' mean PSNRs and their paired differences from the defaults."""
    names = [n for n in ABLATIONS if f"psnr_{n}" in frame]
    if not names:
        return ""
    lines = [
        "## leakbench with one setting changed",
        "",
        "Same images and attempt seeds, leakbench only (`--ablations`); a changed `init` also",
        "changes the start.",
        "",
        "| `ig` settings | mean PSNR (95% CI) | minus the defaults, paired (95% CI) | lower on |",
        "| --- | --- | --- | --- |",
    ]
    for name in names:
        changed = ", ".join(f"{k} = {v!r}" for k, v in ABLATIONS[name].items())
        mean, ci, _ = metrics.mean_ci95(frame[f"psnr_{name}"])
        diff = frame[f"psnr_{name}"] - frame["psnr_leakbench"]
        d_mean, d_ci, _ = metrics.mean_ci95(diff)
        lower = int((diff < 0).sum())
        lines.append(
            f"| {changed} | {mean:.2f} dB (+-{ci:.2f}) | {d_mean:+.2f} dB (+-{d_ci:.2f}) | "
            f"{lower} of {len(frame)} |"
        )
    return "\n".join(lines) + "\n"


def readme(frame: pd.DataFrame, info: dict) -> str:
    """The results README of a run: its summary, table and settings (``info``: what
    `run_info` recorded of the run)."""
    s = summary(frame)
    table = "\n".join(
        f"| {r.image_index} | {r.label} | {r.psnr_leakbench:.2f} | {r.psnr_torch:.2f} | "
        f"{r.psnr_leakbench - r.psnr_torch:+.2f} | {r.ssim_leakbench:.3f} | {r.ssim_torch:.3f} | "
        f"{r.matching_leakbench:.4f} | {r.matching_torch:.4f} |"
        for r in frame.itertuples()
    )
    verdict = (
        "within the PyTorch interval or above it: accepted"
        if s["accepted"]
        else "below the PyTorch interval: NOT accepted"
    )
    agree = frame[frame["relu_gates_differing"] == 0]
    part = frame[frame["relu_gates_differing"] > 0]
    gradients = (
        f"On the {len(agree)} images where every ReLU gate of the two networks agrees, the "
        f"Keras and PyTorch gradients of the private image differ by at most "
        f"{agree['gradient_max_abs_diff'].max():.1e} (entries up to "
        f"{agree['gradient_max_abs'].max():.1f})"
    )
    if len(part):
        listed = ", ".join(
            f"{r.image_index} ({r.relu_gates_differing}, {r.gradient_max_abs_diff:.1e})"
            for r in part.itertuples()
        )
        gradients += (
            f". On {len(part)} images rounding puts a ReLU input that lies within about 1e-6 of "
            "zero on different sides of it in the two networks, and the gradients of the layers "
            "below that unit can part (image (gates that differ, largest gradient difference)): "
            f"{listed}"
        )
    return f"""# `ig` against a PyTorch implementation of Inverting Gradients

Made by `benchmarks/ig_reference.py` on {info["date"]} ({info["minutes"]} minutes on
{info["cores"]} shared CPU cores, TensorFlow {info["tensorflow"]}, PyTorch {info["torch"]}, the
PyTorch side on {info["threads"]} thread):

    {info["command"]}

{len(frame)} CIFAR-10 test images (leakbench's test split of `cifar10-test.npz`, indices drawn
by `seeds.private_indices` with seed {info["draw_seed"]}), one at a time, labels known, the
`convnet` (width 8) at its seed-{MODEL_SEED} initialisation, {info["iterations"]:,} iterations
on both sides, one start each, the same start on both sides.

| | mean PSNR (95% CI) | mean SSIM |
| --- | --- | --- |
| leakbench `ig`, defaults | {s["leakbench_mean"]:.2f} dB (+-{s["leakbench_ci"]:.2f}) | \
{s["leakbench_ssim"]:.3f} |
| PyTorch implementation | {s["torch_mean"]:.2f} dB (+-{s["torch_ci"]:.2f}) | \
{s["torch_ssim"]:.3f} |

Per image, leakbench minus PyTorch: {s["diff_mean"]:+.2f} dB (+-{s["diff_ci"]:.2f}), leakbench
higher on {s["wins"]} of {len(frame)} images (paired t-test p = {s["p_value"]:.2f}).
leakbench's mean is {verdict}.

| image | label | PSNR leakbench | PSNR torch | difference | SSIM leakbench | SSIM torch | \
1 - cos leakbench | 1 - cos torch |
| --- | --- | --- | --- | --- | --- | --- | --- | --- |
{table}

`1 - cos` is the matching loss of each reconstruction measured by leakbench's model (one
yardstick for both). `per_image.csv` also holds each side's own final loss (matching loss plus
weighted total variation, in its own units), the loss at the start, the seconds of each attack
and the gradient check. {gradients}. Mean seconds per attack (leakbench's first one compiles
its loop): leakbench {frame["seconds_leakbench"].mean():.1f}, PyTorch
{frame["seconds_torch"].mean():.1f}.

## Settings

The reference's configuration: `breaching/config/attack/invertinggradients.yaml` (the authors'
maintained implementation, which the original `invertinggradients` repository's README points
to): Adam, `signed: "hard"`, `step_size: 0.1`, `boxed: True`, `step_size_decay: step-lr`,
`max_iterations: 24_000`, total variation `scale: 0.2` computed by a difference filter with
zero padding 1 (`breaching/attacks/auxiliaries/regularizers.py`), `init: randn`
(`breaching/attacks/base_attack.py`); the CIFAR-10 normalisation of
`breaching/config/case/data/CIFAR10.yaml` (the values of `inversefed/consts.py`). The original
repository's later `DEFAULT_CONFIG` (`inversefed/reconstruction_algorithms.py`) has step 0.1,
4,800 iterations, total variation 1e-1 without padding (about 0.4 in pixel units), `randn`
starts and step decay, but `signed=False`; its first `reconstruct_image.py` sets `signed=True`
and a later one takes `--signed`.

Both sides: one minus the cosine similarity of the parameter gradients (all tensors), plus
total variation; Adam (betas 0.9, 0.999, epsilon 1e-8) on the sign of the gradient, the step
divided by 10 after `int(f * iterations)` steps for f = 3/8, 5/8, 7/8; the image projected
onto the valid range after every step; the iterate with the lowest total loss kept; the private
image's gradient in BatchNorm's training mode (batch statistics) on both sides.

Differences between the two:

- Units. PyTorch optimises `u = (x - mean) / std` with the reference's CIFAR-10 channel
  statistics and feeds `mean + std * u` to the network; leakbench optimises the pixels `x`.
- Step and total-variation weight. PyTorch: 0.1 and 0.2 in normalised units, per channel in
  effect (pixel step 0.0244 to 0.0262, pixel weight 0.76 to 0.82). leakbench: one `lr` of
  0.025 and one `tv` of 0.8 for all channels (the conversion with the mean std 0.2507, rounded).
- Total variation. Both zero-padded below and to the right in normalised units (leakbench pads
  with the channel mean in pixels, the same thing); PyTorch's differences are of `u`, so each
  channel's is leakbench's divided by that channel's std. The reference's filter form adds 1e-8
  to every absolute difference; neither side does (a constant, no gradient).
- Start. The same N(0, 1) draw. leakbench clamps the start into [0, 1] before its first
  evaluation (its box applies to every iterate it evaluates); the PyTorch side, as the
  reference, evaluates the first gradient at the unclamped start (4.8% of the start
  pixels lie outside the box, in expectation) and projects after the first step.
- Arithmetic. float32 on both sides; a TensorFlow graph (no XLA) against PyTorch eager. The
  loss of a ReLU network with max pooling is not smooth in the image, so rounding alone makes
  the two trajectories part: only the distributions over images compare, not single images.

What neither side does that the paper's experiments do: 4,800 iterations on CIFAR-10 (the
original repository's `DEFAULT_CONFIG`; breaching's config says 24,000), width 64, several
restarts, and BatchNorm in inference mode on a network whose inputs are normalised.

{ablation_lines(frame)}"""


def run_info(args: argparse.Namespace, seconds: float) -> dict:
    """What the README says of a run besides its rows (kept in ``run.json``)."""
    import torch

    return {
        "date": datetime.date.today().isoformat(),
        "engine_version": ENGINE_VERSION,
        "minutes": round(seconds / 60),
        "command": " ".join(["PYTHONSAFEPATH=1 python benchmarks/ig_reference.py", *args.argv]),
        "cores": os.cpu_count(),
        "tensorflow": tf.__version__,
        "torch": torch.__version__,
        "threads": args.threads,
        "images": args.images,
        "iterations": args.iterations,
        "draw_seed": args.draw_seed,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-root", type=Path, default=Path("../shared/data"))
    parser.add_argument("--out", type=Path, default=Path("results/ig_reference"))
    parser.add_argument("--images", type=int, default=10)
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--draw-seed", type=int, default=0, help="seed of the image draw")
    parser.add_argument("--attack-seed", type=int, default=0, help="image n's start: seed + n")
    parser.add_argument("--threads", type=int, default=1, help="PyTorch threads")
    parser.add_argument("--ablations", action="store_true", help="also run `ABLATIONS`")
    parser.add_argument(
        "--readme-only", action="store_true", help="rewrite README.md from the CSV and run.json"
    )
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import torch_reference

    if not torch_reference.available():
        print("PyTorch is not installed: pip install torch", file=sys.stderr)
        return 2
    if args.readme_only:
        frame = pd.read_csv(args.out / "per_image.csv")
        info = json.loads((args.out / "run.json").read_text())
    else:
        began = time.perf_counter()
        frame = run(args)
        info = run_info(args, time.perf_counter() - began)
        args.out.mkdir(parents=True, exist_ok=True)
        frame.to_csv(args.out / "per_image.csv", index=False, float_format="%.6g")
        (args.out / "run.json").write_text(json.dumps(info, indent=1) + "\n")
    (args.out / "README.md").write_text(readme(frame, info))
    s = summary(frame)
    print(
        f"leakbench {s['leakbench_mean']:.2f} +- {s['leakbench_ci']:.2f} dB, torch "
        f"{s['torch_mean']:.2f} +- {s['torch_ci']:.2f} dB, accepted: {s['accepted']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
