"""BatchNorm statistics: the prior of Yin et al., "See through Gradients: Image Batch Recovery
via GradInversion", CVPR 2021 (their R_BN)."""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from leakbench.attacks.priors.base import PRIORS, Prior, PriorContext
from leakbench.components.forward import batch_statistics_fn
from leakbench.core.params import Number, param


def _distance(a: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
    """The L2 distance of two vectors, kept differentiable where they are equal (the plain
    norm's gradient is NaN at zero)."""
    return tf.sqrt(tf.reduce_sum(tf.square(a - b)) + 1e-12)


@PRIORS.register("bn_statistics")
@dataclasses.dataclass(frozen=True)
class BatchNormStatistics(Prior):
    """Pulls the dummy batch's BatchNorm statistics towards the private batch's.

    For every BatchNorm layer, the L2 distance between the per-channel mean of its input on the
    dummy batch and on the private batch, plus the same for the variance, summed over layers.
    The private batch's statistics come from the threat model: with ``[threat_model]
    bn_statistics_known = true`` the server knows them (a FedAvg server that averages
    BatchNorm buffers receives each client's updated moving statistics, from which one step's
    batch mean and variance follow exactly). Yin et al. use a trained model's moving
    statistics as a proxy instead; knowing the batch's own is the stronger, worst-case
    assumption of breaching's and GradInversion's experiments.
    """

    name = "bn_statistics"
    needs_statistics = True

    weight: float = param(0.01, Number(0.0, None), doc="multiplier of the penalty in the loss")

    def penalty(self, images: tf.Tensor, context: PriorContext) -> tf.Tensor:
        statistics = batch_statistics_fn(context.model)
        problems = images.shape[0]
        if problems is None:
            raise ValueError("prior bn_statistics needs a static number of problems")
        rows = []
        for n in range(problems):
            dummy = statistics([w[n] for w in context.weights], images[n])
            if len(dummy) != len(context.known):
                raise ValueError(
                    f"prior bn_statistics: {len(context.known)} known statistics for "
                    f"{len(dummy)} of the model's"
                )
            rows.append(
                tf.add_n([_distance(d, k[n]) for d, k in zip(dummy, context.known, strict=True)])
            )
        return tf.stack(rows)
