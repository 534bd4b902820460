"""The undefended baseline: the client shares its true gradient."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import tensorflow as tf

from leakbench.defenses.base import DEFENSES, Defense, Gradients, Sample


@DEFENSES.register("none")
@dataclasses.dataclass(frozen=True)
class NoDefense(Defense):
    """Identity: returns the gradients unchanged (the reference point of every comparison).

    This is the setting in which gradient inversion was first shown to recover training images
    pixel-wise; every other defense is measured against it.

    Reference:
        Zhu, Liu and Han. "Deep Leakage from Gradients". NeurIPS 2019 (the undefended setting of
        sections 4 and 5).
    """

    name: ClassVar[str] = "none"
    level: ClassVar[str] = "batch"
    summary: ClassVar[str] = "the reference"
    samples: ClassVar[tuple[Sample, ...]] = (Sample(),)

    def __call__(self, grads: Gradients, *, seed: tf.Tensor) -> Gradients:
        del seed  # Deterministic; the seed is part of the common signature only.
        return list(grads)

    def data_independent(self) -> bool:
        return True
