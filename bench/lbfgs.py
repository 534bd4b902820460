"""Limited-memory BFGS written in TensorFlow ops, so that a whole attack compiles into one graph.

tensorflow-probability ships an L-BFGS, but it needs the legacy ``tf_keras`` package next to
Keras 3; this one is small and has what the attacks need: a backtracking (Armijo) line search,
a circular history, the best iterate kept by loss, and safe handling of non-finite values
(a non-finite trial point is treated as a failed step and the step is shortened).

Reference: Nocedal & Wright, "Numerical Optimization", 2nd ed., Algorithms 7.4 (two-loop
recursion) and 7.5 (L-BFGS), with the initial step of PyTorch's ``LBFGS`` (``min(1, 1/|g|_1)``
while the history is empty), which the DLG reference code uses.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import tensorflow as tf

ValueAndGrad = Callable[[tf.Tensor], tuple[tf.Tensor, tf.Tensor]]


class LbfgsResult(NamedTuple):
    """What `minimize` returns (all tensors).

    Attributes:
        x: The iterate with the lowest finite loss seen.
        loss: Its loss.
        history: Loss after each iteration, shape [max_iterations]; NaN after the last one.
        iterations: Iterations run.
        evaluations: Calls of the loss-and-gradient function.
        finite: False when the loss at the starting point was not finite.
    """

    x: tf.Tensor
    loss: tf.Tensor
    history: tf.Tensor
    iterations: tf.Tensor
    evaluations: tf.Tensor
    finite: tf.Tensor


def _direction(
    g: tf.Tensor,
    s_hist: tf.Tensor,
    y_hist: tf.Tensor,
    rho: tf.Tensor,
    count: tf.Tensor,
    head: tf.Tensor,
) -> tf.Tensor:
    """Two-loop recursion: returns ``-H g`` for the inverse-Hessian estimate ``H``."""
    m = tf.shape(rho)[0]
    alphas = tf.zeros_like(rho)

    def newest_first(j: tf.Tensor, q: tf.Tensor, alphas: tf.Tensor):
        i = tf.math.floormod(head - 1 - j, m)
        alpha = rho[i] * tf.tensordot(s_hist[i], q, 1)
        return j + 1, q - alpha * y_hist[i], tf.tensor_scatter_nd_update(alphas, [[i]], [alpha])

    _, q, alphas = tf.while_loop(
        lambda j, q, a: j < count, newest_first, (tf.constant(0), g, alphas)
    )
    newest = tf.math.floormod(head - 1, m)
    y_last = y_hist[newest]
    gamma = tf.where(
        count > 0,
        tf.tensordot(s_hist[newest], y_last, 1)
        / tf.maximum(tf.tensordot(y_last, y_last, 1), 1e-30),
        tf.ones([], g.dtype),
    )
    r = gamma * q

    def oldest_first(j: tf.Tensor, r: tf.Tensor):
        i = tf.math.floormod(head - count + j, m)
        beta = rho[i] * tf.tensordot(y_hist[i], r, 1)
        return j + 1, r + (alphas[i] - beta) * s_hist[i]

    _, r = tf.while_loop(lambda j, r: j < count, oldest_first, (tf.constant(0), r))
    return -r


def minimize(
    fn: ValueAndGrad,
    x0: tf.Tensor,
    *,
    max_iterations: int,
    history_size: int = 100,
    max_line_search: int = 25,
    armijo: float = 1e-4,
    tolerance_grad: float = 1e-9,
    tolerance_change: float = 1e-12,
) -> LbfgsResult:
    """Minimises ``fn`` from ``x0`` (a flat float tensor). Call it inside a ``tf.function``.

    Args:
        fn: Maps a flat tensor to (loss scalar, gradient of the same shape).
        x0: Starting point, shape [n].
        max_iterations: L-BFGS iterations (each runs one line search).
        history_size: Number of (s, y) pairs kept.
        max_line_search: Most loss evaluations of one line search; when none is accepted the
            history is cleared and the next iteration starts again from steepest descent, and
            two failures in a row end the run.
        armijo: Sufficient-decrease constant of the line search.
        tolerance_grad: Stop when the largest absolute gradient entry is at most this.
        tolerance_change: Stop when an accepted step changes the loss by at most this.
    """
    dtype = x0.dtype
    n = tf.shape(x0)[0]
    m = history_size
    f0, g0 = fn(x0)
    finite0 = tf.math.is_finite(f0) & tf.reduce_all(tf.math.is_finite(g0))

    def line_search(x, f, g, d, gd, t0):
        def cond(k, t, f_new, g_new, ok):
            return (k < max_line_search) & ~ok

        def body(k, t, f_new, g_new, ok):
            t = tf.where(k == 0, t0, 0.5 * t)
            f_new, g_new = fn(x + t * d)
            ok = (
                tf.math.is_finite(f_new)
                & tf.reduce_all(tf.math.is_finite(g_new))
                & (f_new <= f + armijo * t * gd)
            )
            return k + 1, t, f_new, g_new, ok

        return tf.while_loop(cond, body, (tf.constant(0), t0, f, g, tf.constant(False)))

    def body(it, evals, x, f, g, s_hist, y_hist, rho, count, head, hist, failures, done):
        d = _direction(g, s_hist, y_hist, rho, count, head)
        gd = tf.tensordot(g, d, 1)
        # A non-descent direction means the curvature pairs went stale: fall back to -g.
        fresh = ~(gd < 0) | (count == 0)
        d = tf.where(fresh, -g, d)
        gd = tf.where(fresh, -tf.tensordot(g, g, 1), gd)
        count = tf.where(fresh, 0, count)
        t0 = tf.where(
            count == 0,
            tf.minimum(tf.ones([], dtype), 1.0 / tf.maximum(tf.reduce_sum(tf.abs(g)), 1e-30)),
            tf.ones([], dtype),
        )
        k, t, f_new, g_new, ok = line_search(x, f, g, d, gd, t0)
        evals += k
        x_new = tf.where(ok, x + t * d, x)
        s = x_new - x
        y = tf.where(ok, g_new - g, tf.zeros_like(g))
        sy = tf.tensordot(s, y, 1)
        # Keep only pairs with positive curvature, so that H stays positive definite.
        keep = ok & (sy > 1e-10 * tf.maximum(tf.tensordot(y, y, 1), 1e-30))
        s_hist = tf.where(keep, tf.tensor_scatter_nd_update(s_hist, [[head]], [s]), s_hist)
        y_hist = tf.where(keep, tf.tensor_scatter_nd_update(y_hist, [[head]], [y]), y_hist)
        rho = tf.where(
            keep, tf.tensor_scatter_nd_update(rho, [[head]], [1.0 / tf.maximum(sy, 1e-30)]), rho
        )
        head = tf.where(keep, tf.math.floormod(head + 1, m), head)
        count = tf.where(keep, tf.minimum(count + 1, m), tf.where(ok, count, 0))
        f_next = tf.where(ok, f_new, f)
        g_next = tf.where(ok, g_new, g)
        failures = tf.where(ok, 0, failures + 1)
        done = (
            (failures >= 2)
            | (tf.reduce_max(tf.abs(g_next)) <= tolerance_grad)
            | (ok & (tf.abs(f_new - f) <= tolerance_change))
        )
        hist = tf.tensor_scatter_nd_update(hist, [[it]], [f_next])
        return (
            it + 1,
            evals,
            x_new,
            f_next,
            g_next,
            s_hist,
            y_hist,
            rho,
            count,
            head,
            hist,
            failures,
            done,
        )

    state = (
        tf.constant(0),
        tf.constant(1),
        x0,
        f0,
        g0,
        tf.zeros([m, n], dtype),
        tf.zeros([m, n], dtype),
        tf.zeros([m], dtype),
        tf.constant(0),
        tf.constant(0),
        tf.fill([max_iterations], tf.constant(float("nan"), dtype)),
        tf.constant(0),
        ~finite0 | (tf.reduce_max(tf.abs(g0)) <= tolerance_grad),
    )
    out = tf.while_loop(lambda *s: (s[0] < max_iterations) & ~s[-1], body, state)
    it, evals, x, f, _, _, _, _, _, _, hist, _, _ = out
    # Accepted steps never increase the loss, so the last iterate is the best one seen.
    return LbfgsResult(x, f, hist, it, evals, finite0)
