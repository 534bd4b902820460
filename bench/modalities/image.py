"""Images: float32 inputs ``[B, H, W, C]`` in [0, 1] and label distributions ``[B, classes]``.

The batch gradient comes from the training-mode forward pass that
`leakbench.components.forward` owns; the client draws inside its model (PRECODE's sampling) from
its own stream of the step's seed. Every defense acts on image gradients.
"""

from __future__ import annotations

from typing import ClassVar

import keras
import tensorflow as tf

from leakbench.components.bottleneck import noise_seed_positions, with_noise_seed
from leakbench.components.forward import loss_gradients_and_state, stateless_forward, task_loss
from leakbench.components.per_example import per_example_losses_and_gradients
from leakbench.defenses import Defense, tensor_seed
from leakbench.modalities.base import Modality, Step

# The stream of the client's draws inside its model (PRECODE's sampling), apart from the
# defense's own draws (`tensor_seed(seed, i)` for i >= 0 and `prepare_seed`, which is -1).
NOISE_STREAM = -2


class ImageModality(Modality):
    """Image classification (`leakbench.modalities.base.Modality`)."""

    name: ClassVar[str] = "image"
    dtypes: ClassVar[tuple[tf.DType, ...]] = (tf.float32, tf.float32)

    def check_defense(self, defense: Defense) -> None:
        del defense  # every defense acts on images

    def check_step(self, defense: Defense, inputs: tf.Tensor) -> None:
        del defense, inputs  # a run checks the batch size first (`client.update.check_model`)

    def batch_step(
        self, model: keras.Model, inputs: tf.Tensor, targets: tf.Tensor, seed: tf.Tensor | None
    ) -> Step:
        current = [tf.convert_to_tensor(v) for v in model.non_trainable_variables]
        sampled = current
        if seed is not None:
            sampled = with_noise_seed(model, current, tensor_seed(seed, NOISE_STREAM))
        loss, grads, state = loss_gradients_and_state(model, inputs, targets, sampled)
        # The noise seed is an input of the forward pass, not state it leaves behind.
        for i in noise_seed_positions(model):
            state[i] = current[i]
        return Step(loss, list(grads), state)

    def example_step(self, model: keras.Model, inputs: tf.Tensor, targets: tf.Tensor) -> Step:
        losses, grads = per_example_losses_and_gradients(model, inputs, targets)
        state = [tf.convert_to_tensor(v) for v in model.non_trainable_variables]
        return Step(tf.reduce_mean(losses), list(grads), state)

    def local_loss(
        self,
        model: keras.Model,
        weights: list[tf.Tensor],
        frozen: list[tf.Tensor],
        inputs: tf.Tensor,
        targets: tf.Tensor,
    ) -> tf.Tensor:
        logits, _ = stateless_forward(model, inputs, weights, frozen)
        return task_loss(logits, targets)

    def shared(self, gradients: list[object]) -> list[tf.Tensor]:
        return list(gradients)  # image gradients are dense tensors


IMAGE = ImageModality()
