"""The batched functional copy of a model against the Keras model itself."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from leakbench.attacks.engine.functional import batched_forward
from leakbench.components.forward import model_gradients
from leakbench.components.models import build_model


def _odd_convnet() -> keras.Model:
    """Every supported layer option: same and valid padding, odd sizes, strides, no bias."""
    model = keras.Sequential(
        [
            keras.Input(shape=(9, 7, 2)),
            keras.layers.Conv2D(3, 3, strides=2, padding="same", activation="tanh"),
            keras.layers.ZeroPadding2D(((1, 0), (0, 2))),
            keras.layers.Conv2D(4, (2, 3), strides=(1, 2), padding="valid", use_bias=False),
            keras.layers.Activation("relu"),
            keras.layers.Flatten(),
            keras.layers.Dense(5, activation="sigmoid"),
            keras.layers.Dense(3),
        ]
    )
    rng = np.random.default_rng(0)
    for var in model.trainable_variables:
        var.assign(rng.normal(size=var.shape).astype(np.float32))
    return model


MODELS = {
    "lenet": lambda: build_model("lenet", (12, 12, 3), 10, seed=1),
    "mlp": lambda: build_model("mlp", (6, 6, 1), 4, seed=1),
    "odd": _odd_convnet,
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_each_problem_gets_its_own_logits_and_gradient(name: str) -> None:
    """Three problems with different weights and inputs: problem n's logits and parameter
    gradient equal the Keras model's with weights n, within float32 rounding."""
    model = MODELS[name]()
    forward = batched_forward(model)
    assert forward is not None
    rng = np.random.default_rng(2)
    shape = tuple(model.inputs[0].shape[1:])
    classes = model.outputs[0].shape[-1]
    x = rng.uniform(0, 1, (3, 2, *shape)).astype(np.float32)
    y = tf.one_hot(rng.integers(0, classes, (3, 2)), classes)
    base = [v.numpy() for v in model.trainable_variables]
    weights = [np.stack([w * (1.0 + 0.1 * n) for n in range(3)]).astype(np.float32) for w in base]
    ws = [tf.constant(w) for w in weights]
    with tf.GradientTape() as tape:
        tape.watch(ws)
        logits = forward(ws, tf.constant(x))
        loss = tf.reduce_sum(
            tf.reduce_mean(-tf.reduce_sum(y * tf.nn.log_softmax(logits), axis=-1), axis=-1)
        )
    grads = tape.gradient(loss, ws)
    for n in range(3):
        model.set_weights([w[n] for w in weights])
        expected = model(x[n]).numpy()
        np.testing.assert_allclose(logits[n].numpy(), expected, rtol=1e-4, atol=1e-5)
        for got, want in zip(grads, model_gradients(model, x[n], y[n]), strict=True):
            np.testing.assert_allclose(got[n].numpy(), want.numpy(), rtol=1e-3, atol=1e-6)


def test_a_nan_in_one_problem_stays_there() -> None:
    model = MODELS["lenet"]()
    forward = batched_forward(model)
    ws = [tf.constant(np.stack([v.numpy()] * 2)) for v in model.trainable_variables]
    x = np.random.default_rng(0).uniform(0, 1, (2, 1, 12, 12, 3)).astype(np.float32)
    x[0, 0, 3, 3, 0] = np.nan
    with tf.GradientTape() as tape:
        tape.watch(ws)
        loss = tf.reduce_sum(forward(ws, tf.constant(x)))
    grads = tape.gradient(loss, ws)
    assert all(np.all(np.isfinite(g[1].numpy())) for g in grads)
    assert not np.all(np.isfinite(grads[0][0].numpy()))


def test_unsupported_models_are_declined() -> None:
    pooled = keras.Sequential(
        [keras.Input(shape=(8, 8, 1)), keras.layers.MaxPooling2D(), keras.layers.Flatten(),
         keras.layers.Dense(2)]
    )  # fmt: skip
    normed = keras.Sequential(
        [keras.Input(shape=(4,)), keras.layers.BatchNormalization(), keras.layers.Dense(2)]
    )
    assert batched_forward(pooled) is None
    assert batched_forward(normed) is None
