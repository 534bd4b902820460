"""Resumable optimisation loops: a long attack run in chunks, its state handed to a `Saver`.

An iterative attack at ImageNet size can run for hours on a CPU. When a `Saver` is active
(`saving`, which the runner enters around a trial group, `leakbench.run.partial`), `run_chunks`
runs the loop a chunk of iterations at a time, gives the saver the whole loop state after each
chunk (the saver decides when to write it) and the iterations done (for a progress bar), and
starts from the state the saver holds for the same loop when it holds one. The loop's state is
everything its later iterations read, so a loop resumed from it computes what the
uninterrupted loop computes, bit for bit; chunks are cut by time, so their boundaries vary, and
the loops split this way (`leakbench.attacks.engine.adam`) compute the same numbers for any
cut. Without a saver the loop runs in one piece, as before.

A loop is named by a tag that its caller derives from everything that sets its numbers besides
the trial (`fingerprint`: the start points, the budget), so that a retry from fresh starts or
the judge's escalation with more budget never picks up another loop's state.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NamedTuple, Protocol, TypeVar

import numpy as np
import tensorflow as tf

# A chunk grows (doubling from one iteration) until one takes about this long.
CHUNK_SECONDS = 10.0

State = TypeVar("State", bound=NamedTuple)


class Saver(Protocol):
    """Where `run_chunks` keeps loop states (one per tag) and reports progress."""

    def load(self, tag: str) -> Mapping[str, np.ndarray] | None:
        """The state held for ``tag`` (one array per field), or None."""

    def save(self, tag: str, state: Mapping[str, np.ndarray], *, force: bool) -> None:
        """Holds ``state`` for ``tag``; written now if ``force``, else when the saver's own
        interval has passed."""

    def progress(self, tag: str, done: int, total: int) -> None:
        """``done`` of the loop's ``total`` iterations are done."""


_ACTIVE: contextvars.ContextVar[Saver | None] = contextvars.ContextVar(
    "leakbench_resume_saver", default=None
)


@contextlib.contextmanager
def saving(saver: Saver | None) -> Iterator[None]:
    """Makes ``saver`` the one `run_chunks` uses inside the block (None: no saver)."""
    token = _ACTIVE.set(saver)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def active() -> Saver | None:
    """The saver of the enclosing `saving` block, or None."""
    return _ACTIVE.get()


def fingerprint(*parts: Any) -> str:
    """A short hash of arrays, tensors and plain values: a loop's tag."""
    digest = hashlib.sha256()
    for part in parts:
        if isinstance(part, tf.Tensor | np.ndarray):
            value = np.ascontiguousarray(np.asarray(part))
            digest.update(f"{value.dtype}{value.shape}".encode())
            digest.update(value.tobytes())
        else:
            digest.update(repr(part).encode())
        digest.update(b"|")
    return digest.hexdigest()[:24]


def fits(held: Mapping[str, np.ndarray], state: NamedTuple, fields: tuple[str, ...]) -> bool:
    """Whether ``held`` has exactly ``fields``, each of the shape and dtype it has in ``state``."""
    return set(held) == set(fields) and all(
        tuple(held[k].shape) == tuple(getattr(state, k).shape)
        and held[k].dtype == getattr(state, k).dtype.as_numpy_dtype
        for k in fields
    )


def restored(state: State, held: Mapping[str, np.ndarray] | None, tag: str) -> State | None:
    """``held`` as a state like ``state`` (same fields, shapes and dtypes), or None with a
    warning when it does not fit."""
    if held is None:
        return None
    fields = state._fields
    if not fits(held, state, fields):
        warnings.warn(f"checkpoint of loop {tag} does not fit the loop; starting it again",
                      stacklevel=2)  # fmt: skip
        return None
    return type(state)(*(tf.constant(held[k]) for k in fields))


def run_chunks(
    state: State,
    advance: Callable[[State, int], State],
    total: int,
    tag: str,
) -> State:
    """Runs a loop from ``state`` to ``total`` iterations with ``advance(state, stop)``
    (``state.step`` is the iterations done); with an active saver, in chunks from the state it
    holds for ``tag``, handing it the state after each chunk (forced after the last)."""
    saver = active()
    if saver is None:
        return advance(state, total)
    state = restored(state, saver.load(tag), tag) or state
    done = int(state.step)  # type: ignore[attr-defined]
    saver.progress(tag, done, total)
    size = 1
    while done < total:
        stop = min(total, done + size)
        began = time.perf_counter()
        state = advance(state, stop)
        seconds = time.perf_counter() - began
        done = stop
        arrays = {k: np.asarray(getattr(state, k)) for k in state._fields}
        saver.save(tag, arrays, force=done >= total)
        saver.progress(tag, done, total)
        if seconds * 2 < CHUNK_SECONDS:
            size *= 2
    return state
