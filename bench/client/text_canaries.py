"""The epsilon audit's rounds on a text client (`leakbench.client.canaries`, the same rounds,
canaries and scores as an image client's).

A text client's batch is its token ids ``[B, L]`` alone (the targets are the ids shifted by one).
Its gradients are the dense ones it shares (`leakbench.modalities.text`): the batch gradient
(`text_gradients`, the mean next-token loss over the batch's counted positions) for a batch-level
defense and for the auditor's knowledge of the batch, each sentence's own gradient
(`per_example_text_gradients`) for an example-level defense (DP-SGD) and for the canary's
default norm (the largest sentence's). The Dirac canaries sit in the first trainable tensor, as
for images: for the text models the token embedding, in the coordinates where the batch's
gradient is smallest (rows of words the batch does not read are exactly zero there).

Every defense a text run accepts reads the gradient alone (`check_text_defense` refuses mixup,
Soteria and PRECODE), so the batch's gradient is computed once per audit and only the defense
runs each round; an input canary, which exists for defenses that act on the data, has no text
form and is refused in one line.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from leakbench.client.canaries import Batch, CanaryRounds, Round, source_rounds
from leakbench.core.errors import ConfigError
from leakbench.defenses import ClientView, Defense
from leakbench.modalities.text import (
    check_text_defense,
    per_example_text_gradients,
    text_gradients,
)


@dataclasses.dataclass(frozen=True)
class TextGradients:
    """A text client's gradients (`leakbench.client.canaries.ClientGradients`): a batch is
    ``(ids,)``, token ids ``[B, L]``."""

    model: keras.Model
    # Each held batch's gradients, computed once: the audit asks for them several times (the
    # canary's norm and coordinates, the batch's baseline, what the defense gets).
    _held: dict[tuple[str, int], list[tf.Tensor]] = dataclasses.field(
        default_factory=dict, compare=False, repr=False
    )

    def hold(self, batch: Sequence[Any]) -> Batch:
        (ids,) = batch
        return (tf.convert_to_tensor(ids, tf.int32),)

    def mean(self, batch: Batch) -> list[tf.Tensor]:
        key = ("mean", id(batch[0]))
        if key not in self._held:
            self._held[key] = text_gradients(self.model, batch[0])[1]
        return self._held[key]

    def examples(self, batch: Batch) -> list[tf.Tensor]:
        key = ("examples", id(batch[0]))
        if key not in self._held:
            self._held[key] = per_example_text_gradients(self.model, batch[0])[1]
        return self._held[key]

    def undefended(
        self, defense: Defense, batch: Batch, key: tf.Tensor
    ) -> tuple[list[tf.Tensor], ClientView | None]:
        # A text defense reads the gradient alone (no draw before it, so ``key`` is unused):
        # the per-example gradients for an example-level one, the batch gradient otherwise,
        # as `leakbench.client.update.undefended_step` gives them.
        del key
        grads = self.examples(batch) if defense.level == "example" else self.mean(batch)
        return grads, None

    def input_round(self, defense: Defense, batch: Batch) -> tuple[Round, np.ndarray, float]:
        raise ConfigError(
            f"epsilon_audit: defense {defense.name} acts on the data and would get an input "
            "canary, which text has none of (token ids cannot be blended); leave it out of a "
            "text run's audit"
        )


def text_audit_rounds(
    defense: Defense,
    model: keras.Model,
    batches: Sequence[np.ndarray],
    *,
    rounds: int,
    seed: int,
    norm: float | None = None,
    canaries: int = 1,
) -> CanaryRounds:
    """The audit rounds of ``defense`` on a text client holding ``batches`` (token ids ``[B,
    L]`` each; round ``r`` on batch ``r mod n``): `leakbench.client.canaries.audit_rounds` with
    the text client's gradients. Refuses a defense that cannot act on text first
    (`check_text_defense`), in one line."""
    check_text_defense(defense)
    return source_rounds(
        defense,
        TextGradients(model),
        [(ids,) for ids in batches],
        rounds=rounds,
        seed=seed,
        norm=norm,
        canaries=canaries,
    )
