"""Magnitude pruning of the shared gradient (DLG's gradient-sparsification defense)."""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import tensorflow as tf

from leakbench.core.params import REQUIRED, Number, param
from leakbench.defenses.base import DEFENSES, AdaptiveSetting, PerTensor, Sample

# ratio * n is computed in float64, so a decimal ratio such as 0.29 gives 28.999999999999996 for
# n = 100. Its error is below n * 2.3e-16 (< 1e-6 for any realistic tensor), so adding this slack
# before the floor recovers the intended count; it can only change the count when the exact
# decimal product lies within 1e-6 below an integer, which needs a ratio with > 6 digits.
_COUNT_SLACK = 1e-6


@DEFENSES.register("prune")
@dataclasses.dataclass(frozen=True)
class Prune(PerTensor):
    """Zeroes the smallest-magnitude entries of every gradient tensor, tensor by tensor.

    In a tensor with ``n`` entries exactly ``k = floor(ratio * n)`` entries are set to zero: those
    with the smallest absolute value. Ties in magnitude are broken by position in the flattened
    (row-major) tensor: among equal magnitudes the earlier entry is pruned first (a stable
    argsort), so the mask is exact and deterministic. Surviving entries are passed through
    unchanged (no rescaling). ``k`` is computed as ``floor(ratio * n + 1e-6)`` so that decimal
    ratios such as ``0.29`` prune the intended ``29`` of ``100`` entries despite float round-off.
    Behaviour with NaN entries is unspecified.

    Attributes:
        ratio: Fraction of entries of each tensor to zero, in ``[0, 1]`` (DLG's pruning or
            sparsity ratio). ``0`` is the identity, ``1`` zeroes everything.

    Reference:
        Zhu, Liu and Han. "Deep Leakage from Gradients". NeurIPS 2019, section 5 (gradient
        compression and sparsification).
    """

    name: ClassVar[str] = "prune"
    level: ClassVar[str] = "batch"
    summary: ClassVar[str] = (
        "share of each tensor's entries with the smallest magnitude set to zero (DLG's pruning)"
    )
    samples: ClassVar[tuple[Sample, ...]] = (Sample({"ratio": 0.5}),)
    strength: ClassVar[tuple[str, int] | None] = ("ratio", 1)
    # The pruned entries are sent as zeros: the adaptive attacker matches only the kept ones.
    adaptive: ClassVar[tuple[AdaptiveSetting, ...]] = (AdaptiveSetting({"match": "kept"}),)

    ratio: float = param(REQUIRED, Number(0.0, 1.0), doc="fraction of each tensor zeroed")

    def transform(self, g: tf.Tensor) -> tf.Tensor:
        if self.ratio == 0.0:
            return g
        if self.ratio == 1.0:
            return tf.zeros_like(g)
        n = g.shape.num_elements()
        if n is not None:
            # Static shape (the usual case): the count and the trivial cases are Python values,
            # so nothing depends on the seed and no extra ops are built.
            # (No annotation on k: AutoGraph cannot convert an annotated name bound in branches.)
            k = math.floor(self.ratio * n + _COUNT_SLACK)
            if k == 0:
                return g
            if k >= n:
                return tf.zeros_like(g)
        else:
            size = tf.cast(tf.size(g), tf.float64)
            k = tf.cast(tf.floor(self.ratio * size + _COUNT_SLACK), tf.int32)
        flat = tf.reshape(g, [-1])
        order = tf.argsort(tf.abs(flat), stable=True)
        # rank[j] = position of entry j in ascending magnitude order; the k lowest ranks go.
        rank = tf.math.invert_permutation(order)
        kept = tf.where(rank >= k, flat, tf.zeros_like(flat))
        return tf.reshape(kept, tf.shape(g))
