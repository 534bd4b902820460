"""The text attacks' base: recover a client's private token sequences from its dense gradient.

A text attack is an attack of the one contract (`leakbench.attacks.base.AttackContract`): a
frozen dataclass of its parameters (declared with `leakbench.core.params.param`, checked by
``__post_init__``), registered in `leakbench.attacks.base.ATTACKS` with ``modality = "text"``
(an image attack reads images of a shape and classes, a text attack token ids of a vocabulary,
and neither can run on the other's model: `leakbench.attacks.base.attacks_of` keeps them apart).
It implements ``run(target, seed) -> TextResult``: one attempt on one observed text update. The
final ``attack_many`` / ``__call__`` check the `TextTarget`, seed attempt k with
`leakbench.core.seeds.attempt_draw` (seed, k), retry an attempt whose answer is not finite (ids
outside [0, V), or a non-finite loss for an attack that `has_loss`), record a failing kernel as
``error``, time it and return a `TextReconstruction`.

What the attacker may use is what `TextTarget` holds: the model it sent (never changed), the
observed dense gradient, the batch's shape, the special ids, and the public pool (the attacker's
vocabulary and prior data, disjoint from the private pool). Never the private ids. Every choice
it makes (which start to keep, when to stop, which candidate to accept) is made on quantities
it can compute from these.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import keras
import numpy as np
import tensorflow as tf

from leakbench.attacks.base import RETRIES, AttackContract, Tally, check_gradients
from leakbench.core.federated import LocalTraining
from leakbench.core.params import PLAIN, param, validate
from leakbench.datasets.text_base import PAD

# Why a text attack stopped (`TextResult.stop_reason`): an optimiser's three (as the image
# attacks'), ``exact`` for an attack whose answer is a test it passed (span recovery, bag of
# words), ``beyond_rank`` for a span attack whose batch holds more tokens than the layer's rank
# can separate (its answer is then partial, and the report says so).
TEXT_STOP_REASONS = ("converged", "stalled", "budget", "exact", "beyond_rank")


@dataclasses.dataclass(frozen=True)
class TextTarget:
    """What an honest-but-curious server observes for one text client batch.

    Attributes:
        model: The text model (`leakbench.components.text_models`) the gradient is of.
        gradients: The observed (defended) dense gradient, ordered like
            ``model.trainable_variables``.
        batch_size: B, the number of sequences behind the gradient.
        sequence_length: L, the length of each id sequence [B, L] (the model reads L - 1 ids
            and predicts the next L - 1: `leakbench.modalities.text`).
        vocabulary_size: V, the number of ids (ids 0-3 are ``<pad>``, ``<unk>``, ``<bos>``,
            ``<eos>``: `leakbench.datasets.text_base`).
        public_ids: The public pool encoded like the private one, [N, L] int: what the attacker
            may read (its prior data), never a private sequence.
        local: The clients' local training under FedAvg (the server knows it), None for
            FedSGD. Then ``gradients`` is the defended weight change ``w_0 - w_S`` divided by
            ``local.scale`` (``steps * lr``): the update read as one gradient, as the image
            attacks' ``"as_gradient"`` mode reads it; it is not the gradient of any batch, and an
            attack that checks its answer must simulate the local steps
            (`leakbench.client.update.local_change` of the text modality).
        clients: The clients whose updates the server sees only as their mean (secure
            aggregation): ``batch_size`` counts every client's sentences, client k holding the
            k-th ``batch_size / clients`` of them. Each client's update is the mean over its
            own counted positions, so the mean is the gradient of the B x K sentences as one
            batch only when the clients count as many positions.
    """

    model: keras.Model
    gradients: tuple[tf.Tensor, ...]
    batch_size: int
    sequence_length: int
    vocabulary_size: int
    public_ids: np.ndarray
    local: LocalTraining | None = None
    clients: int = 1


@dataclasses.dataclass(frozen=True)
class TextResult:
    """One attempt's answer.

    Attributes:
        ids: The reconstructed sequences, [B, L] int in [0, V) (order among the B rows is the
            attacker's own; the judge matches them to the private rows one to one).
        loss: The attacker's final objective (its matching loss; NaN for an attack without one).
        stop_reason: One of `TEXT_STOP_REASONS`.
        iterations_used: Optimiser steps (or candidate tests) used.
        budget: The most it could have used.
        note: One line for the report (e.g. ``"beyond rank: B x L = 72 > d = 64"``), or "".
    """

    ids: np.ndarray
    loss: float
    stop_reason: str
    iterations_used: int
    budget: int
    note: str = ""

    def __post_init__(self) -> None:
        if self.stop_reason not in TEXT_STOP_REASONS:
            allowed = ", ".join(TEXT_STOP_REASONS)
            raise ValueError(f"stop_reason must be one of {allowed}, got {self.stop_reason!r}")


@dataclasses.dataclass(frozen=True)
class TextReconstruction:
    """A text attack's result (what `TextAttack.attack_many` returns for one target).

    Attributes:
        ids: The kept attempt's sequences, [B, L] (``<pad>`` everywhere when no attempt
            returned: a kernel failed).
        loss: The kept attempt's `TextResult.loss` (NaN when none returned).
        stop_reason: The kept attempt's (`TEXT_STOP_REASONS`) when the status is ``ok``,
            else the status: ``diverged`` or ``error``.
        iterations_used: The kept attempt's (0 when none returned).
        budget: The kept attempt's (0 when none returned).
        note: The kept attempt's note, after the message when the status is not ``ok``.
        status: ``ok``, ``diverged`` (no attempt was finite after every retry) or ``error``.
        message: Why the status is not ``ok``, else empty.
        attempts: Number of attempts run (1 + retries used).
        seconds: Wall time of the attempts.
    """

    ids: np.ndarray
    loss: float
    stop_reason: str
    iterations_used: int
    budget: int
    note: str
    status: str
    message: str
    attempts: int
    seconds: float


@dataclasses.dataclass(frozen=True)
class TextAttack(AttackContract[TextTarget, TextResult, TextReconstruction]):
    """Base class of the text attacks; subclasses are frozen dataclasses of their parameters.

    Attributes:
        retries: Fresh starts after an attempt whose answer is not finite; part of the keys
            only when set (text attacks ran without retries before it existed). An attack that
            draws nothing sets its default to 0: a fresh start is the same start.
    """

    modality: ClassVar[str] = "text"
    # Whether `TextResult.loss` is the attack's own objective: a non-finite one is then an
    # attempt to retry. An attack without one (a bag of words) reports NaN by design.
    has_loss: ClassVar[bool] = True
    not_finite: ClassVar[str] = "no attempt gave ids in [0, V) with a finite loss"

    retries: int = param(
        2,
        RETRIES,
        doc="fresh random starts after ids outside the vocabulary or a non-finite loss",
        keyed_when_set=True,
    )

    def __post_init__(self) -> None:
        validate(self, f"text attack {self.name}", PLAIN)

    def check_model(self, model: keras.Model) -> None:
        """Raises `ConfigError` if the attack cannot attack this model (default: any text model)."""
        del model

    def run(self, target: TextTarget, seed: tf.Tensor) -> TextResult:
        """One attempt from the random start given by ``seed`` (int64 tensor of shape [2])."""
        raise NotImplementedError(f"text attack {self.name} does not implement run")

    def run_many(self, targets: list[TextTarget], seeds: list[tf.Tensor]) -> list[TextResult]:
        """`run` on each target in turn (`attack_many` hands it one target at a time)."""
        return [self.run(t, s) for t, s in zip(targets, seeds, strict=True)]

    def _check_target(self, target: TextTarget) -> None:
        check_gradients(target.model, target.gradients)
        if target.batch_size < 1 or target.sequence_length < 2 or target.vocabulary_size < 1:
            raise ValueError(
                f"target must hold a batch of B >= 1 sequences of L >= 2 ids of V >= 1, got "
                f"B = {target.batch_size}, L = {target.sequence_length}, "
                f"V = {target.vocabulary_size}"
            )
        public = np.shape(target.public_ids)
        if len(public) != 2 or public[1] != target.sequence_length:
            raise ValueError(
                f"target.public_ids must be [N, {target.sequence_length}] ids, got {public}"
            )
        if target.clients < 1 or target.batch_size % target.clients:
            raise ValueError(
                f"target.clients ({target.clients}) must divide batch_size ({target.batch_size})"
            )
        self.check_model(target.model)

    def _finite(self, target: TextTarget, output: TextResult) -> bool:
        ids = np.asarray(output.ids)
        inside = ids.size == 0 or bool(ids.min() >= 0 and ids.max() < target.vocabulary_size)
        return inside and (not self.has_loss or math.isfinite(output.loss))

    def _result(self, target: TextTarget, tally: Tally[TextResult]) -> TextReconstruction:
        shape = (target.batch_size, target.sequence_length)
        # No attempt returned (a kernel failed): no answer, every position padding.
        out = tally.kept or TextResult(np.full(shape, PAD, np.int64), math.nan, "exact", 0, 0)
        ok = tally.status == "ok"
        return TextReconstruction(
            ids=out.ids,
            loss=out.loss,
            stop_reason=out.stop_reason if ok else tally.status,
            iterations_used=out.iterations_used,
            budget=out.budget,
            note=out.note if ok else "; ".join(filter(None, [tally.message, out.note])),
            status=tally.status,
            message=tally.message,
            attempts=tally.attempts,
            seconds=tally.seconds,
        )
