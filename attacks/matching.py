"""Gradient matching: the compiled optimisation loop shared by the DLG-family attacks.

The loop (model forward, parameter gradient, matching loss, its gradient with respect to the
dummy inputs, and the L-BFGS iterations) is one XLA-compiled ``tf.function`` per (architecture,
attack parameters, input shape, batch size, label mode). The model runs through Keras'
``stateless_call`` with its weights passed in as tensors, so the compiled loop is shared by
every model of the same architecture (other seeds, other training states) and attacking many
trials traces it once; weights, observed gradient, start point and labels are tensor arguments.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from leakbench import lbfgs
from leakbench.models import task_loss

_CACHE: dict[Any, Callable[..., Any]] = {}
# Keys whose XLA compilation failed once: they run as plain graphs from then on.
_NO_XLA: set[Any] = set()


def squared_l2(dummy: list[tf.Tensor], observed: list[tf.Tensor]) -> tf.Tensor:
    """DLG's matching loss: the squared L2 distance summed over all gradient tensors."""
    return tf.add_n([tf.reduce_sum(tf.square(d - o)) for d, o in zip(dummy, observed, strict=True)])


def matching_objective(
    model: keras.Model,
    weights: tuple[tf.Tensor, ...],
    observed: tuple[tf.Tensor, ...],
    labels: tf.Tensor,
    *,
    input_shape: tuple[int, int, int],
    batch_size: int,
    num_classes: int,
    learn_labels: bool,
) -> Callable[[tf.Tensor], tuple[tf.Tensor, tf.Tensor]]:
    """The DLG objective on a flat vector ``z``: returns ``z -> (loss, d loss / d z)``.

    ``z`` holds the dummy images, then (when ``learn_labels``) the dummy label logits, whose
    softmax is the soft label; otherwise the one-hot ``labels`` are used. The loss is
    `squared_l2` between the dummy batch's parameter gradient and ``observed``. The model is
    evaluated at ``weights`` (ordered like ``model.trainable_variables``), not its own variables.
    """
    frozen = [v.value for v in model.non_trainable_variables]
    pixels = batch_size * int(np.prod(input_shape))
    image_shape = (batch_size, *input_shape)

    def value_and_grad(z: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        with tf.GradientTape() as outer:
            outer.watch(z)
            images = tf.reshape(z[:pixels], image_shape)
            if learn_labels:
                targets = tf.nn.softmax(tf.reshape(z[pixels:], (batch_size, num_classes)))
            else:
                targets = labels
            with tf.GradientTape() as inner:
                inner.watch(weights)
                logits, _ = model.stateless_call(list(weights), frozen, images, training=False)
                loss = task_loss(logits, targets)
            dummy = inner.gradient(loss, list(weights))
            match = squared_l2(dummy, list(observed))
        return match, outer.gradient(match, z)

    return value_and_grad


def lbfgs_matcher(
    model: keras.Model,
    *,
    input_shape: tuple[int, int, int],
    batch_size: int,
    num_classes: int,
    learn_labels: bool,
    iterations: int,
    history_size: int,
) -> Callable[[tf.Tensor, tuple[tf.Tensor, ...], tf.Tensor], lbfgs.LbfgsResult]:
    """Returns the cached compiled loop ``loop(z0, weights, observed, labels) -> LbfgsResult``.

    ``z0`` is the flat start point: the dummy images, followed by the dummy label logits when
    ``learn_labels`` (DLG); otherwise ``labels`` (one-hot, [batch, classes]) is used as given.
    """
    architecture = architecture_key(model)
    key = (architecture, input_shape, batch_size, num_classes, learn_labels, iterations,
           history_size)  # fmt: skip
    if key in _CACHE:
        return _CACHE[key]

    def loop(
        z0: tf.Tensor,
        weights: tuple[tf.Tensor, ...],
        observed: tuple[tf.Tensor, ...],
        labels: tf.Tensor,
    ) -> lbfgs.LbfgsResult:
        value_and_grad = matching_objective(
            model,
            weights,
            observed,
            labels,
            input_shape=input_shape,
            batch_size=batch_size,
            num_classes=num_classes,
            learn_labels=learn_labels,
        )
        return lbfgs.minimize(
            value_and_grad, z0, max_iterations=iterations, history_size=history_size
        )

    compiled = _compile(loop, key)
    _CACHE[key] = compiled
    return compiled


def architecture_key(model: keras.Model) -> str:
    """The model's config without layer names: equal for every model of one architecture
    (Keras numbers the names of new layers, so two identical models differ only in them)."""

    def strip(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: strip(v) for k, v in node.items() if k != "name"}
        if isinstance(node, list):
            return [strip(v) for v in node]
        return node

    return json.dumps(strip(model.get_config()), sort_keys=True, default=str)


def _compile(loop: Callable[..., Any], key: Any) -> Callable[..., Any]:
    """Compiles with XLA, falling back to a plain graph if XLA cannot compile an op."""
    xla = tf.function(loop, jit_compile=True, reduce_retracing=True)
    graph = tf.function(loop, reduce_retracing=True)

    def run(*args: Any) -> lbfgs.LbfgsResult:
        if key not in _NO_XLA:
            try:
                return xla(*args)
            except (tf.errors.InvalidArgumentError, tf.errors.UnimplementedError) as err:
                if "XLA" not in str(err) and "compil" not in str(err).lower():
                    raise
                _NO_XLA.add(key)
        return graph(*args)

    run.xla = xla  # type: ignore[attr-defined]
    run.graph = graph  # type: ignore[attr-defined]
    return run
