"""Global L2-norm clipping of the shared gradient."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import tensorflow as tf

from leakbench.core.params import REQUIRED, Number, param
from leakbench.defenses.base import DEFENSES, AdaptiveSetting, Defense, Gradients, Sample


@DEFENSES.register("clip")
@dataclasses.dataclass(frozen=True)
class ClipGlobalNorm(Defense):
    """Scales the whole gradient list down so that its global L2 norm is at most ``norm``.

    Exactly ``tf.clip_by_global_norm``: with ``G = sqrt(sum_i ||g_i||**2)`` over all tensors,
    every tensor becomes ``g_i * norm / max(G, norm)``; gradients already within the bound are
    unchanged, and the direction is always preserved. If ``G`` is not finite, every entry becomes
    NaN (TensorFlow's behaviour), which the training loop counts as a skipped update. All tensors
    must share one dtype (``tf.clip_by_global_norm`` requires it).

    This clips the batch gradient once (``level = "batch"``); DP-SGD's per-example clipping is a
    different, example-level defense. On its own, clipping only rescales the gradient, which
    gradient-matching attacks with a cosine or scale-free loss undo; it is mostly useful as the
    first step of a ``chain`` before noise.

    Attributes:
        norm: Upper bound on the global L2 norm of the gradient list, ``> 0``, in gradient units.

    Reference:
        Abadi, Chu, Goodfellow, McMahan, Mironov, Talwar and Zhang. "Deep Learning with
        Differential Privacy". CCS 2016 (norm clipping before noise); Pascanu, Mikolov and
        Bengio. "On the difficulty of training recurrent neural networks". ICML 2013 (global
        norm clipping).
    """

    name: ClassVar[str] = "clip"
    level: ClassVar[str] = "batch"
    summary: ClassVar[str] = "global L2 norm bound, as `tf.clip_by_global_norm`"
    samples: ClassVar[tuple[Sample, ...]] = (Sample({"norm": 1.0}),)
    strength: ClassVar[tuple[str, int] | None] = ("norm", -1)
    # Clipping rescales the gradient: a scale-blind loss ignores what it changed.
    adaptive: ClassVar[tuple[AdaptiveSetting, ...]] = (AdaptiveSetting({"loss": "cosine"}),)

    norm: float = param(REQUIRED, Number(0.0, low_open=True), doc="bound on the global L2 norm")

    def __call__(self, grads: Gradients, *, seed: tf.Tensor) -> Gradients:
        del seed  # Deterministic; the seed is part of the common signature only.
        if not grads:
            return []
        clipped, _ = tf.clip_by_global_norm(list(grads), self.norm)
        return list(clipped)
