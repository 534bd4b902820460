"""Trains digits under a defense that returns NaN on chosen steps and prints a JSON report.

Run as a script (``python tests/guard_check.py --devices N``) so that the logical CPU devices
can be configured before TensorFlow starts; `test_training.py` runs it for 1 and 2 devices.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import ClassVar

import numpy as np
import tensorflow as tf


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument(
        "--checked-epochs",
        type=int,
        default=2,
        help="epochs whose every step is compared bit for bit with the state before it",
    )
    args = parser.parse_args()
    cpu = tf.config.list_physical_devices("CPU")[0]
    if args.devices > 1:
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * args.devices
        )

    from leakbench.client.recipes import TrainingConfig
    from leakbench.client.training import DefendedTrainer, evaluate
    from leakbench.components.models import build_model
    from leakbench.datasets import load_dataset
    from leakbench.defenses import Defense

    @dataclasses.dataclass(frozen=True)
    class NanEvery(Defense):
        """NaN on every step t with t % period == phase (the trainer's seed is (client, t))."""

        name: ClassVar[str] = "nan_every"
        period: int = 0
        phase: int = 3

        def __call__(self, grads, *, seed):
            if self.period == 0:
                return list(grads)
            bad = tf.equal(tf.math.floormod(tf.cast(seed[1], tf.int64), self.period), self.phase)
            return [tf.where(bad, g * float("nan"), g) for g in grads]

    data = load_dataset("digits")
    config = TrainingConfig(epochs=args.epochs)
    strategy = (
        tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(args.devices)])
        if args.devices > 1
        else tf.distribute.get_strategy()
    )
    report = {}
    for label, defense in (("clean", NanEvery(period=0)), ("poisoned", NanEvery(period=7))):
        with strategy.scope():
            model = build_model("lenet", data.input_shape, data.num_classes, seed=0)
            optimizer = config.make_optimizer()
            trainer = DefendedTrainer(
                model, defense, optimizer, num_classes=10, seed=0, strategy=strategy
            )
        rng = np.random.default_rng(0)
        n = len(data.train)
        per_epoch = n // config.batch_size
        violations, updates_ok = [], []
        for epoch in range(config.epochs):
            order = rng.permutation(n)
            for b in range(per_epoch):
                idx = order[b * config.batch_size : (b + 1) * config.batch_size]
                if epoch >= args.checked_epochs:
                    trainer.step(tf.constant(data.train.x[idx]), tf.constant(data.train.y[idx]))
                    continue
                step = int(trainer.step_count.numpy())
                state = [v.numpy().copy() for v in model.trainable_variables]
                state += [v.numpy().copy() for v in optimizer.variables]
                result = trainer.step(
                    tf.constant(data.train.x[idx]), tf.constant(data.train.y[idx])
                )
                after = [v.numpy() for v in model.trainable_variables]
                after += [v.numpy() for v in optimizer.variables]
                unchanged = all(np.array_equal(a, b) for a, b in zip(state, after, strict=True))
                expected_skip = defense.period > 0 and step % defense.period == defense.phase
                if bool(result.skipped.numpy()) != expected_skip or unchanged != expected_skip:
                    violations.append(step)
                updates_ok.append(not unchanged)
        report[label] = {
            "accuracy": evaluate(model, data.test.x, data.test.y),
            "steps": int(trainer.step_count.numpy()),
            "skipped_steps": int(trainer.skipped_steps.numpy()),
            "iterations": int(optimizer.iterations.numpy()),
            "checked_steps": len(updates_ok),
            "checked_updates": int(sum(updates_ok)),
            "violations": violations[:10],
            "traces": trainer.traces,
            "finite_weights": all(np.all(np.isfinite(v.numpy())) for v in model.weights),
        }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
