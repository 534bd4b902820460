"""Limited-memory BFGS written in TensorFlow ops, so that a whole attack compiles into one graph.

It minimises N independent problems at once (a batch of attacks): each problem has its own
history, line search, convergence test and divergence handling; the problems share only the
loop, and a problem that has stopped keeps its state while the others go on. One problem is the
case N = 1, so a batched run and one-at-a-time runs follow the same arithmetic.

tensorflow-probability ships an L-BFGS, but it needs the legacy ``tf_keras`` package next to
Keras 3; this one is small and has what the attacks need: a backtracking (Armijo) line search,
a circular history, the best iterate kept by loss, and safe handling of non-finite values
(a non-finite trial point is treated as a failed step and the step is shortened).

Reference: Nocedal & Wright, "Numerical Optimization", 2nd ed., Algorithm 7.5 (L-BFGS), with
the search direction in the compact form of Byrd, Nocedal & Schnabel (1994), which gives the
two-loop recursion's direction (Algorithm 7.4) from a few matrix products, and the initial
step of PyTorch's ``LBFGS``, which the DLG reference code uses: ``min(1, 1/|g|_1)`` on the
first iteration, after the history was reset and after a failed line search. With unit steps
(no line search), an iteration whose history is empty only because every pair so far had
non-positive curvature takes a unit step along ``-g``, as PyTorch does. (Scaling those steps
too made the search crawl along ``-g`` into other basins: DLG on the same 32 starts recovered
27 of 32 MNIST images against PyTorch's 29, and 23 of 32 CIFAR-10 images against 25; with
PyTorch's rule both give the same images.) ``pytorch_steps`` adds PyTorch's step structure.
"""

from __future__ import annotations

import dataclasses
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
        reason: Why each problem stopped, an index into `REASONS`, [N].
    """

    x: tf.Tensor
    loss: tf.Tensor
    history: tf.Tensor
    iterations: tf.Tensor
    evaluations: tf.Tensor
    finite: tf.Tensor
    reason: tf.Tensor


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
    sy: tf.Tensor  # [N, m, m] s_i . y_j by slot
    yy: tf.Tensor  # [N, m, m] y_i . y_j by slot
    count: tf.Tensor  # [N] pairs held
    head: tf.Tensor  # [N] slot of the next pair
    history: tf.Tensor  # [N, max_iterations] loss after each iteration, NaN after the last
    failures: tf.Tensor  # [N] failed line searches in a row
    done: tf.Tensor  # [N] bool
    iterations: tf.Tensor  # [N] int32
    spent: tf.Tensor  # [N] int32: iterations charged to the budget (see `advance`)
    x_best: tf.Tensor  # [N, D]
    f_best: tf.Tensor  # [N]
    finite: tf.Tensor  # [N] bool: the start's loss and gradient were finite
    f_start: tf.Tensor  # [N] the loss at the start
    anchor_f: tf.Tensor  # [N] the best loss when the current progress window began
    anchor_at: tf.Tensor  # [N] int32: `spent` when it began
    reason: tf.Tensor  # [N] int32: why the row stopped (`REASONS`), RUNNING while it runs


# Why a row stopped, as `LbfgsState.reason` holds it (index into `REASONS`).
RUNNING, CONVERGED, STALLED, BUDGET, NONFINITE = range(5)
REASONS = ("running", "converged", "stalled", "budget", "nonfinite")


def _dot(a: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
    """Row-wise inner product of two [N, D] tensors."""
    return tf.reduce_sum(a * b, axis=-1)


def _solve_upper(r: tf.Tensor, b: tf.Tensor, *, transpose: bool = False) -> tf.Tensor:
    """Solves ``r x = b`` (or ``r^T x = b``) for upper-triangular ``r`` [N, m, m] and ``b``
    [N, m] by substitution, one unknown per step on [N, m] tensors. XLA's own triangular solve
    inverts blocks in a loop of its own and, measured on a CPU, cost about 15 times this here."""
    m = r.shape[1]

    def step(j: tf.Tensor, rest: tf.Tensor, x: tf.Tensor):
        column = r[:, j, :] if transpose else r[:, :, j]  # column j of r^T or of r
        xj = rest[:, j] / column[:, j]
        return (
            j + (1 if transpose else -1),
            rest - xj[:, None] * column,
            x + xj[:, None] * (tf.one_hot(j, m, dtype=b.dtype)),
        )

    first, cond = (0, lambda j, *_: j < m) if transpose else (m - 1, lambda j, *_: j >= 0)
    return tf.while_loop(cond, step, (tf.constant(first), b, tf.zeros_like(b)))[2]


def _direction(
    g: tf.Tensor,
    s_hist: tf.Tensor,
    y_hist: tf.Tensor,
    sy: tf.Tensor,
    yy: tf.Tensor,
    count: tf.Tensor,
    head: tf.Tensor,
) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """``-H g`` for each problem's L-BFGS inverse-Hessian estimate ``H``, in the compact form of
    Byrd, Nocedal & Schnabel (1994; Nocedal & Wright eq. 7.24), which equals the two-loop
    recursion: ``H g = gamma g + S p - gamma Y c`` with ``R c = S^T g`` and ``R^T p = (D + gamma
    Y^T Y) c - gamma Y^T g``, where ``R`` is the upper triangle of ``S^T Y`` (pairs oldest
    first), ``D`` its diagonal and ``gamma = s.y / y.y`` of the newest pair.

    The histories are circular buffers [N, m, D]: problem ``n`` holds ``count[n]`` pairs ending
    before slot ``head[n]``. ``sy`` and ``yy`` [N, m, m] hold ``s_i . y_j`` and ``y_i . y_j`` by
    slot; the newest pair's row and column are filled in here, in the same pass over the
    history as ``S^T g`` and ``Y^T g``. Returns the direction and the updated ``sy``, ``yy``.

    The history is read twice, as the two-loop recursion reads it, but in four matrix
    products instead of 2m small steps; only the m x m system is put in time order.
    """
    m = s_hist.shape[1]
    k = tf.range(m)
    newest = tf.math.floormod(head - 1, m)
    s_new = tf.gather(s_hist, newest, batch_dims=1)
    y_new = tf.gather(y_hist, newest, batch_dims=1)
    with_s = tf.einsum("nmd,ncd->nmc", s_hist, tf.stack([g, y_new], axis=1))
    with_y = tf.einsum("nmd,ncd->nmc", y_hist, tf.stack([g, s_new, y_new], axis=1))
    at = tf.one_hot(newest, m, on_value=True, off_value=False)
    sy = tf.where(at[:, :, None], with_y[:, None, :, 1], sy)  # row: s_new . y_j
    sy = tf.where(at[:, None, :], with_s[:, :, 1:], sy)  # column: s_i . y_new
    yy = tf.where(at[:, :, None], with_y[:, None, :, 2], yy)
    yy = tf.where(at[:, None, :], with_y[:, :, 2:], yy)

    start = head - count  # slot of the oldest pair, modulo m
    order = tf.math.floormod(start[:, None] + k, m)  # [N, m]: slot of the k-th oldest pair
    age = tf.math.floormod(k - start[:, None], m)  # [N, m]: time index of each slot
    valid = tf.cast(k < count[:, None], g.dtype)  # by time index
    both = valid[:, :, None] * valid[:, None, :]

    def in_time_order(matrix: tf.Tensor) -> tf.Tensor:
        rows = tf.gather(matrix, order, batch_dims=1)
        return tf.gather(rows, order, axis=2, batch_dims=1) * both

    sy_t, yy_t = in_time_order(sy), in_time_order(yy)
    curvature = tf.linalg.diag_part(sy_t)
    # Pairs not held get a unit diagonal and zero right-hand sides, so they solve to zero.
    r = tf.linalg.band_part(sy_t, 0, -1) + tf.linalg.diag(1.0 - valid)
    gamma = tf.where(
        count > 0,
        _dot(s_new, y_new) / tf.maximum(_dot(y_new, y_new), 1e-30),
        tf.ones_like(count, g.dtype),
    )[:, None]
    sg = tf.gather(with_s[:, :, 0], order, batch_dims=1) * valid
    yg = tf.gather(with_y[:, :, 0], order, batch_dims=1) * valid
    c = _solve_upper(r, sg)
    rhs = curvature * c + gamma * tf.linalg.matvec(yy_t, c) - gamma * yg
    p = _solve_upper(r, rhs, transpose=True)
    p, c = tf.gather(p, age, batch_dims=1), tf.gather(c, age, batch_dims=1)  # back to slots
    hg = gamma * g + tf.einsum("nmd,nm->nd", s_hist, p) - gamma * tf.einsum("nmd,nm->nd", y_hist, c)
    return -hg, sy, yy


def _with_pair(
    s_hist: tf.Tensor,
    y_hist: tf.Tensor,
    head: tf.Tensor,
    keep: tf.Tensor,
    s: tf.Tensor,
    y: tf.Tensor,
) -> tuple[tf.Tensor, tf.Tensor]:
    """The histories with the pair ``(s, y)`` written to slot ``head`` of the rows where
    ``keep`` is set (in place: a select would copy the whole history every time). Its products
    with the other pairs are filled in by the next `_direction`."""
    slot = tf.stack([tf.range(tf.shape(head)[0]), head], axis=1)
    s_hist = tf.tensor_scatter_nd_update(
        s_hist, slot, tf.where(keep[:, None], s, tf.gather_nd(s_hist, slot))
    )
    y_hist = tf.tensor_scatter_nd_update(
        y_hist, slot, tf.where(keep[:, None], y, tf.gather_nd(y_hist, slot))
    )
    return s_hist, y_hist


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
        sy=tf.zeros([n, history_size, history_size], dtype),
        yy=tf.zeros([n, history_size, history_size], dtype),
        count=zeros,
        head=zeros,
        history=tf.fill([n, max_iterations], tf.constant(float("nan"), dtype)),
        failures=zeros,
        done=tf.ones([n], tf.bool),
        iterations=zeros,
        spent=zeros,
        x_best=tf.zeros([n, dim], dtype),
        f_best=tf.zeros([n], dtype),
        finite=tf.zeros([n], tf.bool),
        f_start=tf.zeros([n], dtype),
        anchor_f=tf.zeros([n], dtype),
        anchor_at=zeros,
        reason=zeros,
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
        flat = finite0 & (tf.reduce_max(tf.abs(g0), axis=-1) <= tolerance_grad)
        zeros = tf.zeros_like(state.count)
        new = LbfgsState(
            evaluations=tf.ones_like(zeros),
            x=x0,
            f=f0,
            g=g0,
            s_hist=tf.zeros_like(state.s_hist),
            y_hist=tf.zeros_like(state.y_hist),
            sy=tf.zeros_like(state.sy),
            yy=tf.zeros_like(state.yy),
            count=zeros,
            head=zeros,
            history=tf.fill(tf.shape(state.history), tf.constant(float("nan"), f0.dtype)),
            failures=zeros,
            done=~finite0 | flat,
            iterations=zeros,
            spent=zeros,
            x_best=x0,
            f_best=f0,
            finite=finite0,
            f_start=f0,
            anchor_f=f0,
            anchor_at=zeros,
            reason=tf.where(~finite0, NONFINITE, tf.where(flat, CONVERGED, RUNNING)),
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
        state.finite, state.reason,
    )  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Search:
    """How `minimize` and `advance` search and when a problem stops: one value for both.

    Attributes:
        max_line_search: Most loss evaluations of one line search; when none is accepted the
            history is cleared and the next iteration starts again from steepest descent, and
            two failures in a row end the problem's run.
        armijo: Sufficient-decrease constant of the line search; None accepts any finite
            point (unit steps, as PyTorch's ``LBFGS`` without ``line_search_fn``, which the DLG
            paper's code uses; the loss may then rise, and the best iterate is returned).
        tolerance_grad: A problem stops when its largest absolute gradient entry is at most this.
        tolerance_change: A problem stops when an accepted step changes its loss by at most this.
        pytorch_steps: Follow the step structure of ``torch.optim.LBFGS(max_iter=pytorch_steps)``
            called ``max_iterations / pytorch_steps`` times, as the DLG paper's code does (use
            it with ``armijo=None``, ``tolerance_grad=1e-7`` and ``tolerance_change=1e-9``,
            PyTorch's defaults). Iterations are then grouped into steps of this many. A loss
            change below ``tolerance_change``, or a step no longer than it in every coordinate,
            ends the current step, not the run. The budget charges every step begun in full.
            A direction with ``g . d > -tolerance_change`` ends the run: PyTorch would stay at
            that point for every remaining step, re-evaluating it, so those evaluations are
            not repeated here. Pairs are kept when ``s . y > 1e-10``, PyTorch's absolute test.
            The trajectory is PyTorch's up to rounding. Only the evaluations differ: PyTorch
            evaluates the same point again at the start of a step that follows one a
            tolerance ended, and this code does not.
        tolerance_loss: A problem that stops (by any test) with its best loss at most this
            multiple of its loss at the start has converged rather than stalled (0: only the
            gradient tolerance says converged; for losses that are >= 0). It does not stop a
            problem by itself: the iterations at the float32 floor still sharpen the result.
        stall_window: Budget units (iterations, charged as ``spent``) over which the best
            loss must improve; None: no such test.
        stall_progress: The relative improvement of the best loss that a window must make:
            a problem whose best loss is above ``(1 - stall_progress)`` times the best loss
            at the window's start has stalled and stops.
    """

    max_line_search: int = 25
    armijo: float | None = 1e-4
    tolerance_grad: float = 1e-9
    tolerance_change: float = 1e-12
    pytorch_steps: int | None = None
    tolerance_loss: float = 0.0
    stall_window: int | None = None
    stall_progress: float = 0.0


def minimize(
    fn: ValueAndGrad,
    x0: tf.Tensor,
    *,
    max_iterations: int,
    history_size: int = 100,
    search: Search = Search(),
) -> LbfgsResult:
    """Minimises N independent problems from ``x0`` [N, D]. Call it inside a ``tf.function``.

    Args:
        fn: Maps [N, D] points to (losses [N], gradients [N, D]); row ``n`` of the output must
            depend on row ``n`` of the input only.
        x0: Starting points, [N, D].
        max_iterations: L-BFGS iterations (each runs one line search).
        history_size: Number of (s, y) pairs kept per problem.
        search: The line search and the stopping tests (`Search`).

    Each problem records why it stopped in ``reason`` (`REASONS`): converged (the gradient
    tolerance, or any stop with the loss at ``search.tolerance_loss``), stalled (no progress
    over a window, failed line searches, a loss change or a direction below
    ``search.tolerance_change``), budget (``max_iterations`` spent), or nonfinite (the start).

    It is `restart` of every row of an empty state followed by `advance` to the end; a
    scheduler that refills finished rows (`leakbench.attacks.engine.lanes`) uses those two directly.
    """
    x0 = tf.convert_to_tensor(x0)
    n = tf.shape(x0)[0]
    state = empty_state(
        n, x0.shape[1], history_size=history_size, max_iterations=max_iterations, dtype=x0.dtype
    )
    state = restart(fn, state, tf.ones([n], tf.bool), x0, tolerance_grad=search.tolerance_grad)
    state = advance(fn, state, max_iterations, search=search)
    return result(state)


def advance(
    fn: ValueAndGrad,
    state: LbfgsState,
    steps: int | tf.Tensor,
    *,
    until: int | tf.Tensor = 0,
    search: Search = Search(),
) -> LbfgsState:
    """Runs at most ``steps`` more iterations of every row that is not done, searching and stopping
    as ``search`` says (`Search`); stops early once at most ``until`` rows are not done (a
    scheduler stops when a slot frees up). A row is done when it converged, stalled, or spent
    its budget (as many iterations as its history has columns), and says which in ``reason``.
    Each row's arithmetic depends on its own values only, so where and when a row runs does not
    change its numbers (beyond the last bits, which can depend on the program's width). Call it
    inside a ``tf.function``."""
    rows = tf.range(tf.shape(state.x)[0])
    max_iterations = tf.shape(state.history)[1]

    def body(k: tf.Tensor, s: LbfgsState) -> tuple[tf.Tensor, LbfgsState]:
        return k + 1, _iteration(fn, s, search, rows, max_iterations)

    _, state = tf.while_loop(
        lambda k, s: (k < steps) & (tf.reduce_sum(tf.cast(~s.done, tf.int32)) > until),
        body,
        (tf.constant(0), state),
    )
    return state


def _iteration(
    fn: ValueAndGrad,
    s: LbfgsState,
    search: Search,
    rows: tf.Tensor,
    max_iterations: tf.Tensor,
) -> LbfgsState:
    """One L-BFGS iteration of every row that is not done: a direction, a line search along
    it, the new curvature pair, and the stopping tests. ``rows`` is ``range(N)`` and
    ``max_iterations`` the history's columns."""
    d, gd, sy, yy, fresh, stalled = _search_direction(s, search)
    searching = ~s.done & ~stalled
    count = tf.where(fresh & searching, 0, s.count)
    t0 = _first_step(s, search, fresh)
    t, f_new, g_new, ok, used = _line_search(fn, search, s.x, s.f, s.g, d, gd, t0, searching)
    x_new = tf.where(ok[:, None], s.x + t[:, None] * d, s.x)
    step = x_new - s.x
    s_hist, y_hist, head, count = _with_curvature_pair(s, search, count, searching, ok, step, g_new)
    f_next = tf.where(ok, f_new, s.f)
    g_next = tf.where(ok[:, None], g_new, s.g)
    failures = tf.where(searching, tf.where(ok, 0, s.failures + 1), s.failures)
    column = tf.stack([rows, tf.minimum(s.iterations, max_iterations - 1)], axis=1)
    hist = tf.tensor_scatter_nd_update(
        s.history, column, tf.where(searching, f_next, tf.gather_nd(s.history, column))
    )
    moved = s._replace(
        evaluations=s.evaluations + used, x=x_new, f=f_next, g=g_next, s_hist=s_hist,
        y_hist=y_hist, sy=sy, yy=yy, count=count, head=head, history=hist, failures=failures,
        iterations=s.iterations + tf.cast(searching, tf.int32),
        spent=s.spent + tf.cast(searching, tf.int32),
    )  # fmt: skip
    return _stopped(moved, search, searching, stalled, ok, step, f_new, s.f, max_iterations)


def _search_direction(
    s: LbfgsState, search: Search
) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor]:
    """The direction of each row, its slope ``g . d``, the updated ``sy`` and ``yy``, where
    the direction fell back to ``-g`` (``fresh``), and where PyTorch's direction test ends the
    row (``stalled``)."""
    d, sy, yy = _direction(s.g, s.s_hist, s.y_hist, s.sy, s.yy, s.count, s.head)
    gd = _dot(s.g, d)
    if search.pytorch_steps is None:
        # A non-descent direction means the curvature pairs went stale: fall back to -g.
        fresh = ~(gd < 0) | (s.count == 0)
        stalled = tf.zeros_like(s.done)
    else:
        # PyTorch stops moving for good here (see `minimize`); an empty history gives -g.
        fresh = s.count == 0
        stalled = ~s.done & (gd > -search.tolerance_change)
    d = tf.where(fresh[:, None], -s.g, d)
    gd = tf.where(fresh, -_dot(s.g, s.g), gd)
    return d, gd, sy, yy, fresh, stalled


def _first_step(s: LbfgsState, search: Search, fresh: tf.Tensor) -> tf.Tensor:
    """The step length each row's line search tries first."""
    # The cautious first step: on the first iteration, after a reset (stale pairs) and after
    # a failed line search; a backtracking search also takes it whenever the history is
    # empty (its own safeguard, unchanged).
    scaled = (s.iterations == 0) | (fresh & (s.count > 0)) | (s.failures > 0)
    if search.armijo is not None:
        scaled = scaled | (s.count == 0)
    return tf.where(
        scaled,
        tf.minimum(tf.ones_like(s.f), 1.0 / tf.maximum(tf.reduce_sum(tf.abs(s.g), axis=-1), 1e-30)),
        tf.ones_like(s.f),
    )


def _line_search(
    fn: ValueAndGrad,
    search: Search,
    x: tf.Tensor,
    f: tf.Tensor,
    g: tf.Tensor,
    d: tf.Tensor,
    gd: tf.Tensor,
    t0: tf.Tensor,
    searching: tf.Tensor,
) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor]:
    """Backtracking along ``d`` from ``x`` for the rows where ``searching`` is set, halving
    the step from ``t0`` until the point is finite (and, with ``search.armijo``, decreases
    the loss enough), at most ``search.max_line_search`` evaluations. Returns each row's last
    step, the loss and gradient there, whether it was accepted, and the evaluations used."""
    max_line_search, armijo = search.max_line_search, search.armijo

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

    zeros = tf.zeros_like(searching, tf.int32)
    start = (tf.constant(0), t0, f, g, tf.zeros_like(searching), zeros)
    return tf.while_loop(cond, body, start)[1:]


def _with_curvature_pair(
    s: LbfgsState,
    search: Search,
    count: tf.Tensor,
    searching: tf.Tensor,
    ok: tf.Tensor,
    step: tf.Tensor,
    g_new: tf.Tensor,
) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor]:
    """The histories, head and pair count after an accepted ``step``: its pair is kept where
    its curvature is positive; a failed search clears the row's history."""
    m = s.s_hist.shape[1]
    y = tf.where(ok[:, None], g_new - s.g, tf.zeros_like(s.g))
    sy_new = _dot(step, y)
    # Keep only pairs with positive curvature, so that H stays positive definite.
    if search.pytorch_steps is None:
        keep = ok & (sy_new > 1e-10 * tf.maximum(_dot(y, y), 1e-30))
    else:
        keep = ok & (sy_new > 1e-10)
    s_hist, y_hist = _with_pair(s.s_hist, s.y_hist, s.head, keep, step, y)
    head = tf.where(keep, tf.math.floormod(s.head + 1, m), s.head)
    new_count = tf.where(keep, tf.minimum(count + 1, m), tf.where(ok, count, 0))
    return s_hist, y_hist, head, tf.where(searching, new_count, count)


def _stopped(
    s: LbfgsState,
    search: Search,
    searching: tf.Tensor,
    stalled: tf.Tensor,
    ok: tf.Tensor,
    step: tf.Tensor,
    f_new: tf.Tensor,
    f: tf.Tensor,
    max_iterations: tf.Tensor,
) -> LbfgsState:
    """``s`` after an iteration's stopping tests: the best iterate, the progress window, the
    budget charged (``spent``), and which rows are done and why. ``f`` is each row's loss
    before the iteration, ``f_new`` the loss at its last trial point."""
    tolerance_change, pytorch_steps = search.tolerance_change, search.pytorch_steps
    spent, anchor_f, anchor_at = s.spent, s.anchor_f, s.anchor_at
    converged = tf.reduce_max(tf.abs(s.g), axis=-1) <= search.tolerance_grad
    if pytorch_steps is None:
        settled = ok & (tf.abs(f_new - f) <= tolerance_change)
    else:
        settled = tf.zeros_like(ok)
        small = ok & (
            (tf.abs(f_new - f) < tolerance_change)
            | (tf.reduce_max(tf.abs(step), axis=-1) <= tolerance_change)
        )
        whole = (spent + pytorch_steps - 1) // pytorch_steps * pytorch_steps
        spent = tf.where(searching & small, whole, spent)
    better = searching & (s.f < s.f_best)
    x_best = tf.where(better[:, None], s.x, s.x_best)
    f_best = tf.where(better, s.f, s.f_best)
    no_progress = tf.zeros_like(ok)
    if search.stall_window is not None:
        # Every window, the best loss must have improved by the relative stall_progress.
        due = searching & (spent - anchor_at >= search.stall_window)
        no_progress = due & (f_best > (1.0 - search.stall_progress) * anchor_f)
        anchor_f = tf.where(due, f_best, anchor_f)
        anchor_at = tf.where(due, spent, anchor_at)
    budget = spent >= max_iterations
    stop = (s.failures >= 2) | converged | settled | budget | no_progress
    # A search that stops with its loss at the tolerance has converged, whichever test
    # stopped it (the loss is not a stop test of its own: the last iterations still
    # sharpen the image at the float32 floor).
    tolerance_loss = search.tolerance_loss
    at_floor = f_best <= tolerance_loss * s.f_start if tolerance_loss > 0 else converged
    why = tf.where(converged | at_floor, CONVERGED, tf.where(budget, BUDGET, STALLED))
    # PyTorch's direction test (``stalled``) ends a row the same way: at the floor, converged.
    ended = tf.where(at_floor, CONVERGED, STALLED)
    reason = tf.where(searching & stop, why, tf.where(stalled & ~s.done, ended, s.reason))
    return s._replace(
        spent=spent, x_best=x_best, f_best=f_best, anchor_f=anchor_f, anchor_at=anchor_at,
        reason=reason, done=s.done | stalled | (searching & stop),
    )  # fmt: skip
