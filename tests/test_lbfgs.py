"""The TensorFlow L-BFGS on problems with known minima."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from leakbench import lbfgs


def _minimize(fn, x0, **kwargs):
    return tf.function(lambda x: lbfgs.minimize(fn, x, **kwargs))(tf.constant(x0, tf.float32))


def _value_and_grad(f):
    def fn(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            value = f(x)
        return value, tape.gradient(value, x)

    return fn


def test_quadratic_reaches_its_minimum() -> None:
    scales = tf.constant([1.0, 10.0, 100.0, 0.5])
    target = tf.constant([1.0, -2.0, 0.5, 3.0])
    fn = _value_and_grad(lambda x: tf.reduce_sum(scales * tf.square(x - target)))
    result = _minimize(fn, np.zeros(4), max_iterations=50)
    np.testing.assert_allclose(result.x.numpy(), target.numpy(), atol=1e-4)
    assert bool(result.finite)
    assert int(result.iterations) < 50


def test_rosenbrock() -> None:
    fn = _value_and_grad(
        lambda x: tf.reduce_sum(100.0 * tf.square(x[1:] - x[:-1] ** 2) + tf.square(1.0 - x[:-1]))
    )
    result = _minimize(fn, [-1.2, 1.0, -0.5, 0.8], max_iterations=500, history_size=10)
    np.testing.assert_allclose(result.x.numpy(), np.ones(4), atol=1e-3)


def test_history_is_monotone_and_padded_with_nan() -> None:
    fn = _value_and_grad(lambda x: tf.reduce_sum(tf.square(x)) + tf.reduce_sum(x**4))
    result = _minimize(fn, [2.0, -3.0], max_iterations=100)
    n = int(result.iterations)
    hist = result.history.numpy()
    assert np.all(np.diff(hist[:n]) <= 0)
    assert np.all(np.isnan(hist[n:]))
    assert int(result.evaluations) >= n


def test_non_finite_region_is_avoided_by_the_line_search() -> None:
    # log(x) is NaN for x < 0; the minimum of x - log(x) is at x = 1, and a full Newton-sized
    # first step from x = 0.1 would overshoot into x < 0.
    fn = _value_and_grad(lambda x: tf.reduce_sum(x - tf.math.log(x)))
    result = _minimize(fn, [0.1], max_iterations=100)
    assert result.x.numpy() == pytest.approx([1.0], abs=1e-3)


def test_non_finite_start_is_reported() -> None:
    fn = _value_and_grad(lambda x: tf.reduce_sum(tf.math.log(x)))
    result = _minimize(fn, [-1.0], max_iterations=10)
    assert not bool(result.finite)
    assert int(result.iterations) == 0
