"""The epsilon audit of defenses that depend on the batch: one batch against several, and
MixUp's input canary against its null.

On the digits LeNet at its seed-0 initialisation, with client batches of ``--batch`` test
digits (batch j: test digits j*B .. j*B + B - 1), `leakbench.run.epsilon_audit.audit_defense`
with ``--rounds`` rounds at confidence 0.95 and delta 1e-5:

* relative noise (sigma 1 and 3), Soteria (share 0.5), top-k (0.1) and the chain clip 1 then
  Gaussian 0.01 (a clip of the whole update, then noise): on batch 0 alone and with the rounds
  spread over ``--batches`` batches (round r on batch r mod n, each score relative to its
  batch's own contribution);
* MixUp (2 and 4 mixed): the input canary (a white image with the label of largest gradient,
  appended to the batch before the mixing), on batch 0 and over the batches, and its null: the
  same rounds with the canary dropped before the mixing, which must prove nothing.

Prints one line per audit and writes them as Markdown to ``--out``:

    PYTHONSAFEPATH=1 python benchmarks/data_dependent_audit.py \\
        --out results/epsilon_audit/data_dependent_audit.md
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path
from typing import Any, ClassVar

import tensorflow as tf

from leakbench.components.models import build_model
from leakbench.core.canonical import canonical_json
from leakbench.datasets import load_dataset
from leakbench.defenses import Defense, MixUp, make_defense
from leakbench.outputs.naming import defense_label
from leakbench.run.epsilon_audit import audit_defense


@dataclasses.dataclass(frozen=True)
class MixesWithoutTheCanary(MixUp):
    """MixUp that drops every example past the first ``keep`` before it mixes: the input
    canary, appended last, never reaches the update (the audit's null)."""

    name: ClassVar[str] = "mixup"
    keep: int = 4

    def prepare(self, images: Any, targets: Any, *, seed: Any) -> Any:
        return super().prepare(images[: self.keep], targets[: self.keep], seed=seed)


def _row(label: str, defense: Defense, model: Any, batches: list, rounds: int) -> str:
    start = time.perf_counter()
    found = audit_defense(
        defense, model, [x for x, _ in batches], [y for _, y in batches], rounds=rounds,
        seed=0, delta=1e-5,
    )  # fmt: skip
    return (
        f"| {label} | {found['canary_type']} | {found['batches']} | "
        f"{found['epsilon_audit']:.2f} | {found['epsilon_audit_cap']:.2f} | "
        f"{found['auroc']:.3f} | {found['tpr_at_1pct_fpr']:.3f} | "
        f"{time.perf_counter() - start:.1f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4000)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    data = load_dataset("digits")
    model = build_model("lenet", data.input_shape, data.num_classes, seed=0)
    size = args.batch
    every = [
        (data.test.x[j * size : (j + 1) * size],
         tf.one_hot(data.test.y[j * size : (j + 1) * size], data.num_classes).numpy())
        for j in range(args.batches)
    ]  # fmt: skip
    cases: list[tuple[str, Defense]] = [
        (defense_label(d.name, canonical_json(d.params())), d)
        for d in (
            make_defense("relative_noise", sigma=1.0),
            make_defense("relative_noise", sigma=3.0),
            make_defense("soteria", share=0.5),
            make_defense("topk", fraction=0.1),
            make_defense(
                "chain", steps=[{"name": "clip", "norm": 1.0}, {"name": "gaussian", "sigma": 0.01}]
            ),
            make_defense("mixup", mixed=2),
            make_defense("mixup", mixed=4),
        )
    ]
    cases += [
        (f"null: mixup mixed={k}, canary dropped", MixesWithoutTheCanary(mixed=k, keep=size))
        for k in (2, 4)
    ]
    lines = [
        f"rounds {args.rounds}, digits LeNet (seed 0), batch {size}, confidence 0.95, delta "
        "1e-5, audit seed 0",
        "",
        "| defense | canary | batches | distribution-free | ceiling | AUROC | TPR at 1% FPR | "
        "seconds |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for label, defense in cases:
        for count in sorted({1, args.batches}):
            lines.append(_row(label, defense, model, every[:count], args.rounds))
            print(lines[-1], flush=True)
    if args.out is not None:
        args.out.write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
