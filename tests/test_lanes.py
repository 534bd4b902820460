"""Continuous batching (`leakbench.attacks.engine.lanes`): refilled slots, lanes and the width-1
finish give every problem the run it gets alone."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from objectives import convex

from leakbench.attacks.engine import lanes, lbfgs

HISTORY, ITERATIONS, DIM = 5, 400, 6


def _chunk():
    """A compiled chunk with the signature `lanes.solve` calls."""

    @tf.function(jit_compile=True)
    def chunk(state, z0, fresh, weights, observed, labels, steps, until):
        fn = convex(weights[0])
        state = lbfgs.restart(fn, lbfgs.LbfgsState(*state), fresh, z0)
        return lbfgs.advance(fn, state, steps, until=until)

    return chunk


def _starts(count: int) -> np.ndarray:
    # Float64 on a convex problem, so that the last-bit differences between programs of
    # different widths (their products are vectorised differently) stay far below every
    # tolerance and never flip a line-search decision: the test then sees the scheduling, not
    # the rounding. (On a non-convex problem such as 4-D Rosenbrock, those differences grow
    # along some trajectories until a line search decides otherwise.)
    starts = np.random.default_rng(3).uniform(-2.0, 2.0, (count, DIM))
    starts[5] = np.nan  # a start whose loss is not finite: done at once, touching no other
    return starts


def _scales(count: int) -> np.ndarray:
    """Condition numbers from 1 to about 2,000, one per problem."""
    return np.stack([np.logspace(0, k, DIM) for k in np.linspace(0, 3.3, count)])


def _problems(starts: np.ndarray) -> list[lanes.Problem]:
    return [
        lanes.Problem(tf.constant(s), (tf.constant(w),), (), tf.zeros([1], tf.float64))
        for s, w in zip(starts, _scales(len(starts)), strict=True)
    ]


@tf.function(jit_compile=True)
def _minimize(x: tf.Tensor, scales: tf.Tensor) -> lbfgs.LbfgsResult:
    return lbfgs.minimize(convex(scales), x, max_iterations=ITERATIONS, history_size=HISTORY)


def _alone(problem: lanes.Problem) -> lbfgs.LbfgsResult:
    return _minimize(problem.start[None], problem.weights[0][None])


@pytest.mark.parametrize(("width", "slots", "threads"), [(8, 4, 2), (4, 4, 1), (8, 8, 1)])
def test_every_problem_ends_as_it_does_alone(width: int, slots: int, threads: int) -> None:
    """13 problems of different lengths through slots that are refilled, lanes, and the width-1
    finish of the last few: each ends at the iterate, loss history, iteration and evaluation
    counts of its run alone."""
    problems = _problems(_starts(13))
    compiled, widths = _chunk(), []

    def chunk(state, *args):
        widths.append(int(state.x.shape[0]))
        return compiled(state, *args)

    states = lanes.solve(
        chunk,
        problems,
        width=width,
        plan=lanes.Plan(slots=slots, threads=threads, tail=slots // 2),
        history_size=HISTORY,
        max_iterations=ITERATIONS,
    )
    lengths = set()
    for i, (state, problem) in enumerate(zip(states, problems, strict=True)):
        got, want = lbfgs.result(state), _alone(problem)
        n = int(want.iterations[0])
        lengths.add(n)
        assert int(got.iterations[0]) == n, i
        assert int(got.evaluations[0]) == int(want.evaluations[0]), i
        assert bool(got.finite[0]) == bool(want.finite[0]), i
        np.testing.assert_allclose(got.x.numpy(), want.x.numpy(), rtol=1e-7, atol=1e-9)
        np.testing.assert_allclose(got.history.numpy(), want.history.numpy(), rtol=1e-6, atol=1e-9)
    assert 0 in lengths  # the NaN start
    runs = sorted(lengths - {0})
    assert runs[-1] > 3 * runs[0], "the problems should end at different times"
    # Slots were refilled (more problems than slots) and the last few finished at width 1.
    assert set(widths) == {slots, 1}


def test_a_lane_that_fails_raises_and_the_others_stop() -> None:
    """An op error in one lane reaches the caller; no lane is left waiting for it."""
    calls = []

    def chunk(state, *args):
        calls.append(1)
        if len(calls) == 3:
            raise tf.errors.InvalidArgumentError(None, None, "a kernel failed")
        return _chunk()(state, *args)

    with pytest.raises(tf.errors.InvalidArgumentError, match="a kernel failed"):
        lanes.solve(
            chunk,
            _problems(_starts(8)),
            width=8,
            plan=lanes.Plan(slots=4, threads=2, tail=2),
            history_size=HISTORY,
            max_iterations=ITERATIONS,
        )


def test_plan_follows_the_kind_of_device() -> None:
    if tf.config.list_physical_devices("GPU"):
        assert lanes.default_plan(32) == lanes.Plan(slots=32, threads=1, tail=8)
    else:  # the same programs on every CPU, whatever its number of cores
        assert lanes.default_plan(32).slots == 1 and lanes.default_plan(32).tail == 0
        assert lanes.default_plan(32).threads >= 1
