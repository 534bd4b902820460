"""Model zoo: shapes, seeded weights, and the explicit task loss."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from leakbench.errors import ConfigError, UnknownNameError
from leakbench.models import MODELS, build_model, model_gradients, task_loss


@pytest.mark.parametrize(
    ("shape", "flat"), [((32, 32, 3), 768), ((28, 28, 1), 588), ((8, 8, 1), 48), ((25, 25, 1), 588)]
)
def test_lenet_matches_the_dlg_paper_sizes(shape: tuple[int, int, int], flat: int) -> None:
    # PyTorch's Conv2d(k=5, padding=2, stride 2, 2, 1): 32 -> 16 -> 8 -> 8, so 8*8*12 = 768.
    model = build_model("lenet", shape, 10, seed=0)
    assert model.layers[-1].kernel.shape == (flat, 10)
    assert model(np.zeros((2, *shape), np.float32)).shape == (2, 10)


def test_lenet_weights_are_uniform_and_distinct_per_layer() -> None:
    model = build_model("lenet", (32, 32, 3), 10, seed=0)
    weights = model.get_weights()
    assert len(weights) == 8
    for w in weights:
        assert -0.5 <= w.min() and w.max() <= 0.5
    # The 2nd and 3rd convolutions have the same kernel shape: a shared seeded initializer
    # would make them identical.
    assert weights[2].shape == weights[4].shape
    assert not np.array_equal(weights[2], weights[4])


@pytest.mark.parametrize("name", MODELS.names())
def test_weights_follow_the_seed(name: str) -> None:
    a = build_model(name, (8, 8, 1), 10, seed=3).get_weights()
    b = build_model(name, (8, 8, 1), 10, seed=3).get_weights()
    c = build_model(name, (8, 8, 1), 10, seed=4).get_weights()
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)
    assert any(not np.array_equal(x, z) for x, z in zip(a, c, strict=True))


def test_mlp_has_a_first_layer_bias() -> None:
    model = build_model("mlp", (8, 8, 1), 10, seed=0)
    kernel, bias = model.trainable_variables[:2]
    assert kernel.shape == (64, 256) and bias.shape == (256,)


def test_bad_model_arguments() -> None:
    with pytest.raises(UnknownNameError, match="lenet"):
        build_model("resnet1000", (8, 8, 1), 10, seed=0)
    with pytest.raises(ConfigError, match="num_classes"):
        build_model("lenet", (8, 8, 1), 1, seed=0)


def test_task_loss_equals_keras_cross_entropy_on_one_hot_labels() -> None:
    rng = np.random.default_rng(0)
    logits = tf.constant(rng.normal(size=(4, 10)), tf.float32)
    labels = tf.one_hot([1, 3, 3, 9], 10)
    expected = keras.losses.CategoricalCrossentropy(from_logits=True)(labels, logits)
    assert float(task_loss(logits, labels)) == pytest.approx(float(expected), rel=1e-6)


def test_task_loss_has_the_right_second_derivative_for_soft_labels() -> None:
    """d/dy of the parameter gradient: what DLG's joint label optimisation differentiates.

    For logits z = a W and p = softmax(z), the loss -sum(y log p) has
    dL/dW_jk = a_j (p_k sum(y) - y_k), hence d(dL/dW_jk)/dy_m = a_j (p_k - [m == k]).
    """
    rng = np.random.default_rng(1)
    a = tf.constant(rng.uniform(0.1, 1.0, size=(1, 3)), tf.float64)
    w = tf.Variable(rng.normal(size=(3, 4)))
    y = tf.constant([[0.1, 0.2, 0.3, 0.4]], tf.float64)
    with tf.GradientTape() as outer:
        outer.watch(y)
        with tf.GradientTape() as inner:
            loss = task_loss(a @ w, y)
        grad_w = inner.gradient(loss, w)
        probe = grad_w[0, 2]  # j = 0, k = 2
    dy = outer.gradient(probe, y).numpy()[0]
    p = tf.nn.softmax(a @ w).numpy()[0]
    a0 = float(a[0, 0])
    np.testing.assert_allclose(dy, [a0 * p[2], a0 * p[2], a0 * (p[2] - 1), a0 * p[2]], rtol=1e-10)


def test_model_gradients_are_ordered_like_the_variables() -> None:
    model = build_model("lenet", (8, 8, 1), 10, seed=0)
    grads = model_gradients(model, tf.zeros((1, 8, 8, 1)), tf.one_hot([2], 10))
    assert [tuple(g.shape) for g in grads] == [tuple(v.shape) for v in model.trainable_variables]
