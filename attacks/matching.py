"""Gradient matching: the compiled optimisation loop shared by the DLG-family attacks.

The loop (model forward, parameter gradient, matching loss, its gradient with respect to the
dummy inputs, and the L-BFGS iterations) is one XLA-compiled ``tf.function`` per (architecture,
attack parameters, input shape, batch size, label mode), traced once per number of problems N.
It attacks N independent trials at once: each problem has its own weights, observed gradient,
labels and L-BFGS state (`leakbench.lbfgs`), and no op mixes problems. Models that
`leakbench.functional.batched_forward` can copy run that batched copy; any other model runs
through Keras' ``stateless_call`` one problem at a time (N = 1). Either way the weights are tensor
arguments, so the compiled loop is shared by every model of the same architecture (other seeds,
other training states) and attacking many trials traces it once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from leakbench import lbfgs
from leakbench.functional import batched_forward
from leakbench.models import architecture_key

_CACHE: dict[Any, Callable[..., Any]] = {}
# Keys whose XLA compilation failed once: they run as plain graphs from then on.
_NO_XLA: set[Any] = set()


def squared_l2(dummy: list[tf.Tensor], observed: list[tf.Tensor]) -> tf.Tensor:
    """DLG's matching loss per problem: the squared L2 distance summed over all gradient
    tensors, for [N, ...] tensors; returns [N]."""
    return tf.add_n(
        [
            tf.reduce_sum(tf.square(d - o), axis=list(range(1, len(d.shape))))
            for d, o in zip(dummy, observed, strict=True)
        ]
    )


def supports_batches(model: keras.Model) -> bool:
    """Whether the compiled loop can attack several problems of this model in one program."""
    return batched_forward(model) is not None


def stack_weights(targets: list[Any]) -> tuple[tf.Tensor, ...]:
    """Each trainable variable of the targets' models, stacked along a new problem axis."""
    models = [t.model for t in targets]
    if all(m is models[0] for m in models):  # one model: read each variable once
        return tuple(
            tf.broadcast_to(v.value, [len(models), *v.shape]) for v in models[0].trainable_variables
        )
    return tuple(tf.stack(vs) for vs in zip(*(m.trainable_variables for m in models), strict=True))


def stack_gradients(targets: list[Any]) -> tuple[tf.Tensor, ...]:
    """Each observed gradient tensor of the targets, stacked along a new problem axis."""
    return tuple(tf.stack(gs) for gs in zip(*(t.gradients for t in targets), strict=True))


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
    """The DLG objective for N problems: returns ``z -> (loss [N], d loss / d z [N, size])``.

    Row ``n`` of ``z`` holds problem n's dummy images, then (when ``learn_labels``) its dummy
    label logits, whose softmax is the soft label; otherwise the one-hot ``labels`` [N, batch,
    classes] are used. The loss is `squared_l2` between the dummy batch's parameter gradient and
    ``observed``. ``weights`` and ``observed`` are ordered like ``model.trainable_variables``
    with a leading problem axis; the model is evaluated at ``weights``, not its own variables.
    Models without a batched copy accept N = 1 only.
    """
    forward = batched_forward(model)
    pixels = batch_size * int(np.prod(input_shape))

    if forward is None:
        frozen = [v.value for v in model.non_trainable_variables]

        def forward(ws: list[tf.Tensor], images: tf.Tensor) -> tf.Tensor:
            if images.shape[0] != 1:
                raise ValueError(f"model {model.name} can only be attacked one problem at a time")
            logits, _ = model.stateless_call([w[0] for w in ws], frozen, images[0], training=False)
            return logits[None]

    def value_and_grad(z: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        with tf.GradientTape() as outer:
            outer.watch(z)
            images = tf.reshape(z[:, :pixels], (-1, batch_size, *input_shape))
            if learn_labels:
                targets = tf.nn.softmax(tf.reshape(z[:, pixels:], (-1, batch_size, num_classes)))
            else:
                targets = labels
            with tf.GradientTape() as inner:
                inner.watch(weights)
                logits = forward(list(weights), images)
                # Each problem's task loss (a mean over its examples); the sum's gradient with
                # respect to weights[i][n] is problem n's own parameter gradient.
                loss = tf.reduce_sum(
                    tf.reduce_mean(
                        -tf.reduce_sum(targets * tf.nn.log_softmax(logits, axis=-1), axis=-1),
                        axis=-1,
                    )
                )
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
    armijo: float | None = 1e-4,
) -> Callable[[tf.Tensor, tuple[tf.Tensor, ...], tf.Tensor], lbfgs.LbfgsResult]:
    """Returns the cached compiled loop ``loop(z0, weights, observed, labels) -> LbfgsResult``.

    ``z0`` [N, size] holds one flat start point per problem: the dummy images, followed by the
    dummy label logits when ``learn_labels`` (DLG); otherwise ``labels`` (one-hot, [N, batch,
    classes]) is used as given. ``weights`` and ``observed`` carry a leading problem axis.
    """
    architecture = architecture_key(model)
    key = (architecture, input_shape, batch_size, num_classes, learn_labels, iterations,
           history_size, armijo)  # fmt: skip
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
            value_and_grad,
            z0,
            max_iterations=iterations,
            history_size=history_size,
            armijo=armijo,
        )

    compiled = _compile(loop, key)
    _CACHE[key] = compiled
    return compiled


def _compile(loop: Callable[..., Any], key: Any) -> Callable[..., Any]:
    """Compiles with XLA, falling back to a plain graph if XLA cannot compile an op."""
    xla = tf.function(loop, jit_compile=True)
    graph = tf.function(loop)

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
