"""Continuous batching of L-BFGS problems: lanes of slots, refilled as problems finish.

A compiled L-BFGS program of width W optimises W problems in lockstep, so one that runs long
keeps the other W - 1 rows computing after they have finished. Here the program runs in chunks
(`leakbench.attacks.engine.lbfgs.advance`) that return as soon as a row finishes while problems wait
to start; the finished row is taken out and its slot is given the lane's next problem, so slots stay
busy. When no problem is left to start and only a few rows are still busy, those rows move to the
width-1 program and finish there, one at a time, instead of dragging the whole width along.

The problems in flight are cut into lanes (programs of `Plan.slots` rows), and lanes run side by
side on threads: one compiled call keeps about one CPU core busy at these sizes, so on a CPU
the threads are what uses the other cores. On a CPU the default is lanes of one slot (each
trial alone in a width-1 program, the trials spread over one thread per core); on a GPU, one
lane of all the slots (`default_plan`).

Numbers do not depend on timing or on the number of cores. Problems are dealt to lanes in turn
before anything runs; a lane's chunks, refills and hand-over to width 1 depend only on its own
problems; each row's arithmetic depends only on its own values (``advance`` mixes no rows); and
a lane's numbers do not depend on the thread that runs it. Rows do depend on the width of the
program that computes them, in the last bits (vectorised reductions), which is why the plan
depends only on the kind of device.

Under a resume saver (`leakbench.attacks.engine.resume.saving`, entered by the runner around a
trial group) and with programs of one slot (the CPU plan), each problem's result is handed to
the saver as it finishes, and a problem the saver already holds is not run again: a group
stopped part-way loses only the problems in flight. A width-1 program computes each problem
exactly as it computes it alone, so skipping the finished ones moves no number. With wider
programs a lane's hand-over to width 1 depends on how many problems it holds, so nothing is
skipped there.

A stop (Ctrl-C, or a kill through `leakbench.core.stopping`) raised while lanes run on threads
lets each running lane finish its current chunk (a chunk cannot be cut; on a CPU it is one whole
problem, whose result the saver keeps) and starts nothing more, so the run exits after at most
one problem per thread.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import math
import os
import threading
import warnings
from collections.abc import Callable, Sequence

import numpy as np
import tensorflow as tf

from leakbench.attacks.engine import lbfgs, resume

# chunk(state, starts, fresh, weights, observed, labels, steps, until) -> state
Chunk = Callable[..., lbfgs.LbfgsState]

# What a caller reads of a finished problem: the fields a saver keeps of it. A problem read
# back from a saver holds these and an empty search state (`lbfgs.empty_state`) otherwise.
RESULT = ("evaluations", "x_best", "f_best", "history", "iterations", "spent", "reason")


@dataclasses.dataclass(frozen=True)
class Problem:
    """One problem for `solve`: its start point and the tensors its objective reads.

    Attributes:
        start: Flat start point, [D].
        weights: The model's weights, ordered like its trainable variables.
        observed: The observed gradient, ordered the same way.
        labels: One-hot labels, [batch, classes] (ignored when the attack learns them).
    """

    start: tf.Tensor
    weights: tuple[tf.Tensor, ...]
    observed: tuple[tf.Tensor, ...]
    labels: tf.Tensor


@dataclasses.dataclass(frozen=True)
class Plan:
    """How `solve` spreads problems over compiled programs and threads.

    Attributes:
        slots: Rows of one program (its width). The problems in flight (``width`` of `solve`)
            are cut into lanes of this many slots; each lane is given its share of the problems
            in turn, before anything runs, and refills its own slots.
        threads: Lanes run at once, each in its own thread, taking the next lane when done.
        tail: A lane with no problem left to start and at most this many busy rows finishes
            them one at a time in the width-1 program.
    """

    slots: int
    threads: int
    tail: int


def default_plan(width: int) -> Plan:
    """The plan for this machine. On a GPU: one program of all ``width`` slots, whose few last
    rows finish alone once at most a quarter are busy. On a CPU one compiled call keeps about
    one core busy at these sizes, so trials run in width-1 programs, one thread per core. A
    4-row program costs about 0.75 of four 1-row programs per iteration (CIFAR-10 LeNet, with
    the compact L-BFGS direction), but its rows end at different times: with 32 trials in
    flight and none waiting, 4-slot lanes reached 757 useful evaluations per second and 1-slot
    lanes 1,086 (`benchmarks/attack_speed.py`, paper budget). On a CPU every trial therefore
    computes exactly what it computes alone, whatever the width, the machine or the timing.
    A call on a larger model can keep every core busy by itself (the LFW LeNet's 5,749-class
    head: two lanes 27.0 iterations per second, one lane 25.7, `benchmarks/lane_threads.py`);
    lanes then add little, and cost nothing."""
    if tf.config.list_physical_devices("GPU"):
        return Plan(slots=width, threads=1, tail=width // 4)
    return Plan(slots=1, threads=max(1, len(os.sched_getaffinity(0))), tail=0)


def solve(
    chunk: Chunk,
    problems: Sequence[Problem],
    *,
    width: int,
    plan: Plan,
    history_size: int,
    max_iterations: int,
    tag: str | None = None,
) -> list[lbfgs.LbfgsState]:
    """Runs every problem to the end; returns each one's final state (one row each, in order).

    Args:
        chunk: The compiled program: ``chunk(state, starts, fresh, weights, observed, labels,
            steps, until)`` starts the rows where ``fresh`` is set from ``starts`` and advances
            every row at most ``steps`` iterations, returning once at most ``until`` rows are
            still running (``leakbench.attacks.engine.matching.lbfgs_chunker``).
        problems: The problems; all of one shape.
        width: Problems in flight at once, over all lanes.
        plan: Program width, threads and when a lane's last rows finish alone (`default_plan`).
        history_size: L-BFGS pairs kept per problem.
        max_iterations: Iterations allowed per problem.
        tag: What sets the problems' numbers besides their tensors and these arguments (the
            attack and its parameters): with it, an active saver and a plan of one slot,
            finished problems are saved and skipped as the module says.
    """
    count = len(problems)
    if not count:
        return []
    slots = max(1, min(plan.slots, width, count))
    saver = resume.active() if tag is not None and plan.slots == 1 else None
    run = _Lanes(chunk, problems, slots, plan.tail, history_size, max_iterations)
    if saver is not None:
        run.keep(saver, _tags(str(tag), problems, history_size, max_iterations))
    left = [i for i in range(count) if run.out[i] is None]
    if not left:
        return run.finished()
    lanes = math.ceil(min(width, len(left)) / slots)
    dealt = [left[k::lanes] for k in range(lanes)]
    threads = max(1, min(plan.threads, lanes))
    if threads == 1:
        for indices in dealt:
            run.lane(indices)
    else:
        pool = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="lane")
        try:
            for future in [pool.submit(run.lane, d) for d in dealt]:
                future.result()  # re-raises a lane's error here
        except BaseException:
            # A lane's error, or a stop (Ctrl-C, `leakbench.core.stopping`) raised in this
            # thread while it waits: the lanes that run return after their current chunk, and
            # the lanes not started are cancelled. Without this the pool's shutdown ran every
            # queued lane to its end before the stop could leave (minutes on LFW).
            run.stopping.set()
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
    return run.finished()


class _Lanes:
    """The lanes of one `solve`: what they share (the program, the problems, each problem's
    final state as it finishes) and how one lane runs."""

    def __init__(
        self,
        chunk: Chunk,
        problems: Sequence[Problem],
        slots: int,
        tail: int,
        history_size: int,
        max_iterations: int,
    ) -> None:
        self.chunk = chunk
        self.problems = problems
        self.slots = slots
        self.tail = tail
        self.history_size = history_size
        self.max_iterations = max_iterations
        self.steps = tf.constant(max_iterations, tf.int32)
        self.out: list[lbfgs.LbfgsState | None] = [None] * len(problems)
        self.compiled: set[int] = set()
        self.compile_lock = threading.Lock()
        self.saver: resume.Saver | None = None
        self.tags: list[str] = []
        self.save_lock = threading.Lock()
        self.stopping = threading.Event()  # set: every lane returns after its current chunk

    def keep(self, saver: resume.Saver, tags: list[str]) -> None:
        """Saves each problem's result to ``saver`` under its tag as it finishes, and takes
        the result of each problem ``saver`` already holds."""
        self.saver, self.tags = saver, tags
        template = lbfgs.empty_state(
            1,
            int(self.problems[0].start.shape[0]),
            history_size=self.history_size,
            max_iterations=self.max_iterations,
            dtype=self.problems[0].start.dtype,
        )
        for i, tag in enumerate(tags):
            held = saver.load(tag)
            if held is None:
                continue
            if not resume.fits(held, template, RESULT):
                warnings.warn(f"checkpoint of problem {tag} does not fit it; solving it again",
                              stacklevel=3)  # fmt: skip
                continue
            self.out[i] = template._replace(**{k: tf.constant(held[k]) for k in RESULT})

    def finish(self, index: int, row: lbfgs.LbfgsState) -> None:
        """Problem ``index`` finished with ``row``: kept, and handed to the saver if any."""
        self.out[index] = row
        if self.saver is not None:
            arrays = {k: np.asarray(getattr(row, k)) for k in RESULT}
            with self.save_lock:
                self.saver.save(self.tags[index], arrays, force=True)

    def finished(self) -> list[lbfgs.LbfgsState]:
        """Each problem's final state, in order (once every lane has run)."""
        return self.out  # type: ignore[return-value]

    def call(
        self, state: lbfgs.LbfgsState, members: list[int], fresh: list[bool], until: int
    ) -> lbfgs.LbfgsState:
        """One chunk over the slots' problems; the first call of each width holds a lock, so
        that two threads never trace and compile the same program at once."""
        ps = [self.problems[i] for i in members]
        args = (
            state,
            tf.stack([p.start for p in ps]),
            tf.constant(fresh),
            stack_rows([p.weights for p in ps]),
            stack_rows([p.observed for p in ps]),
            tf.stack([p.labels for p in ps]),
            self.steps,
            tf.constant(until, tf.int32),
        )
        if len(members) in self.compiled:
            return self.chunk(*args)
        with self.compile_lock:
            result = self.chunk(*args)
            self.compiled.add(len(members))
            return result

    def lane(self, indices: list[int]) -> None:
        """A lane's program, refilled from its own problems; its last rows finish alone."""
        slots = self.slots
        queue = collections.deque(indices)
        held: list[int | None] = [None] * slots
        state = lbfgs.empty_state(
            slots,
            int(self.problems[0].start.shape[0]),
            history_size=self.history_size,
            max_iterations=self.max_iterations,
            dtype=self.problems[0].start.dtype,
        )
        while (queue or any(h is not None for h in held)) and not self.stopping.is_set():
            fresh = [False] * slots
            for k in range(slots):
                if held[k] is None and queue:
                    held[k], fresh[k] = queue.popleft(), True
            busy = [(k, h) for k, h in enumerate(held) if h is not None]
            if slots > 1 and not queue and not any(fresh) and len(busy) <= self.tail:
                for k, h in busy:  # a few long runs left: on alone, not at the full width
                    self.finish(h, self.call(lbfgs.take(state, [k]), [h], [False], 0))
                return
            filler = busy[0][1]  # idle slots compute a copy of a busy one, then drop it
            # Return when a slot frees up while problems wait, else when the last few are left.
            until = len(busy) - 1 if queue else (self.tail if slots > 1 else 0)
            state = self.call(state, [filler if h is None else h for h in held], fresh, until)
            done = state.done.numpy()
            for k, h in busy:
                if done[k]:
                    self.finish(h, lbfgs.take(state, [k]))
                    held[k] = None


def _tags(
    tag: str, problems: Sequence[Problem], history_size: int, max_iterations: int
) -> list[str]:
    """Each problem's name for a saver: a hash of ``tag``, the budget and its tensors (the
    hash of a weights tuple shared by several problems is computed once)."""
    weights: dict[int, str] = {}
    tags = []
    for p in problems:
        if id(p.weights) not in weights:
            weights[id(p.weights)] = resume.fingerprint(*p.weights)
        parts = (tag, history_size, max_iterations, weights[id(p.weights)], p.start)
        tags.append(resume.fingerprint("lbfgs", *parts, *p.observed, p.labels))
    return tags


def stack_rows(per_problem: list[tuple[tf.Tensor, ...]]) -> tuple[tf.Tensor, ...]:
    """Each tensor of the problems' tuples, stacked along a new first axis; a tensor shared by
    every problem is broadcast instead of copied."""
    first = per_problem[0]
    if all(p is first for p in per_problem):
        return tuple(tf.broadcast_to(t, [len(per_problem), *t.shape]) for t in first)
    return tuple(tf.stack(ts) for ts in zip(*per_problem, strict=True))
