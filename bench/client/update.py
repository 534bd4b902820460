"""The client's side: the gradient a federated client shares for one batch.

A client computes the gradient of its batch on the model it received (the batch gradient, or
per-example gradients for an example-level defense such as DP-SGD), passes it through its defense
and shares the result. The steps are the same for every modality: what depends on the examples (how
a batch becomes a loss and a gradient, which defenses apply, what may leave the client) is the
`leakbench.modalities.Modality` each function takes, images by default. `defended_gradients` is that
one code path: the runner's observed gradient (what the attacker sees) and the trainer's update
(what the defense costs) both come from it, so the two can never drift apart. The forward pass runs
in the mode that `leakbench.components.forward.forward_training` owns.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import keras
import numpy as np
import tensorflow as tf

from leakbench.components.forward import (
    batch_norm_layers,
    batch_statistics_fn,
    head_kernel_index,
    head_layer,
    representation_fn,
)
from leakbench.core.errors import ConfigError
from leakbench.core.federated import LocalTraining
from leakbench.defenses import ClientView, Defense, Gradients
from leakbench.modalities import IMAGE, Modality


class ClientStep(NamedTuple):
    """One client batch's forward and backward pass under a defense.

    Attributes:
        loss: The batch's mean task loss (undefended).
        gradients: The defended gradient, ordered like ``model.trainable_variables``.
        state: The non-trainable values (BatchNorm's moving statistics) after the forward
            pass, ordered like ``model.non_trainable_variables``; the trainer writes them back.
    """

    loss: tf.Tensor
    gradients: Gradients
    state: list[tf.Tensor]


def check_model(
    model: keras.Model,
    defenses: list[Defense],
    batch_size: int,
    local: LocalTraining | None = None,
) -> None:
    """Raises `ConfigError` for a client this model cannot have.

    Each defense checks the batch size (`Defense.check_client`: mixup needs as many examples
    as it mixes); defenses that read the representation or extend the model need an output
    layer on a feature vector; PRECODE is refused under FedAvg with several local steps.

    An example-level defense (DP-SGD) needs each example's own gradient, which BatchNorm in
    training mode does not give (its batch statistics mix the examples; Opacus refuses such
    models too). A BatchNorm layer that sees one value per channel (one example of 1x1
    features) outputs a constant whatever the input, so the gradient would carry nothing of the
    images (PyTorch refuses to train such a batch).
    """
    for defense in defenses:
        defense.check_client(batch_size)
        if defense.needs_view or defense.architecture is not None:
            head_layer(model)  # refuses a model without an output layer on a feature vector
        if defense.architecture is not None and local is not None and not local.fedsgd:
            raise ConfigError(
                f"defense {defense.name} samples inside the model, which FedAvg's simulated "
                "local steps do not follow; use it with local_training.steps = 1"
            )
    layers = batch_norm_layers(model)
    if not layers:
        return
    for defense in defenses:
        if defense.level == "example":
            raise ConfigError(
                f"defense {defense.name} clips each example's gradient, but model {model.name} "
                f"has {len(layers)} BatchNorm layers whose batch statistics mix the examples; "
                "use a model without BatchNorm (lenet, mlp)"
            )
    for layer in layers:
        values = batch_size * math.prod(int(d) for d in layer.input.shape[1:-1])
        if values == 1:
            raise ConfigError(
                f"model {model.name}: BatchNorm layer {layer.name} sees one value per channel "
                f"at batch_size {batch_size} on these images, so its output is constant; use "
                "larger images or batch_size >= 2"
            )


def defended_gradients(
    defense: Defense,
    model: keras.Model,
    images: tf.Tensor,
    targets: tf.Tensor,
    seed: tf.Tensor,
    modality: Modality = IMAGE,
) -> Gradients:
    """The gradient a client shares for one batch under ``defense``.

    Both the attack side (the observed gradient) and the trainer (the update) use it, so that
    both see the same defended gradient. A batch-level defense gets the batch gradient
    (`leakbench.components.forward.loss_and_gradients`); an example-level one gets the
    per-example gradients (`leakbench.components.per_example.per_example_losses_and_gradients`)
    and reduces them itself. Works eagerly and inside a ``tf.function``, where it traces once
    per input shape: new seed or image values reuse the trace.

    Args:
        defense: The defense (its ``level`` is read on the instance, as chains set it there).
        model: The Keras model whose ``trainable_variables`` the gradient is taken for.
        images: The client's batch of inputs, shape ``[B, ...]``.
        targets: Label distributions, shape ``[B, num_classes]``.
        seed: int32/int64 tensor of shape [2], the defense's only source of randomness.
        modality: What the batch is (`leakbench.modalities`).

    Returns:
        The defended batch gradient, ordered like ``model.trainable_variables``.
    """
    return defended_step(defense, model, images, targets, seed, modality=modality).gradients


def defended_step(
    defense: Defense,
    model: keras.Model,
    images: tf.Tensor,
    targets: tf.Tensor,
    seed: tf.Tensor,
    expected_size: int | tf.Tensor | None = None,
    modality: Modality = IMAGE,
) -> ClientStep:
    """`defended_gradients` with the batch's loss and the forward pass's updated statistics
    (the trainer reports the loss, keeps the statistics and must not pay a second forward
    pass). The model is not changed. With ``expected_size``, the batch is a Poisson sample
    whose expected size that is, and the defense releases `Defense.apply_sampled` (DP
    training; `sampled_step` also takes an empty batch). ``modality`` refuses first a defense
    that cannot act on its batch (`Modality.check_step`)."""
    modality.check_step(defense, images)
    seed = tf.cast(tf.convert_to_tensor(seed), tf.int64)
    undefended, images = undefended_step(defense, model, images, targets, seed, modality)
    view = client_view(model, images) if defense.needs_view else None
    if expected_size is None:
        shared = defense.apply(undefended.gradients, seed=seed, view=view)
    else:
        shared = defense.apply_sampled(
            undefended.gradients, seed=seed, expected_size=expected_size, view=view
        )
    return ClientStep(undefended.loss, modality.shared(list(shared)), undefended.state)


def sampled_step(
    defense: Defense,
    model: keras.Model,
    images: tf.Tensor,
    targets: tf.Tensor,
    seed: tf.Tensor,
    expected_size: int | tf.Tensor,
    modality: Modality = IMAGE,
) -> ClientStep:
    """The client's step on a Poisson-sampled batch of any size, 0 included (DP training):
    `defended_step` with ``expected_size`` for a batch that holds an example. An empty batch
    has no gradient to compute; the mechanism still releases its noise, so the defense gets the
    gradients of no example (per-example gradients with a batch axis of 0, or a zero batch
    gradient) and releases `Defense.apply_sampled` of them. An empty batch's loss is NaN (it
    has none) and its statistics are the model's own."""
    seed = tf.cast(tf.convert_to_tensor(seed), tf.int64)

    def drawn() -> tuple[tf.Tensor, Gradients, list[tf.Tensor]]:
        step = defended_step(defense, model, images, targets, seed, expected_size, modality)
        return tf.cast(step.loss, tf.float32), step.gradients, step.state

    def empty() -> tuple[tf.Tensor, Gradients, list[tf.Tensor]]:
        modality.check_step(defense, images)
        lead = [0] if defense.level == "example" else []
        nothing = [tf.zeros([*lead, *v.shape], v.dtype) for v in model.trainable_variables]
        view = client_view(model, images) if defense.needs_view else None
        shared = defense.apply_sampled(nothing, seed=seed, expected_size=expected_size, view=view)
        state = [tf.convert_to_tensor(v) for v in model.non_trainable_variables]
        return tf.constant(math.nan, tf.float32), list(shared), state

    loss, grads, state = tf.cond(tf.shape(images)[0] > 0, drawn, empty)
    return ClientStep(loss, list(grads), list(state))


def undefended_step(
    defense: Defense,
    model: keras.Model,
    images: tf.Tensor,
    targets: tf.Tensor,
    seed: tf.Tensor,
    modality: Modality = IMAGE,
) -> tuple[ClientStep, tf.Tensor]:
    """The first half of `defended_step`: the batch as the defense prepares it (mixup), and the
    gradient the defense then gets, undefended (the per-example gradients for an example-level
    defense, the batch gradient otherwise), with the loss and the statistics. The epsilon audit
    (`leakbench.client.canaries`) adds its canary between this and the defense."""
    images, targets = defense.prepare(images, targets, seed=seed)
    if defense.level == "example":
        step = modality.example_step(model, images, targets)
    else:
        step = modality.batch_step(model, images, targets, seed)
    return ClientStep(*step), images


def client_view(model: keras.Model, images: tf.Tensor) -> ClientView:
    """What a defense that reads more than the gradient gets (`Defense.needs_view`): the batch,
    the model's representation at its current weights and where the output layer's kernel
    sits in the gradient list."""
    trainable = [tf.convert_to_tensor(v) for v in model.trainable_variables]
    represent = representation_fn(model)
    return ClientView(
        images=tf.convert_to_tensor(images),
        representation=lambda x: represent(trainable, x),
        head_kernel=head_kernel_index(model),
    )


def local_weights(
    model: keras.Model,
    images: tf.Tensor,
    targets: tf.Tensor,
    local: LocalTraining,
    modality: Modality = IMAGE,
) -> Gradients:
    """The trainable weights ``w_S`` after the client's ``local.steps`` SGD steps at rate
    ``local.lr`` on its batch (mini-batches in order, `LocalTraining.minibatches`; each step's
    loss `Modality.local_loss`), starting from the model's own. The model is not changed: the
    steps run on weight values through Keras' ``stateless_call``. A step whose gradient holds a
    NaN or an infinity is skipped (the weights stay), as the trainers skip one: a non-finite
    gradient never reaches the weights. Each step's gradient is what may leave the client
    (`Modality.shared`: a text model's embedding gradient densified). The steps unroll into one
    graph: inside a ``tf.function`` it traces once per batch shape."""
    frozen = [tf.convert_to_tensor(v) for v in model.non_trainable_variables]
    weights = [tf.convert_to_tensor(v) for v in model.trainable_variables]
    for first, last in local.minibatches(int(images.shape[0])):
        with tf.GradientTape() as tape:
            tape.watch(weights)
            loss = modality.local_loss(
                model, weights, frozen, images[first:last], targets[first:last]
            )
        raw = tape.gradient(loss, weights, unconnected_gradients=tf.UnconnectedGradients.ZERO)
        grads = modality.shared(raw)
        finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in grads])
        weights = [
            tf.where(finite, w - tf.cast(local.lr, w.dtype) * g, w)
            for w, g in zip(weights, grads, strict=True)
        ]
    return weights


def local_change(
    model: keras.Model,
    images: tf.Tensor,
    targets: tf.Tensor,
    local: LocalTraining,
    modality: Modality = IMAGE,
) -> Gradients:
    """The change ``w_0 - w_S`` of the weights after the client's ``local.steps`` SGD steps on
    its batch (`local_weights`). The model is not changed. A Flower client that sends ``w_S``
    lets the receiver compute this same difference, bit for bit
    (`leakbench.integrations.flower`). An attacker that reads it as a gradient divides it by
    ``local.scale`` (``steps * lr``)."""
    start = [tf.convert_to_tensor(v) for v in model.trainable_variables]
    weights = local_weights(model, images, targets, local, modality)
    return [w0 - w for w0, w in zip(start, weights, strict=True)]


def defended_update(
    defense: Defense,
    model: keras.Model,
    images: tf.Tensor,
    targets: tf.Tensor,
    seed: tf.Tensor,
    local: LocalTraining | None = None,
    modality: Modality = IMAGE,
) -> Gradients:
    """What a client shares in one round under ``defense``: its defended gradient in FedSGD
    (``local`` None or one step: exactly `defended_gradients`), or its defended weight change
    after local training in FedAvg (a batch-level defense only: an example-level one would
    have to act inside every local step).

    Raises:
        ConfigError: For a defense that cannot act on the modality's batch
            (`Modality.check_step`).
        ValueError: For an example-level defense under FedAvg (a run refuses it first:
            `leakbench.run.checks.check_fedavg_defenses`).
    """
    if local is None or local.fedsgd:
        return defended_gradients(defense, model, images, targets, seed, modality)
    modality.check_step(defense, images)
    if defense.level == "example":
        raise ValueError(f"defense {defense.name} acts per example; FedAvg needs a batch-level one")
    seed = tf.cast(tf.convert_to_tensor(seed), tf.int64)
    images, targets = defense.prepare(images, targets, seed=seed)
    view = client_view(model, images) if defense.needs_view else None
    change = local_change(model, images, targets, local, modality)
    return modality.shared(list(defense.apply(change, seed=seed, view=view)))


def observer(
    defense: Defense,
    model: keras.Model,
    local: LocalTraining | None = None,
    modality: Modality = IMAGE,
) -> Callable[[tf.Tensor, tf.Tensor, tf.Tensor], Gradients]:
    """``observe(inputs, targets, seed)``: the observed update of a batch under ``defense``
    (`defended_update`).

    One ``tf.function`` per defense configuration and model, traced once per batch shape (an
    eager call would rebuild the per-example vectorisation of example-level defenses for every
    batch). The seed is the defense-draw stream of `leakbench.core.seeds`. A defense that cannot
    act on the modality is refused now, before anything is traced.
    """
    modality.check_defense(defense)
    return tf.function(
        lambda x, y, seed: defended_update(defense, model, x, y, seed, local, modality)
    )


def batch_statistics(model: keras.Model, images: tf.Tensor | np.ndarray) -> tuple[tf.Tensor, ...]:
    """The BatchNorm statistics of the client's batch in its training-mode forward pass (per
    BatchNorm layer, the per-channel mean and variance of its input;
    `leakbench.components.forward.batch_statistics_fn`): what a server that knows them
    observes. They are not defended: a defense acts on the update."""
    values = [tf.convert_to_tensor(v) for v in model.trainable_variables]
    return tuple(batch_statistics_fn(model)(values, tf.convert_to_tensor(images)))
