"""The multi-step (last-iterate) audit of DP-SGD against the exact epsilon of T steps.

`leakbench.run.multistep_audit.multistep_audit` on the default setting (softmax regression on
the first 8 training digits, clip norm 1, full batch, learning rate 0.5, delta 1e-5), for every
noise multiplier of ``--z`` and number of steps of ``--steps``, over ``--seeds`` audit seeds,
with ``--rounds`` training runs of ``--canaries`` canaries each; with ``--bug``, also DP-SGD
that trains with 10% less noise than it accounts for, at T = 10 and the first z. Prints one
line per audit and writes the table, a summary and the machine to ``--out``:

    PYTHONSAFEPATH=1 python benchmarks/multistep_audit.py --seeds 3 --bug \\
        --out results/epsilon_audit/multistep_audit.md
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import tensorflow as tf

from leakbench.core.environment import describe_environment, script_command
from leakbench.defenses import DPSGD, Gradients
from leakbench.run.multistep_audit import multistep_audit

HEADER = (
    "| mechanism | z | T | seed | trials | exact (PLD) | Renyi-DP | Gaussian-DP bound | ratio | "
    "distribution-free | mu bound | mu estimate | mu theory | audit | seconds |"
)


@dataclasses.dataclass(frozen=True)
class TenPercentLessNoise(DPSGD):
    """DP-SGD whose noise is drawn at 0.9 z while its accountant reads z."""

    name: ClassVar[str] = "dpsgd"

    def __call__(self, grads: Gradients, *, seed: tf.Tensor) -> Gradients:
        less = DPSGD(norm=self.norm, noise_multiplier=0.9 * self.noise_multiplier)
        return less(grads, seed=seed)


def row_line(mechanism: str, seed: int, row: dict[str, Any]) -> str:
    """One audit as a row of the table."""
    return (
        f"| {mechanism} | {row['noise_multiplier']:g} | {row['steps']} | {seed} | "
        f"{row['trials']:,} | {row['epsilon_exact']:.2f} | {row['epsilon_rdp']:.2f} | "
        f"{row['epsilon_audit_gdp']:.2f} | {row['ratio']:.3f} | {row['epsilon_audit']:.2f} | "
        f"{row['mu_audit']:.3f} | {row['mu_estimate']:.3f} | {row['mu_theory']:.3f} | "
        f"{row['audit']} | {row['seconds']:.1f} |"
    )


def summary(rows: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """The mean and range of the ratio and the mean seconds per mechanism, z and T."""
    lines = [
        "| mechanism | z | T | exact (PLD) | ratio: mean (min-max) | failed | seconds (mean) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    groups: dict[tuple[str, float, int], list[dict[str, Any]]] = {}
    for mechanism, row in rows:
        groups.setdefault((mechanism, row["noise_multiplier"], row["steps"]), []).append(row)
    for (mechanism, z, steps), found in groups.items():
        ratios = np.array([r["ratio"] for r in found])
        failed = sum(r["audit"] == "failed" for r in found)
        lines.append(
            f"| {mechanism} | {z:g} | {steps} | {found[0]['epsilon_exact']:.2f} | "
            f"{ratios.mean():.3f} ({ratios.min():.3f}-{ratios.max():.3f}) | "
            f"{failed} of {len(found)} | {np.mean([r['seconds'] for r in found]):.1f} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, nargs="+", default=[1, 10, 30])
    parser.add_argument("--z", type=float, nargs="+", default=[1.0, 2.0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=1000)
    parser.add_argument("--canaries", type=int, default=128)
    parser.add_argument("--confidence", type=float, default=0.95)
    parser.add_argument("--bug", action="store_true")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    # The defense's stateless draws run as a loop inside the vectorised map; TensorFlow says so
    # once per trace, on its logger.
    tf.get_logger().setLevel("ERROR")
    plan = [
        ("DPSGD", DPSGD(norm=1.0, noise_multiplier=z), steps, seed)
        for z in args.z
        for steps in args.steps
        for seed in range(args.seeds)
    ]
    if args.bug:
        bug = TenPercentLessNoise(norm=1.0, noise_multiplier=args.z[0])
        plan += [("TenPercentLessNoise", bug, 10, seed) for seed in range(args.seeds)]
    lines = [HEADER, "| " + " | ".join(["---"] * 15) + " |"]
    rows = []
    start = time.perf_counter()
    for mechanism, defense, steps, seed in plan:
        row = multistep_audit(
            defense, steps=steps, rounds=args.rounds, canaries=args.canaries, seed=seed,
            confidence=args.confidence,
        )  # fmt: skip
        rows.append((mechanism, row))
        lines.append(row_line(mechanism, seed, row))
        print(lines[-1], flush=True)
    total = time.perf_counter() - start
    print(f"total {total:.0f} s", flush=True)
    if args.out is not None:
        args.out.write_text(_document(args, lines, rows, total), encoding="utf-8")


def _document(
    args: argparse.Namespace,
    lines: list[str],
    rows: list[tuple[str, dict[str, Any]]],
    total: float,
) -> str:
    """The Markdown file: how it was made, the summary, every audit."""
    env = describe_environment()
    head = [
        "# Multi-step (last-iterate) DP-SGD audit",
        "",
        f"Made by `{script_command(__file__)}`",
        f"on {env['date']}: {env['cpu']}, {env['cpu_count']} cores (shared with other jobs), "
        f"TensorFlow {env['tensorflow']}, leakbench {env['leakbench']}, engine version "
        f"{env['engine_version']}; {total:.0f} s in all.",
        "",
        f"Softmax regression on the first 8 training digits, full batch, clip norm 1, learning "
        f"rate 0.5, delta 1e-5, confidence {args.confidence}; each audit {args.rounds} training "
        f"runs of T steps with {args.canaries} Dirac canaries each (one in every step), scored "
        "on the final model only. `ratio` is the Gaussian-DP bound over the exact (PLD) epsilon "
        "of T full-batch steps; `seconds` is the training runs' wall time.",
        "",
        "## Summary",
        "",
        *summary(rows),
        "",
        "## Every audit",
        "",
    ]
    return "\n".join(head + lines) + "\n"


if __name__ == "__main__":
    main()
