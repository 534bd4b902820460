"""The multi-step (last-iterate) audit of DP-SGD: T noisy steps, canaries in each, the last model.

The one-update audit (`leakbench.run.epsilon_audit`) reads one defended update. Here the
mechanism is a whole training: ``T`` steps of DP-SGD with the full batch (sampling rate 1) from
known initial weights, and the auditor sees only the final model. What the accountant states
for it is ``T`` self-compositions of the Gaussian mechanism (`Defense.dp_event` at sampling rate
1 and ``T`` steps), read exactly by dp-accounting's PLD accountant and, as training reports it,
by its Renyi-DP accountant. The audit follows the white-box last-iterate audit of Nasr, Hayes,
Steinke, Balle, Tramer, Jagielski, Carlini and Terzis ("Tight Auditing of Differentially
Private Machine Learning", USENIX Security 2023) and Steinke, Nasr and Jagielski ("Privacy
Auditing with One (1) Training Run", NeurIPS 2023): a Dirac gradient canary in every step.

*Rounds.* A round is one independent training run. The batch holds the ``B`` honest examples
and ``k`` extra slots; slot ``j`` holds, in its own seeded half of the rounds
(`leakbench.core.seeds.audit_membership`), an example whose gradient is ``norm`` (the clip
norm by default) in coordinate ``c_j`` and zero elsewhere, in every step, and an example of zero
gradient otherwise. Both neighbours have ``B + k`` slots, so they differ exactly as
add/remove-one adjacency says. Step ``t`` of round ``r`` runs the defense itself on the
per-example gradients, with its own stateless draw (`leakbench.core.seeds.audit_step_draw`), and
takes a plain SGD step of size ``learning_rate`` on what it shares.

*The honest gradients.* A coordinate's score would mix the canary with whatever the honest
examples push into it, and that drift depends on the noise of the earlier steps. The canaries
sit where no honest gradient ever reaches: in the first dense kernel, in rows of input features
that are zero in every example of the batch (`dead_coordinates`). Such a weight multiplies a
zero in the forward pass, so its gradient is exactly zero at any weights, at every step, and it
changes nothing the model computes: the honest trajectory is the same whatever the canaries do.
They are picked as the one-update audit picks them (`leakbench.client.canaries.canary_coordinates`:
smallest honest gradient first), and a pick outside the dead coordinates is refused.

*Score.* The auditor knows the initial weights, the learning rate and the slot count (white
box) and reads the final weights only: ``s_j = (w_0 - w_T)[c_j] * (B + k) / learning_rate``,
the sum over the steps of the noisy clipped sum in ``c_j``. For DP-SGD it is exactly
``N(T * norm, T * (z * C)**2)`` with the canary and ``N(0, T * (z * C)**2)`` without: with
``norm = C`` a Gaussian shift of ``mu_T = sqrt(T) / z``, the value whose epsilon the PLD
accountant reports, so a tight audit can reach it. The scores go to the Gaussian-DP bound
(`leakbench.components.gaussian_dp_bound`) and the distribution-free one
(`leakbench.components.epsilon_bound`), ``k`` independent trials per round (the noise is drawn
per coordinate, and no slot reaches another's coordinate).

*Vectorised.* Rounds are trained ``CHUNK`` at a time in one compiled function: weights carry a
leading round axis, the per-example gradients come from the batched functional copy of the model
(`leakbench.attacks.engine.functional`), the defense runs once per round through
``tf.vectorized_map`` (its stateless draws have no vectorised kernel in TensorFlow, so they run
as a loop inside the map), and the ``T`` steps are one ``tf.while_loop``: no op is built per
step or per round.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from leakbench.attacks.engine.functional import batched_forward
from leakbench.client.canaries import canary_coordinates
from leakbench.components.epsilon_bound import epsilon_lower_bound
from leakbench.components.forward import task_loss
from leakbench.components.gaussian_dp_bound import gaussian_dp_lower_bound
from leakbench.core.errors import ConfigError
from leakbench.core.seeds import audit_draw, audit_membership, audit_step_draw
from leakbench.datasets import load_dataset
from leakbench.defenses import Defense
from leakbench.run.epsilon_audit import exact_epsilon, update_epsilon, verdict

# Rounds per compiled call (each call trains its rounds for all T steps).
CHUNK = 250

Trainer = Callable[[tf.Tensor, tf.Tensor], list[tf.Tensor]]


@dataclasses.dataclass(frozen=True)
class LastIterateRounds:
    """The last-iterate scores of an audit's rounds.

    Attributes:
        scores: Each canary's score read from its round's final model, ``[rounds, canaries]``.
        included: Whether slot ``j`` of the round held its canary, the same shape.
        indices: The canaries' flat coordinates in the first trainable tensor.
        norm: Each canary's gradient norm, in every step.
        seconds: Wall time of the training rounds.
    """

    scores: np.ndarray
    included: np.ndarray
    indices: tuple[int, ...]
    norm: float
    seconds: float

    def trials(self) -> tuple[np.ndarray, np.ndarray]:
        """Scores and membership as one trial per canary and round, round by round."""
        return self.scores.reshape(-1), self.included.reshape(-1)


def logistic_model(input_shape: tuple[int, ...], num_classes: int, seed: int) -> keras.Model:
    """The audit's default model: softmax regression (flatten, one dense layer to the logits),
    weights U(-0.1, 0.1) drawn from ``seed``."""
    model = keras.Sequential(
        [keras.Input(shape=input_shape), keras.layers.Flatten(), keras.layers.Dense(num_classes)],
        name="logistic",
    )
    rng = np.random.default_rng(seed)
    for var in model.trainable_variables:
        var.assign(rng.uniform(-0.1, 0.1, size=var.shape).astype(np.float32))
    return model


def dead_coordinates(model: keras.Model, images: np.ndarray) -> np.ndarray:
    """The flat indices of the first trainable tensor that no example of ``images`` can move:
    the first dense kernel's rows of the input features that are zero in every example. The
    model must start with that kernel on the flattened input (only Flatten before it)."""
    first = next(layer for layer in model.layers if layer.trainable_variables)
    before = model.layers[: model.layers.index(first)]
    if not isinstance(first, keras.layers.Dense) or any(
        not isinstance(layer, keras.layers.Flatten) for layer in before
    ):
        raise ConfigError(
            "the multi-step audit needs a model whose first trainable layer is a dense layer on "
            f"the flattened input, got {type(first).__name__} after "
            f"{[type(layer).__name__ for layer in before]}"
        )
    flat = np.asarray(images).reshape(len(images), -1)
    features = np.flatnonzero(np.all(flat == 0.0, axis=0))
    units = int(first.units)
    return (features[:, None] * units + np.arange(units)[None, :]).reshape(-1)


def last_iterate_scores(
    initial: np.ndarray,
    final: np.ndarray,
    indices: tuple[int, ...],
    learning_rate: float,
    slots: int,
) -> np.ndarray:
    """The auditor's scores from the final models alone (module docstring): ``(w_0 - w_T)`` at
    each canary's coordinate, times the batch's ``slots`` over the learning rate.

    Args:
        initial: The first trainable tensor at the start, known to the white-box auditor.
        final: That tensor at the end of each round, ``[rounds, *shape]``.
        indices: The canaries' flat coordinates.
        learning_rate: The SGD step size.
        slots: Examples per step, honest and extra (the mean's divisor).

    Returns:
        ``[rounds, len(indices)]`` scores, in units of the clipped gradient sum.
    """
    where = np.asarray(indices)
    start = np.asarray(initial, np.float64).reshape(-1)[where]
    end = np.asarray(final, np.float64).reshape(len(final), -1)[:, where]
    return (start[None, :] - end) * (slots / learning_rate)


def _example_gradients(
    model: keras.Model, images: np.ndarray, targets: np.ndarray
) -> Callable[[list[tf.Tensor]], list[tf.Tensor]]:
    """``weights -> per-example gradients``: weights with a leading round axis ``[R, ...]``
    in, ``[R, B, ...]`` out, each entry the task loss's gradient of one example at its round's
    weights (every example gets its own copy of its round's weights)."""
    forward = batched_forward(model)
    if forward is None:
        raise ConfigError("the multi-step audit needs a model of the batched functional copy")
    x = tf.convert_to_tensor(images, tf.float32)[:, None]  # one problem per example
    y = tf.convert_to_tensor(targets, tf.float32)
    batch = int(x.shape[0])

    def gradients(weights: list[tf.Tensor]) -> list[tf.Tensor]:
        rounds = int(weights[0].shape[0])
        copies = [tf.repeat(w, batch, axis=0) for w in weights]  # round-major, like the tiles
        inputs = tf.tile(x, [rounds, *([1] * (x.shape.rank - 1))])
        labels = tf.tile(y, [rounds, 1])
        with tf.GradientTape() as tape:
            tape.watch(copies)
            logits = forward(copies, inputs)[:, 0]
            total = task_loss(logits, labels) * float(rounds * batch)  # the sum of the losses
        found = tape.gradient(total, copies)
        return [tf.reshape(g, [rounds, batch, *g.shape[1:]]) for g in found]

    return gradients


def _trainer(
    defense: Defense,
    model: keras.Model,
    images: np.ndarray,
    targets: np.ndarray,
    diracs: np.ndarray,
    steps: int,
    learning_rate: float,
) -> Trainer:
    """A compiled ``(keys [R, 2], present [R, k]) -> final weights`` of ``R`` rounds of
    ``steps`` DP-SGD steps from the model's weights; ``diracs[j]`` is slot ``j``'s canary
    gradient (flat, first tensor), present where ``present[:, j]`` is 1. Only the final weights
    leave the function: the loop carries the current ones and nothing else."""
    gradients = _example_gradients(model, images, targets)
    initial = [tf.constant(v.numpy()) for v in model.trainable_variables]
    extra = int(diracs.shape[0])
    canary = tf.constant(diracs, initial[0].dtype)

    def step(
        t: tf.Tensor, weights: list[tf.Tensor], keys: tf.Tensor, present: tf.Tensor
    ) -> list[tf.Tensor]:
        rounds = int(keys.shape[0])
        slots = [tf.zeros([rounds, extra, *v.shape], v.dtype) for v in initial]
        slots[0] = tf.reshape(
            tf.cast(present, canary.dtype)[:, :, None] * canary[None], slots[0].shape
        )
        full = [tf.concat([g, s], axis=1) for g, s in zip(gradients(weights), slots, strict=True)]

        def one_round(args: tuple[tf.Tensor, ...]) -> list[tf.Tensor]:
            *examples, key = args
            return defense.apply(list(examples), seed=audit_step_draw(key, t))

        shared = tf.vectorized_map(one_round, (*full, keys), fallback_to_while_loop=True)
        return [w - learning_rate * s for w, s in zip(weights, shared, strict=True)]

    @tf.function
    def train(keys: tf.Tensor, present: tf.Tensor) -> list[tf.Tensor]:
        rounds = int(keys.shape[0])
        start = [tf.tile(v[None], [rounds, *([1] * v.shape.rank)]) for v in initial]
        done = tf.while_loop(
            lambda t, *weights: t < steps,
            lambda t, *weights: (t + 1, *step(t, list(weights), keys, present)),
            (tf.constant(0), *start),
        )
        return list(done[1:])

    return train


def last_iterate_rounds(
    defense: Defense,
    model: keras.Model,
    images: np.ndarray,
    targets: np.ndarray,
    *,
    steps: int,
    rounds: int,
    seed: int,
    canaries: int = 1,
    learning_rate: float = 0.5,
    norm: float | None = None,
) -> LastIterateRounds:
    """Trains ``rounds`` independent runs of ``steps`` full-batch steps under ``defense`` and
    scores each canary on its run's final model (module docstring).

    Args:
        defense: An example-level defense (DP-SGD), run as is in every step.
        model: A model whose first trainable layer is a dense layer on the flattened input.
            Not modified: its weights are the runs' start.
        images, targets: The honest batch and its label distributions.
        steps: Steps per run, ``T >= 1``.
        rounds: Independent runs.
        seed: Draws the membership and every step's defense draw.
        canaries: Extra slots per run, each with its own canary and dead coordinate.
        learning_rate: The SGD step size.
        norm: Each canary's gradient norm; None: the defense's clip norm. 0 inserts nothing.

    Returns:
        The scores and what they were computed with.
    """
    if defense.level != "example":
        raise ConfigError(f"the multi-step audit runs example-level defenses, got {defense.name}")
    if steps < 1 or rounds < 2:
        raise ConfigError(
            f"the multi-step audit needs steps >= 1 and rounds >= 2, got {steps}, {rounds}"
        )
    x = tf.convert_to_tensor(images, tf.float32)
    y = tf.convert_to_tensor(targets, tf.float32)
    dead = set(dead_coordinates(model, images).tolist())
    indices = canary_coordinates(model, x, y, canaries)
    if not dead.issuperset(indices):
        raise ConfigError(
            f"the multi-step audit's canaries need coordinates no example reaches; this batch "
            f"has {len(dead)} (input features zero in every example), got canaries = {canaries}"
        )
    norm = float(getattr(defense, "norm", 1.0) if norm is None else norm)
    size = int(np.prod(model.trainable_variables[0].shape))
    diracs = np.zeros((canaries, size), np.float32)
    diracs[np.arange(canaries), list(indices)] = norm
    train = _trainer(defense, model, images, targets, diracs, steps, learning_rate)
    included = audit_membership(seed, rounds * canaries).reshape(rounds, canaries)
    keys = audit_draw(seed, rounds)
    present = tf.constant(included.astype(np.float32))
    initial = model.trainable_variables[0].numpy()
    scores = np.empty((rounds, canaries))
    start = time.perf_counter()
    for first in range(0, rounds, CHUNK):
        last = min(first + CHUNK, rounds)
        final = train(keys[first:last], present[first:last])[0].numpy()
        scores[first:last] = last_iterate_scores(
            initial, final, indices, learning_rate, len(images) + canaries
        )
    return LastIterateRounds(scores, included, indices, norm, time.perf_counter() - start)


def audit_batch(batch_size: int, seed: int) -> tuple[keras.Model, np.ndarray, np.ndarray]:
    """The default audit's model and honest batch: `logistic_model` at ``seed`` on the first
    ``batch_size`` training digits (8x8, so a few border pixels are zero in every one)."""
    data = load_dataset("digits")
    images = data.train.x[:batch_size]
    targets = np.eye(data.num_classes, dtype=np.float32)[data.train.y[:batch_size]]
    return logistic_model(data.input_shape, data.num_classes, seed), images, targets


def multistep_audit(
    defense: Defense,
    *,
    steps: int,
    rounds: int,
    canaries: int = 64,
    seed: int = 0,
    delta: float = 1e-5,
    confidence: float = 0.95,
    learning_rate: float = 0.5,
    batch_size: int = 8,
    norm: float | None = None,
) -> dict[str, Any]:
    """The last-iterate audit of ``steps`` full-batch DP-SGD steps against the accountants:
    `audit_batch`'s model and batch (weights drawn from ``seed``), `last_iterate_rounds`'
    rounds, and `audit_record` of them."""
    model, images, targets = audit_batch(batch_size, seed)
    found = last_iterate_rounds(
        defense, model, images, targets, steps=steps, rounds=rounds, seed=seed,
        canaries=canaries, learning_rate=learning_rate, norm=norm,
    )  # fmt: skip
    return audit_record(defense, found, steps=steps, delta=delta, confidence=confidence)


def audit_record(
    defense: Defense, found: LastIterateRounds, *, steps: int, delta: float, confidence: float
) -> dict[str, Any]:
    """What the rounds ``found`` of ``steps`` steps under ``defense`` prove, beside what the
    accountants state for the ``steps``-fold composition.

    Returns:
        ``steps``, ``rounds``, ``canaries``, ``trials``, the defense's ``noise_multiplier`` and
        ``clip_norm``, ``canary_norm``, ``delta``, ``confidence``; the accountants
        (``epsilon_exact``: PLD, ``epsilon_rdp``: Renyi-DP); the bounds at ``confidence``
        (``epsilon_audit_gdp``, ``mu_audit``, ``mu_estimate`` beside ``mu_theory =
        sqrt(steps) / z``; ``epsilon_audit``, distribution-free); ``ratio`` (the Gaussian-DP
        bound over the exact epsilon) and ``ratio_distribution_free``; ``audit`` (``failed``
        when the Gaussian-DP bound exceeds the exact epsilon); ``seconds`` (the rounds).
    """
    scores, included = found.trials()
    gdp = gaussian_dp_lower_bound(scores, included, delta=delta, confidence=confidence)
    free = epsilon_lower_bound(scores, included, delta=delta, confidence=confidence)
    exact = exact_epsilon(defense, delta, steps)
    z = float(getattr(defense, "noise_multiplier", math.nan))
    return {
        "steps": steps,
        "rounds": found.scores.shape[0],
        "canaries": found.scores.shape[1],
        "trials": len(scores),
        "noise_multiplier": z,
        "clip_norm": float(getattr(defense, "norm", math.nan)),
        "canary_norm": found.norm,
        "delta": delta,
        "confidence": confidence,
        "epsilon_exact": exact,
        "epsilon_rdp": update_epsilon(defense, delta, steps),
        "epsilon_audit_gdp": gdp.epsilon,
        "mu_audit": gdp.mu,
        "mu_estimate": gdp.mu_estimate,
        "mu_theory": math.sqrt(steps) / z if z > 0 else math.inf,
        "epsilon_audit": free.epsilon,
        "ratio": gdp.epsilon / exact,
        "ratio_distribution_free": free.epsilon / exact,
        "audit": verdict(exact, gdp.epsilon),
        "seconds": found.seconds,
    }
