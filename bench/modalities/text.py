"""Text: token ids ``[B, L]`` (`leakbench.datasets.text_base`: ``<bos>`` words ``<eos>``, padded
with ``<pad>``), a text client's gradient dense on the wire.

The model reads ``ids[:, :-1]`` and is scored on predicting ``ids[:, 1:]``: the loss is the mean
next-token cross-entropy over every position of the batch whose target is not ``<pad>``. A text
batch is the pair ``(ids, ids)`` (`leakbench.modalities.base`): the targets are the same rows,
read one position on.

Why dense: TensorFlow returns the gradient of an embedding lookup as ``tf.IndexedSlices``
whose ``indices`` are the looked-up token ids, in input order, one per position. A client that
sent that object would hand over its sequence itself, not a gradient. `text_gradients`
therefore converts every gradient to a dense tensor (``tf.convert_to_tensor``, which sums the
slices of a repeated id into its row) before anything else, a defense or an attacker, sees it;
`assert_dense` is the check, and `TextModality.shared` applies both to every update a client
shares, a FedAvg weight change included (each local step's gradient is densified before it is
applied).

A text model's utility (`text_utility`): on held-out rows, the **perplexity** ``exp(mean
next-token cross-entropy)`` over every counted position (``<eos>`` included, ``<unk>`` a token
like any other) and the **next-token accuracy**, the share of those positions whose most likely
token is the target. A model that ignores context can do no better than the unigram
distribution of the targets, whose perplexity `unigram_perplexity` computes by hand.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import ClassVar

import keras
import numpy as np
import tensorflow as tf

from leakbench.components.text_models import check_input_length
from leakbench.core.errors import ConfigError
from leakbench.datasets.text_base import PAD, check_sequence_length
from leakbench.defenses import Defense
from leakbench.modalities.base import Modality, Step


def next_token_loss(model: keras.Model, ids: tf.Tensor) -> tf.Tensor:
    """The mean next-token cross-entropy of ``ids`` [B, L] (the module's rule); 0 when no
    target is counted.

    Raises:
        ConfigError: If the model cannot read L - 1 tokens (`check_input_length`).
    """
    ids = tf.convert_to_tensor(ids, tf.int32)
    check_input_length(model, int(ids.shape[1]) - 1)
    return masked_loss(model(ids[:, :-1], training=False), ids[:, 1:])


def masked_loss(logits: tf.Tensor, targets: tf.Tensor) -> tf.Tensor:
    """The mean cross-entropy of ``logits`` [B, L, V] against ``targets`` [B, L] over the
    positions whose target is not ``<pad>``; 0 when none is counted."""
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


def check_text_defense(defense: Defense) -> None:
    """Raises `ConfigError` in one line for a defense that cannot act on a text client: one
    that changes the batch before the gradient (`Defense.prepare`: mixup blends inputs, and
    token ids cannot be blended), one that reads the client's view of an image model
    (`Defense.needs_view`: Soteria perturbs the representation of the images before the output
    layer) or one that changes the model (`Defense.architecture`: PRECODE inserts a bottleneck
    before an image classifier's head). A chain is refused for such a step, named."""
    for step in _steps(defense):
        if type(step).prepare is not Defense.prepare:
            why = "it changes the client's batch before the gradient, and token ids cannot be mixed"
        elif step.needs_view:
            why = "it reads the representation of an image model's output layer"
        elif step.architecture is not None:
            why = "it changes an image model's architecture"
        else:
            continue
        where = "" if step is defense else f" (step {step.name} of {defense.name})"
        raise ConfigError(
            f"defense {step.name} does not apply to text models{where}: {why}; use one that "
            "acts on the gradient alone (e.g. clip, gaussian, dpsgd)"
        )


def _steps(defense: Defense) -> list[Defense]:
    """The defense itself, or every step of a chain (nested chains flattened)."""
    steps = getattr(defense, "steps", None)
    if steps is None:
        return [defense]
    return [leaf for step in steps for leaf in _steps(step)]


def per_example_text_gradients(
    model: keras.Model, ids: tf.Tensor
) -> tuple[tf.Tensor, list[tf.Tensor]]:
    """Each row's own loss [B] and dense gradient (one tensor per trainable variable, shaped
    ``[B, *variable.shape]``): entry ``b`` is `text_gradients` of ``ids[b:b+1]``, the mean
    next-token loss over that row's counted positions. (Their mean over the batch is the batch
    gradient only when every row counts as many positions: the batch loss weighs rows by their
    counted positions.)

    The rows run through ``tf.map_fn`` (a graph loop) on the weights' current values
    (``stateless_call``), so no variable is read inside and one trace serves every call of a
    shape; each row's embedding gradient is densified inside the loop. Not
    ``tf.vectorized_map`` as the image side does (`leakbench.components.per_example`): on
    TensorFlow 2.21 its conversion of the transformer's backward pass crashes the process
    (a segmentation fault) and it cannot convert the GRU's.
    """
    ids = tf.convert_to_tensor(ids, tf.int32)
    check_input_length(model, int(ids.shape[1]) - 1)
    trainable = [tf.convert_to_tensor(v) for v in model.trainable_variables]
    frozen = [tf.convert_to_tensor(v) for v in model.non_trainable_variables]

    def one_row(row: tf.Tensor) -> list[tf.Tensor]:
        with tf.GradientTape() as tape:
            tape.watch(trainable)
            logits, _ = model.stateless_call(trainable, frozen, row[None, :-1], training=False)
            loss = masked_loss(logits, row[None, 1:])
        grads = tape.gradient(loss, trainable, unconnected_gradients=tf.UnconnectedGradients.ZERO)
        return [loss, *densify(grads)]

    signature = [tf.TensorSpec([], tf.float32)] + [
        tf.TensorSpec(v.shape, v.dtype) for v in trainable
    ]
    losses, *grads = tf.map_fn(one_row, ids, fn_output_signature=signature)
    return losses, list(grads)


def text_utility(model: keras.Model, ids: np.ndarray, batch_size: int = 256) -> dict[str, float]:
    """``perplexity`` and ``next_token_accuracy`` of ``model`` on the rows ``ids`` [N, L] (the
    module's rule), with ``positions``, the counted positions; NaN scores when none is
    counted."""
    ids = np.asarray(ids, np.int32)
    total = hits = count = 0.0
    for start in range(0, len(ids), batch_size):
        batch = tf.constant(ids[start : start + batch_size])
        logits = model(batch[:, :-1], training=False)
        targets = batch[:, 1:]
        counted = tf.cast(tf.not_equal(targets, PAD), tf.float64)
        positions = float(tf.reduce_sum(counted))
        total += float(masked_loss(logits, targets)) * positions
        right = tf.equal(tf.argmax(logits, -1, output_type=tf.int32), targets)
        hits += float(tf.reduce_sum(tf.cast(right, tf.float64) * counted))
        count += positions
    if count == 0:
        return {"perplexity": math.nan, "next_token_accuracy": math.nan, "positions": 0}
    return {
        "perplexity": math.exp(total / count),
        "next_token_accuracy": hits / count,
        "positions": int(count),
    }


def unigram_perplexity(train_ids: np.ndarray, ids: np.ndarray | None = None) -> float:
    """The perplexity of the unigram distribution of ``train_ids``' counted targets (each
    token's share of them) on the counted targets of ``ids`` (default: ``train_ids``
    themselves, the distribution's own ``exp(entropy)``); infinite if ``ids`` holds a target
    that ``train_ids`` never does. What a model that ignores the context can reach."""
    train = np.asarray(train_ids)[:, 1:]
    targets = train[train != PAD]
    tokens, counts = np.unique(targets, return_counts=True)
    share = dict(zip(tokens.tolist(), (counts / counts.sum()).tolist(), strict=True))
    scored = train if ids is None else np.asarray(ids)[:, 1:]
    seen = scored[scored != PAD]
    if any(t not in share for t in seen.tolist()):
        return math.inf
    return math.exp(-float(np.mean([math.log(share[t]) for t in seen.tolist()])))


def check_training(
    train_ids: np.ndarray, vocabulary_size: int, *, epochs: int, batch_size: int
) -> np.ndarray:
    """The training rows as int32 [n, L], or a one-line `ConfigError` naming the field: epochs
    and batch_size integers of at least 1, a batch no larger than the rows, every id below
    ``vocabulary_size``."""
    rows = np.asarray(train_ids, np.int32)
    for field, value in (("epochs", epochs), ("batch_size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ConfigError(f"{field} must be an integer >= 1, got {value!r}")
    if rows.ndim != 2 or len(rows) < batch_size:
        raise ConfigError(
            f"batch_size must be at most the training rows ({len(rows)}), got {batch_size}"
        )
    check_sequence_length(rows.shape[1])
    if rows.size and (rows.min() < 0 or rows.max() >= vocabulary_size):
        raise ConfigError(
            f"train_ids hold ids in [{rows.min()}, {rows.max()}], beyond vocabulary_size "
            f"{vocabulary_size}"
        )
    return rows


class TextModality(Modality):
    """Next-token language modelling (`leakbench.modalities.base.Modality`)."""

    name: ClassVar[str] = "text"
    dtypes: ClassVar[tuple[tf.DType, ...]] = (tf.int32, tf.int32)

    def check_defense(self, defense: Defense) -> None:
        check_text_defense(defense)

    def check_step(self, defense: Defense, inputs: tf.Tensor) -> None:
        check_text_defense(defense)
        if inputs.shape[0] is not None:  # a Poisson batch's size is known only when it runs
            defense.check_client(int(inputs.shape[0]))

    def batch_step(
        self, model: keras.Model, inputs: tf.Tensor, targets: tf.Tensor, seed: tf.Tensor | None
    ) -> Step:
        del targets, seed  # the targets are the inputs one position on; no draw in the model
        loss, grads = text_gradients(model, inputs)
        return Step(loss, grads, _state(model))

    def example_step(self, model: keras.Model, inputs: tf.Tensor, targets: tf.Tensor) -> Step:
        del targets
        losses, grads = per_example_text_gradients(model, inputs)
        return Step(tf.reduce_mean(losses), grads, _state(model))

    def local_loss(
        self,
        model: keras.Model,
        weights: list[tf.Tensor],
        frozen: list[tf.Tensor],
        inputs: tf.Tensor,
        targets: tf.Tensor,
    ) -> tf.Tensor:
        inputs = tf.convert_to_tensor(inputs, tf.int32)
        targets = tf.convert_to_tensor(targets, tf.int32)
        check_input_length(model, int(inputs.shape[1]) - 1)
        logits, _ = model.stateless_call(weights, frozen, inputs[:, :-1], training=False)
        return masked_loss(logits, targets[:, 1:])

    def shared(self, gradients: list[object]) -> list[tf.Tensor]:
        dense = densify(gradients)
        assert_dense(dense)
        return dense


def _state(model: keras.Model) -> list[tf.Tensor]:
    """The model's non-trainable values, unchanged: a text model's forward pass leaves none."""
    return [tf.convert_to_tensor(v) for v in model.non_trainable_variables]


TEXT = TextModality()
