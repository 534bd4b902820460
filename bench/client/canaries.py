"""Gradient canaries: the rounds of an epsilon audit of one defense on one client.

The audit asks whether a server that sees the client's defended update can tell if one extra
example took part. The client's batch gets one more slot, which holds, in a seeded half of the
rounds, a *Dirac canary* (an example whose gradient is zero but in one coordinate, where it is
``norm``) and in the other half an example whose gradient is zero. Both neighbours have ``B + 1``
slots, so the defense divides by the same count and the two differ only by the canary's
gradient: for DP-SGD, the noisy sum of clipped gradients differs exactly as under add/remove-one
adjacency, which is what its accountant bounds. Each round runs the defense as the client does
(`leakbench.client.update.undefended_step`, then `Defense.apply`) with a fresh draw, and the
auditor's score is the defended update's value in the canary's coordinate. Dirac canaries in the
white-box update setting are the strongest known for DP-SGD: Nasr, Hayes, Steinke, Balle,
Tramer, Jagielski, Carlini and Terzis, "Tight Auditing of Differentially Private Machine
Learning", USENIX Security 2023.

The auditor is as strong as the threat model lets it be: it knows the rest of the batch (the
batch is the same in every round, so the only randomness is the defense's), and it picks the
coordinate where the batch's own gradient is smallest in magnitude (in the first trainable
tensor, which no defense of this package treats apart from the rest).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import keras
import numpy as np
import tensorflow as tf

from leakbench.client.update import client_view, undefended_step
from leakbench.components.forward import model_gradients
from leakbench.components.per_example import per_example_losses_and_gradients
from leakbench.core.seeds import audit_draw, audit_membership
from leakbench.defenses import Defense

# Rounds per compiled call (the last call of an audit may be shorter, and traces once more).
CHUNK = 500


@dataclasses.dataclass(frozen=True)
class CanaryRounds:
    """The scores of an audit's rounds.

    Attributes:
        scores: The defended update's value in the canary's coordinate, one per round.
        included: Whether the round's extra slot held the canary.
        tensor, index: The canary's coordinate: trainable tensor ``tensor``, flat ``index``.
        norm: The canary's gradient norm (its value in that coordinate).
        seconds: Wall time of the rounds.
    """

    scores: np.ndarray
    included: np.ndarray
    tensor: int
    index: int
    norm: float
    seconds: float


def reads_only_gradients(defense: Defense) -> bool:
    """Whether the defense's input depends only on the batch's gradient, not on a draw made
    before it (mixup's mixing, PRECODE's sampling): then the gradient is computed once and only
    the defense runs each round."""
    return type(defense).prepare is Defense.prepare and defense.architecture is None


def example_norms(model: keras.Model, images: tf.Tensor, targets: tf.Tensor) -> np.ndarray:
    """The L2 norm, over all trainable tensors, of each example's undefended gradient."""
    _, grads = per_example_losses_and_gradients(model, images, targets)
    squares = [tf.reduce_sum(tf.reshape(tf.square(g), [tf.shape(g)[0], -1]), axis=1) for g in grads]
    return np.sqrt(tf.add_n(squares).numpy().astype(np.float64))


def canary_coordinate(model: keras.Model, images: tf.Tensor, targets: tf.Tensor) -> int:
    """The flat index, in the first trainable tensor, where the batch's undefended mean
    gradient is smallest in magnitude (the first such index on ties)."""
    first = model_gradients(model, images, targets)[0]
    return int(np.argmin(np.abs(tf.reshape(first, [-1]).numpy())))


def canary_rounds(
    defense: Defense,
    model: keras.Model,
    images: np.ndarray,
    targets: np.ndarray,
    *,
    rounds: int,
    seed: int,
    norm: float | None = None,
    progress: Callable[[int], None] | None = None,
) -> CanaryRounds:
    """Runs ``rounds`` audit rounds of ``defense`` on the client's batch.

    Args:
        defense: The defense under audit.
        model: The model the client computes its update on (extended already if the defense
            changes the architecture). Not modified.
        images: The client's batch of ``B`` examples.
        targets: Its label distributions.
        rounds: How many rounds; ``rounds // 2`` hold the canary (`audit_membership`).
        seed: The run seed: it draws the membership and each round's defense draw
            (`leakbench.core.seeds.audit_draw`).
        norm: The canary's gradient norm; None: the largest per-example gradient norm of the
            batch (a canary no larger than a real example's influence).
        progress: Called with the number of rounds done, now and then.

    Returns:
        The rounds' scores and what they were computed with.
    """
    x = tf.convert_to_tensor(images, tf.float32)
    y = tf.convert_to_tensor(targets, tf.float32)
    if norm is None:
        norm = float(example_norms(model, x, y).max())
    index = canary_coordinate(model, x, y)
    variables = model.trainable_variables
    dtype = variables[0].dtype
    size = int(np.prod(variables[0].shape))
    canary = tf.reshape(tf.one_hot(index, size, on_value=norm, dtype=dtype), variables[0].shape)
    one_round = _round_fn(defense, model, x, y, canary, index)

    @tf.function
    def chunk(keys: tf.Tensor, flags: tf.Tensor) -> tf.Tensor:
        # Rounds one after another in one graph (a while loop): each its own stateless draw.
        return tf.map_fn(
            lambda pair: one_round(pair[0], pair[1]),
            (keys, flags),
            fn_output_signature=tf.float64,
        )

    included = audit_membership(seed, rounds)
    keys = audit_draw(seed, rounds)
    flags = tf.constant(included.astype(np.float32))
    scores = np.empty(rounds, dtype=np.float64)
    start = time.perf_counter()
    for first in range(0, rounds, CHUNK):
        last = min(first + CHUNK, rounds)
        scores[first:last] = chunk(keys[first:last], flags[first:last]).numpy()
        if progress is not None:
            progress(last)
    return CanaryRounds(
        scores=scores,
        included=included,
        tensor=0,
        index=index,
        norm=norm,
        seconds=time.perf_counter() - start,
    )


def _round_fn(
    defense: Defense, model: keras.Model, x: tf.Tensor, y: tf.Tensor, canary: tf.Tensor, index: int
) -> Callable[[tf.Tensor, tf.Tensor], tf.Tensor]:
    """One audit round, ``(key, present) -> score``: the client's update on ``x, y`` with an
    extra slot (the ``canary`` gradient when ``present`` is 1, a zero one when 0) under the
    defense's draw ``key``, read at the canary's coordinate ``index``. A defense that reads only
    the gradient gets the batch's gradient computed once, here."""
    dtype = model.trainable_variables[0].dtype
    batch = float(x.shape[0])
    level = defense.level

    def with_slot(grads: list[tf.Tensor], present: tf.Tensor) -> list[tf.Tensor]:
        # The extra slot: the canary when present is 1, an example of zero gradient when 0.
        if level == "example":
            slot = [tf.zeros((1, *g.shape[1:]), g.dtype) for g in grads]
            slot[0] = (canary * tf.cast(present, dtype))[None]
            return [tf.concat([g, s], axis=0) for g, s in zip(grads, slot, strict=True)]
        out = [g * (batch / (batch + 1.0)) for g in grads]
        out[0] = out[0] + canary * tf.cast(present, dtype) / (batch + 1.0)
        return out

    def score(shared: list[tf.Tensor]) -> tf.Tensor:
        return tf.cast(tf.reshape(shared[0], [-1])[index], tf.float64)

    if reads_only_gradients(defense):
        step, _ = undefended_step(defense, model, x, y, tf.constant([0, 0], tf.int64))
        fixed = step.gradients
        view = client_view(model, x) if defense.needs_view else None

        def one_round(key: tf.Tensor, present: tf.Tensor) -> tf.Tensor:
            return score(defense.apply(with_slot(fixed, present), seed=key, view=view))

    else:

        def one_round(key: tf.Tensor, present: tf.Tensor) -> tf.Tensor:
            step, prepared = undefended_step(defense, model, x, y, key)
            view = client_view(model, prepared) if defense.needs_view else None
            return score(defense.apply(with_slot(step.gradients, present), seed=key, view=view))

    return one_round
