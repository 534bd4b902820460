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

With ``canaries = k`` each round is ``k`` trials: canary ``j`` is present in its own seeded half
of the rounds, a Dirac canary in the ``j``-th smallest coordinate, and its score is that
coordinate. For an example-level defense (DP-SGD) each canary is its own extra example, so the
batch gets ``k`` extra slots and each canary is clipped alone, as one example is; for a
batch-level defense the batch gets one extra slot, an example whose gradient holds every
canary present that round, so that each canary weighs what the single canary weighs (its norm
over ``B + 1``), not ``1 / k`` of it. The trials are independent only where the defense keeps
coordinates (or examples) apart and draws its noise per coordinate
(`Defense.independent_canaries`); the epsilon audit uses ``k > 1`` only there.

A defense whose output depends on the batch beyond the canary (`Defense.data_independent` is
False: relative noise, Soteria, pruning) is audited on several batches (`audit_rounds`): round
``r`` runs on batch ``r mod n``, so both halves of the rounds cover every batch, and each
round's score is taken relative to what its batch alone puts in the canary's coordinates. A
defense that acts on the data before the gradient (`Defense.acts_on_data`: mixup) gets an
*input canary* instead of a gradient one (`input_canary`): an example added to the batch
before the defense prepares it, so that the mixing acts on it, scored by the projection of the
shared update on the canary's own gradient.

The rounds, canaries and scores are the same for every modality; how a client's batch (the
modality's ``(inputs, targets)`` pair) becomes its mean gradient, its per-example gradients and
the gradient the defense gets is its `leakbench.modalities.Modality`'s (`ClientGradients`). For
a text model the first trainable tensor is the token embedding, and the canaries sit in rows of
words the batch does not read (exactly zero there). Every defense a text run accepts reads the
gradient alone (`leakbench.modalities.text.check_text_defense` refuses mixup, Soteria and
PRECODE first), so a text audit never gets an input canary, which token ids have no form of.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from leakbench.client.update import client_view, defended_gradients, undefended_step
from leakbench.components.forward import model_gradients
from leakbench.core.errors import ConfigError
from leakbench.core.seeds import audit_draw, audit_membership
from leakbench.defenses import ClientView, Defense
from leakbench.modalities import IMAGE, Modality

# Rounds per compiled call (the last call of an audit may be shorter, and traces once more).
CHUNK = 500

# A client batch as the audit holds it: its modality's (inputs, targets), tensors whose first
# axis is the batch's examples (images and label distributions, or a text batch's ids twice).
Batch = tuple[tf.Tensor, ...]
# One round: (the defense's draw, which canaries are present) -> the canaries' scores.
Round = Callable[[tf.Tensor, tf.Tensor], tf.Tensor]


@dataclasses.dataclass(frozen=True)
class ClientGradients:
    """How the audited client's batch becomes gradients, through its ``modality`` (the one part
    of the audit that depends on what an example is). Every gradient list is ordered like
    ``model.trainable_variables``; the model is never modified."""

    model: keras.Model
    modality: Modality = IMAGE
    # Each held batch's gradients, computed once: the audit asks for them several times (the
    # canary's norm and coordinates, the batch's baseline, what the defense gets).
    _held: dict[tuple[str, int], list[tf.Tensor]] = dataclasses.field(
        default_factory=dict, compare=False, repr=False
    )

    def hold(self, batch: Sequence[Any]) -> Batch:
        """The batch as tensors of the dtypes the client reads."""
        pairs = zip(batch, self.modality.dtypes, strict=True)
        return tuple(tf.convert_to_tensor(t, dtype) for t, dtype in pairs)

    def mean(self, batch: Batch) -> list[tf.Tensor]:
        """The batch's undefended gradient at the model's own state (what the auditor knows of
        the batch)."""
        key = ("mean", id(batch[0]))
        if key not in self._held:
            inputs, targets = batch
            self._held[key] = self.modality.batch_step(self.model, inputs, targets, None).gradients
        return self._held[key]

    def examples(self, batch: Batch) -> list[tf.Tensor]:
        """Each example's undefended gradient, ``[B, *variable.shape]`` per variable."""
        key = ("examples", id(batch[0]))
        if key not in self._held:
            inputs, targets = batch
            self._held[key] = self.modality.example_step(self.model, inputs, targets).gradients
        return self._held[key]

    def undefended(
        self, defense: Defense, batch: Batch, key: tf.Tensor
    ) -> tuple[list[tf.Tensor], ClientView | None]:
        """What the defense gets before the canary joins, under its draw ``key``, as
        `leakbench.client.update.undefended_step` gives it (the per-example gradients for an
        example-level defense, the batch gradient otherwise; computed once for a defense that
        reads only them), and the client's view where the defense reads one."""
        inputs, targets = batch
        if reads_only_gradients(defense):
            grads = self.examples(batch) if defense.level == "example" else self.mean(batch)
        else:
            step, inputs = undefended_step(defense, self.model, inputs, targets, key, self.modality)
            grads = list(step.gradients)
        view = client_view(self.model, inputs) if defense.needs_view else None
        return grads, view


@dataclasses.dataclass(frozen=True)
class CanaryRounds:
    """The scores of an audit's rounds.

    Attributes:
        scores: The defended update's value in each canary's coordinate, shape
            ``[rounds, canaries]``.
        included: Whether the round's extra slot ``j`` held its canary, the same shape.
        tensor, indices: The canaries' coordinates: trainable tensor ``tensor``, flat indices.
        norm: Each canary's gradient norm (its value in its coordinate; an input canary's:
            the norm of its own undefended gradient).
        seconds: Wall time of the rounds.
        batches: How many client batches the rounds were spread over (`audit_rounds`).
        kind: ``"gradient"`` (Dirac canaries added to the gradient) or ``"input"`` (an example
            added to the batch before the defense prepares it: `input_canary`; then
            ``tensor`` is -1 and ``indices`` is empty).
    """

    scores: np.ndarray
    included: np.ndarray
    tensor: int
    indices: tuple[int, ...]
    norm: float
    seconds: float
    batches: int = 1
    kind: str = "gradient"

    @property
    def index(self) -> int:
        """The first canary's coordinate (the only one with one canary per round)."""
        return self.indices[0]

    def trials(self) -> tuple[np.ndarray, np.ndarray]:
        """Scores and membership flattened to one trial per canary and round, round by round
        (so the first half of the trials is the first half of the rounds)."""
        return self.scores.reshape(-1), self.included.reshape(-1)


def reads_only_gradients(defense: Defense) -> bool:
    """Whether the defense's input depends only on the batch's gradient, not on a draw made
    before it (mixup's mixing, PRECODE's sampling): then the gradient is computed once and only
    the defense runs each round."""
    return type(defense).prepare is Defense.prepare and defense.architecture is None


def example_norms(source: ClientGradients, batch: Batch) -> np.ndarray:
    """The L2 norm, over all trainable tensors, of each example's undefended gradient."""
    grads = source.examples(batch)
    squares = [tf.reduce_sum(tf.reshape(tf.square(g), [tf.shape(g)[0], -1]), axis=1) for g in grads]
    return np.sqrt(tf.add_n(squares).numpy().astype(np.float64))


def canary_coordinates(
    model: keras.Model, images: tf.Tensor, targets: tf.Tensor, count: int = 1
) -> tuple[int, ...]:
    """The ``count`` flat indices, in the first trainable tensor, where the batch's undefended
    mean gradient is smallest in magnitude, smallest first (the earlier index on ties)."""
    return coordinates(ClientGradients(model), (images, targets), count)


def coordinates(source: ClientGradients, batch: Batch, count: int) -> tuple[int, ...]:
    """`canary_coordinates` of any client's batch."""
    first = np.abs(tf.reshape(source.mean(batch)[0], [-1]).numpy())
    if not 1 <= count <= first.size:
        raise ConfigError(
            f"epsilon_audit.canaries must be an integer in [1, {first.size}] for this model "
            f"(its first trainable tensor's size), got {count}"
        )
    return tuple(int(i) for i in np.argsort(first, kind="stable")[:count])


def canary_rounds(
    defense: Defense,
    model: keras.Model,
    images: np.ndarray,
    targets: np.ndarray,
    *,
    rounds: int,
    seed: int,
    norm: float | None = None,
    canaries: int = 1,
    progress: Callable[[int], None] | None = None,
) -> CanaryRounds:
    """Runs ``rounds`` audit rounds of ``defense`` on one client batch (`audit_rounds` with
    that batch alone).

    Args:
        defense: The defense under audit.
        model: The model the client computes its update on (extended already if the defense
            changes the architecture). Not modified.
        images: The client's batch of ``B`` examples.
        targets: Its label distributions.
        rounds: How many rounds; ``rounds // 2`` hold the canary (`audit_membership`); with
            several canaries, each slot's own seeded half of them.
        seed: The run seed: it draws the membership and each round's defense draw
            (`leakbench.core.seeds.audit_draw`).
        norm: The canary's gradient norm; None: the largest per-example gradient norm of the
            batch (a canary no larger than a real example's influence).
        canaries: Extra slots, each with its own canary and coordinate (module docstring).
        progress: Called with the number of rounds done, now and then.

    Returns:
        The rounds' scores and what they were computed with.
    """
    return audit_rounds(
        defense,
        model,
        [(images, targets)],
        rounds=rounds,
        seed=seed,
        norm=norm,
        canaries=canaries,
        progress=progress,
    )


def audit_rounds(
    defense: Defense,
    model: keras.Model,
    batches: Sequence[Sequence[Any]],
    *,
    rounds: int,
    seed: int,
    norm: float | None = None,
    canaries: int = 1,
    progress: Callable[[int], None] | None = None,
    modality: Modality = IMAGE,
) -> CanaryRounds:
    """`canary_rounds` spread over several client batches: round ``r`` audits batch ``r mod
    n`` of the ``n`` (inputs, targets) pairs of ``modality`` (images and label distributions by
    default; a text batch's ids twice), with the membership and the defense's draw of round
    ``r`` as one batch would have it, so that one batch is exactly `canary_rounds`. Each batch
    gets its own canary coordinates; the canary's norm is the largest per-example gradient norm
    over all batches unless ``norm`` is given. With several batches each round's score is taken
    relative to its batch's own contribution, which the auditor knows (`_gradient_round`,
    `_input_round_fn`), so that one threshold serves every batch. A defense that acts on the
    data (`Defense.acts_on_data`) gets an input canary instead (`input_canary`; one per round;
    ``norm`` does not apply). A defense that cannot act on the modality is refused first, in
    one line (`Modality.check_defense`)."""
    modality.check_defense(defense)
    source = ClientGradients(model, modality)
    held = [source.hold(batch) for batch in batches]
    kind = "input" if defense.acts_on_data() else "gradient"
    if kind == "input" and canaries != 1:
        raise ConfigError(
            f"epsilon_audit.canaries must be 1 for defense {defense.name}, which acts on the "
            f"data and gets one input canary per round, got {canaries}"
        )
    size = 0.0 if norm is None else float(norm)
    if kind == "gradient" and norm is None:
        size = max(float(example_norms(source, batch).max()) for batch in held)
    # Slot j of round r is membership entry r * canaries + j (one canary: as it always was).
    included = audit_membership(seed, rounds * canaries).reshape(rounds, canaries)
    keys = audit_draw(seed, rounds)
    flags = tf.constant(included.astype(np.float32))
    scores = np.empty((rounds, canaries), dtype=np.float64)
    start, done = time.perf_counter(), 0
    first_indices: tuple[int, ...] = ()
    for b, batch in enumerate(held):
        if kind == "input":
            one_round, baseline, size = _input_round_fn(defense, model, *batch)
            indices: tuple[int, ...] = ()
        else:
            indices = coordinates(source, batch, canaries)
            one_round, baseline = _gradient_round(defense, source, batch, indices, size)
        first_indices = first_indices or indices
        chunk = _compiled(one_round)
        rows = np.arange(b, rounds, len(held))
        for first in range(0, len(rows), CHUNK):
            part = rows[first : first + CHUNK]
            scores[part] = chunk(tf.gather(keys, part), tf.gather(flags, part)).numpy()
            done += len(part)
            if progress is not None:
                progress(done)
        if len(held) > 1:
            scores[rows] -= baseline
    return CanaryRounds(
        scores=scores,
        included=included,
        tensor=0 if kind == "gradient" else -1,
        indices=first_indices,
        norm=size,
        seconds=time.perf_counter() - start,
        batches=len(held),
        kind=kind,
    )


def _compiled(one_round: Round) -> Round:
    """Rounds one after another in one graph (a while loop), each its own stateless draw."""

    @tf.function
    def chunk(keys: tf.Tensor, flags: tf.Tensor) -> tf.Tensor:
        return tf.map_fn(
            lambda pair: one_round(pair[0], pair[1]),
            (keys, flags),
            fn_output_signature=tf.float64,
        )

    return chunk


def _gradient_round(
    defense: Defense,
    source: ClientGradients,
    batch: Batch,
    indices: tuple[int, ...],
    norm: float,
) -> tuple[Round, np.ndarray]:
    """A gradient-canary round on ``batch`` (`_round_fn`, Dirac canaries of ``norm`` in
    ``indices``) and the batch's baseline: what its own gradient puts in those coordinates
    once it shares the update with the extra slots, ``B / (B + slots)`` of its mean gradient,
    undefended."""
    first_tensor = source.model.trainable_variables[0]
    size = int(np.prod(first_tensor.shape))
    slots = [
        tf.reshape(tf.one_hot(i, size, on_value=norm, dtype=first_tensor.dtype), first_tensor.shape)
        for i in indices
    ]
    one_round = _round_fn(defense, source, batch, slots, indices)
    extra = len(indices) if defense.level == "example" else 1
    mean = tf.reshape(source.mean(batch)[0], [-1]).numpy().astype(np.float64)
    count = int(batch[0].shape[0])
    return one_round, mean[list(indices)] * count / (count + extra)


def _round_fn(
    defense: Defense,
    source: ClientGradients,
    batch: Batch,
    canaries: list[tf.Tensor],
    indices: tuple[int, ...],
) -> Round:
    """One audit round, ``(key, present) -> scores``: the client's update on ``batch`` with the
    canaries' extra slots (module docstring: canary ``j`` is the ``canaries[j]`` gradient when
    ``present[j]`` is 1, nothing when 0) under the defense's draw ``key``, read at the canaries'
    coordinates ``indices``. A defense that reads only the gradient gets the batch's gradient
    computed once, here."""
    dtype = source.model.trainable_variables[0].dtype
    count = float(batch[0].shape[0])
    level = defense.level
    # Example level: a slot per canary. Batch level: one slot, holding every canary present.
    extra = float(len(canaries)) if level == "example" else 1.0
    where = tf.constant(indices, tf.int32)

    def with_slots(grads: list[tf.Tensor], present: tf.Tensor) -> list[tf.Tensor]:
        # The extra slots: a canary where present is 1, an example of zero gradient where 0.
        flags = [tf.cast(present[j], dtype) for j in range(len(canaries))]
        if level == "example":
            slots = [tf.zeros((len(canaries), *g.shape[1:]), g.dtype) for g in grads]
            slots[0] = tf.stack([c * f for c, f in zip(canaries, flags, strict=True)])
            return [tf.concat([g, s], axis=0) for g, s in zip(grads, slots, strict=True)]
        out = [g * (count / (count + extra)) for g in grads]
        for c, f in zip(canaries, flags, strict=True):
            out[0] = out[0] + c * f / (count + extra)
        return out

    def score(shared: list[tf.Tensor]) -> tf.Tensor:
        return tf.cast(tf.gather(tf.reshape(shared[0], [-1]), where), tf.float64)

    if reads_only_gradients(defense):
        fixed, view = source.undefended(defense, batch, tf.constant([0, 0], tf.int64))

        def one_round(key: tf.Tensor, present: tf.Tensor) -> tf.Tensor:
            return score(defense.apply(with_slots(fixed, present), seed=key, view=view))

    else:

        def one_round(key: tf.Tensor, present: tf.Tensor) -> tf.Tensor:
            grads, view = source.undefended(defense, batch, key)
            return score(defense.apply(with_slots(grads, present), seed=key, view=view))

    return one_round


def input_canary(
    model: keras.Model, images: tf.Tensor, classes: int
) -> tuple[tf.Tensor, tf.Tensor, list[tf.Tensor]]:
    """The input canary of a defense that acts on the data: one example, an image whose every
    pixel is 1 (the brightest the images hold, far from any digit or photograph), labelled
    with the class whose gradient on it is largest (a mislabelled example, the kind of input
    canary Nasr et al. 2023 and Jagielski et al. 2020 audit with). It depends on the model
    alone, never on the private batch. Returns the image ``[1, ...]``, its label distribution
    ``[1, classes]`` and its undefended gradient."""
    image = tf.ones([1, *images.shape[1:]], tf.float32)
    best: tuple[float, tf.Tensor, list[tf.Tensor]] | None = None
    for k in range(classes):
        label = tf.one_hot([k], classes, dtype=tf.float32)
        grads = model_gradients(model, image, label)
        size = float(tf.linalg.global_norm(grads).numpy())
        if best is None or size > best[0]:
            best = (size, label, grads)
    assert best is not None
    return image, best[1], best[2]


def _input_round_fn(
    defense: Defense, model: keras.Model, x: tf.Tensor, y: tf.Tensor
) -> tuple[Callable[[tf.Tensor, tf.Tensor], tf.Tensor], np.ndarray, float]:
    """An input-canary round, ``(key, present) -> [score]``: the client's whole step on its
    batch ``x, y`` with the canary example appended when ``present`` (``B + 1`` examples, so
    that the defense's preparation mixes it with the others) or without it (``B``: the
    add/remove-one neighbour), under the defense's draw ``key``. The score is the shared
    update's projection on the canary's own undefended gradient, a unit vector ``u``: ``<u,
    update>``. Also returns the batch's baseline ``<u, mean gradient of x>`` (what the
    auditor knows of the batch) and the canary's gradient norm."""
    image, label, own = input_canary(model, x, int(y.shape[-1]))
    length = tf.linalg.global_norm(own)
    unit = [g / length for g in own]
    with_x = tf.concat([x, image], axis=0)
    with_y = tf.concat([y, label], axis=0)

    def project(grads: list[tf.Tensor]) -> tf.Tensor:
        total = tf.add_n([tf.reduce_sum(g * u) for g, u in zip(grads, unit, strict=True)])
        return tf.cast(total, tf.float64)

    def one_round(key: tf.Tensor, present: tf.Tensor) -> tf.Tensor:
        def inside() -> tf.Tensor:
            return project(defended_gradients(defense, model, with_x, with_y, key))

        def outside() -> tf.Tensor:
            return project(defended_gradients(defense, model, x, y, key))

        return tf.reshape(tf.cond(present[0] > 0, inside, outside), [1])

    baseline = float(project(model_gradients(model, x, y)).numpy())
    return one_round, np.array([baseline]), float(length.numpy())
