"""Tests of per-example gradients and of `defended_gradients`, the one shared-gradient path."""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf

from leakbench.client import defended_gradients, defended_step
from leakbench.components.forward import loss_and_gradients, model_gradients, task_loss
from leakbench.components.models import build_model
from leakbench.components.per_example import per_example_gradients, per_example_losses_and_gradients
from leakbench.defenses import DEFENSES, make_defense

INPUT_SHAPE = (8, 8, 1)
CLASSES = 4
BATCH = 3

# Every sample configuration each registered defense declares (`Defense.samples`), by test id.
SAMPLE_PARAMS: dict[str, tuple[str, dict[str, Any]]] = {
    name if i == 0 else f"{name}-{i}": (name, dict(sample.params))
    for name in DEFENSES.names()
    for i, sample in enumerate(DEFENSES.get(name).samples)
}


@pytest.fixture(scope="module", params=["lenet", "mlp"])
def model(request: pytest.FixtureRequest) -> keras.Model:
    return build_model(request.param, INPUT_SHAPE, CLASSES, seed=3)


def batch(seed: int, soft: bool = False) -> tuple[tf.Tensor, tf.Tensor]:
    rng = np.random.default_rng(seed)
    images = tf.constant(rng.uniform(size=(BATCH, *INPUT_SHAPE)), tf.float32)
    if soft:
        targets = rng.dirichlet(np.ones(CLASSES), size=BATCH)
    else:
        targets = np.eye(CLASSES)[rng.integers(0, CLASSES, size=BATCH)]
    return images, tf.constant(targets, tf.float32)


def looped(model: keras.Model, images: tf.Tensor, targets: tf.Tensor) -> list[np.ndarray]:
    """The reference: one `model_gradients` call per single-example batch, stacked."""
    per = [
        model_gradients(model, images[i : i + 1], targets[i : i + 1])
        for i in range(images.shape[0])
    ]
    return [np.stack([g[j].numpy() for g in per]) for j in range(len(per[0]))]


# --- per_example_gradients ----------------------------------------------------------------------


@pytest.mark.parametrize("soft", [False, True])
def test_matches_a_loop_over_examples(model: keras.Model, soft: bool) -> None:
    images, targets = batch(0, soft)
    out = per_example_gradients(model, images, targets)
    expected = looped(model, images, targets)
    assert len(out) == len(model.trainable_variables)
    for o, e, var in zip(out, expected, model.trainable_variables, strict=True):
        assert o.shape == (BATCH, *var.shape)
        assert o.dtype == tf.float32
        np.testing.assert_allclose(o.numpy(), e, rtol=0, atol=1e-6)
    # Not trivially equal: the examples' gradients differ.
    assert not np.allclose(out[-1][0].numpy(), out[-1][1].numpy())


def test_mean_is_the_batch_gradient(model: keras.Model) -> None:
    images, targets = batch(1)
    out = per_example_gradients(model, images, targets)
    for o, g in zip(out, model_gradients(model, images, targets), strict=True):
        np.testing.assert_allclose(tf.reduce_mean(o, axis=0).numpy(), g.numpy(), atol=1e-6)


def test_inside_tf_function_traced_once(model: keras.Model) -> None:
    traces = []

    @tf.function
    def compute(images: tf.Tensor, targets: tf.Tensor) -> list[tf.Tensor]:
        traces.append(1)
        return per_example_gradients(model, images, targets)

    for seed in (2, 3):
        images, targets = batch(seed)
        for o, e in zip(compute(images, targets), looped(model, images, targets), strict=True):
            np.testing.assert_allclose(o.numpy(), e, rtol=0, atol=1e-6)
    assert len(traces) == 1


def test_reads_the_current_weights() -> None:
    # A traced function must use the weights at call time (the trainer updates them in place).
    model = build_model("mlp", INPUT_SHAPE, CLASSES, seed=0)
    compute = tf.function(lambda x, y: per_example_gradients(model, x, y))
    images, targets = batch(4)
    before = [g.numpy() for g in compute(images, targets)]
    # Scale the last kernel (a constant shift of the last bias would leave softmax unchanged).
    kernel = model.trainable_variables[-2]
    kernel.assign(kernel * 3.0)
    after = compute(images, targets)
    assert not np.allclose(before[-1], after[-1].numpy())
    for o, e in zip(after, looped(model, images, targets), strict=True):
        np.testing.assert_allclose(o.numpy(), e, rtol=0, atol=1e-6)


# --- defended_gradients -------------------------------------------------------------------------


@pytest.mark.parametrize("name", DEFENSES.names())
def test_every_defense_declares_samples(name: str) -> None:
    assert DEFENSES.get(name).samples, (
        f"defense {name!r} declares no samples: set samples = (Sample({{...}}),) on its class"
    )


# A graph and an eager pass may round the raw gradient differently in the last bits (oneDNN on
# CPUs with AMX/AVX-512 does); half precision turns such a difference at a rounding boundary
# into one float16 step, a relative 2**-10 at most.
RTOL = {"fp16": 2.0**-10}


@pytest.mark.parametrize("case", sorted(SAMPLE_PARAMS))
def test_defended_gradients_shapes_and_single_trace(case: str) -> None:
    model = build_model("mlp", INPUT_SHAPE, CLASSES, seed=1)
    name, params = SAMPLE_PARAMS[case]
    defense = make_defense(name, **params)
    traces = []

    @tf.function
    def shared(images: tf.Tensor, targets: tf.Tensor, seed: tf.Tensor) -> list[tf.Tensor]:
        traces.append(1)
        return defended_gradients(defense, model, images, targets, seed)

    outs = []
    for i in range(3):
        images, targets = batch(i)
        seed = tf.constant([i, 7], tf.int64)
        out = shared(images, targets, seed)
        eager = defended_gradients(defense, model, images, targets, seed)
        for o, e, var in zip(out, eager, model.trainable_variables, strict=True):
            assert o.shape == var.shape
            np.testing.assert_allclose(o.numpy(), e.numpy(), rtol=RTOL.get(name, 1e-5), atol=1e-6)
        outs.append(out)
    assert len(traces) == 1


def test_defended_gradients_feeds_each_level_its_input(model: keras.Model) -> None:
    images, targets = batch(5)
    seed = tf.constant([1, 2], tf.int64)
    # Batch level: the defense of the batch gradient.
    gaussian = make_defense("gaussian", sigma=0.1)
    expected = gaussian(model_gradients(model, images, targets), seed=seed)
    for o, e in zip(
        defended_gradients(gaussian, model, images, targets, seed), expected, strict=True
    ):
        np.testing.assert_array_equal(o.numpy(), e.numpy())
    # Example level: the defense of the per-example gradients, reduced by the defense.
    dpsgd = make_defense("dpsgd", norm=0.1, noise_multiplier=1.0)
    expected = dpsgd(per_example_gradients(model, images, targets), seed=seed)
    for o, e in zip(defended_gradients(dpsgd, model, images, targets, seed), expected, strict=True):
        np.testing.assert_array_equal(o.numpy(), e.numpy())


def test_dpsgd_without_clipping_or_noise_is_the_plain_gradient(model: keras.Model) -> None:
    images, targets = batch(6)
    dpsgd = make_defense("dpsgd", norm=1e6, noise_multiplier=0.0)
    out = defended_gradients(dpsgd, model, images, targets, tf.constant([0, 0], tf.int64))
    for o, g in zip(out, model_gradients(model, images, targets), strict=True):
        np.testing.assert_allclose(o.numpy(), g.numpy(), atol=1e-6)


def test_losses_come_from_the_same_pass_and_match_the_task_loss(model: keras.Model) -> None:
    images, targets = batch(0, False)
    losses, _ = per_example_losses_and_gradients(model, images, targets)
    expected = [
        float(task_loss(model(images[i : i + 1]), targets[i : i + 1])) for i in range(BATCH)
    ]
    np.testing.assert_allclose(losses.numpy(), expected, rtol=1e-6)
    batch_loss, _ = loss_and_gradients(model, images, targets)
    seed = tf.constant([0, 0], tf.int64)
    for defense in (make_defense("none"), make_defense("dpsgd", norm=1.0, noise_multiplier=0.0)):
        loss = defended_step(defense, model, images, targets, seed).loss
        assert float(loss) == pytest.approx(float(batch_loss), rel=1e-6)
