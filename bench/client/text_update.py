"""A text client's gradient, dense on the wire.

The client holds token ids [B, L] (`leakbench.datasets.text_base`: ``<bos>`` words ``<eos>``,
padded with ``<pad>``). The model reads ``ids[:, :-1]`` and is scored on predicting
``ids[:, 1:]``: the loss is the mean next-token cross-entropy over every position of the batch
whose target is not ``<pad>``.

Why dense: TensorFlow returns the gradient of an embedding lookup as ``tf.IndexedSlices``
whose ``indices`` are the looked-up token ids, in input order, one per position. A client that
sent that object would hand over its sequence itself, not a gradient. `text_gradients`
therefore converts every gradient to a dense tensor (``tf.convert_to_tensor``, which sums the
slices of a repeated id into its row) before anything else, a defense or an attacker, sees it;
`assert_dense` is the check.
"""

from __future__ import annotations

from collections.abc import Sequence

import keras
import numpy as np
import tensorflow as tf

from leakbench.components.text_models import check_input_length
from leakbench.datasets.text_base import PAD


def next_token_loss(model: keras.Model, ids: tf.Tensor) -> tf.Tensor:
    """The mean next-token cross-entropy of ``ids`` [B, L] (the module's rule); 0 when no
    target is counted.

    Raises:
        ConfigError: If the model cannot read L - 1 tokens (`check_input_length`).
    """
    ids = tf.convert_to_tensor(ids, tf.int32)
    check_input_length(model, int(ids.shape[1]) - 1)
    inputs, targets = ids[:, :-1], ids[:, 1:]
    logits = model(inputs, training=False)
    losses = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=targets, logits=logits)
    counted = tf.cast(tf.not_equal(targets, PAD), losses.dtype)
    return tf.reduce_sum(losses * counted) / tf.maximum(tf.reduce_sum(counted), 1.0)


def raw_gradients(model: keras.Model, ids: tf.Tensor) -> tuple[tf.Tensor, list[object]]:
    """The loss and the tape's gradients as TensorFlow returns them: an embedding's gradient
    is ``tf.IndexedSlices``. Never to be sent; `text_gradients` is what a client shares."""
    with tf.GradientTape() as tape:
        loss = next_token_loss(model, ids)
    return loss, tape.gradient(loss, model.trainable_variables)


def densify(gradients: Sequence[object]) -> list[tf.Tensor]:
    """Every gradient as a dense tensor (``tf.IndexedSlices`` become their full table)."""
    return [tf.convert_to_tensor(g) for g in gradients]


def text_gradients(model: keras.Model, ids: tf.Tensor) -> tuple[tf.Tensor, list[tf.Tensor]]:
    """A text client's loss and its dense gradient, ordered like ``model.trainable_variables``:
    what it shares (checked by `assert_dense` before it is returned)."""
    loss, raw = raw_gradients(model, ids)
    if any(g is None for g in raw):
        missing = [v.path for v, g in zip(model.trainable_variables, raw, strict=True) if g is None]
        raise ValueError(f"model {model.name}: no gradient reaches {', '.join(missing)}")
    dense = densify(raw)
    assert_dense(dense)
    return loss, dense


def assert_dense(gradients: Sequence[object]) -> None:
    """Raises ``TypeError`` if a gradient is ``tf.IndexedSlices`` (or not a tensor at all).

    The message names the gradient's position: such a gradient carries the input token ids
    (its ``indices``) and must be densified before it leaves the client.
    """
    for i, g in enumerate(gradients):
        if isinstance(g, tf.IndexedSlices):
            raise TypeError(
                f"gradient {i} is tf.IndexedSlices: its indices are the input token ids in "
                "order; densify it (tf.convert_to_tensor) before it leaves the client"
            )
        if not isinstance(g, (tf.Tensor, np.ndarray)):
            raise TypeError(f"gradient {i} is a {type(g).__name__}, expected a dense tensor")


def read_tokens(ids: np.ndarray | tf.Tensor) -> np.ndarray:
    """The sorted distinct input ids that the loss reads: ``ids[:, :-1]`` at the positions
    whose target ``ids[:, 1:]`` is not ``<pad>`` (an input whose every later target is padding
    reaches no counted loss, so the gradient cannot show it)."""
    ids = np.asarray(ids)
    inputs, targets = ids[:, :-1], ids[:, 1:]
    return np.unique(inputs[targets != PAD])
