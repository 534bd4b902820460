"""The Gaussian-DP audit of one DP-SGD update against its exact epsilon, and a planted bug.

On the digits LeNet at its seed-0 initialisation (the first two test images, clip norm 1,
noise multiplier 1, delta 1e-5), `leakbench.run.epsilon_audit.audit_defense` with ``--rounds``
rounds of ``--canaries`` Dirac canaries, for the real DP-SGD and for one that draws 5% less
noise than it accounts for (z = 0.95 accounted as 1), over ``--seeds`` audit seeds. Prints one
line per audit (the exact PLD epsilon, both lower bounds, mu, the verdict, the time) and writes
them as Markdown to ``--out``:

    PYTHONSAFEPATH=1 python benchmarks/gaussian_audit.py --seeds 3 \\
        --out results/epsilon_audit/gaussian_audit.md
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path
from typing import ClassVar

import tensorflow as tf

from leakbench.components.models import build_model
from leakbench.datasets import load_dataset
from leakbench.defenses import DPSGD, Gradients
from leakbench.run.epsilon_audit import audit_defense


@dataclasses.dataclass(frozen=True)
class FivePercentLessNoise(DPSGD):
    """DP-SGD whose noise is drawn at 0.95 z while its accountant reads z."""

    name: ClassVar[str] = "dpsgd"

    def __call__(self, grads: Gradients, *, seed: tf.Tensor) -> Gradients:
        less = DPSGD(norm=self.norm, noise_multiplier=0.95 * self.noise_multiplier)
        return less(grads, seed=seed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--canaries", type=int, default=128)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--confidence", type=float, default=0.9875)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    data = load_dataset("digits")
    model = build_model("lenet", data.input_shape, data.num_classes, seed=0)
    x = data.test.x[:2]
    targets = tf.one_hot(data.test.y[:2], data.num_classes).numpy()
    lines = [
        f"rounds {args.rounds}, canaries {args.canaries}, confidence {args.confidence}, "
        "digits LeNet, batch 2, clip norm 1, z = 1, delta 1e-5",
        "",
        "| mechanism | seed | exact (PLD) | distribution-free | Gaussian-DP | mu bound | "
        "mu estimate | audit | seconds |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for defense in (DPSGD(norm=1.0, noise_multiplier=1.0),
                    FivePercentLessNoise(norm=1.0, noise_multiplier=1.0)):  # fmt: skip
        for seed in range(args.seeds):
            start = time.perf_counter()
            row = audit_defense(
                defense, model, x, targets, rounds=args.rounds, seed=seed, delta=1e-5,
                confidence=args.confidence, canaries=args.canaries,
            )  # fmt: skip
            lines.append(
                f"| {type(defense).__name__} | {seed} | {row['epsilon_exact']:.3f} | "
                f"{row['epsilon_audit']:.3f} | {row['epsilon_audit_gdp']:.3f} | "
                f"{row['mu_audit']:.4f} | {row['mu_estimate']:.4f} | {row['audit']} | "
                f"{time.perf_counter() - start:.1f} |"
            )
            print(lines[-1], flush=True)
    if args.out is not None:
        args.out.write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
