"""Per-example gradients of the task loss, vectorised over the batch (for DP-SGD-style defenses).

Example-level defenses (DP-SGD's per-example clipping) need one gradient per example rather than
the batch mean. A Python loop over examples would build one graph per example and scale badly;
instead the gradient of one example is written as a function of that example alone and mapped
over the batch with ``tf.vectorized_map``, which turns it into batched ops.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from leakbench.components.forward import (
    examples_interact,
    forward_training,
    stateless_forward,
    task_loss,
)


def per_example_gradients(
    model: keras.Model, images: tf.Tensor, targets: tf.Tensor
) -> list[tf.Tensor]:
    """Per-example gradients only; see `per_example_losses_and_gradients`."""
    return per_example_losses_and_gradients(model, images, targets)[1]


def per_example_losses_and_gradients(
    model: keras.Model, images: tf.Tensor, targets: tf.Tensor
) -> tuple[tf.Tensor, list[tf.Tensor]]:
    """Gradient of `leakbench.components.forward.task_loss` for each example of a batch separately.

    Entry ``b`` of the result equals ``model_gradients(model, images[b:b+1], targets[b:b+1])``,
    and the mean over the batch axis equals ``model_gradients(model, images, targets)`` (the
    task loss is a mean over examples). The model runs in
    `leakbench.components.forward.forward_training`'s mode, as in
    `leakbench.components.forward.model_gradients`.

    The forward and backward pass of one example are vectorised with ``tf.vectorized_map``:
    the model is called through Keras 3's ``stateless_call`` on the current weight values, and a
    ``GradientTape`` differentiates with respect to those value tensors, so no variable is read
    or created inside the vectorised function. Works eagerly and inside a ``tf.function`` (one
    trace per input shape; the weight values are read when the function runs, so training steps
    see the current weights). Ops without a vectorised form fall back to a ``tf.while_loop``
    over the batch (correct, only slower; TensorFlow logs a warning). TensorFlow's converter for
    ``Conv2DBackpropFilter`` (the gradient of a convolution kernel) is such a loop internally;
    it was still as fast as the vectorised path overall for the DLG LeNet on CPU.

    Args:
        model: A Keras 3 model of logits. Not modified.
        images: Batch of inputs, shape ``[B, ...]``.
        targets: Label distributions (one-hot or soft), shape ``[B, num_classes]``.

    Returns:
        The task loss of each example (shape ``[B]``), and one tensor per
        ``model.trainable_variables`` entry, in that order, of shape ``[B, *variable.shape]``.
        A variable the loss does not depend on gets zeros (not ``None``), so that the shapes
        always hold.

    Raises:
        ValueError: The model has BatchNorm, whose batch statistics mix the examples, so an
            example has no gradient of its own (`leakbench.client.check_model`).
    """
    if examples_interact(model):
        raise ValueError(
            f"model {model.name} has BatchNorm: its examples have no per-example gradients"
        )
    images = tf.convert_to_tensor(images)
    targets = tf.convert_to_tensor(targets)
    # Value tensors rather than variables: the tape can watch them inside the vectorised
    # function, and the gradients are those of the weights as they are at this call.
    trainable = [tf.convert_to_tensor(v) for v in model.trainable_variables]
    non_trainable = [tf.convert_to_tensor(v) for v in model.non_trainable_variables]
    if not trainable:
        logits, _ = stateless_forward(model, images)
        losses = -tf.reduce_sum(targets * tf.nn.log_softmax(logits, axis=-1), axis=-1)
        return losses, []

    def one_example(example: tuple[tf.Tensor, tf.Tensor]) -> list[tf.Tensor]:
        x, y = example
        with tf.GradientTape() as tape:
            tape.watch(trainable)
            logits, _ = model.stateless_call(
                trainable, non_trainable, x[None], training=forward_training()
            )
            loss = task_loss(logits, y[None])
        grads = tape.gradient(loss, trainable, unconnected_gradients=tf.UnconnectedGradients.ZERO)
        return [loss, *grads]  # one flat list: the loss, then the gradients

    losses, *grads = tf.vectorized_map(one_example, (images, targets))
    return losses, grads
