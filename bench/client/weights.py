"""A client that sends its weights, not its update: what the server then sees.

A Flower client (`leakbench.integrations.flower`) replies to the server with its weights after
local training, ``w_S``; the server's update is ``w_0 - w_S``, computed from the weights it
sent, in float32. `weights_observer` is that view for the benchmark (``[threat_model] shares =
"weights"``), computed the way the Flower client and the auditor compute it, so that a
benchmark trial and an audited round of the same model, batch, defense and seeds see the same
update bit for bit:

* a defense that acts on the finished update alone (`acts_on_update`: a Flower ``DefenseMod``)
  defends the weight change ``w_0 - w_S``, whatever the number of local steps, and the client
  sends ``w_0 - defended``; without a defense it sends ``w_S`` itself;
* any other defense acts where `leakbench.client.update.observer` puts it (a Flower
  ``LocalClient`` step): on the gradient of a single local step, which the client then applies
  (it sends ``w_0 - lr * defended gradient``), or on the change after several steps.
"""

from __future__ import annotations

from collections.abc import Callable

import keras
import tensorflow as tf

from leakbench.client.update import local_change, observer
from leakbench.core.federated import LocalTraining
from leakbench.defenses import Defense, Gradients, NoDefense


def acts_on_update(defense: Defense) -> bool:
    """Whether ``defense`` can act on a finished update alone: batch level, and no step reads
    the batch, changes it or changes the model."""
    steps = getattr(defense, "steps", (defense,))
    return (
        defense.level == "batch"
        and not defense.needs_view
        and defense.architecture is None
        and all(type(step).prepare is Defense.prepare for step in steps)
    )


def weights_observer(
    defense: Defense, model: keras.Model, local: LocalTraining
) -> Callable[[tf.Tensor, tf.Tensor, tf.Tensor], Gradients]:
    """``observe(images, targets, seed)``: the server's update ``w_0 - w_S`` of a client that
    sends its weights ``w_S`` after ``local`` on the batch under ``defense`` (see the module
    docstring for where the defense acts). The defended update is computed by one traced
    function per defense configuration and model; the weights it turns into, and the server's
    difference, are taken eagerly, as the client and the server take them."""
    scale = None
    if not local.fedsgd or not acts_on_update(defense):
        step = observer(defense, model, local)
        if local.fedsgd:
            scale = local.lr  # the defended gradient of the one step the client applies
    else:
        step = tf.function(
            lambda x, y, seed: list(defense.apply(local_change(model, x, y, local), seed=seed))
        )
    undefended = isinstance(defense, NoDefense)

    def observe(images: tf.Tensor, targets: tf.Tensor, seed: tf.Tensor) -> Gradients:
        update = list(step(images, targets, seed))
        if undefended:
            return update  # w_0 - w_S, the change itself: the client sends w_S unchanged
        start = [tf.convert_to_tensor(v) for v in model.trainable_variables]
        if scale is not None:
            update = [scale * g for g in update]
        sent = [w0 - u for w0, u in zip(start, update, strict=True)]
        return [w0 - w for w0, w in zip(start, sent, strict=True)]

    return observe
