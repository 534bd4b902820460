"""The TensorFlow L-BFGS on problems with known minima, one at a time and in batches."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from leakbench import lbfgs


def _minimize(fn, x0, **kwargs):
    """One problem: runs it as a batch of one and returns the row of each result."""
    x = tf.constant([x0], tf.float32)
    result = tf.function(lambda x: lbfgs.minimize(fn, x, **kwargs))(x)
    return lbfgs.LbfgsResult(*(t[0] for t in result))


def _value_and_grad(f):
    """Batched objective from a single-problem function: row n of the output uses row n only."""

    def fn(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            values = tf.stack([f(x[i]) for i in range(x.shape[0])])
        return values, tape.gradient(values, x)

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


def _batched(fn, x0, **kwargs):
    return tf.function(lambda x: lbfgs.minimize(fn, x, **kwargs))(tf.constant(x0, tf.float32))


def test_a_batch_gives_each_problem_its_own_run() -> None:
    """Three problems of different difficulty together: each ends where it ends alone, with the
    same iteration and evaluation counts; a NaN start in a fourth row touches none of them."""
    rosen = _value_and_grad(
        lambda x: tf.reduce_sum(100.0 * tf.square(x[1:] - x[:-1] ** 2) + tf.square(1.0 - x[:-1]))
    )
    starts = [[-1.2, 1.0, -0.5, 0.8], [0.5, 0.5, 0.5, 0.5], [2.0, -1.0, 0.0, 1.0]]
    alone = [_minimize(rosen, s, max_iterations=300, history_size=10) for s in starts]
    batch = _batched(rosen, [*starts, [float("nan")] * 4], max_iterations=300, history_size=10)
    for i, one in enumerate(alone):
        np.testing.assert_allclose(batch.x[i].numpy(), one.x.numpy(), rtol=1e-5, atol=1e-6)
        assert int(batch.iterations[i]) == int(one.iterations)
        assert int(batch.evaluations[i]) == int(one.evaluations)
        assert bool(batch.finite[i])
    assert len({int(r.iterations) for r in alone}) > 1, (
        "the problems should stop at different times"
    )
    assert not bool(batch.finite[3]) and int(batch.iterations[3]) == 0
    hist = batch.history.numpy()
    for i, one in enumerate(alone):
        n = int(one.iterations)
        np.testing.assert_allclose(hist[i, :n], one.history.numpy()[:n], rtol=1e-5)
        assert np.all(np.isnan(hist[i, n:]))


def test_a_problem_that_turns_non_finite_midway_does_not_stop_the_others() -> None:
    # Row 0 runs into a region where its loss is NaN (log of a negative number after the
    # minimum moved there); the line search must shorten its steps without touching row 1.
    def f(x):
        return tf.reduce_sum(tf.square(x - 3.0))

    def g(x):
        return tf.reduce_sum(x - tf.math.log(x))

    fns = [g, f]

    def fn(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            values = tf.stack([fns[i](x[i]) for i in range(2)])
        return values, tape.gradient(values, x)

    batch = _batched(fn, [[0.1], [0.0]], max_iterations=100)
    np.testing.assert_allclose(batch.x.numpy(), [[1.0], [3.0]], atol=1e-3)


def test_without_line_search_unit_steps_are_taken_and_the_best_point_is_kept() -> None:
    """armijo=None: PyTorch-style unit steps (only non-finite points are shortened). On a
    quadratic the unit L-BFGS step is exact after the first curvature pair, and the result is
    the best iterate seen."""
    fn = _value_and_grad(lambda x: tf.reduce_sum(tf.square(x - 2.0)))
    result = _minimize(fn, [0.0, 5.0], max_iterations=20, armijo=None)
    np.testing.assert_allclose(result.x.numpy(), [2.0, 2.0], atol=1e-5)
    hist = result.history.numpy()[: int(result.iterations)]
    assert float(result.loss) == pytest.approx(float(np.min(hist)), abs=1e-12)
    # One evaluation per iteration (plus the start) when every point is finite.
    assert int(result.evaluations) == int(result.iterations) + 1


def test_unit_steps_scale_only_the_first_step_as_pytorch_does() -> None:
    # f(x) = -x^2 from x = 1: the first step is min(1, 1/|g|_1) = 0.5 along -g = 2, to x = 2;
    # its pair has negative curvature (s = 1, y = -2) and is rejected, so the history stays
    # empty. PyTorch's LBFGS (lr 1, no line search) then takes a unit step, to 2 + 4 = 6;
    # the backtracking search keeps its cautious step 1/|g|_1 = 0.25, to 3.
    def fn(x: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        return -tf.reduce_sum(x * x, axis=-1), -2.0 * x

    x0 = tf.constant([[1.0]], tf.float64)
    unit = tf.function(lambda x: lbfgs.minimize(fn, x, max_iterations=2, armijo=None))(x0)
    np.testing.assert_allclose(unit.history.numpy(), [[-4.0, -36.0]])
    armijo = tf.function(lambda x: lbfgs.minimize(fn, x, max_iterations=2))(x0)
    np.testing.assert_allclose(armijo.history.numpy(), [[-4.0, -9.0]])
