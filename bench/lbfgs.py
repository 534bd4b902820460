"""Limited-memory BFGS written in TensorFlow ops, so that a whole attack compiles into one graph.

It minimises N independent problems at once (a batch of attacks): each problem has its own
history, line search, convergence test and divergence handling; the problems share only the
loop, and a problem that has stopped keeps its state while the others go on. One problem is the
case N = 1, so a batched run and one-at-a-time runs follow the same arithmetic.

tensorflow-probability ships an L-BFGS, but it needs the legacy ``tf_keras`` package next to
Keras 3; this one is small and has what the attacks need: a backtracking (Armijo) line search,
a circular history, the best iterate kept by loss, and safe handling of non-finite values
(a non-finite trial point is treated as a failed step and the step is shortened).

Reference: Nocedal & Wright, "Numerical Optimization", 2nd ed., Algorithms 7.4 (two-loop
recursion) and 7.5 (L-BFGS), with the initial step of PyTorch's ``LBFGS``, which the DLG
reference code uses: ``min(1, 1/|g|_1)`` on the first iteration, after the history was reset
and after a failed line search; with unit steps (no line search), an iteration whose history is
empty only because every pair so far had non-positive curvature takes a unit step along
``-g``, as PyTorch does. (Scaling those steps too made the search crawl along ``-g`` into other
basins: DLG on the same 32 starts recovered 27 of 32 MNIST images against PyTorch's 29, and 23
of 32 CIFAR-10 images against 25; with PyTorch's rule both give the same images.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import tensorflow as tf

ValueAndGrad = Callable[[tf.Tensor], tuple[tf.Tensor, tf.Tensor]]


class LbfgsResult(NamedTuple):
    """What `minimize` returns (all tensors, one entry per problem).

    Attributes:
        x: The iterate with the lowest finite loss seen, [N, D].
        loss: Its loss, [N].
        history: Loss after each iteration, [N, max_iterations]; NaN after the problem's last one.
        iterations: Iterations run, [N].
        evaluations: Loss-and-gradient evaluations the problem used, [N] (in a batch every
            evaluation computes all problems; this counts the ones the problem asked for).
        finite: False where the loss at the starting point was not finite, [N].
    """

    x: tf.Tensor
    loss: tf.Tensor
    history: tf.Tensor
    iterations: tf.Tensor
    evaluations: tf.Tensor
    finite: tf.Tensor


class LbfgsState(NamedTuple):
    """Everything `advance` carries from one iteration to the next, one row per problem.

    Every field has the problem axis first and nothing is shared between rows, so a row can be
    taken out of one state (`take`) and go on in a program of another width exactly where it
    was.
    An empty slot is a row with ``done`` set.
    """

    evaluations: tf.Tensor  # [N] int32
    x: tf.Tensor  # [N, D] current iterate
    f: tf.Tensor  # [N] its loss
    g: tf.Tensor  # [N, D] its gradient
    s_hist: tf.Tensor  # [N, m, D] steps, circular
    y_hist: tf.Tensor  # [N, m, D] gradient changes, circular
    rho: tf.Tensor  # [N, m] 1 / (s . y)
    count: tf.Tensor  # [N] pairs held
    head: tf.Tensor  # [N] slot of the next pair
    history: tf.Tensor  # [N, max_iterations] loss after each iteration, NaN after the last
    failures: tf.Tensor  # [N] failed line searches in a row
    done: tf.Tensor  # [N] bool
    iterations: tf.Tensor  # [N] int32
    x_best: tf.Tensor  # [N, D]
    f_best: tf.Tensor  # [N]
    finite: tf.Tensor  # [N] bool: the start's loss and gradient were finite


def _dot(a: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
    """Row-wise inner product of two [N, D] tensors."""
    return tf.reduce_sum(a * b, axis=-1)


def _direction(
    g: tf.Tensor,
    s_hist: tf.Tensor,
    y_hist: tf.Tensor,
    rho: tf.Tensor,
    count: tf.Tensor,
    head: tf.Tensor,
) -> tf.Tensor:
    """Two-loop recursion per problem: returns ``-H g`` for each problem's inverse-Hessian
    estimate ``H``. Histories are circular buffers [N, m, D]; problem ``n`` holds ``count[n]``
    pairs ending before slot ``head[n]``."""
    m = tf.shape(rho)[1]
    rows = tf.range(tf.shape(g)[0])
    alphas = tf.zeros_like(rho)

    def pick(slot: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor]:
        index = tf.stack([rows, slot], axis=1)
        return (
            index,
            tf.gather_nd(s_hist, index),
            tf.gather_nd(y_hist, index),
            tf.gather_nd(rho, index),
        )

    def newest_first(j: tf.Tensor, q: tf.Tensor, alphas: tf.Tensor):
        index, s, y, r = pick(tf.math.floormod(head - 1 - j, m))
        alpha = tf.where(j < count, r * _dot(s, q), tf.zeros_like(r))
        # Rows with j >= count write 0 into a slot outside their window, which is never read.
        return j + 1, q - alpha[:, None] * y, tf.tensor_scatter_nd_update(alphas, index, alpha)

    longest = tf.reduce_max(count)
    _, q, alphas = tf.while_loop(
        lambda j, q, a: j < longest, newest_first, (tf.constant(0), g, alphas)
    )
    _, s_new, y_new, _ = pick(tf.math.floormod(head - 1, m))
    gamma = tf.where(
        count > 0,
        _dot(s_new, y_new) / tf.maximum(_dot(y_new, y_new), 1e-30),
        tf.ones_like(count, g.dtype),
    )
    r = gamma[:, None] * q

    def oldest_first(j: tf.Tensor, r: tf.Tensor):
        slot = tf.math.floormod(head - count + j, m)
        index, s, y, rh = pick(slot)
        beta = rh * _dot(y, r)
        step = tf.where(j < count, tf.gather_nd(alphas, index) - beta, tf.zeros_like(beta))
        return j + 1, r + step[:, None] * s

    _, r = tf.while_loop(lambda j, r: j < longest, oldest_first, (tf.constant(0), r))
    return -r


def empty_state(
    n: int, dim: int, *, history_size: int, max_iterations: int, dtype: tf.DType = tf.float32
) -> LbfgsState:
    """A state of ``n`` empty slots (every row ``done``) for problems of ``dim`` unknowns."""
    zeros = tf.zeros([n], tf.int32)
    return LbfgsState(
        evaluations=zeros,
        x=tf.zeros([n, dim], dtype),
        f=tf.zeros([n], dtype),
        g=tf.zeros([n, dim], dtype),
        s_hist=tf.zeros([n, history_size, dim], dtype),
        y_hist=tf.zeros([n, history_size, dim], dtype),
        rho=tf.zeros([n, history_size], dtype),
        count=zeros,
        head=zeros,
        history=tf.fill([n, max_iterations], tf.constant(float("nan"), dtype)),
        failures=zeros,
        done=tf.ones([n], tf.bool),
        iterations=zeros,
        x_best=tf.zeros([n, dim], dtype),
        f_best=tf.zeros([n], dtype),
        finite=tf.zeros([n], tf.bool),
    )


def take(state: LbfgsState, rows: list[int]) -> LbfgsState:
    """The given rows of a state, as a state of ``len(rows)`` rows."""
    return LbfgsState(*(tf.gather(t, rows) for t in state))


def restart(
    fn: ValueAndGrad,
    state: LbfgsState,
    fresh: tf.Tensor,
    x0: tf.Tensor,
    *,
    tolerance_grad: float = 1e-9,
) -> LbfgsState:
    """``state`` with the rows where ``fresh`` [N] is set started afresh from ``x0`` [N, D]
    (other rows of ``x0`` are ignored). Costs one evaluation of every row, and none when no row
    is fresh. Call it inside a ``tf.function``."""

    def started() -> LbfgsState:
        f0, g0 = fn(x0)
        finite0 = tf.math.is_finite(f0) & tf.reduce_all(tf.math.is_finite(g0), axis=-1)
        zeros = tf.zeros_like(state.count)
        new = LbfgsState(
            evaluations=tf.ones_like(zeros),
            x=x0,
            f=f0,
            g=g0,
            s_hist=tf.zeros_like(state.s_hist),
            y_hist=tf.zeros_like(state.y_hist),
            rho=tf.zeros_like(state.rho),
            count=zeros,
            head=zeros,
            history=tf.fill(tf.shape(state.history), tf.constant(float("nan"), f0.dtype)),
            failures=zeros,
            done=~finite0 | (tf.reduce_max(tf.abs(g0), axis=-1) <= tolerance_grad),
            iterations=zeros,
            x_best=x0,
            f_best=f0,
            finite=finite0,
        )
        return LbfgsState(
            *(
                tf.where(tf.reshape(fresh, [-1] + [1] * (len(old.shape) - 1)), n, old)
                for old, n in zip(state, new, strict=True)
            )
        )

    return tf.cond(tf.reduce_any(fresh), started, lambda: state)


def result(state: LbfgsState) -> LbfgsResult:
    """What a (finished or not) state has found: the `LbfgsResult` of its rows."""
    return LbfgsResult(
        state.x_best, state.f_best, state.history, state.iterations, state.evaluations,
        state.finite,
    )  # fmt: skip


def minimize(
    fn: ValueAndGrad,
    x0: tf.Tensor,
    *,
    max_iterations: int,
    history_size: int = 100,
    max_line_search: int = 25,
    armijo: float | None = 1e-4,
    tolerance_grad: float = 1e-9,
    tolerance_change: float = 1e-12,
) -> LbfgsResult:
    """Minimises N independent problems from ``x0`` [N, D]. Call it inside a ``tf.function``.

    Args:
        fn: Maps [N, D] points to (losses [N], gradients [N, D]); row ``n`` of the output must
            depend on row ``n`` of the input only.
        x0: Starting points, [N, D].
        max_iterations: L-BFGS iterations (each runs one line search).
        history_size: Number of (s, y) pairs kept per problem.
        max_line_search: Most loss evaluations of one line search; when none is accepted the
            history is cleared and the next iteration starts again from steepest descent, and
            two failures in a row end the problem's run.
        armijo: Sufficient-decrease constant of the line search; None accepts any finite
            point (unit steps, as PyTorch's ``LBFGS`` without ``line_search_fn``, which the DLG
            paper's code uses; the loss may then rise, and the best iterate is returned).
        tolerance_grad: A problem stops when its largest absolute gradient entry is at most this.
        tolerance_change: A problem stops when an accepted step changes its loss by at most this.

    It is `restart` of every row of an empty state followed by `advance` to the end; a
    scheduler that refills finished rows (`leakbench.lanes`) uses those two directly.
    """
    x0 = tf.convert_to_tensor(x0)
    n = tf.shape(x0)[0]
    state = empty_state(
        n, x0.shape[1], history_size=history_size, max_iterations=max_iterations, dtype=x0.dtype
    )
    state = restart(fn, state, tf.ones([n], tf.bool), x0, tolerance_grad=tolerance_grad)
    state = advance(
        fn, state, max_iterations, max_line_search=max_line_search, armijo=armijo,
        tolerance_grad=tolerance_grad, tolerance_change=tolerance_change,
    )  # fmt: skip
    return result(state)


def advance(
    fn: ValueAndGrad,
    state: LbfgsState,
    steps: int | tf.Tensor,
    *,
    until: int | tf.Tensor = 0,
    max_line_search: int = 25,
    armijo: float | None = 1e-4,
    tolerance_grad: float = 1e-9,
    tolerance_change: float = 1e-12,
) -> LbfgsState:
    """Runs at most ``steps`` more iterations of every row that is not done (see `minimize`
    for the arguments); stops early once at most ``until`` rows are not done (a scheduler
    stops when a slot frees up). A row is done when it converged,
    failed twice, or ran as many iterations as its history has columns. Each row's arithmetic
    depends on its own values only, so where and when a row runs does not change its numbers.
    Call it inside a ``tf.function``."""
    n = tf.shape(state.x)[0]
    m = tf.shape(state.rho)[1]
    max_iterations = tf.shape(state.history)[1]
    rows = tf.range(n)

    def line_search(x, f, g, d, gd, t0, searching):
        def cond(k, t, f_new, g_new, ok, used):
            return (k < max_line_search) & tf.reduce_any(searching & ~ok)

        def body(k, t, f_new, g_new, ok, used):
            pending = searching & ~ok
            t = tf.where(k == 0, t0, tf.where(pending, 0.5 * t, t))
            f_try, g_try = fn(x + t[:, None] * d)
            good = tf.math.is_finite(f_try) & tf.reduce_all(tf.math.is_finite(g_try), axis=-1)
            if armijo is not None:
                good &= f_try <= f + armijo * t * gd
            f_new = tf.where(pending, f_try, f_new)
            g_new = tf.where(pending[:, None], g_try, g_new)
            return k + 1, t, f_new, g_new, ok | (pending & good), used + tf.cast(pending, tf.int32)

        zeros = tf.zeros_like(state.count)
        start = (tf.constant(0), t0, f, g, tf.zeros_like(searching), zeros)
        return tf.while_loop(cond, body, start)[1:]

    def body(k, s: LbfgsState):
        (evals, x, f, g, s_hist, y_hist, rho, count, head, hist, failures, done, iters,
         x_best, f_best, finite) = s  # fmt: skip
        searching = ~done
        d = _direction(g, s_hist, y_hist, rho, count, head)
        gd = _dot(g, d)
        # A non-descent direction means the curvature pairs went stale: fall back to -g.
        fresh = ~(gd < 0) | (count == 0)
        d = tf.where(fresh[:, None], -g, d)
        gd = tf.where(fresh, -_dot(g, g), gd)
        # The cautious first step: on the first iteration, after a reset (stale pairs) and after
        # a failed line search; a backtracking search also takes it whenever the history is
        # empty (its own safeguard, unchanged).
        scaled = (iters == 0) | (fresh & (count > 0)) | (failures > 0)
        if armijo is not None:
            scaled = scaled | (count == 0)
        count = tf.where(fresh & searching, 0, count)
        t0 = tf.where(
            scaled,
            tf.minimum(tf.ones_like(f), 1.0 / tf.maximum(tf.reduce_sum(tf.abs(g), axis=-1), 1e-30)),
            tf.ones_like(f),
        )
        t, f_new, g_new, ok, used = line_search(x, f, g, d, gd, t0, searching)
        evals += used
        x_new = tf.where(ok[:, None], x + t[:, None] * d, x)
        step = x_new - x
        y = tf.where(ok[:, None], g_new - g, tf.zeros_like(g))
        sy = _dot(step, y)
        # Keep only pairs with positive curvature, so that H stays positive definite.
        keep = ok & (sy > 1e-10 * tf.maximum(_dot(y, y), 1e-30))
        slot = tf.stack([rows, head], axis=1)
        s_hist = tf.tensor_scatter_nd_update(
            s_hist, slot, tf.where(keep[:, None], step, tf.gather_nd(s_hist, slot))
        )
        y_hist = tf.tensor_scatter_nd_update(
            y_hist, slot, tf.where(keep[:, None], y, tf.gather_nd(y_hist, slot))
        )
        rho = tf.tensor_scatter_nd_update(
            rho, slot, tf.where(keep, 1.0 / tf.maximum(sy, 1e-30), tf.gather_nd(rho, slot))
        )
        head = tf.where(keep, tf.math.floormod(head + 1, m), head)
        new_count = tf.where(keep, tf.minimum(count + 1, m), tf.where(ok, count, 0))
        count = tf.where(searching, new_count, count)
        f_next = tf.where(ok, f_new, f)
        g_next = tf.where(ok[:, None], g_new, g)
        failures = tf.where(searching, tf.where(ok, 0, failures + 1), failures)
        column = tf.stack([rows, tf.minimum(iters, max_iterations - 1)], axis=1)
        hist = tf.tensor_scatter_nd_update(
            hist, column, tf.where(searching, f_next, tf.gather_nd(hist, column))
        )
        iters += tf.cast(searching, tf.int32)
        stop = (
            (failures >= 2)
            | (tf.reduce_max(tf.abs(g_next), axis=-1) <= tolerance_grad)
            | (ok & (tf.abs(f_new - f) <= tolerance_change))
            | (iters >= max_iterations)
        )
        done = done | (searching & stop)
        better = searching & (f_next < f_best)
        x_best = tf.where(better[:, None], x_new, x_best)
        f_best = tf.where(better, f_next, f_best)
        return k + 1, LbfgsState(
            evals, x_new, f_next, g_next, s_hist, y_hist, rho, count, head, hist, failures, done,
            iters, x_best, f_best, finite,
        )  # fmt: skip

    _, state = tf.while_loop(
        lambda k, s: (k < steps) & (tf.reduce_sum(tf.cast(~s.done, tf.int32)) > until),
        body,
        (tf.constant(0), state),
    )
    return state
