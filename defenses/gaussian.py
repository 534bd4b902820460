"""Additive Gaussian noise on the shared gradient (DLG's noisy-gradient defense)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import tensorflow as tf

from leakbench.core.params import REQUIRED, Number, param
from leakbench.defenses.base import DEFENSES, AdditiveNoise, Sample


@DEFENSES.register("gaussian")
@dataclasses.dataclass(frozen=True)
class GaussianNoise(AdditiveNoise):
    """Adds i.i.d. zero-mean Gaussian noise to every gradient entry: ``g + N(0, sigma**2)``.

    Tensor ``i`` of the list draws its noise with the stateless seed ``tensor_seed(seed, i)``, so
    tensors get independent noise and the same ``seed`` always gives the same output. The noise
    is drawn in float32 (float64 for float64 gradients) and cast to the gradient's dtype, so that
    half-precision gradients still get properly distributed noise.

    This is a batch-level defense with an absolute noise scale; it is not DP-SGD (there is no
    clipping, so ``sigma`` is not a multiplier of a clip norm and gives no privacy guarantee).

    Attributes:
        sigma: Absolute standard deviation of the noise, ``>= 0``, in gradient units. DLG reports
            its noise levels as a "variance" (``1e-4`` ... ``1e-1``); that variance is
            ``sigma**2``, so DLG's variance ``1e-2`` is ``sigma = 0.1``. ``0`` is the identity.

    Reference:
        Zhu, Liu and Han. "Deep Leakage from Gradients". NeurIPS 2019, section 5 (noisy
        gradients, Gaussian noise).
    """

    name: ClassVar[str] = "gaussian"
    level: ClassVar[str] = "batch"
    summary: ClassVar[str] = 'absolute std of the added noise (DLG\'s "variance" is `sigma**2`)'
    samples: ClassVar[tuple[Sample, ...]] = (Sample({"sigma": 0.1}, seeded=True),)
    strength: ClassVar[tuple[str, int] | None] = ("sigma", 1)

    sigma: float = param(REQUIRED, Number(0.0), doc="standard deviation of the noise")

    @property
    def scale(self) -> float:
        return self.sigma

    def noise(self, shape: tf.Tensor, seed: tf.Tensor, dtype: tf.DType) -> tf.Tensor:
        return tf.random.stateless_normal(shape, seed=seed, stddev=self.sigma, dtype=dtype)

    def gaussian_score(self) -> bool:
        return self.sigma > 0.0

    def independent_canaries(self) -> bool:
        return self.sigma > 0.0

    def unclipped_noise_std(self) -> float | None:
        return self.sigma if self.scale > 0.0 else None
