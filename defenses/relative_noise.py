"""Gaussian noise scaled to the update itself, as federated deployments add it."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import tensorflow as tf

from leakbench.core.params import REQUIRED, Number, param
from leakbench.defenses.base import DEFENSES, Defense, Gradients, Sample, tensor_seed


def percentile_of_magnitudes(grads: Gradients, percentile: float) -> tf.Tensor:
    """The ``percentile``-th percentile of the absolute values of every entry of ``grads``
    together, interpolated linearly between the two nearest ranks (numpy's default)."""
    values = tf.sort(
        tf.concat([tf.reshape(tf.abs(tf.cast(g, tf.float32)), [-1]) for g in grads], 0)
    )
    position = (percentile / 100.0) * tf.cast(tf.size(values) - 1, tf.float32)
    low = tf.cast(tf.floor(position), tf.int32)
    high = tf.minimum(low + 1, tf.size(values) - 1)
    share = position - tf.cast(low, tf.float32)
    return values[low] * (1.0 - share) + values[high] * share


@DEFENSES.register("relative_noise")
@dataclasses.dataclass(frozen=True)
class RelativeNoise(Defense):
    """Adds Gaussian noise whose standard deviation is ``sigma`` times a percentile of the
    update's own entry magnitudes: ``g + N(0, (sigma * P_p(|g|))**2)``, one scale for the whole
    update, recomputed for every update.

    An absolute noise level (`gaussian`) means different things for different models and
    training stages, whose gradients differ by orders of magnitude; a relative one does not.
    It gives no differential-privacy guarantee (the scale depends on the data).

    Tensor ``i`` draws its noise with ``tensor_seed(seed, i)``, as `gaussian` does.

    Attributes:
        sigma: The noise's standard deviation in units of the percentile, ``>= 0``; ``0`` is
            the identity.
        percentile: Which percentile of the update's absolute entries is the unit (0-100;
            default 95).

    Reference:
        Hatamizadeh et al. "Do Gradient Inversion Attacks Make Federated Learning Unsafe?".
        IEEE Transactions on Medical Imaging, 2023: a Gaussian privacy filter of NVIDIA FLARE
        whose noise is calibrated to a percentile of the update, against gradient inversion.
    """

    name: ClassVar[str] = "relative_noise"
    level: ClassVar[str] = "batch"
    summary: ClassVar[str] = (
        "Gaussian noise of std `sigma` times the `percentile`-th percentile of the update's "
        "absolute entries, recomputed per update (the calibration of the Gaussian privacy "
        "filter Hatamizadeh et al., 2023, ran against gradient inversion); no DP guarantee"
    )
    samples: ClassVar[tuple[Sample, ...]] = (Sample({"sigma": 0.5}, seeded=True),)
    strength: ClassVar[tuple[str, int] | None] = ("sigma", 1)

    sigma: float = param(REQUIRED, Number(0.0), doc="noise std in units of the percentile")
    percentile: float = param(95.0, Number(0.0, 100.0), doc="percentile of |update| as the unit")

    def __call__(self, grads: Gradients, *, seed: tf.Tensor) -> Gradients:
        if self.sigma == 0.0 or not grads:
            return list(grads)
        scale = self.sigma * percentile_of_magnitudes(grads, self.percentile)
        out = []
        for i, g in enumerate(grads):
            g = tf.convert_to_tensor(g)
            work = tf.float64 if g.dtype == tf.float64 else tf.float32
            noise = tf.random.stateless_normal(tf.shape(g), seed=tensor_seed(seed, i), dtype=work)
            out.append(g + tf.cast(noise * tf.cast(scale, work), g.dtype))
        return out
