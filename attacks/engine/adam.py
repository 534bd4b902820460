"""Projected Adam written in TensorFlow ops, for N independent problems in one compiled loop.

Inverting Gradients (Geiping et al., 2020) optimises its dummy images with Adam at learning
rate 0.1, dividing the rate by 10 at 3/8, 5/8 and 7/8 of the iterations, optionally on the sign
of the gradient, and clamps the images to the valid pixel range after every step. Written here
as a ``tf.while_loop`` over [N, D] tensors (every op is elementwise or per row, so problems never
mix), so that a batch of attacks, restarts included, is one XLA program with the moments as
loop tensors; a Keras optimizer would need variables created outside the compiled function.

Reference: Kingma & Ba, "Adam: A Method for Stochastic Optimization", ICLR 2015 (Algorithm 1,
with PyTorch's placement of epsilon outside the square root of the bias-corrected moment).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import tensorflow as tf

ValueAndGrad = Callable[[tf.Tensor], tuple[tf.Tensor, tf.Tensor]]

BETA1, BETA2, EPSILON = 0.9, 0.999, 1e-8
# Fractions of the iterations after which the learning rate is divided by 10 (Geiping et al.).
MILESTONES = (3 / 8, 5 / 8, 7 / 8)


class AdamResult(NamedTuple):
    """What `minimize` returns (all tensors, one entry per problem).

    Attributes:
        x: The iterate with the lowest finite loss seen, [N, D].
        loss: Its loss, [N] (infinite when no evaluated loss was finite).
        history: Loss at each iteration's starting point, [N, iterations].
    """

    x: tf.Tensor
    loss: tf.Tensor
    history: tf.Tensor


def learning_rate(step: tf.Tensor, iterations: int, lr: float) -> tf.Tensor:
    """The step-decayed learning rate at (0-based) ``step``: ``lr``, divided by 10 at each
    milestone that ``step`` has reached."""
    rate = tf.constant(lr, tf.float32)
    for fraction in MILESTONES:
        milestone = int(fraction * iterations)
        rate = tf.where(step >= milestone, rate * 0.1, rate)
    return rate


class AdamState(NamedTuple):
    """The loop's state between two iterations (all tensors): what `advance` reads and writes,
    so that a loop stopped after ``step`` iterations and continued from this state computes what
    the uninterrupted loop computes, bit for bit.

    Attributes:
        step: Iterations done, an int32 scalar.
        x: The current iterate, [N, D] (not yet evaluated).
        m: Adam's first moment, [N, D].
        v: Adam's second moment, [N, D].
        best_x: The evaluated iterate with the lowest finite loss so far, [N, D].
        best_f: Its loss, [N] (infinite while none was finite).
        history: Loss at each iteration's starting point, [iterations, N] (zeros not yet run).
    """

    step: tf.Tensor
    x: tf.Tensor
    m: tf.Tensor
    v: tf.Tensor
    best_x: tf.Tensor
    best_f: tf.Tensor
    history: tf.Tensor


def initial(
    x0: tf.Tensor, iterations: int, project: Callable[[tf.Tensor], tf.Tensor] | None = None
) -> AdamState:
    """The state before the first iteration: ``x0`` [N, D] projected, zero moments, no best."""
    project = project or (lambda x: x)
    x0 = project(tf.convert_to_tensor(x0, tf.float32))
    n = tf.shape(x0)[0]
    zeros = tf.zeros_like(x0)
    inf = tf.fill([n], tf.constant(float("inf"), tf.float32))
    return AdamState(
        tf.constant(0), x0, zeros, zeros, x0, inf, tf.zeros([iterations, n], tf.float32)
    )


def advance(
    value_and_grad: ValueAndGrad,
    state: AdamState,
    stop: tf.Tensor | int,
    *,
    iterations: int,
    lr: float = 0.1,
    signed: bool = False,
    project: Callable[[tf.Tensor], tf.Tensor] | None = None,
) -> AdamState:
    """Runs the iterations from ``state.step`` up to ``stop`` (of ``iterations`` in all: the
    learning-rate schedule reads the total); arguments as in `minimize`."""
    project = project or (lambda x: x)

    def body(step, x, m, v, best_x, best_f, hist):
        f, g = value_and_grad(x)
        better = tf.math.is_finite(f) & (f < best_f)
        best_x = tf.where(better[:, None], x, best_x)
        best_f = tf.where(better, f, best_f)
        hist = tf.tensor_scatter_nd_update(hist, [[step]], f[None])
        if signed:
            g = tf.sign(g)
        m = BETA1 * m + (1 - BETA1) * g
        v = BETA2 * v + (1 - BETA2) * tf.square(g)
        t = tf.cast(step + 1, tf.float32)
        m_hat = m / (1 - BETA1**t)
        v_hat = v / (1 - BETA2**t)
        rate = learning_rate(step, iterations, lr)
        x = project(x - rate * m_hat / (tf.sqrt(v_hat) + EPSILON))
        return step + 1, x, m, v, best_x, best_f, hist

    return AdamState(*tf.while_loop(lambda step, *_: step < stop, body, tuple(state)))


def finish(value_and_grad: ValueAndGrad, state: AdamState) -> AdamResult:
    """The result of a loop that ran all its iterations: the final iterate was never
    evaluated, so it is evaluated once here and kept if it is the best."""
    f, _ = value_and_grad(state.x)
    better = tf.math.is_finite(f) & (f < state.best_f)
    best_x = tf.where(better[:, None], state.x, state.best_x)
    best_f = tf.where(better, f, state.best_f)
    return AdamResult(best_x, best_f, tf.transpose(state.history))


def minimize(
    value_and_grad: ValueAndGrad,
    x0: tf.Tensor,
    *,
    iterations: int,
    lr: float = 0.1,
    signed: bool = False,
    project: Callable[[tf.Tensor], tf.Tensor] | None = None,
) -> AdamResult:
    """Runs ``iterations`` Adam steps on each row of ``x0`` [N, D].

    Args:
        value_and_grad: ``x [N, D] -> (loss [N], d loss / d x [N, D])``; row n's loss may
            depend on row n of x only.
        x0: Start points, one row per problem.
        iterations: Adam steps (the loss is evaluated once per step).
        lr: Initial learning rate, step-decayed at the `MILESTONES`.
        signed: Feed Adam the sign of the gradient instead of the gradient.
        project: Applied to the iterate before the first evaluation and after every step
            (the box constraint); the identity when None.

    The iterate with the lowest finite loss is returned with that loss, so the result is what an
    attacker who watches only the matching loss would keep. A problem whose loss becomes
    non-finite keeps its best iterate; its later iterates are NaN and never chosen. The same
    loop cut into pieces (`initial`, `advance` to any steps in turn, `finish`) computes the
    same numbers: a checkpointed attack resumes from its `AdamState`.
    """
    state = initial(x0, iterations, project)
    state = advance(
        value_and_grad, state, iterations, iterations=iterations, lr=lr, signed=signed,
        project=project,
    )  # fmt: skip
    return finish(value_and_grad, state)
