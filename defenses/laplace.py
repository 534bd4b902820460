"""Additive Laplace noise on the shared gradient (DLG's Laplacian-noise defense)."""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import tensorflow as tf

from leakbench.core.params import REQUIRED, Number, param
from leakbench.defenses.base import DEFENSES, AdaptiveSetting, AdditiveNoise, Sample


@DEFENSES.register("laplace")
@dataclasses.dataclass(frozen=True)
class LaplaceNoise(AdditiveNoise):
    """Adds i.i.d. zero-mean Laplace noise with scale ``b`` to every gradient entry.

    The Laplace(0, b) density is ``exp(-|x| / b) / (2 b)``: mean absolute deviation ``b``,
    variance ``2 b**2``, standard deviation ``b * sqrt(2)``. Each entry is drawn as the
    difference of two independent Exp(b) variables, each by inverse CDF ``-b * log(1 - u)`` with
    ``u`` uniform on ``[0, 1)``; ``1 - u`` lies in ``(0, 1]``, so the logarithm never sees 0
    (unlike the one-draw form ``-b * sign(v) * log(1 - 2|v|)``, which hits ``log(0)`` at
    ``v = -0.5``). Tensor ``i`` uses the stateless seed ``tensor_seed(seed, i)``; noise is drawn
    in float32 (float64 for float64 gradients) and cast to the gradient's dtype.

    Attributes:
        b: Scale of the Laplace distribution, ``>= 0``, in gradient units; the standard
            deviation is ``b * sqrt(2)`` and DLG's "variance" is ``2 * b**2``. ``0`` is the
            identity. This is an absolute scale, not a multiplier of a sensitivity.

    Reference:
        Zhu, Liu and Han. "Deep Leakage from Gradients". NeurIPS 2019, section 5 (noisy
        gradients, Laplacian noise); Dwork, McSherry, Nissim and Smith. "Calibrating Noise to
        Sensitivity in Private Data Analysis". TCC 2006 (the Laplace mechanism).
    """

    name: ClassVar[str] = "laplace"
    level: ClassVar[str] = "batch"
    summary: ClassVar[str] = "Laplace scale (std `b * sqrt(2)`)"
    samples: ClassVar[tuple[Sample, ...]] = (Sample({"b": 0.1}, seeded=True),)
    # The maximum-likelihood attacker under Laplace noise matches gradients in L1.
    adaptive: ClassVar[tuple[AdaptiveSetting, ...]] = (AdaptiveSetting({"loss": "l1"}),)
    strength: ClassVar[tuple[str, int] | None] = ("b", 1)

    b: float = param(REQUIRED, Number(0.0), doc="scale of the Laplace noise")

    @property
    def std(self) -> float:
        """Standard deviation of the added noise, ``b * sqrt(2)``."""
        return self.b * math.sqrt(2.0)

    @property
    def scale(self) -> float:
        return self.b

    def noise(self, shape: tf.Tensor, seed: tf.Tensor, dtype: tf.DType) -> tf.Tensor:
        # One draw of shape [2, *shape] keeps one seed per tensor for both exponentials.
        u = tf.random.stateless_uniform(tf.concat([[2], shape], axis=0), seed=seed, dtype=dtype)
        exp = -tf.math.log1p(-u)
        return self.b * (exp[0] - exp[1])

    def unclipped_noise_std(self) -> float | None:
        return self.std if self.scale > 0.0 else None
