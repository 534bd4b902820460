"""A model as leakbench computes with it: the forward mode (`forward_training`), stateless
forward passes, the task loss and its gradients, and the parts of a model that the client,
defenses and attacks read (the output layer and the representation before it, the BatchNorm
layers and their batch statistics, the architecture's key). The models themselves are built in
`leakbench.components.models`.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf

from leakbench.core.errors import ConfigError


def task_loss(logits: tf.Tensor, targets: tf.Tensor) -> tf.Tensor:
    """Mean cross-entropy of ``logits`` against (soft) label distributions ``targets``.

    Written as ``-sum(y * log_softmax(logits))`` on purpose: the fused
    ``softmax_cross_entropy_with_logits`` op has no correct second derivative with respect to
    soft labels, which DLG's joint image + label optimisation needs (DESIGN.md, pitfalls).
    """
    return tf.reduce_mean(-tf.reduce_sum(targets * tf.nn.log_softmax(logits, axis=-1), axis=-1))


def forward_training() -> bool:
    """The ``training`` flag of every forward pass whose gradient leakbench computes: True.

    The one owner of the model's forward mode: the client's shared gradient
    (`leakbench.client`), the per-example gradients of example-level defenses, the attacker's
    dummy gradients (`leakbench.attacks.engine.matching`), label recovery and the utility
    training steps all ask here. Training mode is how Keras trains and how clients compute the
    gradients they share: BatchNorm normalises each batch with that batch's own mean and
    variance (the examples of a batch interact, and the attacker's dummy batch must be
    normalised by its own statistics too), and the training steps update the moving statistics
    that inference (`leakbench.client.training.evaluate`) then uses. Every forward pass here is
    stateless (`stateless_forward`): computing a gradient never changes a model's variables;
    only `leakbench.client.training.DefendedTrainer` writes the updated statistics back.
    """
    return True


def stateless_forward(
    model: keras.Model,
    images: tf.Tensor,
    trainable: list[tf.Tensor] | None = None,
    non_trainable: list[tf.Tensor] | None = None,
) -> tuple[tf.Tensor, list[tf.Tensor]]:
    """The logits of ``images`` in `forward_training`'s mode and the non-trainable values
    (BatchNorm's moving statistics) that forward pass would leave; the model is not changed.

    ``trainable`` and ``non_trainable`` are the values to evaluate the model at, ordered like
    its variables; None means the variables' current values.
    """
    logits, state, _ = stateless_forward_and_penalty(model, images, trainable, non_trainable)
    return logits, state


def stateless_forward_and_penalty(
    model: keras.Model,
    images: tf.Tensor,
    trainable: list[tf.Tensor] | None = None,
    non_trainable: list[tf.Tensor] | None = None,
) -> tuple[tf.Tensor, list[tf.Tensor], tf.Tensor]:
    """`stateless_forward` and the sum of the losses the model's layers add to the task loss
    (PRECODE's KL term; 0 for the other models): the training objective is `task_loss` plus
    this penalty, so the client's gradient, and an attacker's dummy gradient, include it."""
    if trainable is None:
        trainable = [tf.convert_to_tensor(v) for v in model.trainable_variables]
    if non_trainable is None:
        non_trainable = [tf.convert_to_tensor(v) for v in model.non_trainable_variables]
    logits, state, losses = model.stateless_call(
        trainable, non_trainable, images, training=forward_training(), return_losses=True
    )
    penalty = tf.add_n(list(losses)) if losses else tf.zeros([], logits.dtype)
    return logits, list(state), penalty


def loss_gradients_and_state(
    model: keras.Model,
    images: tf.Tensor,
    targets: tf.Tensor,
    non_trainable: list[tf.Tensor] | None = None,
) -> tuple[tf.Tensor, list[tf.Tensor], list[tf.Tensor]]:
    """The training loss of the batch (`task_loss` plus the layers' penalty,
    `stateless_forward_and_penalty`), its gradient with respect to
    ``model.trainable_variables``, and the updated non-trainable values of the forward pass (at
    ``non_trainable`` if given); the model is not changed."""
    trainable = [tf.convert_to_tensor(v) for v in model.trainable_variables]
    with tf.GradientTape() as tape:
        tape.watch(trainable)
        logits, state, penalty = stateless_forward_and_penalty(
            model, images, trainable, non_trainable
        )
        loss = task_loss(logits, targets) + penalty
    grads = tape.gradient(loss, trainable, unconnected_gradients=tf.UnconnectedGradients.ZERO)
    return loss, grads, state


def loss_and_gradients(
    model: keras.Model, images: tf.Tensor, targets: tf.Tensor
) -> tuple[tf.Tensor, list[tf.Tensor]]:
    """`task_loss` of the batch and its gradient with respect to ``model.trainable_variables``."""
    loss, grads, _ = loss_gradients_and_state(model, images, targets)
    return loss, grads


def model_gradients(model: keras.Model, images: tf.Tensor, targets: tf.Tensor) -> list[tf.Tensor]:
    """Gradient of `task_loss` with respect to ``model.trainable_variables`` (a client's update)."""
    return loss_and_gradients(model, images, targets)[1]


def batch_norm_layers(model: keras.Model) -> list[keras.layers.BatchNormalization]:
    """The model's BatchNorm layers in the order the forward pass reaches them."""
    return [
        layer
        for layer in model._flatten_layers(include_self=False)  # noqa: SLF001 (Keras' own walk)
        if isinstance(layer, keras.layers.BatchNormalization)
    ]


def examples_interact(model: keras.Model) -> bool:
    """Whether a training-mode forward pass mixes the examples of a batch (BatchNorm's batch
    statistics): then a batch's gradient is not the mean of its examples' gradients."""
    return bool(batch_norm_layers(model))


def head_layer(model: keras.Model) -> keras.layers.Dense:
    """The model's output layer: its last layer, a dense layer from the representation (a
    vector per example) to the logits. Every model of the zoo ends with one.

    Raises:
        ConfigError: If the model does not end with a dense layer on vectors.
    """
    head = model.layers[-1] if model.layers else None
    if not isinstance(head, keras.layers.Dense) or len(head.input.shape) != 2:
        raise ConfigError(
            f"model {model.name} does not end with a dense layer on a feature vector; Soteria, "
            'PRECODE and match = "features" need one'
        )
    return head


def _positions(model: keras.Model, variables: list[Any]) -> list[int]:
    """Where each of ``variables`` sits in ``model.trainable_variables``."""
    position = {id(v): i for i, v in enumerate(model.trainable_variables)}
    return [position[id(v)] for v in variables]


def head_start(model: keras.Model) -> int:
    """Index, in ``model.trainable_variables``, of the first variable of the model's head:
    its output layer, or the variational bottleneck before it (PRECODE). The variables before
    it are the feature extractor's, whose gradients an adaptive attack matches alone."""
    first = min(_positions(model, head_layer(model).trainable_variables))
    for layer in model.layers:
        if getattr(layer, "stochastic", False) and layer.trainable_variables:
            first = min(first, *_positions(model, layer.trainable_variables))
    return first


def head_kernel_index(model: keras.Model) -> int:
    """Index of the output layer's kernel in ``model.trainable_variables``."""
    return _positions(model, [head_layer(model).kernel])[0]


def _part(model: keras.Model, outputs: Any) -> Callable[[list[tf.Tensor], tf.Tensor], Any]:
    """``part(trainable, images)``: the functional sub-model from the model's inputs to
    ``outputs``, evaluated statelessly in `forward_training`'s mode at ``trainable`` (ordered
    like ``model.trainable_variables``), with the current non-trainable values."""
    inner = keras.Model(model.inputs, outputs)
    picks = _positions(model, inner.trainable_variables)
    frozen = [tf.convert_to_tensor(v) for v in inner.non_trainable_variables]

    def part(trainable: list[tf.Tensor], images: tf.Tensor) -> Any:
        out, _ = inner.stateless_call(
            [trainable[i] for i in picks], frozen, images, training=forward_training()
        )
        return out

    return part


_REPRESENTATION: dict[int, tuple[keras.Model, Callable[..., Any]]] = {}


def representation_fn(model: keras.Model) -> Callable[[list[tf.Tensor], tf.Tensor], tf.Tensor]:
    """``representation(trainable, images) -> [B, F]``: the input of the output layer
    (`head_layer`) at the given trainable values; the model is not changed."""
    cached = _REPRESENTATION.get(id(model))
    if cached is None or cached[0] is not model:
        cached = (model, _part(model, head_layer(model).input))
        _REPRESENTATION[id(model)] = cached
    return cached[1]


StatisticsFn = Callable[[list[tf.Tensor], tf.Tensor], list[tf.Tensor]]
_STATISTICS: dict[int, tuple[keras.Model, StatisticsFn]] = {}


def batch_statistics_fn(model: keras.Model) -> StatisticsFn:
    """``statistics(trainable, images) -> [mean_1, variance_1, mean_2, ...]``: per BatchNorm
    layer (`batch_norm_layers`), the per-channel mean and (biased) variance of its input over
    every axis but the channels, as the layer normalises a batch in training mode.

    ``trainable`` holds the model's trainable values, ordered like
    ``model.trainable_variables``; the statistics are evaluated at them, not at the variables.
    The client (what a server that knows them observes) and the attacker's BatchNorm prior
    (`leakbench.attacks.priors.bn_statistics`) both compute them here.
    """
    cached = _STATISTICS.get(id(model))
    if cached is not None and cached[0] is model:
        return cached[1]
    layers = batch_norm_layers(model)
    if not layers:
        raise ValueError(f"model {model.name} has no BatchNorm layer")
    # The inputs of BatchNorm layers do not depend on the moving statistics in training mode
    # (only on the batch's own), so fixed values serve every weight state.
    inputs = _part(model, [layer.input for layer in layers])

    def statistics(trainable: list[tf.Tensor], images: tf.Tensor) -> list[tf.Tensor]:
        features = inputs(trainable, images)
        if not isinstance(features, (list, tuple)):
            features = [features]
        out: list[tf.Tensor] = []
        for feature in features:
            mean, variance = tf.nn.moments(feature, axes=list(range(len(feature.shape) - 1)))
            out += [mean, variance]
        return out

    _STATISTICS[id(model)] = (model, statistics)
    return statistics


# Each live model's `architecture_key` (its config is read once: about 3 ms a time, and the
# judge asks once per trial).
_ARCHITECTURES: weakref.WeakKeyDictionary[keras.Model, str] = weakref.WeakKeyDictionary()


def architecture_key(model: keras.Model) -> str:
    """The model's config without layer names: equal for every model of one architecture
    (Keras numbers the names of new layers, so two identical models differ only in them).
    Read once per model object: a built model's architecture does not change."""
    if model not in _ARCHITECTURES:
        _ARCHITECTURES[model] = _config_key(model)
    return _ARCHITECTURES[model]


def _config_key(model: keras.Model) -> str:
    """`architecture_key`, computed."""

    def strip(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: strip(v) for k, v in node.items() if k != "name"}
        if isinstance(node, list):
            return [strip(v) for v in node]
        return node

    return json.dumps(strip(model.get_config()), sort_keys=True, default=str)
