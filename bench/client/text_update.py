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

Under FedAvg (`leakbench.core.federated.LocalTraining` with more than one step) the client
trains first: ``local.steps`` plain SGD steps on its sentences, mini-batches taken in order, and
shares the change ``w_0 - w_S`` of its weights (`local_text_change`), as the image client does
(`leakbench.client.update.local_change`); the defense acts on that change. Each step's gradient
is densified before it is applied, and the change is dense too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import keras
import numpy as np
import tensorflow as tf

from leakbench.components.text_models import check_input_length
from leakbench.core.errors import ConfigError
from leakbench.core.federated import LocalTraining
from leakbench.datasets.text_base import PAD
from leakbench.defenses import Defense


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


# --- The update under a defense -----------------------------------------------------------------


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


def undefended_text_step(
    model: keras.Model, ids: tf.Tensor, defense: Defense
) -> tuple[tf.Tensor, list[tf.Tensor]]:
    """The loss and the gradient the defense gets, undefended: the batch gradient
    (`text_gradients`) for a batch-level defense, the per-example ones
    (`per_example_text_gradients`, the loss their mean) for an example-level one."""
    if defense.level == "example":
        losses, grads = per_example_text_gradients(model, ids)
        return tf.reduce_mean(losses), grads
    return text_gradients(model, ids)


def defended_text_step(
    model: keras.Model,
    ids: tf.Tensor,
    defense: Defense,
    seed: tf.Tensor | Sequence[int],
    expected_size: int | tf.Tensor | None = None,
) -> tuple[tf.Tensor, list[tf.Tensor]]:
    """`defended_text_update` with the batch's loss (undefended; the trainer reports it). With
    ``expected_size``, the batch is a Poisson sample whose expected size that is, and the
    defense releases `Defense.apply_sampled` (DP training)."""
    check_text_defense(defense)
    ids = tf.convert_to_tensor(ids, tf.int32)
    if ids.shape[0] is not None:  # a Poisson batch's size is known only when it runs
        defense.check_client(int(ids.shape[0]))
    seed = tf.cast(tf.convert_to_tensor(seed), tf.int64)
    loss, grads = undefended_text_step(model, ids, defense)
    if expected_size is None:
        shared = list(defense.apply(grads, seed=seed))
    else:
        shared = list(defense.apply_sampled(grads, seed=seed, expected_size=expected_size))
    assert_dense(shared)
    return loss, shared


def sampled_text_step(
    model: keras.Model,
    ids: tf.Tensor,
    defense: Defense,
    seed: tf.Tensor | Sequence[int],
    expected_size: int | tf.Tensor,
) -> tuple[tf.Tensor, list[tf.Tensor]]:
    """The client's step on a Poisson-sampled batch of any size, 0 included (DP training), as
    `leakbench.client.update.sampled_step` is for images: `defended_text_step` with
    ``expected_size`` for a batch that holds a row; an empty batch has no gradient, and the
    defense releases `Defense.apply_sampled` of the gradients of no row (per-example gradients
    with a batch axis of 0, or a zero batch gradient), its noise alone. An empty batch's loss is
    NaN."""
    ids = tf.convert_to_tensor(ids, tf.int32)
    seed = tf.cast(tf.convert_to_tensor(seed), tf.int64)

    def drawn() -> tuple[tf.Tensor, list[tf.Tensor]]:
        loss, grads = defended_text_step(model, ids, defense, seed, expected_size)
        return tf.cast(loss, tf.float32), grads

    def empty() -> tuple[tf.Tensor, list[tf.Tensor]]:
        check_text_defense(defense)
        lead = [0] if defense.level == "example" else []
        nothing = [tf.zeros([*lead, *v.shape], v.dtype) for v in model.trainable_variables]
        shared = defense.apply_sampled(nothing, seed=seed, expected_size=expected_size)
        return tf.constant(float("nan"), tf.float32), list(shared)

    loss, grads = tf.cond(tf.shape(ids)[0] > 0, drawn, empty)
    return loss, list(grads)


def local_text_weights(model: keras.Model, ids: tf.Tensor, local: LocalTraining) -> list[tf.Tensor]:
    """The trainable weights ``w_S`` after the client's ``local.steps`` SGD steps at rate
    ``local.lr`` on ``ids`` [B, L] (mini-batches of `LocalTraining.minibatches`, in order; each
    step's loss `masked_loss` on its mini-batch), starting from the model's own. The model is
    not changed (Keras' ``stateless_call`` on weight values). A step whose gradient holds a NaN
    or infinity is skipped (the weights stay), as the text trainer skips one
    (`leakbench.client.text_training`). The steps unroll into one graph: inside a
    ``tf.function`` it traces once per shape of ``ids``."""
    ids = tf.convert_to_tensor(ids, tf.int32)
    check_input_length(model, int(ids.shape[1]) - 1)
    frozen = [tf.convert_to_tensor(v) for v in model.non_trainable_variables]
    weights = [tf.convert_to_tensor(v) for v in model.trainable_variables]
    for first, last in local.minibatches(int(ids.shape[0])):
        batch = ids[first:last]
        with tf.GradientTape() as tape:
            tape.watch(weights)
            logits, _ = model.stateless_call(weights, frozen, batch[:, :-1], training=False)
            loss = masked_loss(logits, batch[:, 1:])
        raw = tape.gradient(loss, weights, unconnected_gradients=tf.UnconnectedGradients.ZERO)
        grads = densify(raw)
        finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in grads])
        weights = [
            tf.where(finite, w - tf.cast(local.lr, w.dtype) * g, w)
            for w, g in zip(weights, grads, strict=True)
        ]
    return weights


def local_text_change(model: keras.Model, ids: tf.Tensor, local: LocalTraining) -> list[tf.Tensor]:
    """The change ``w_0 - w_S`` of the trainable weights after the client's local steps
    (`local_text_weights`), dense, ordered like ``model.trainable_variables``: what a FedAvg
    text client shares before its defense. An attacker that reads it as a gradient divides it
    by ``local.scale`` (``steps * lr``), as the image attacks do."""
    start = [tf.convert_to_tensor(v) for v in model.trainable_variables]
    weights = local_text_weights(model, ids, local)
    return [w0 - w for w0, w in zip(start, weights, strict=True)]


def defended_text_update(
    model: keras.Model,
    ids: tf.Tensor,
    defense: Defense,
    seed: tf.Tensor | Sequence[int],
    local: LocalTraining | None = None,
) -> list[tf.Tensor]:
    """What a text client shares for the batch ``ids`` [B, L] under ``defense``: the dense
    batch gradient through a batch-level defense, or the dense per-example gradients through an
    example-level one (DP-SGD), which reduces them itself; under FedAvg (``local`` of more
    than one step) its weight change after local training (`local_text_change`) through a
    batch-level defense. Ordered like ``model.trainable_variables`` and checked by
    `assert_dense`. ``seed`` (int pair) is the defense's only randomness. Pure and traceable:
    inside a ``tf.function`` it traces once per shape of ``ids`` (`text_observer`).

    Raises:
        ConfigError: For a defense that cannot act on text (`check_text_defense`) or a batch it
            cannot take (`Defense.check_client`).
        ValueError: For an example-level defense under FedAvg (a run refuses it first:
            `leakbench.run.checks.check_fedavg_defenses`).
    """
    if local is None or local.fedsgd:
        return defended_text_step(model, ids, defense, seed)[1]
    check_text_defense(defense)
    if defense.level == "example":
        raise ValueError(f"defense {defense.name} acts per example; FedAvg needs a batch-level one")
    ids = tf.convert_to_tensor(ids, tf.int32)
    defense.check_client(int(ids.shape[0]))
    seed = tf.cast(tf.convert_to_tensor(seed), tf.int64)
    shared = list(defense.apply(local_text_change(model, ids, local), seed=seed))
    assert_dense(shared)
    return shared


def text_observer(
    model: keras.Model, defense: Defense, local: LocalTraining | None = None
) -> Callable[[tf.Tensor, tf.Tensor], list[tf.Tensor]]:
    """``observe(ids, seed)``: `defended_text_update` (under ``local``'s training, if any)
    compiled once per shape of ``ids`` (new ids or seed values reuse the trace). Refuses a
    defense that cannot act on text now, before anything is traced."""
    check_text_defense(defense)
    return tf.function(lambda ids, seed: defended_text_update(model, ids, defense, seed, local))
