"""The defended train step is built once: 2,000 steps neither retrace nor grow graph or state.

The long version (10,000 steps, timing and memory) is ``benchmarks/train_steady_state.py``.
"""

from __future__ import annotations

import os
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from leakbench.client.training import DefendedTrainer
from leakbench.components.models import build_model
from leakbench.datasets import load_dataset
from leakbench.defenses import make_defense

STEPS = 2000
BATCH = 32


def _checkpoint_bytes(checkpoint: tf.train.Checkpoint, directory: Path, name: str) -> int:
    checkpoint.write(str(directory / name))
    return sum(f.stat().st_size for f in directory.iterdir() if f.name.startswith(name + "."))


def _graph_def_bytes(trainer: DefendedTrainer, images: tf.Tensor, labels: tf.Tensor) -> int:
    # Passing the real tensors looks up the existing trace; a new one would show in the counts.
    return trainer.step.get_concrete_function(images, labels).graph.as_graph_def().ByteSize()


def test_gaussian_training_traces_once_and_keeps_graph_and_checkpoint_size(
    tmp_path: Path,
) -> None:
    data = load_dataset("digits")
    model = build_model("lenet", data.input_shape, data.num_classes, seed=0)
    optimizer = keras.optimizers.Adam(1e-3)
    trainer = DefendedTrainer(
        model,
        make_defense("gaussian", sigma=0.01),
        optimizer,
        num_classes=data.num_classes,
        seed=0,
    )
    checkpoint = tf.train.Checkpoint(
        model=model,
        optimizer=optimizer,
        steps=trainer.step_count,
        skipped=trainer.skipped_steps,
    )
    x, y = data.train.x, data.train.y
    rng = np.random.default_rng(0)
    per_epoch = len(x) // BATCH
    sizes: dict[int, tuple[int, int]] = {}
    for t in range(STEPS):
        if t % per_epoch == 0:
            order = rng.permutation(len(x))
        idx = order[(t % per_epoch) * BATCH : (t % per_epoch + 1) * BATCH]
        images, labels = tf.constant(x[idx]), tf.constant(y[idx])
        trainer.step(images, labels)
        if t + 1 in (10, STEPS):
            sizes[t + 1] = (
                _checkpoint_bytes(checkpoint, tmp_path, f"step{t + 1}"),
                _graph_def_bytes(trainer, images, labels),
            )

    assert int(trainer.step_count.numpy()) == STEPS
    assert int(trainer.skipped_steps.numpy()) == 0
    assert int(optimizer.iterations.numpy()) == STEPS
    assert trainer.traces == 1
    assert trainer.step.experimental_get_tracing_count() == 1
    (ckpt_10, graph_10), (ckpt_end, graph_end) = sizes[10], sizes[STEPS]
    assert os.path.exists(tmp_path / f"step{STEPS}.index")
    assert abs(ckpt_end - ckpt_10) / ckpt_10 < 0.01
    assert graph_end == graph_10
    # The checkpoint really holds the step counter (it is not an empty or stale file).
    restored = tf.Variable(0, dtype=tf.int64)
    tf.train.Checkpoint(steps=restored).read(str(tmp_path / f"step{STEPS}")).expect_partial()
    assert int(restored.numpy()) == STEPS
