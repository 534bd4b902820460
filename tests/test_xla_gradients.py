"""`leakbench.models.TiledMaxPooling2D`: max pooling whose second derivative XLA computes
exactly (issue 19). XLA's lowering of ``MaxPoolGradGrad`` picks each window's maximum on inputs
rounded to bfloat16, which put errors of 0.2% and more into `convnet`'s input gradients when
the attack objective was XLA-compiled (`docs/xla_gradients.md`).
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from leakbench.models import TiledMaxPooling2D


def _near_ties(seed: int) -> tf.Tensor:
    """[2, 10, 11, 4] inputs whose 3x3 windows are full of exact ties and of values that
    differ only below bfloat16's precision (1 + k / 4096)."""
    rng = np.random.default_rng(seed)
    values = 1.0 + rng.integers(0, 4, size=(2, 10, 11, 4)) / 4096
    values[:, :3, :3] = 0.5  # one window of exact ties everywhere
    return tf.constant(values.astype(np.float32))


def test_tiled_max_pooling_is_max_pooling_bit_for_bit() -> None:
    x = _near_ties(0)
    u = tf.random.stateless_normal([2, 3, 3, 4], seed=[1, 2])
    tiled, keras_pool = TiledMaxPooling2D((3, 3)), keras.layers.MaxPooling2D(3)

    def value_and_grad(layer, x, u):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = layer(x)
        return y, tape.gradient(y, x, output_gradients=u)

    ours, theirs = value_and_grad(tiled, x, u), value_and_grad(keras_pool, x, u)
    for a, b in zip(ours, theirs, strict=True):  # the values, then the gradient
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_tiled_max_pooling_second_derivative_is_exact_under_xla() -> None:
    # The derivative of pooling's gradient with respect to the incoming gradient u (what
    # MaxPoolGradGrad computes): v at each window's first maximum. Eager Keras pooling is the
    # reference; the tiled layer must give it exactly, compiled with XLA.
    x = _near_ties(1)
    u = tf.random.stateless_normal([2, 3, 3, 4], seed=[3, 4])
    v = tf.random.stateless_normal(x.shape, seed=[5, 6])

    def gradgrad(layer):
        def fn(x, u, v):
            with tf.GradientTape() as outer:
                outer.watch(u)
                with tf.GradientTape() as inner:
                    inner.watch(x)
                    y = layer(x)
                g = inner.gradient(y, x, output_gradients=u)
                total = tf.reduce_sum(g * v)
            return outer.gradient(total, u)

        return fn

    # (Keras' MaxPooling2D itself, compiled with XLA, gets 40 of these 72 entries wrong.)
    reference = gradgrad(keras.layers.MaxPooling2D(3))(x, u, v).numpy()
    compiled = tf.function(gradgrad(TiledMaxPooling2D((3, 3))), jit_compile=True)(x, u, v)
    np.testing.assert_array_equal(compiled.numpy(), reference)
