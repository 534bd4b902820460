"""The TensorFlow L-BFGS on problems with known minima, one at a time and in batches."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from objectives import convex

from leakbench.attacks.engine import lbfgs


def _minimize(fn, x0, max_iterations, history_size=100, **search):
    """One problem: runs it as a batch of one and returns the row of each result; ``search``
    holds `lbfgs.Search`'s settings."""
    x = tf.constant([x0], tf.float32)
    settings = lbfgs.Search(**search)
    result = tf.function(
        lambda x: lbfgs.minimize(
            fn, x, max_iterations=max_iterations, history_size=history_size, search=settings
        )
    )(x)
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


def _convex(scales: np.ndarray):
    """`objectives.convex` with fixed float64 scales, one row per problem."""
    return convex(tf.constant(scales, tf.float64))


def test_a_batch_gives_each_problem_its_own_run() -> None:
    """Three problems of different difficulty together: each ends where it ends alone, with the
    same iteration and evaluation counts; a NaN start in a fourth row touches none of them.
    (Float64 and convex, so that the last-bit differences between a batch and a single row
    cannot grow into a different line-search decision.)"""
    scales = np.stack([np.logspace(0, k, 5) for k in (0.0, 1.5, 3.0, 1.0)])
    starts = np.array([[-1.2, 1.0, -0.5, 0.8, 0.1], [0.5] * 5, [2.0, -1.0, 0.0, 1.0, -2.0],
                       [np.nan] * 5])  # fmt: skip
    run = tf.function(lambda fn, x: lbfgs.minimize(fn, x, max_iterations=300, history_size=4))
    alone = [run(_convex(scales[i : i + 1]), tf.constant(starts[i : i + 1])) for i in range(3)]
    alone = [lbfgs.LbfgsResult(*(t[0] for t in r)) for r in alone]
    batch = run(_convex(scales), tf.constant(starts))
    for i, one in enumerate(alone):
        np.testing.assert_allclose(batch.x[i].numpy(), one.x.numpy(), rtol=1e-10)
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
        np.testing.assert_allclose(hist[i, :n], one.history.numpy()[:n], rtol=1e-10)
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
    unit = tf.function(
        lambda x: lbfgs.minimize(fn, x, max_iterations=2, search=lbfgs.Search(armijo=None))
    )(x0)
    np.testing.assert_allclose(unit.history.numpy(), [[-4.0, -36.0]])
    armijo = tf.function(lambda x: lbfgs.minimize(fn, x, max_iterations=2))(x0)
    np.testing.assert_allclose(armijo.history.numpy(), [[-4.0, -9.0]])


def _two_loop(g, pairs):
    """Nocedal & Wright's Algorithm 7.4 in numpy, float64: ``-H g`` for pairs oldest first."""
    q, alphas = g.copy(), []
    for s, y in reversed(pairs):
        alphas.append(s @ q / (s @ y))
        q -= alphas[-1] * y
    s, y = pairs[-1]
    r = (s @ y) / (y @ y) * q
    for (s, y), alpha in zip(pairs, reversed(alphas), strict=True):
        r += (alpha - y @ r / (s @ y)) * s
    return -r


@pytest.mark.parametrize(("m", "head", "count"), [(5, 0, 5), (5, 3, 5), (5, 4, 2), (6, 1, 3)])
def test_the_compact_direction_equals_the_two_loop_recursion(m, head, count) -> None:
    """The direction from the compact form, with its circular buffers and products kept by
    slot, equals the textbook two-loop recursion over the same pairs in time order: full and
    wrapped-around buffers, a partial history, and stale slots outside the window."""
    rng = np.random.default_rng(m + head + count)
    dim = 7
    a = rng.standard_normal((dim, dim))
    hessian = a @ a.T + dim * np.eye(dim)
    s_hist = rng.standard_normal((m, dim))
    y_hist = s_hist @ hessian + 0.1 * rng.standard_normal((m, dim))
    g = rng.standard_normal(dim)
    slots = [(head - count + k) % m for k in range(count)]
    expected = _two_loop(g, [(s_hist[j], y_hist[j]) for j in slots])
    # Slots outside the window hold junk, with junk products: they must not be read.
    sy, yy = s_hist @ y_hist.T, y_hist @ y_hist.T
    # Slots outside the window hold junk products, which must not be read; the newest pair's
    # products are left for `_direction` to fill in, so they are junk here too.
    junk = [j for j in range(m) if j not in slots] + [slots[-1]]
    sy[junk, :] = sy[:, junk] = yy[junk, :] = yy[:, junk] = 1e6
    args = [g[None], s_hist[None], y_hist[None], sy[None], yy[None]]
    got, sy_out, yy_out = lbfgs._direction(
        *(tf.constant(t, tf.float64) for t in args), tf.constant([count]), tf.constant([head])
    )
    np.testing.assert_allclose(got.numpy()[0], expected, rtol=1e-10)
    filled = np.ix_(slots, slots)
    np.testing.assert_allclose(sy_out.numpy()[0][filled], (s_hist @ y_hist.T)[filled])
    np.testing.assert_allclose(yy_out.numpy()[0][filled], (y_hist @ y_hist.T)[filled])
    # With no pairs the direction is -g.
    none, _, _ = lbfgs._direction(
        *(tf.constant(t, tf.float64) for t in args), tf.constant([0]), tf.constant([head])
    )
    np.testing.assert_allclose(none.numpy()[0], -g)


def _torch_lbfgs(fun, x, *, max_iter, steps, history, tolerance_grad, tolerance_change):
    """torch.optim.LBFGS(lr=1, max_iter, history_size, tolerance_grad, tolerance_change), no
    line search, its ``step`` called ``steps`` times, written out in numpy from PyTorch's
    published algorithm. Returns the loss at each point it moved to, its evaluations, how many
    steps a tolerance ended early, and whether it stalled (a direction with g.d above
    -tolerance_change, after which it stays where it is)."""
    dirs, stps, moved, evals, early, stalled = [], [], [], 0, 0, False
    d = t = prev_g = prev_loss = None
    n_iter, h_diag = 0, 1.0
    for _ in range(steps):
        loss, g = fun(x)
        evals += 1
        if np.abs(g).max() <= tolerance_grad:
            break
        n = 0
        while n < max_iter:
            n += 1
            n_iter += 1
            if n_iter == 1:
                d = -g
            else:
                y, s = g - prev_g, d * t
                if y @ s > 1e-10:
                    if len(dirs) == history:
                        dirs.pop(0), stps.pop(0)
                    dirs.append(y), stps.append(s)
                    h_diag = (y @ s) / (y @ y)
                q, alphas = -g, []
                for y_i, s_i in zip(reversed(dirs), reversed(stps), strict=True):
                    alphas.append((s_i @ q) / (y_i @ s_i))
                    q = q - alphas[-1] * y_i
                d = q * h_diag
                for y_i, s_i, a in zip(dirs, stps, reversed(alphas), strict=True):
                    d = d + s_i * (a - (y_i @ d) / (y_i @ s_i))
            prev_g, prev_loss = g.copy(), loss
            t = min(1.0, 1.0 / np.abs(g).sum()) if n_iter == 1 else 1.0
            if g @ d > -tolerance_change:
                stalled = True
                break
            x = x + t * d
            moved.append(fun(x)[0])
            if n != max_iter:
                loss, g = fun(x)
                evals += 1
            if n == max_iter or np.abs(g).max() <= tolerance_grad:
                break
            if np.abs(d * t).max() <= tolerance_change or abs(loss - prev_loss) < tolerance_change:
                early += 1
                break
    return np.array(moved), evals, early, stalled


def test_pytorch_steps_follow_torch_lbfgs_step_by_step() -> None:
    """With ``pytorch_steps`` the unit-step L-BFGS moves through the points that
    torch.optim.LBFGS's repeated ``step`` calls move through (numpy reference above). The loss
    it is shown is rounded to integers (the gradient is exact), so the loss often does not
    change and many steps end early, mid-run: with 30 steps the run ends on a stalled
    direction; with 6 it ends when the steps are used up, the early ones counted whole. It
    evaluates fewer times, because it does not evaluate again a point it already has."""
    smooth = _convex(np.logspace(0, 2, 5)[None])

    def fn(x):
        value, grad = smooth(x)
        return tf.round(value), grad

    def numpy_fn(x):
        value, grad = fn(tf.constant(x[None]))
        return float(value[0]), grad.numpy()[0]

    start = np.array([[-1.2, 1.0, -0.5, 0.8, 0.1]])
    options = dict(tolerance_grad=1e-7, tolerance_change=1e-9)  # PyTorch's defaults

    @tf.function
    def run(x, steps, pytorch_steps):
        search = lbfgs.Search(armijo=None, pytorch_steps=pytorch_steps, **options)
        return lbfgs.minimize(fn, x, max_iterations=4 * steps, history_size=3, search=search)

    for steps in (30, 6):
        moved, torch_evals, early, stalled = _torch_lbfgs(
            numpy_fn, start[0], max_iter=4, steps=steps, history=3, **options
        )
        # The cases this test is for: steps ended early, and the run stalled or ran out.
        assert early >= 3 and stalled == (steps == 30) and len(moved) < 4 * steps - 3
        ours = run(tf.constant(start), steps, 4)
        n = int(ours.iterations[0])
        assert n == len(moved), steps
        np.testing.assert_allclose(ours.history.numpy()[0, :n], moved, rtol=1e-9)
        assert int(ours.evaluations[0]) == n + 1 < torch_evals
    # The same tolerance ending the run, not the step, stops it at the first unchanged loss.
    assert int(run(tf.constant(start), 30, None).iterations[0]) < len(moved)


# --- why a problem stops -------------------------------------------------------------------------


def _reason(result: lbfgs.LbfgsResult) -> str:
    return lbfgs.REASONS[int(result.reason)]


@pytest.mark.parametrize("pytorch_steps", [None, 20])
def test_stop_reasons(pytorch_steps) -> None:
    # A bowl with its floor at 1: the minimum is reached, its loss never falls below 1.
    fn = _value_and_grad(lambda x: tf.reduce_sum(tf.square(x - 2.0)) + 1.0)
    steps = {"pytorch_steps": pytorch_steps, "armijo": None} if pytorch_steps else {}
    # The gradient vanishes at the minimum: converged.
    assert _reason(_minimize(fn, [5.0, -3.0], max_iterations=200, **steps)) == "converged"
    # Three iterations cannot cross Rosenbrock's valley: the budget ends it.
    valley = _value_and_grad(lambda x: 100.0 * tf.square(x[1] - x[0] ** 2) + tf.square(1 - x[0]))
    assert _reason(_minimize(valley, [-1.2, 1.0], max_iterations=3, **steps)) == "budget"
    # Tests that cannot fire (negative tolerances): only the window can end it. The floor of 1
    # keeps the best loss from halving once the bowl is reached, so the window stalls it long
    # before the budget.
    never = {"tolerance_grad": -1.0, "tolerance_change": -1.0}
    stalled = _minimize(fn, [5.0, -3.0], max_iterations=2000, stall_window=40,
                        stall_progress=0.5, **never, **steps)  # fmt: skip
    assert _reason(stalled) == "stalled"
    assert int(stalled.iterations) < 2000
    np.testing.assert_allclose(stalled.x.numpy(), [2.0, 2.0], atol=1e-3)
    # The loss test only names the stop: a bowl without a floor, stopped by the window with its
    # loss far below a hundredth of the start, has converged; the floored bowl has not.
    bowl = _value_and_grad(lambda x: tf.reduce_sum(tf.square(x - 2.0)))
    window = {"stall_window": 40, "stall_progress": 0.5, "tolerance_loss": 1e-2}
    done = _minimize(bowl, [5.0, -3.0], max_iterations=2000, **window, **never, **steps)
    assert _reason(done) == "converged"
    assert float(done.loss) <= 1e-2 * 34.0
    floored = _minimize(fn, [5.0, -3.0], max_iterations=2000, **window, **never, **steps)
    assert _reason(floored) == "stalled"
    if pytorch_steps:
        # PyTorch's own end (a direction below tolerance_change) is named by the loss too.
        direction = {"tolerance_grad": -1.0, "tolerance_loss": 1e-2}
        at_zero = _minimize(bowl, [5.0, -3.0], max_iterations=2000, **direction, **steps)
        assert _reason(at_zero) == "converged"
        at_floor = _minimize(fn, [5.0, -3.0], max_iterations=2000, **direction, **steps)
        assert _reason(at_floor) == "stalled"


def test_a_non_finite_start_says_so() -> None:
    fn = _value_and_grad(lambda x: tf.reduce_sum(tf.math.log(x)))
    assert _reason(_minimize(fn, [-1.0, 1.0], max_iterations=10)) == "nonfinite"
