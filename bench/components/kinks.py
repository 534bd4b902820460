"""How far a batch of inputs is from a kink of a model's forward pass.

Where an input sits on a ReLU's zero or on a tie of a max-pooling window, the gradient is not
unique, and two correct implementations (eager TensorFlow and XLA, or TensorFlow and PyTorch)
may pick different one-sided derivatives. `kink_margin` says whether a disagreement between
two gradients can be explained so.
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf


def kink_margin(model: keras.Model, images: tf.Tensor | np.ndarray) -> float:
    """The distance of ``images`` (a batch of model inputs) from the nearest kink of ``model``
    in training mode: the smallest absolute input of a ReLU layer, and for max pooling the
    smallest gap between a window's two largest inputs where the largest is positive (a window
    of zeros after a ReLU passes no gradient either way). Infinite for a model with neither."""
    relus = [layer for layer in model.layers if isinstance(layer, keras.layers.ReLU)]
    pools = [layer for layer in model.layers if isinstance(layer, keras.layers.MaxPooling2D)]
    if not relus + pools:
        return float("inf")
    probe = keras.Model(model.inputs, [layer.input for layer in relus + pools])
    values = [np.asarray(v) for v in probe(images, training=True)]
    margin = min((float(np.min(np.abs(v))) for v in values[: len(relus)]), default=np.inf)
    for layer, v in zip(pools, values[len(relus) :], strict=True):
        ph, pw = layer.pool_size
        rows, cols = v.shape[1] // ph, v.shape[2] // pw
        windows = v[:, : rows * ph, : cols * pw].reshape(-1, rows, ph, cols, pw, v.shape[-1])
        windows = windows.transpose(0, 1, 3, 5, 2, 4).reshape(-1, ph * pw)
        top = np.sort(windows, axis=1)[:, -2:]
        live = top[:, 1] > 0
        margin = min(margin, float(np.min(top[live, 1] - top[live, 0], initial=np.inf)))
    return float(margin)
