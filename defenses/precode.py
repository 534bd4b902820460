"""PRECODE: a variational bottleneck before the output layer (Scheliga et al., WACV 2022)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import tensorflow as tf

from leakbench.core.params import Int, Number, param
from leakbench.defenses.base import DEFENSES, AdaptiveSetting, Defense, Gradients, Sample


@DEFENSES.register("precode")
@dataclasses.dataclass(frozen=True)
class Precode(Defense):
    """Trains and shares the gradient of a model extended by a variational bottleneck.

    PRECODE changes the architecture, not the gradient: between the model's representation
    ``h`` (the input of its output layer) and the output layer, an encoder maps ``h`` to the
    mean ``mu`` and log-variance ``s`` of a ``size``-dimensional Gaussian, a sample ``z = mu +
    exp(s / 2) * eps`` (``eps ~ N(0, I)``, drawn anew for every forward pass in training mode)
    is decoded back to ``h``'s width, and the output layer reads the decoded sample
    (`leakbench.components.models.with_architecture`). The gradient of the extended model passes
    unchanged. The sampling noise of the client's forward pass is drawn from the defense seed; the
    server knows the architecture and weights but not that draw.

    The training loss adds ``beta`` times the KL divergence of the sampled Gaussian from N(0, I)
    (in bits, as the paper's code), so the shared gradient carries that term too. The model it
    extends keeps its seeded weights, so its rows are compared with the plain model's (the
    leaderboard's ``model`` column is the base model).

    Attributes:
        size: Width of the bottleneck (the paper's default is 256).
        beta: Weight of the KL term (the paper's default is 1e-3; 0 drops it).

    Reference:
        Scheliga, Mäder and Seeland. "PRECODE - A Generic Model Extension to Prevent Deep
        Gradient Leakage". WACV 2022.
    """

    name: ClassVar[str] = "precode"
    level: ClassVar[str] = "batch"
    summary: ClassVar[str] = (
        "PRECODE (Scheliga et al., WACV 2022): the model gets a variational bottleneck of "
        "width `size` before its output layer (encoder to a mean and a softplus spread, a "
        "Gaussian sample, decoder back), trained with `beta` times its KL divergence from "
        "N(0, I) added to the loss, as in the paper's code; the client's sample is drawn from "
        "the defense seed"
    )
    # Random in the model it extends, not in the gradient.
    samples: ClassVar[tuple[Sample, ...]] = (Sample({"size": 8}),)
    # The tensors before the bottleneck, with the client's unknown draw learned jointly.
    adaptive: ClassVar[tuple[AdaptiveSetting, ...]] = (
        AdaptiveSetting({"match": "features", "noise": "learn"}),
    )

    size: int = param(256, Int(1, 65_536), doc="width of the variational bottleneck")
    beta: float = param(1e-3, Number(0.0, 1e3), doc="weight of the KL term in the loss")

    @property
    def architecture(self) -> tuple[str, int, float]:  # type: ignore[override]
        return ("variational_bottleneck", self.size, self.beta)

    def __call__(self, grads: Gradients, *, seed: tf.Tensor) -> Gradients:
        del seed
        return list(grads)
