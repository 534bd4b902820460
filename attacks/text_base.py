"""The text attack contract: recover a client's private token sequences from its dense gradient.

A text attack is a frozen dataclass of its parameters (declared with `leakbench.core.params.param`,
checked by ``__post_init__``), registered in `TEXT_ATTACKS` apart from the image attacks'
`ATTACKS`: an image attack reads images of a shape and classes, a text attack token ids of a
vocabulary, and neither can run on the other's model. It implements
``run(target, seed) -> TextResult``: one attempt on one observed text update.

What the attacker may use is what `TextTarget` holds: the model it sent (never changed), the
observed dense gradient, the batch's shape, the special ids, and the public pool (the attacker's
vocabulary and prior data, disjoint from the private pool). Never the private ids. Every choice
it makes (which start to keep, when to stop, which candidate to accept) is made on quantities
it can compute from these.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

import keras
import numpy as np
import tensorflow as tf

from leakbench.core.errors import ConfigError
from leakbench.core.federated import LocalTraining
from leakbench.core.params import PLAIN, keyed_params, validate
from leakbench.core.registry import Registry

TEXT_ATTACKS: Registry[type[TextAttack]] = Registry("text attack")

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
            and predicts the next L - 1: `leakbench.client.text_update`).
        vocabulary_size: V, the number of ids (ids 0-3 are ``<pad>``, ``<unk>``, ``<bos>``,
            ``<eos>``: `leakbench.datasets.text_base`).
        public_ids: The public pool encoded like the private one, [N, L] int: what the attacker
            may read (its prior data), never a private sequence.
        local: The clients' local training under FedAvg (the server knows it), None for
            FedSGD. Then ``gradients`` is the defended weight change ``w_0 - w_S`` divided by
            ``local.scale`` (``steps * lr``): the update read as one gradient, as the image
            attacks' ``"as_gradient"`` mode reads it; it is not the gradient of any batch, and an
            attack that checks its answer must simulate the local steps
            (`leakbench.client.text_update.local_text_change`).
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
class TextAttack:
    """Base class of the text attacks; subclasses are frozen dataclasses of their parameters."""

    name: ClassVar[str] = ""
    # Parameters that a defense's adaptive settings leave as configured (`with_setting`).
    not_adaptive: ClassVar[tuple[str, ...]] = ()

    def __post_init__(self) -> None:
        validate(self, f"text attack {self.name}", PLAIN)

    def params(self) -> dict[str, Any]:
        """The parameters as trial keys and tables hold them."""
        return keyed_params(self)

    @classmethod
    def adaptive_parameters(cls) -> frozenset[str]:
        """The parameters a defense's adaptive setting may set: every field but `not_adaptive`."""
        return frozenset(f.name for f in dataclasses.fields(cls)) - set(cls.not_adaptive)

    def with_setting(self, setting: Mapping[str, Any]) -> TextAttack | None:
        """This attack with an adaptive ``setting`` applied; None when it lacks one of the
        setting's parameters or refuses a value."""
        if not set(setting) <= self.adaptive_parameters():
            return None
        try:
            return dataclasses.replace(self, **setting)
        except ConfigError:
            return None

    def check_model(self, model: keras.Model) -> None:
        """Raises `ConfigError` if the attack cannot attack this model (default: any text model)."""
        del model

    def run(self, target: TextTarget, seed: tf.Tensor) -> TextResult:
        """One attempt from the random start given by ``seed`` (int64 tensor of shape [2])."""
        raise NotImplementedError(f"text attack {self.name} does not implement run")
