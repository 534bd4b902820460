"""Attack speed: leakbench's compiled, batched DLG against a PyTorch implementation of the paper's.

For the DLG LeNet at initialisation (seed 0) on real images, 32x32x3 CIFAR-10 and 28x28x1 MNIST
test images from ``../shared/data`` (10 classes each), with no defense, it reports:

* per attack width N (trials in flight together; default 1, 8, 32, 128): wall time per attack
  at the runner's default budget until 2026-12-01 (300 L-BFGS iterations with the Armijo
  line search; the default now runs to convergence, capped at 10,000), attacks per minute,
  loss-and-gradient evaluations per second, the success rate (MSE <= 1e-3 after clipping to
  [0, 1]), the achieved GFLOP/s of the attack loop and the peak resident memory so far;
* the first call at each width (``compile_seconds``): it compiles the program and also runs one
  group of attacks, and is not included in the per-attack figures;
* the machine's dense-matmul GFLOP/s (2048 x 2048 float32, the better of eager and XLA), so the
  distance of the attack loop to the hardware limit is visible;
* when PyTorch is importable: the published algorithm (``benchmarks/torch_reference.py``:
  ``torch.optim.LBFGS`` with lr 1, 20 inner iterations per step, 300 steps, no line search) on the
  same images, weights and starting points, and the ratio of the two per-attack times.

N trials in flight run through `leakbench.attacks.engine.lanes` (on a CPU, each trial in a width-1
program, N of them spread over one thread per core; on a GPU, programs of N rows whose finished
slots are refilled); N = 1 is one trial at a time. The plan is printed.

The attack loop's FLOPs are counted from its graph: the matrix products of one evaluation
(forward pass, parameter gradient, and the gradient of the matching loss with respect to the
inputs), times the evaluations the trials asked for. An idle slot computes a copy of a busy one
whose evaluations are not counted: the figure is useful work per second.

Writes ``--out`` (default ``results/perf/attack_speed.csv``) atomically; exits 2 on a usage error.

Run from the repository root (about 50 minutes on 2 cores with PyTorch installed, most of it
the reference; `--no-torch` skips it)::

    python benchmarks/attack_speed.py
    python benchmarks/attack_speed.py --images 8 --widths 1,8 --datasets mnist   # a quick look
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import os
import platform
import resource
import sys
import time
from collections.abc import Sequence
from pathlib import Path

# TensorFlow's C++ start-up lines would bury the table.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from leakbench.attacks import AttackTarget, make_attack  # noqa: E402
from leakbench.attacks.engine import lanes  # noqa: E402
from leakbench.attacks.engine.matching import matching_objective, stack_gradients, stack_weights  # noqa: E402
from leakbench.components.forward import model_gradients  # noqa: E402
from leakbench.components.models import build_model  # noqa: E402
from leakbench.core.environment import script_command, write_run_record  # noqa: E402
from leakbench.core.errors import LeakbenchError  # noqa: E402
from leakbench.datasets import load_dataset  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_outputs import write_rows  # noqa: E402

SUCCESS_MSE = 1e-3
# The paper's code: 300 optimizer steps of torch.optim.LBFGS with max_iter 20, so at most 6,000
# loss-and-gradient evaluations.
PAPER_EVALUATIONS = 6000
DATASETS = {
    "cifar10": "npz:{root}/cifar10/cifar10-test.npz",
    "mnist": "idx:{root}/mnist",
}
COLUMNS = [
    "dataset",
    "input_shape",
    "implementation",
    "budget",
    "width",
    "attacks",
    "seconds_per_attack",
    "attacks_per_minute",
    "evaluations_per_attack",
    "evaluations_per_second",
    "success_rate",
    "successes",
    "gflops",
    "matmul_gflops",
    "compile_seconds",
    "peak_rss_mb",
    "torch_ratio",
    "threads",
    "versions",
    "date",
]


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: kilobytes


def matmul_gflops(size: int = 2048, repeats: int = 10) -> float:
    """The machine's dense float32 matmul rate: the better of eager and XLA."""
    a = tf.random.stateless_normal([size, size], seed=[0, 0])
    best = 0.0
    for fn in (tf.function(tf.matmul), tf.function(tf.matmul, jit_compile=True)):
        fn(a, a).numpy()
        start = time.perf_counter()
        for _ in range(repeats):
            fn(a, a).numpy()
        best = max(best, 2 * size**3 * repeats / (time.perf_counter() - start) / 1e9)
    return best


def evaluation_flops(target: AttackTarget) -> int:
    """FLOPs of the matrix products in one evaluation of the DLG objective for one trial,
    counted from the traced graph (2 * m * n * k per product)."""
    shape, classes = target.input_shape, target.num_classes
    fn = matching_objective(
        target.model,
        stack_weights([target]),
        stack_gradients([target]),
        tf.zeros([1, 1, classes]),
        input_shape=shape,
        batch_size=1,
        num_classes=classes,
        learn_labels=True,
    )
    size = int(np.prod(shape)) + classes
    graph = tf.function(fn).get_concrete_function(tf.TensorSpec([1, size])).graph
    total = 0
    for op in graph.get_operations():
        if op.type not in ("MatMul", "BatchMatMulV2", "BatchMatMulV3"):
            continue
        a, b = op.inputs[0].shape.as_list(), op.inputs[1].shape.as_list()
        adj_a = op.get_attr("adj_x" if "Batch" in op.type else "transpose_a")
        adj_b = op.get_attr("adj_y" if "Batch" in op.type else "transpose_b")
        m, k = (a[-1], a[-2]) if adj_a else (a[-2], a[-1])
        n = b[-2] if adj_b else b[-1]
        batch = int(np.prod(op.outputs[0].shape.as_list()[:-2]))
        total += 2 * batch * m * n * k
    return total


def targets_for(model, x: np.ndarray, y: np.ndarray, classes: int) -> list[AttackTarget]:
    out = []
    for i in range(len(x)):
        grads = model_gradients(model, tf.constant(x[i : i + 1]), tf.one_hot(y[i : i + 1], classes))
        out.append(AttackTarget(model, tuple(grads), x.shape[1:], 1, classes))
    return out


def successes(x: np.ndarray, images: list[np.ndarray]) -> int:
    mse = [float(np.mean((np.clip(r, 0, 1) - x[i]) ** 2)) for i, r in enumerate(images)]
    return int(sum(np.nan_to_num(m, nan=np.inf) <= SUCCESS_MSE for m in mse))


def run_leakbench(
    attack, targets, x, widths: list[int], count: int, budget: str, flops: int, base: dict
) -> list[dict]:
    rows = []
    for width in widths:
        n = max(count, width)
        start = time.perf_counter()
        # The first call compiles (and attacks one group); it is timed apart.
        attack.attack_many(targets[:width], list(range(width)), width=width)
        compile_s = time.perf_counter() - start
        start = time.perf_counter()
        recs = attack.attack_many(targets[:n], list(range(n)), width=width)
        wall = time.perf_counter() - start
        evals = sum(r.evaluations for r in recs)
        ok = successes(x[:n], [r.images[0] for r in recs])
        row = measured(base, "leakbench", budget, width, n, wall, evals, ok, flops, compile_s)
        print_row(row)
        rows.append(row)
    return rows


def run_dataset(name: str, args: argparse.Namespace, common: dict) -> list[dict]:
    dataset = load_dataset(DATASETS[name].format(root=args.data_root))
    shape, classes = dataset.input_shape, dataset.num_classes
    count = max(args.images, max(args.widths), args.torch_images)
    order = np.random.default_rng(0).permutation(len(dataset.test))[:count]
    x, y = dataset.test.x[order], dataset.test.y[order]
    model = build_model("lenet", shape, classes, seed=0)
    targets = targets_for(model, x, y, classes)
    flops = evaluation_flops(targets[0])
    shape_text = "x".join(str(d) for d in shape)
    base = {**common, "dataset": name, "input_shape": shape_text}
    print(f"\n{name} {shape_text}, {classes} classes: {flops / 1e6:.2f} MFLOP per evaluation")
    print("  throughput at the old default budget (dlg: 300 iterations, Armijo line search):")
    # The runner's default until 2026-12-01, pinned: today's default runs to convergence.
    old_default = make_attack("dlg", iterations=300)
    rows = run_leakbench(
        old_default, targets, x, args.widths, args.images, "default-300", flops, base
    )
    n = args.torch_images
    if not n:
        return rows
    print(
        f"  the paper's budget (at most {PAPER_EVALUATIONS} evaluations: leakbench dlg with "
        f'line_search="none", {PAPER_EVALUATIONS // 20} PyTorch steps of 20 unit-step '
        f"iterations), {n} images:"
    )
    paper = make_attack("dlg", iterations=PAPER_EVALUATIONS, line_search="none")
    widths = sorted({min(w, n) for w in args.paper_widths})
    paper_rows = run_leakbench(paper, targets, x, widths, n, "paper-6000", flops, base)
    rows += paper_rows
    if args.torch:
        torch_row = run_torch(model, x[:n], y[:n], classes, flops, args, base)
        rows.append(torch_row)
        for row in paper_rows:
            row["torch_ratio"] = row["seconds_per_attack"] / torch_row["seconds_per_attack"]
        print("  per-attack time / PyTorch's: " + ", ".join(
            f"N={r['width']}: {r['torch_ratio']:.3f}" for r in paper_rows
        ))  # fmt: skip
    return rows


def run_torch(model, x, y, classes, flops, args, base) -> dict:
    import torch_reference  # benchmarks/ is put on sys.path by main()

    weights = [v.numpy() for v in model.trainable_variables]
    size = int(np.prod(x.shape[1:])) + classes
    results = []
    for i in range(len(x)):
        # The same start as leakbench's first attempt for seed i.
        z0 = tf.random.stateless_normal([size], seed=tf.constant([i, 1], tf.int64)).numpy()
        results.append(
            torch_reference.dlg_attack(
                weights, x[i], int(y[i]), classes, z0, threads=args.torch_threads
            )
        )
    seconds = sum(r.seconds for r in results)  # the optimisation loops alone
    evals = sum(r.evaluations for r in results)
    ok = successes(x, [r.images for r in results])
    row = measured(base, "pytorch-reference", "paper-6000", 1, len(x), seconds, evals, ok, flops)
    row["torch_ratio"] = 1.0
    print_row(row)
    return row


def measured(
    base: dict,
    implementation: str,
    budget: str,
    width: int,
    n: int,
    seconds: float,
    evals: int,
    ok: int,
    flops: int,
    compile_s: float = 0.0,
) -> dict:
    """One CSV row from what a measurement saw (``seconds``: wall time of all ``n`` attacks)."""
    return {
        **base,
        "implementation": implementation,
        "budget": budget,
        "width": width,
        "attacks": n,
        "seconds_per_attack": seconds / n,
        "attacks_per_minute": 60 * n / seconds,
        "evaluations_per_attack": evals / n,
        "evaluations_per_second": evals / seconds,
        "success_rate": ok / n,
        "successes": ok,
        "gflops": flops * evals / seconds / 1e9,
        "compile_seconds": compile_s,
        "peak_rss_mb": peak_rss_mb(),
        "torch_ratio": float("nan"),
    }


def print_row(row: dict) -> None:
    print(
        f"  {row['implementation']:>17} {row['budget']:>11} N={row['width']:<4} "
        f"{row['attacks']:>4} attacks: "
        f"{row['seconds_per_attack']:7.3f} s/attack {row['attacks_per_minute']:8.1f}/min "
        f"{row['evaluations_per_attack']:7.0f} evals/attack {row['evaluations_per_second']:8.0f} "
        f"evals/s  success {row['successes']}/{row['attacks']}  {row['gflops']:5.1f} GFLOP/s "
        f"(matmul {row['matmul_gflops']:.0f})  first call {row['compile_seconds']:.1f} s  "
        f"peak RSS {row['peak_rss_mb']:.0f} MB",
        flush=True,
    )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=32, help="attacks per width (>= 1)")
    parser.add_argument("--widths", default="1,8,32,128", help="comma-separated attack widths")
    parser.add_argument("--datasets", default="cifar10,mnist", help="cifar10 and/or mnist")
    parser.add_argument(
        "--torch-images",
        type=int,
        default=32,
        help="images attacked at the paper's budget by both implementations (0: skip)",
    )
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="torch.set_num_threads for the reference (1: measured as fast as 2 on an idle "
        "2-core machine for one LeNet example, and far steadier under any other load)",
    )
    parser.add_argument(
        "--paper-widths",
        default="1,32",
        help="comma-separated attack widths at the paper's budget (capped at --torch-images)",
    )
    parser.add_argument("--no-torch", dest="torch", action="store_false", help="skip PyTorch")
    parser.add_argument("--data-root", type=Path, default=Path("../shared/data"))
    parser.add_argument("--out", type=Path, default=Path("results/perf/attack_speed.csv"))
    args = parser.parse_args(argv)
    for option in ("widths", "paper_widths"):
        flag = "--" + option.replace("_", "-")
        try:
            values = [int(w) for w in getattr(args, option).split(",")]
        except ValueError:
            parser.error(f"{flag} must be comma-separated integers, got {getattr(args, option)!r}")
        if not values or min(values) < 1 or max(values) > 1024:
            parser.error(f"{flag} must be integers in [1, 1024]")
        setattr(args, option, values)
    args.datasets = args.datasets.split(",")
    unknown = sorted(set(args.datasets) - set(DATASETS))
    if unknown:
        parser.error(f"--datasets: unknown {unknown[0]!r}; allowed: {', '.join(DATASETS)}")
    if args.images < 1 or args.torch_images < 0:
        parser.error("--images must be >= 1 and --torch-images >= 0")
    if not args.data_root.is_dir():
        parser.error(f"--data-root {args.data_root} is not a directory (see ../shared/data)")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.torch and importlib.util.find_spec("torch") is None:
        print("PyTorch is not installed: the reference is skipped (pip install torch)")
        args.torch = False
    versions = f"tensorflow {tf.__version__}"
    if args.torch:
        import torch

        versions += f"; torch {torch.__version__}"
    matmul = matmul_gflops()
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores: "
          f"dense matmul {matmul:.1f} GFLOP/s; {versions}")  # fmt: skip
    plan = lanes.default_plan(32)
    print(f"trials in flight run in lanes of {plan.slots} slots (N = 32) on {plan.threads} "
          f"threads; a lane's last {plan.tail} finish in the width-1 program")  # fmt: skip
    common = {
        "matmul_gflops": matmul,
        "threads": os.cpu_count(),
        "versions": versions,
        "date": datetime.date.today().isoformat(),
    }
    rows = []
    try:
        for name in args.datasets:
            rows += run_dataset(name, args, common)
    except LeakbenchError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    write_rows(args.out, COLUMNS, [[row[k] for k in COLUMNS] for row in rows])
    write_run_record(args.out.parent, args.out.name, script_command(__file__, argv))
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
