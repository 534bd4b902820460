"""Symmetric 8-bit quantisation of the shared gradient (DLG's "int8" defense)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import tensorflow as tf

from leakbench.defenses.base import DEFENSES, PerTensor, Sample


@DEFENSES.register("int8")
@dataclasses.dataclass(frozen=True)
class Int8(PerTensor):
    """Quantises every gradient tensor to 8-bit integers with one symmetric linear scale.

    Per tensor, with ``m = max |g|`` over its entries: ``scale = m / 127``, ``q = round(g /
    scale)``, an integer in ``[-127, 127]`` (the symmetric int8 range; ``-128`` is unused), and
    the shared value is ``q * scale``. Rounding is to nearest, ties to even (``tf.round``). The
    largest-magnitude entry is reproduced exactly (up to float rounding) and every other entry
    is off by at most ``scale / 2``. ``q`` is computed as ``round(g / m * 127)``, so that
    representable grid points such as ``0.5`` of the maximum give the exact ``63.5`` before
    rounding rather than a neighbour of it. An all-zero tensor stays zero. The arithmetic is in
    float32 (float64 for float64 tensors) and the result is cast back to the tensor's dtype. A
    tensor with a non-finite entry becomes NaN (the trainer skips such updates). Deterministic.

    Reference:
        Zhu, Liu and Han. "Deep Leakage from Gradients". NeurIPS 2019, section 5 (int8
        quantisation, which did not stop the attack).
    """

    name: ClassVar[str] = "int8"
    level: ClassVar[str] = "batch"
    summary: ClassVar[str] = "per-tensor symmetric 8-bit quantisation and back"
    samples: ClassVar[tuple[Sample, ...]] = (Sample(),)

    def transform(self, g: tf.Tensor) -> tf.Tensor:
        work = tf.float64 if g.dtype == tf.float64 else tf.float32
        x = tf.cast(g, work)
        m = tf.reduce_max(tf.abs(x))
        # divide_no_nan gives q = 0 for an all-zero (or empty) tensor instead of 0 / 0.
        q = tf.clip_by_value(tf.round(tf.math.divide_no_nan(x, m) * 127.0), -127.0, 127.0)
        # m * (1 / 127), not m / 127: inside a tf.function Grappler's constant folding turns the
        # division by a constant into this product, and writing it so keeps eager and graph
        # results bit-identical.
        scale = m * (1.0 / 127.0)
        return tf.cast(q * scale, g.dtype)
