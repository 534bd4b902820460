"""Total variation: Rudin, Osher & Fatemi, "Nonlinear total variation based noise removal
algorithms", Physica D 1992; the image prior of Geiping et al., "Inverting Gradients", 2020."""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from leakbench.attacks.priors.base import PRIORS, Prior, PriorContext


def total_variation(images: tf.Tensor) -> tf.Tensor:
    """Mean absolute difference of vertically and horizontally neighbouring pixels, per problem
    of an [N, batch, H, W, C] tensor; returns [N]."""
    dy = tf.abs(images[:, :, 1:] - images[:, :, :-1])
    dx = tf.abs(images[:, :, :, 1:] - images[:, :, :, :-1])
    return tf.reduce_mean(dy, axis=[1, 2, 3, 4]) + tf.reduce_mean(dx, axis=[1, 2, 3, 4])


@PRIORS.register("tv")
@dataclasses.dataclass(frozen=True)
class TotalVariation(Prior):
    """Penalises the mean absolute difference of neighbouring pixels (images in [0, 1]), which
    favours piecewise-smooth images. ``ig``'s ``tv`` parameter is this prior's weight."""

    name = "tv"

    def penalty(self, images: tf.Tensor, context: PriorContext) -> tf.Tensor:
        del context
        return total_variation(images)
