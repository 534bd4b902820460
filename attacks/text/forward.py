"""A text model's forward pass from input embeddings, and its loss on soft token distributions.

A matching attack on text (`leakbench.attacks.text.matching`) cannot differentiate through an
embedding lookup: token ids are discrete. It optimises a distribution over tokens at every
position instead, feeds the model the expected embedding ``probs @ E`` and needs the rest of
the model from there on. `embedding_forward` rebuilds that rest from the model itself: a
functional Keras model whose input is the output of its input embedding (the first
``keras.layers.Embedding``, `leakbench.components.text_models.input_embedding`) and
whose output is the model's, so it shares every layer and variable with the server's model
(nothing is copied, nothing is changed). On one-hot distributions it computes the model
exactly (tests/test_text_matching.py).

`soft_next_token_loss` is the client's loss (`leakbench.modalities.text.next_token_loss`)
with distributions in place of ids: the model reads positions ``0 .. L-2`` and is scored on
positions ``1 .. L-1`` by the cross-entropy against the distribution there, and a position
counts with weight ``1 - p(<pad>)`` (the client counts a position when its target is not
``<pad>``). On one-hot distributions it equals the client's loss.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from leakbench.components.text_models import input_embedding
from leakbench.core.errors import ConfigError
from leakbench.datasets.text_base import PAD


def embedding_forward(model: keras.Model) -> keras.Model:
    """The model from its token embedding's output on: ``embeddings [B, T, d] -> logits
    [B, T, V]``, sharing the model's layers and variables.

    Raises:
        ConfigError: If the model has no ``Embedding`` layer, or the rest of the model reads
            something other than that layer's output (its ids, say).
    """
    layer = input_embedding(model)
    try:
        return keras.Model(layer.output, model.output, name=f"{model.name}_from_embeddings")
    except ValueError as error:
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ConfigError(
            f"model {model.name}: cannot be run from its embedding {layer.name!r} output ({first})"
        ) from None


def embedding_table(model: keras.Model) -> tf.Variable:
    """The input embedding's table [V, d] (a variable of the model)."""
    return input_embedding(model).embeddings


def soft_next_token_loss(
    forward: keras.Model,
    table: tf.Variable | tf.Tensor,
    probs: tf.Tensor,
    candidates: tf.Tensor,
) -> tf.Tensor:
    """The mean next-token cross-entropy of token distributions (the module's rule).

    Args:
        forward: `embedding_forward` of the model.
        table: The model's input embedding table [V, d].
        probs: Distributions [B, L, K] over the ``candidates`` (each row sums to 1).
        candidates: The K token ids the distributions range over [K] int32; must hold
            ``<pad>`` (id 0) for the counting weight.

    Returns:
        The scalar loss (0 when no position counts).
    """
    rows = tf.gather(table, candidates)  # [K, d]
    embedded = tf.einsum("blk,kd->bld", probs[:, :-1], rows)
    logits = forward(embedded, training=False)
    log_probs = tf.gather(tf.nn.log_softmax(logits, axis=-1), candidates, axis=-1)
    targets = probs[:, 1:]
    losses = -tf.reduce_sum(targets * log_probs, axis=-1)  # [B, L-1]
    is_pad = tf.cast(tf.equal(candidates, PAD), probs.dtype)  # [K]
    counted = 1.0 - tf.einsum("blk,k->bl", targets, is_pad)
    return tf.reduce_sum(losses * counted) / tf.maximum(tf.reduce_sum(counted), 1.0)
