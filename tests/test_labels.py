"""Label recovery from the last layer's gradient (iDLG for one example, counts for batches)."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from leakbench.attacks import idlg
from leakbench.attacks.labels import (
    assign_counts,
    label_from_last_layer,
    present_classes,
    recover_labels,
)
from leakbench.components import metrics
from leakbench.components.forward import model_gradients
from leakbench.components.models import build_model
from leakbench.core.errors import ConfigError

SHAPE = (8, 8, 1)


def _grads(model, x, y, classes: int = 10):
    return model_gradients(model, tf.constant(x), tf.one_hot(y, classes))


def _constant_model(*, last_bias: bool) -> keras.Model:
    """Every input gives the same hidden activations (kernel 0, bias 0.5, ReLU) and uniform
    logits (last kernel 0), so the softmax on dummy inputs is exactly the batch's softmax."""
    model = keras.Sequential(
        [
            keras.Input(SHAPE),
            keras.layers.Flatten(),
            keras.layers.Dense(3, activation="relu"),
            keras.layers.Dense(6, use_bias=last_bias),
        ]
    )
    hidden, last = model.layers[1], model.layers[2]
    hidden.kernel.assign(np.zeros(hidden.kernel.shape, np.float32))
    hidden.bias.assign(np.full(3, 0.5, np.float32))
    last.kernel.assign(np.zeros(last.kernel.shape, np.float32))
    return model


def test_idlg_still_exports_the_rule() -> None:
    assert idlg.label_from_last_layer is label_from_last_layer


def test_batch_of_one_is_the_idlg_rule(digits) -> None:
    for i in range(6):
        model = build_model("lenet", SHAPE, 10, seed=i)
        grads = _grads(model, digits.test.x[i : i + 1], digits.test.y[i : i + 1])
        got = recover_labels(model, grads, 1, 10)
        assert got.tolist() == [label_from_last_layer(grads, 10)] == [digits.test.y[i]]


def test_bias_gradient_identity_is_exact(digits) -> None:
    """B * db[c] = sum_i p_ic - n_c for the mean cross-entropy, on a real batch."""
    model = build_model("lenet", SHAPE, 10, seed=0)
    x, y = digits.test.x[:8], digits.test.y[:8]
    bias_grad = _grads(model, x, y)[-1].numpy()
    p = tf.nn.softmax(model(x, training=False)).numpy()
    counts = np.bincount(y, minlength=10)
    np.testing.assert_allclose(8 * bias_grad, p.sum(axis=0) - counts, atol=1e-5)


@pytest.mark.parametrize("last_bias", [True, False])
def test_counts_are_exact_when_the_softmax_is_known(last_bias: bool) -> None:
    """With input-independent activations and logits the estimate has no error: the repeated
    labels come back exactly, from the bias or (without one) from the kernel gradient."""
    model = _constant_model(last_bias=last_bias)
    labels = np.array([5, 0, 2, 0, 5, 0, 1, 2])
    x = np.random.default_rng(1).uniform(0, 1, (8, *SHAPE)).astype(np.float32)
    got = recover_labels(model, _grads(model, x, labels, 6), 8, 6)
    np.testing.assert_array_equal(got, np.sort(labels))


def test_assign_counts_rounds_by_largest_remainder() -> None:
    np.testing.assert_array_equal(assign_counts(np.array([1.6, 1.4, 1.0]), 4), [0, 0, 1, 2])
    np.testing.assert_array_equal(assign_counts(np.array([-0.3, 2.2, 1.1]), 3), [1, 1, 2])


def test_present_classes_need_a_negative_bias_and_a_one_signed_column() -> None:
    """Noise alone (column 0, 3) is not evidence; a negative column is, unless the bias
    gradient is positive (column 2), which an absent class always has."""
    rng = np.random.default_rng(0)
    kernel = rng.normal(0.0, 1.0, (50, 4))
    kernel[:, 1] = -rng.uniform(0.0, 1.0, 50)
    kernel[:, 2] = -rng.uniform(1.0, 2.0, 50)  # t about -36, column 1 about -12
    bias = np.array([-0.1, -0.2, 0.3, -0.5])
    assert present_classes(kernel, bias, 4).tolist() == [1]
    assert present_classes(kernel, None, 4).tolist() == [2, 1]  # most negative t first
    assert present_classes(kernel, None, 1).tolist() == [2]


def test_output_contract_and_model_untouched(digits) -> None:
    model = build_model("lenet", SHAPE, 10, seed=0)
    before = [w.copy() for w in model.get_weights()]
    for batch in (2, 4, 8):
        grads = _grads(model, digits.test.x[:batch], digits.test.y[:batch])
        got = recover_labels(model, grads, batch, 10, seed=3)
        assert got.dtype == np.int64 and got.shape == (batch,)
        assert np.all((0 <= got) & (got < 10))
        np.testing.assert_array_equal(got, recover_labels(model, grads, batch, 10, seed=3))
    for w0, w1 in zip(before, model.get_weights(), strict=True):
        np.testing.assert_array_equal(w0, w1)


def test_batch_of_four_on_digits_reaches_90_percent(digits) -> None:
    """Acceptance: label recovery >= 90% with batch size 4 on digits (LeNet at initialisation,
    four weight seeds, 32 random test batches; labels may repeat)."""
    rng = np.random.default_rng(2024)
    accuracies = []
    for seed in range(4):
        model = build_model("lenet", SHAPE, 10, seed=seed)
        for _ in range(8):
            idx = rng.integers(0, len(digits.test.y), 4)
            grads = _grads(model, digits.test.x[idx], digits.test.y[idx])
            got = recover_labels(model, grads, 4, 10, seed=seed)
            accuracies.append(metrics.label_accuracy(digits.test.y[idx], got))
    assert np.mean(accuracies) >= 0.90, accuracies


def test_refuses_a_model_without_dense_logits() -> None:
    model = keras.Sequential(
        [keras.Input(SHAPE), keras.layers.Flatten(), keras.layers.Dense(10, activation="softmax")]
    )
    grads = [tf.zeros_like(v) for v in model.trainable_variables]
    with pytest.raises(ConfigError, match="last layer is a dense layer with 10 linear outputs"):
        recover_labels(model, grads, 4, 10)
