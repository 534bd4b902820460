"""Total variation: Rudin, Osher & Fatemi, "Nonlinear total variation based noise removal
algorithms", Physica D 1992; the image prior of Geiping et al., "Inverting Gradients", 2020."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import tensorflow as tf

from leakbench.attacks.priors.base import PRIORS, Prior, PriorContext
from leakbench.core.params import Choice, param

# The per-channel (R, G, B) CIFAR-10 statistics by which the reference implementation of
# Inverting Gradients normalises its images, ``(x - mean) / std`` with x in [0, 1]
# (``inversefed/consts.py``; ``breaching/config/case/data/CIFAR10.yaml``). Its step size and
# total-variation weight are given in those normalised units; `leakbench.attacks.ig` states its
# defaults in pixel units through them.
REFERENCE_MEAN = (0.4914672374725342, 0.4822617471218109, 0.4467701315879822)
REFERENCE_STD = (0.24703224003314972, 0.24348513782024384, 0.26158785820007324)


def reference_channels(values: Sequence[float], channels: int) -> tuple[float, ...]:
    """One of the reference's per-channel statistics for images of ``channels`` channels: the
    three values for RGB images, otherwise their average repeated (an image of another channel
    count has no per-channel statistics in the reference)."""
    if channels == len(values):
        return tuple(float(v) for v in values)
    return (sum(values) / len(values),) * channels


def total_variation(images: tf.Tensor, border: Sequence[float] | None = None) -> tf.Tensor:
    """Mean absolute difference of vertically and horizontally neighbouring pixels, per problem
    of an [N, batch, H, W, C] tensor; returns [N].

    Without ``border`` the differences are those inside the image (H - 1 rows of vertical ones,
    W - 1 columns of horizontal ones), each direction averaged over its own count. With
    ``border`` (one value per channel) every image is first extended by one row below and one
    column to its right holding those values, so each direction has H x W differences (the
    last row's and column's are taken against the border) and is averaged over them. With the
    dataset mean as ``border`` this is, but for the factor 1 / std of each channel, the zero-padded
    total variation the reference computes in its normalised units; the border terms pull the
    bottom and right edges toward the mean.
    """
    if border is not None:
        # Differences do not change when the border is subtracted from every pixel, and then
        # the border is zero: pad one row below and one column to the right with zeros.
        shifted = images - tf.reshape(tf.constant(border, images.dtype), [1, 1, 1, 1, -1])
        padded = tf.pad(shifted, [[0, 0], [0, 0], [0, 1], [0, 1], [0, 0]])
        dy = tf.abs(padded[:, :, 1:, :-1] - padded[:, :, :-1, :-1])
        dx = tf.abs(padded[:, :, :-1, 1:] - padded[:, :, :-1, :-1])
    else:
        dy = tf.abs(images[:, :, 1:] - images[:, :, :-1])
        dx = tf.abs(images[:, :, :, 1:] - images[:, :, :, :-1])
    return tf.reduce_mean(dy, axis=[1, 2, 3, 4]) + tf.reduce_mean(dx, axis=[1, 2, 3, 4])


@PRIORS.register("tv")
@dataclasses.dataclass(frozen=True)
class TotalVariation(Prior):
    """Penalises the mean absolute difference of neighbouring pixels (images in [0, 1]), which
    favours piecewise-smooth images. ``ig``'s ``tv`` parameter is this prior's weight.

    ``padding = "mean"`` extends each image by one row below and one column to its right
    holding the reference's CIFAR-10 channel means (`REFERENCE_MEAN`, their average for images
    that are not RGB) before the differences are taken (see `total_variation`): the zero
    padding of the reference implementation of Inverting Gradients, whose zero is the dataset
    mean in pixel units. ``"none"`` (the default here) compares pixels inside the image only.
    """

    name = "tv"

    padding: str = param(
        "none", Choice("none", "mean"), doc="'mean': the bottom and right edges meet the mean"
    )

    def penalty(self, images: tf.Tensor, context: PriorContext) -> tf.Tensor:
        del context
        border = None
        if self.padding == "mean":
            border = reference_channels(REFERENCE_MEAN, int(images.shape[-1]))
        return total_variation(images, border)
