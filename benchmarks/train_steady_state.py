"""Steady state of training under a defense: step time, memory, traces, graph and checkpoint.

What it checks (the issue's criteria, on lenet / digits / Adam 1e-3):

* over ``--steps`` (default 10,000) steps, the mean step time of the last 1,000 steps is within
  10% of the mean of steps 1,000-2,000 (0-based step indices 1000..1999);
* resident memory (VmRSS) grows by under 50 MB (10**6 bytes) from step 1,000 to the end;
* the step function is traced exactly once (`DefendedTrainer.traces` and the tf.function's own
  tracing count), and its concrete graph has the same size at step 10 and at the end;
* a ``tf.train.Checkpoint`` of model, optimizer and the step counters written after 10 steps and
  one written after 2,000 steps differ in size by under 1%.

Each step is timed alone (the batch is sliced and converted before the clock starts) and the
timer stops only after the loss has been copied to the host. For contrast, the script then
runs a short loop of the ANTI-PATTERN this design avoids: wrapping the very same step in a NEW
``tf.function`` every step, so every step retraces. It is measured on a fresh model and
trainer after the steady-state run, reported separately, and is not a criterion. It is short
because each of its steps costs about a second here.

Writes one row to ``--out`` and a per-100-step series (step, mean ms/step of the 100 steps
ending there, RSS in MB) next to it as ``<stem>_series.csv``, both atomically. Exits 0 when every
criterion passes, 1 when one fails, 2 on a usage error.

Run from the repository root::

    python benchmarks/train_steady_state.py            # 10,000 steps, gaussian sigma=0.01
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

# TensorFlow's C++ start-up lines would bury the table.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow.python.eager import context  # noqa: E402

from leakbench.client.training import DefendedTrainer  # noqa: E402
from leakbench.components.models import build_model  # noqa: E402
from leakbench.core.errors import LeakbenchError  # noqa: E402
from leakbench.datasets import load_dataset  # noqa: E402
from leakbench.defenses import DEFENSES, make_defense  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_outputs import write_summary_and_series  # noqa: E402

MB = 1e6
EARLY = (1000, 2000)  # the reference window of step indices, [start, stop)
LATE_LEN = 1000
CKPT_EARLY, CKPT_LATE = 10, 2000
SERIES_EVERY = 100
TIME_TOLERANCE = 0.10
RSS_LIMIT_MB = 50.0
CKPT_TOLERANCE = 0.01

COLUMNS = (
    "steps", "dataset", "model", "defense", "defense_params", "batch_size", "seed",
    "tensorflow", "keras",
    "early_ms_mean", "late_ms_mean", "time_ratio", "early_ms_median", "late_ms_median",
    "early_cpu_ms_mean", "late_cpu_ms_mean", "cpu_ratio",
    "rss_mb_at_1000", "rss_mb_final", "rss_growth_mb",
    "traces", "tracing_count",
    "graph_bytes_10", "graph_bytes_final", "graph_nodes_10", "graph_nodes_final",
    "library_functions_10", "library_functions_final",
    "checkpoint_bytes_10", "checkpoint_bytes_2000", "checkpoint_rel_diff",
    "skipped_steps", "final_loss", "seconds",
    "naive_steps", "naive_traces", "naive_ms_first10", "naive_ms_last10",
    "naive_library_functions_10", "naive_library_functions_final", "naive_rss_growth_mb",
    "pass_time", "pass_rss", "pass_traces", "pass_checkpoint", "pass_all",
)  # fmt: skip
SERIES_COLUMNS = ("step", "ms_per_step", "rss_mb")


def rss_mb() -> float:
    """Current resident set size in MB (10**6 bytes).

    Read from ``/proc/self/status`` (VmRSS, in KiB). Without procfs it falls back to the peak
    RSS from ``getrusage``, which can only grow, so it overstates growth, never hides it.
    """
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024 / MB
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / MB if sys.platform == "darwin" else peak * 1024 / MB


def library_functions() -> int:
    """Functions registered in the eager context; anything built per step makes it grow.

    Uses a private TensorFlow API, so -1 means "not available in this version".
    """
    try:
        return len(context.context().list_function_names())
    except AttributeError:
        return -1


def checkpoint_bytes(checkpoint: tf.train.Checkpoint, directory: str, name: str) -> int:
    """Writes ``checkpoint`` under ``directory/name`` and returns the size of its files."""
    checkpoint.write(os.path.join(directory, name))
    return sum(
        os.path.getsize(os.path.join(directory, f))
        for f in os.listdir(directory)
        if f.startswith(name + ".")
    )


def graph_size(trainer: DefendedTrainer, images: tf.Tensor, labels: tf.Tensor) -> tuple[int, int]:
    """(GraphDef bytes, nodes) of the step's concrete function for this batch signature.

    The lookup passes the real tensors, so it finds the existing trace rather than making one;
    if it did trace, the tracing count reported next to it would show it.
    """
    graph_def = trainer.step.get_concrete_function(images, labels).graph.as_graph_def()
    return graph_def.ByteSize(), len(graph_def.node)


def make_run_defense(name: str, sigma: float):
    """The defense, given ``sigma`` when it has such a parameter (else its defaults)."""
    fields = {f.name for f in dataclasses.fields(DEFENSES.get(name))}
    return make_defense(name, sigma=sigma) if "sigma" in fields else make_defense(name)


def make_trainer(dataset, defense, seed: int) -> DefendedTrainer:
    model = build_model("lenet", dataset.input_shape, dataset.num_classes, seed)
    optimizer = keras.optimizers.Adam(1e-3)
    return DefendedTrainer(model, defense, optimizer, num_classes=dataset.num_classes, seed=seed)


def batches(x: np.ndarray, y: np.ndarray, batch_size: int, seed: int):
    """Endless (images, labels) batches: a seeded permutation per epoch, last partial dropped."""
    rng = np.random.default_rng(seed)
    n = len(x)
    while True:
        order = rng.permutation(n)
        for b in range(n // batch_size):
            idx = order[b * batch_size : (b + 1) * batch_size]
            yield tf.constant(x[idx]), tf.constant(y[idx])


def steady_state(dataset, defense, args: argparse.Namespace) -> tuple[dict, list[tuple]]:
    """The main measurement: ``args.steps`` steps of one `DefendedTrainer`."""
    trainer = make_trainer(dataset, defense, args.seed)
    checkpoint = tf.train.Checkpoint(
        model=trainer.model,
        optimizer=trainer.optimizer,
        steps=trainer.step_count,
        skipped=trainer.skipped_steps,
    )
    ms = np.empty(args.steps)
    cpu_ms = np.empty(args.steps)
    series: list[tuple] = []
    row: dict = {}
    stream = batches(dataset.train.x, dataset.train.y, args.batch_size, args.seed)
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="leakbench-ckpt-") as tmp:
        for t in range(args.steps):
            images, labels = next(stream)
            start, cpu_start = time.perf_counter(), time.process_time()
            result = trainer.step(images, labels)
            loss = float(result.loss)  # blocks until the step has finished
            ms[t] = (time.perf_counter() - start) * 1e3
            cpu_ms[t] = (time.process_time() - cpu_start) * 1e3
            done = t + 1
            if done == CKPT_EARLY:
                row["graph_bytes_10"], row["graph_nodes_10"] = graph_size(trainer, images, labels)
                row["checkpoint_bytes_10"] = checkpoint_bytes(checkpoint, tmp, "step10")
                # Counted after the first checkpoint write, which registers its save ops (11
                # functions) once; from here on nothing should add any.
                row["library_functions_10"] = library_functions()
            if done == CKPT_LATE:
                row["checkpoint_bytes_2000"] = checkpoint_bytes(checkpoint, tmp, "step2000")
            if done % SERIES_EVERY == 0:
                series.append((done, float(ms[done - SERIES_EVERY : done].mean()), rss_mb()))
            if done % 1000 == 0:
                print(
                    f"  step {done:>6}/{args.steps}: {ms[done - 1000 : done].mean():.2f} ms/step, "
                    f"RSS {series[-1][2]:.1f} MB",
                    file=sys.stderr,
                    flush=True,
                )
    row["seconds"] = time.perf_counter() - began
    row["graph_bytes_final"], row["graph_nodes_final"] = graph_size(trainer, images, labels)
    row["library_functions_final"] = library_functions()
    early, late = ms[EARLY[0] : EARLY[1]], ms[-LATE_LEN:]
    rss_at = dict((s, r) for s, _, r in series)
    row.update(
        early_ms_mean=float(early.mean()),
        late_ms_mean=float(late.mean()),
        early_ms_median=float(np.median(early)),
        late_ms_median=float(np.median(late)),
        # CPU time of all the process's threads: for information, since on a shared machine
        # wall time also measures the other processes; a real slowdown shows in both.
        early_cpu_ms_mean=float(cpu_ms[EARLY[0] : EARLY[1]].mean()),
        late_cpu_ms_mean=float(cpu_ms[-LATE_LEN:].mean()),
        rss_mb_at_1000=rss_at[EARLY[0]],
        rss_mb_final=series[-1][2],
        traces=trainer.traces,
        tracing_count=int(trainer.step.experimental_get_tracing_count()),
        skipped_steps=int(trainer.skipped_steps.numpy()),
        final_loss=loss,
    )
    row["time_ratio"] = row["late_ms_mean"] / row["early_ms_mean"]
    row["cpu_ratio"] = row["late_cpu_ms_mean"] / row["early_cpu_ms_mean"]
    row["rss_growth_mb"] = row["rss_mb_final"] - row["rss_mb_at_1000"]
    row["checkpoint_rel_diff"] = (
        abs(row["checkpoint_bytes_2000"] - row["checkpoint_bytes_10"]) / row["checkpoint_bytes_10"]
    )
    return row, series


def naive_contrast(dataset, defense, args: argparse.Namespace) -> dict:
    """ANTI-PATTERN, for contrast only: a new ``tf.function`` around the same step, every step.

    Same model, defense, optimizer and batches as the steady-state run; the only difference is
    that the step is wrapped anew each time, so each step retraces the whole train step and
    registers new functions with the runtime.
    """
    steps = args.naive_steps
    trainer = make_trainer(dataset, defense, args.seed)
    stream = batches(dataset.train.x, dataset.train.y, args.batch_size, args.seed)
    ms = np.empty(steps)
    functions_10 = -1
    logger = tf.get_logger()
    level = logger.level
    logger.setLevel("ERROR")  # TF warns about the retracing; that is the point here
    rss_before = rss_mb()
    try:
        for t in range(steps):
            images, labels = next(stream)
            start = time.perf_counter()
            step = tf.function(trainer._global_step)  # the anti-pattern
            float(step(images, labels).loss)
            ms[t] = (time.perf_counter() - start) * 1e3
            if t + 1 == min(10, steps):
                functions_10 = library_functions()
    finally:
        logger.setLevel(level)
    return {
        "naive_steps": steps,
        "naive_traces": trainer.traces,
        "naive_ms_first10": float(ms[:10].mean()),
        "naive_ms_last10": float(ms[-10:].mean()),
        "naive_library_functions_10": functions_10,
        "naive_library_functions_final": library_functions(),
        "naive_rss_growth_mb": rss_mb() - rss_before,
    }


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def print_table(row: dict, args: argparse.Namespace) -> None:
    lines = [
        ("mean step time, steps 1,000-2,000 (ms)", f"{row['early_ms_mean']:.3f}", "", ""),
        ("mean step time, last 1,000 steps (ms)", f"{row['late_ms_mean']:.3f}", "", ""),
        (
            "ratio last / 1,000-2,000",
            f"{row['time_ratio']:.3f}",
            "within 10%",
            verdict(row["pass_time"]),
        ),
        (
            "  (medians, for information: ms)",
            f"{row['early_ms_median']:.3f} / {row['late_ms_median']:.3f}",
            "",
            "",
        ),
        (
            "  (CPU ms/step, info: 1,000-2,000 / last)",
            f"{row['early_cpu_ms_mean']:.3f} / {row['late_cpu_ms_mean']:.3f}",
            f"ratio {row['cpu_ratio']:.3f}",
            "",
        ),
        ("RSS at step 1,000 (MB)", f"{row['rss_mb_at_1000']:.1f}", "", ""),
        (f"RSS at step {args.steps:,} (MB)", f"{row['rss_mb_final']:.1f}", "", ""),
        ("RSS growth (MB)", f"{row['rss_growth_mb']:+.1f}", "< 50 MB", verdict(row["pass_rss"])),
        (
            "traces (trainer / tf.function count)",
            f"{row['traces']} / {row['tracing_count']}",
            "exactly 1",
            verdict(row["pass_traces"]),
        ),
        (
            "step graph bytes, step 10 / final",
            f"{row['graph_bytes_10']} / {row['graph_bytes_final']}",
            "",
            "",
        ),
        (
            "step graph nodes, step 10 / final",
            f"{row['graph_nodes_10']} / {row['graph_nodes_final']}",
            "",
            "",
        ),
        (
            "eager function library, step 10 / final",
            f"{row['library_functions_10']} / {row['library_functions_final']}",
            "",
            "",
        ),
        (
            "checkpoint bytes, step 10 / 2,000",
            f"{row['checkpoint_bytes_10']} / {row['checkpoint_bytes_2000']}",
            "",
            "",
        ),
        (
            "checkpoint relative difference",
            f"{row['checkpoint_rel_diff']:.4%}",
            "< 1%",
            verdict(row["pass_checkpoint"]),
        ),
        ("skipped steps / final loss", f"{row['skipped_steps']} / {row['final_loss']:.4f}", "", ""),
        ("overall", "", "", verdict(row["pass_all"])),
    ]
    print(
        f"train_steady_state: {row['defense']} {row['defense_params']}, lenet on digits, "
        f"batch {args.batch_size}, Adam 1e-3, {args.steps:,} steps, seed {args.seed} "
        f"({row['seconds']:.0f} s; TF {row['tensorflow']}, Keras {row['keras']})"
    )
    for name, value, criterion, result in lines:
        print(f"  {name:<42} {value:>22}  {criterion:<11} {result}")
    if row["naive_steps"]:
        n = row["naive_steps"]
        print(
            f"ANTI-PATTERN (contrast only, not a criterion): a NEW tf.function wrapping the same "
            f"step, every step, {n} steps on a fresh model"
        )
        naive = [
            ("traces", f"{row['naive_traces']}"),
            (
                "mean ms/step, first 10 / last 10",
                f"{row['naive_ms_first10']:.0f} / {row['naive_ms_last10']:.0f}",
            ),
            (
                "  vs steady state (last 1,000)",
                f"{row['naive_ms_last10'] / row['late_ms_mean']:.0f}x",
            ),
            (
                f"eager function library, step 10 / {n}",
                f"{row['naive_library_functions_10']} / {row['naive_library_functions_final']}",
            ),
            (
                f"RSS growth over {n} steps (MB)",
                f"{row['naive_rss_growth_mb']:+.1f} ({row['naive_rss_growth_mb'] / n:+.2f}/step)",
            ),
        ]
        for name, value in naive:
            print(f"  {name:<42} {value:>22}")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10_000, help="train steps (>= 2000)")
    parser.add_argument("--defense", default="gaussian", help="registered defense name")
    parser.add_argument(
        "--sigma", type=float, default=0.01, help="the defense's sigma, if it has one"
    )
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--naive-steps",
        type=int,
        default=40,
        help="steps of the retrace-every-step anti-pattern shown for contrast (0: skip)",
    )
    parser.add_argument("--out", type=Path, default=Path("results/perf/train_steady_state.csv"))
    args = parser.parse_args(argv)
    if args.steps < EARLY[1]:
        parser.error(
            f"--steps must be at least {EARLY[1]} (the reference window), got {args.steps}"
        )
    if args.batch_size < 1:
        parser.error(f"--batch-size must be positive, got {args.batch_size}")
    if args.naive_steps < 0:
        parser.error(f"--naive-steps must be >= 0, got {args.naive_steps}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        dataset = load_dataset("digits")
        defense = make_run_defense(args.defense, args.sigma)
    except LeakbenchError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.batch_size > len(dataset.train):
        print(f"error: --batch-size must be at most {len(dataset.train)}", file=sys.stderr)
        return 2
    keras.utils.set_random_seed(args.seed)
    row, series = steady_state(dataset, defense, args)
    row.update(
        steps=args.steps,
        dataset="digits",
        model="lenet",
        defense=args.defense,
        defense_params=json.dumps(defense.params(), sort_keys=True),
        batch_size=args.batch_size,
        seed=args.seed,
        tensorflow=tf.__version__,
        keras=keras.__version__,
    )
    if args.naive_steps:
        row.update(naive_contrast(dataset, defense, args))
    else:
        row.update(dict.fromkeys((c for c in COLUMNS if c.startswith("naive_")), ""))
        row["naive_steps"] = 0
    row["pass_time"] = abs(row["time_ratio"] - 1.0) <= TIME_TOLERANCE
    row["pass_rss"] = row["rss_growth_mb"] < RSS_LIMIT_MB
    row["pass_traces"] = row["traces"] == 1 and row["tracing_count"] == 1
    row["pass_checkpoint"] = row["checkpoint_rel_diff"] < CKPT_TOLERANCE
    row["pass_all"] = all(
        row[k] for k in ("pass_time", "pass_rss", "pass_traces", "pass_checkpoint")
    )
    print_table(row, args)
    write_summary_and_series(args.out, (COLUMNS, row), (SERIES_COLUMNS, series), __file__, argv)
    return 0 if row["pass_all"] else 1


if __name__ == "__main__":
    sys.exit(main())
