"""What a modality plugs into the one pipeline: the parts of a client's step that depend on
what the examples are.

A client's step is the same for every modality (`leakbench.client.update`): the batch's
gradient, or its per-example gradients for an example-level defense, passed through the
defense; under FedAvg the change of the weights after the local SGD steps, through the
defense. What differs is how a batch becomes a loss and a gradient, which defenses can act on
it, and what the gradient must look like before it leaves the client. A `Modality` holds
exactly that, so the client, its trainer and the epsilon audit's canaries exist once.

A batch is a pair ``(inputs, targets)``: an image batch's images and label distributions; a
text batch's token ids twice (the model reads ``ids[:, :-1]`` and is scored on ``ids[:, 1:]``,
`leakbench.modalities.text`), so that mini-batches and Poisson samples cut both alike.
"""

from __future__ import annotations

from typing import ClassVar, NamedTuple

import keras
import tensorflow as tf

from leakbench.defenses import Defense, Gradients


class Step(NamedTuple):
    """One batch's forward and backward pass, undefended.

    Attributes:
        loss: The batch's mean task loss.
        gradients: The batch gradient (or, for per-example gradients, one tensor per variable
            with a leading batch axis), ordered like ``model.trainable_variables``.
        state: The non-trainable values after the forward pass (BatchNorm's moving
            statistics), ordered like ``model.non_trainable_variables``.
    """

    loss: tf.Tensor
    gradients: Gradients
    state: list[tf.Tensor]


class Modality:
    """The modality-specific part of a client's step; subclasses implement every method.

    Every method is pure and traceable: the model is never changed (forward passes run on
    weight values through Keras' ``stateless_call``), and inside a ``tf.function`` each traces
    once per batch shape.
    """

    name: ClassVar[str] = ""
    # The dtypes of a batch's inputs and targets as a client holds them.
    dtypes: ClassVar[tuple[tf.DType, ...]] = ()

    def check_defense(self, defense: Defense) -> None:
        """Raises `leakbench.core.errors.ConfigError` (one line) for a defense that cannot act
        on this modality at all; called before anything is traced."""
        raise NotImplementedError

    def check_step(self, defense: Defense, inputs: tf.Tensor) -> None:
        """Raises `leakbench.core.errors.ConfigError` (one line) for a defense that cannot act
        on the batch ``inputs``; called before every defended step."""
        raise NotImplementedError

    def batch_step(
        self, model: keras.Model, inputs: tf.Tensor, targets: tf.Tensor, seed: tf.Tensor | None
    ) -> Step:
        """The batch's loss, its gradient and the statistics its forward pass leaves (``seed``:
        the client's draws inside its model, PRECODE's sampling, for a modality that has any;
        None: the model's own, as the epsilon audit's auditor computes the batch's gradient)."""
        raise NotImplementedError

    def example_step(self, model: keras.Model, inputs: tf.Tensor, targets: tf.Tensor) -> Step:
        """Each example's gradient (leading axis B) and the mean of their losses: what an
        example-level defense (DP-SGD) gets."""
        raise NotImplementedError

    def local_loss(
        self,
        model: keras.Model,
        weights: list[tf.Tensor],
        frozen: list[tf.Tensor],
        inputs: tf.Tensor,
        targets: tf.Tensor,
    ) -> tf.Tensor:
        """The loss of one local SGD step of FedAvg, at the weight values ``weights`` (the
        non-trainable values ``frozen`` held fixed)."""
        raise NotImplementedError

    def shared(self, gradients: list[object]) -> list[tf.Tensor]:
        """The gradients as they may leave the client (a text client's must be dense: an
        embedding's sparse gradient lists the input ids); raises ``TypeError`` otherwise."""
        raise NotImplementedError
