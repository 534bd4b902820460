"""The batched, projected Adam loop of Inverting Gradients (leakbench.attacks.engine.adam)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from leakbench.attacks.engine import adam


def _quadratic(centres: np.ndarray):
    c = tf.constant(centres, tf.float32)

    def value_and_grad(x: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        return tf.reduce_sum(tf.square(x - c), axis=1), 2.0 * (x - c)

    return value_and_grad


def test_learning_rate_drops_tenfold_at_three_eighths_five_eighths_seven_eighths() -> None:
    # 80 iterations: milestones at steps 30, 50 and 70.
    rates = [float(adam.learning_rate(tf.constant(s), 80, 0.1)) for s in (0, 29, 30, 49, 50, 70)]
    np.testing.assert_allclose(rates, [0.1, 0.1, 0.01, 0.01, 0.001, 0.0001], rtol=1e-6)


def test_first_step_moves_every_coordinate_by_the_learning_rate() -> None:
    # Adam's bias-corrected first step is lr * g / (|g| + eps): lr times the sign of g, so the
    # second loss is that of x0 + 0.1 * sign(c - x0).
    x0 = np.array([[0.0, 0.0, 0.0]], np.float32)
    centres = np.array([[3.0, -2.0, 0.5]], np.float32)
    result = adam.minimize(_quadratic(centres), x0, iterations=8, lr=0.1)
    first, second = result.history.numpy()[0, :2]
    np.testing.assert_allclose(first, 9.0 + 4.0 + 0.25, rtol=1e-6)
    np.testing.assert_allclose(second, 2.9**2 + 1.9**2 + 0.4**2, rtol=1e-5)


def test_problems_converge_independently_and_the_box_is_kept() -> None:
    centres = np.array([[0.3, 0.7], [2.0, -1.0]], np.float32)
    x0 = np.full((2, 2), 0.5, np.float32)
    result = adam.minimize(
        _quadratic(centres),
        x0,
        iterations=400,
        lr=0.1,
        project=lambda x: tf.clip_by_value(x, 0.0, 1.0),
    )
    x = result.x.numpy()
    np.testing.assert_allclose(x[0], [0.3, 0.7], atol=1e-3)
    np.testing.assert_allclose(x[1], [1.0, 0.0], atol=1e-6)  # the box's nearest corner
    assert result.history.shape == (2, 400)


def test_a_batch_gives_each_problem_what_it_gets_alone() -> None:
    centres = np.array([[0.3, 0.7], [2.0, -1.0], [-0.5, 0.1]], np.float32)
    x0 = np.array([[0.0, 1.0], [0.5, 0.5], [1.0, 0.0]], np.float32)
    together = adam.minimize(_quadratic(centres), x0, iterations=50, signed=True)
    for n in range(3):
        alone = adam.minimize(
            _quadratic(centres[n : n + 1]), x0[n : n + 1], iterations=50, signed=True
        )
        np.testing.assert_allclose(together.x.numpy()[n], alone.x.numpy()[0], atol=1e-6)
        np.testing.assert_allclose(together.loss.numpy()[n], alone.loss.numpy()[0], rtol=1e-6)


def test_a_nan_problem_keeps_its_best_iterate_and_spares_the_others() -> None:
    def value_and_grad(x: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        # Problem 1's loss turns NaN once its first coordinate passes 0.25.
        f = tf.reduce_sum(tf.square(x - 1.0), axis=1)
        f = tf.where((tf.range(2) == 1) & (x[:, 0] > 0.25), np.nan, f)
        return f, 2.0 * (x - 1.0)

    result = adam.minimize(value_and_grad, np.zeros((2, 2), np.float32), iterations=200)
    x, loss = result.x.numpy(), result.loss.numpy()
    assert np.all(np.isfinite(x)) and np.all(np.isfinite(loss))
    np.testing.assert_allclose(x[0], [1.0, 1.0], atol=1e-2)
    assert x[1, 0] <= 0.25  # the last finite iterate before the NaNs
    assert np.isnan(result.history.numpy()[1, -1])


@pytest.mark.parametrize("signed", [False, True])
def test_best_loss_is_the_lowest_finite_loss_in_the_history(signed: bool) -> None:
    centres = np.array([[0.2, -0.4, 0.9]], np.float32)
    result = adam.minimize(
        _quadratic(centres), np.zeros((1, 3), np.float32), iterations=60, lr=0.5, signed=signed
    )
    # The kept loss is at most every loss seen (the final iterate is evaluated too).
    assert float(result.loss[0]) <= float(np.nanmin(result.history.numpy()))
