"""Test objectives shared by the L-BFGS and lanes tests (imported; not a test module)."""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf


def convex(scales: tf.Tensor) -> Callable[[tf.Tensor], tuple[tf.Tensor, tf.Tensor]]:
    """Per row: ``sum_i scale_i (x_i - 1)^2 + (|x|^2)^2``, a smooth convex function whose
    conditioning each row sets through its ``scales`` [N, D], so that problems run for very
    different numbers of iterations. Returns ``x -> (values [N], gradients [N, D])``."""

    def value_and_grad(x: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        with tf.GradientTape() as tape:
            tape.watch(x)
            values = tf.reduce_sum(scales * tf.square(x - 1.0), axis=1) + tf.square(
                tf.reduce_sum(tf.square(x), axis=1)
            )
        return values, tape.gradient(values, x)

    return value_and_grad
