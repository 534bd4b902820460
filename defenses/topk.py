"""Global top-k sparsification of the shared gradient (gradient compression)."""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import tensorflow as tf

from leakbench.core.params import REQUIRED, Number, param
from leakbench.defenses.base import DEFENSES, AdaptiveSetting, Defense, Gradients, Sample

# fraction * n is computed in float64, so a decimal fraction such as 0.07 gives 7.000000000000001
# for n = 100, whose ceiling would keep one entry too many. The error is below n * 2.3e-16
# (< 1e-6 for any realistic model), so subtracting this slack before the ceiling recovers the
# intended count; it can only change the count when the exact decimal product lies within 1e-6
# above an integer, which needs a fraction with > 6 digits (same reasoning as prune.py).
_COUNT_SLACK = 1e-6


@DEFENSES.register("topk")
@dataclasses.dataclass(frozen=True)
class TopK(Defense):
    """Keeps the ``k`` largest-magnitude entries over *all* gradient tensors and zeroes the rest.

    All tensors are flattened (row-major) and concatenated in list order, ``n`` entries in all,
    and exactly ``k = max(1, ceil(fraction * n - 1e-6))`` entries keep their value: those with
    the largest absolute value. The selection is global, as in gradient compression, so a
    tensor with small gradients may lose every entry (``prune`` instead works tensor by tensor
    and counts the entries it zeroes). Ties in magnitude are broken by position in the
    concatenation: the earlier entry is kept first (a stable sort), so the mask is exact and
    deterministic. The ``1e-6`` slack keeps a decimal fraction such as ``0.07`` of ``100``
    entries at the intended ``7`` despite float round-off; the ``max`` keeps at least one entry.
    Kept entries are passed through unchanged (no rescaling, no error feedback). Magnitudes are
    compared in float32 (float64 if any tensor is float64). Behaviour with NaN is unspecified.

    Attributes:
        fraction: Fraction of all gradient entries to keep, in ``(0, 1]`` (Lin et al.'s
            "density"; their 99.9% sparsity is ``fraction = 0.001``). ``1`` is the identity.

    Reference:
        Lin, Han, Mao, Wang and Dally. "Deep Gradient Compression: Reducing the Communication
        Bandwidth for Distributed Training". ICLR 2018 (top-k gradient sparsification); Zhu,
        Liu and Han. "Deep Leakage from Gradients". NeurIPS 2019, section 5 (sparsification
        as a defense).
    """

    name: ClassVar[str] = "topk"
    level: ClassVar[str] = "batch"
    summary: ClassVar[str] = (
        "keep the largest-magnitude `fraction` of entries over all tensors (gradient compression)"
    )
    samples: ClassVar[tuple[Sample, ...]] = (Sample({"fraction": 0.25}),)
    strength: ClassVar[tuple[str, int] | None] = ("fraction", -1)
    # The dropped entries are sent as zeros: the adaptive attacker matches only the kept ones.
    adaptive: ClassVar[tuple[AdaptiveSetting, ...]] = (AdaptiveSetting({"match": "kept"}),)

    fraction: float = param(
        REQUIRED, Number(0.0, 1.0, low_open=True), doc="fraction of all entries kept"
    )

    def __call__(self, grads: Gradients, *, seed: tf.Tensor) -> Gradients:
        del seed  # Deterministic; the seed is part of the common signature only.
        grads = [tf.convert_to_tensor(g) for g in grads]
        if not grads or self.fraction == 1.0:
            return grads
        work = tf.float64 if any(g.dtype == tf.float64 for g in grads) else tf.float32
        sizes = [g.shape.num_elements() for g in grads]
        if all(size is not None for size in sizes):
            # Static shapes (the usual case): the count is a Python value.
            n = sum(sizes)
            # (No annotation on k: AutoGraph cannot convert an annotated name bound in branches.)
            k = max(1, math.ceil(self.fraction * n - _COUNT_SLACK))
            if k >= n:
                return grads
            splits = sizes
        else:
            splits = tf.stack([tf.size(g) for g in grads])
            total = tf.cast(tf.reduce_sum(splits), tf.float64)
            k = tf.maximum(1, tf.cast(tf.math.ceil(self.fraction * total - _COUNT_SLACK), tf.int32))
        magnitude = tf.concat([tf.reshape(tf.abs(tf.cast(g, work)), [-1]) for g in grads], axis=0)
        # Ascending stable sort of -|g|: largest magnitudes first, earlier position first on ties.
        order = tf.argsort(-magnitude, stable=True)
        rank = tf.math.invert_permutation(order)
        keep = tf.split(rank < k, splits, num=len(grads))
        return [
            tf.where(tf.reshape(mask, tf.shape(g)), g, tf.zeros_like(g))
            for g, mask in zip(grads, keep, strict=True)
        ]
