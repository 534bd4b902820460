"""Half-precision rounding of the shared gradient (DLG's "half precision" defense)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import tensorflow as tf

from leakbench.defenses.base import DEFENSES, PerTensor, Sample


@DEFENSES.register("fp16")
@dataclasses.dataclass(frozen=True)
class Float16(PerTensor):
    """Rounds every gradient entry to IEEE float16 and casts it back to the tensor's dtype.

    The client shares its gradient in half precision: an 11-bit significand (relative rounding
    error at most ``2**-11``, round to nearest even), magnitudes below float16's smallest
    subnormal (``2**-24``, about ``6e-8``; half of it and less) become ``0``, and magnitudes of
    ``65520`` and more (beyond the largest float16, ``65504``, after rounding) become ``inf``.
    Such an infinite gradient is passed on as is; the trainer skips non-finite updates and
    counts them. NaN stays NaN. Float16 gradients are returned unchanged. Deterministic.

    Reference:
        Zhu, Liu and Han. "Deep Leakage from Gradients". NeurIPS 2019, section 5 (half
        precision, which did not stop the attack).
    """

    name: ClassVar[str] = "fp16"
    level: ClassVar[str] = "batch"
    summary: ClassVar[str] = (
        "each tensor cast to float16 and back (overflow becomes Inf: the step is then skipped)"
    )
    samples: ClassVar[tuple[Sample, ...]] = (Sample(),)

    def transform(self, g: tf.Tensor) -> tf.Tensor:
        return tf.cast(tf.cast(g, tf.float16), g.dtype)
