"""What a careful client can see of a malicious model: how much one example dominates its update.

A malicious server's model makes the client's update carry single examples (an imprint block's
highest occupied unit, a trap unit that one input fires). Garov et al. ("Hiding in Plain Sight:
Disguising Data Stealing Attacks in Federated Learning", ICLR 2024) check for this with a
disaggregation signal-to-noise ratio (D-SNR) of the update. The formulation here is
leakbench's own, computed per output unit, the finest part of a layer that one example can
own:

    D-SNR(unit) = max_n |g_n| / sum_{m != n} |g_m|

where ``g_n`` is example ``n``'s share of the gradient of the unit's weights (a dense kernel's
column, a convolution's output channel, one entry of a bias or a BatchNorm scale) and ``|.|``
its Euclidean norm. A layer's D-SNR is the largest over its units, the model's the largest over
its layers but the output layer: its units are the classes, and a class that only one example
of the batch holds (or that only one example is predicted as, in a saturated model) makes its
unit that example's in any model, honest or not. An honest model spreads every unit's
gradient over the batch (values near ``1 / (B - 1)``); a unit that only one example reaches
gives infinity. A batch of one example has no D-SNR (NaN): any update is that example's.

The client computes it on the undefended update of the model it received, before it trains,
as `leakbench.run.execute` does for every trial when ``[threat_model] detect`` is on (and
always under a malicious server); `threshold` gives the level above which it refuses the model.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import keras
import numpy as np
import tensorflow as tf

from leakbench.components.forward import batch_norm_layers
from leakbench.components.per_example import per_example_gradients

# The D-SNR above which a client flags the model it received, by its batch size: the largest
# D-SNR of an honest model of the zoo at that batch size, rounded up at its first significant
# digit (`benchmarks/dsnr_calibration.py`, results/malicious/calibration.csv: digits and
# CIFAR-10, seven models, five seeds each; no false alarm there by construction). A batch
# between two calibrated sizes takes the smaller size's threshold (the larger value), a batch
# above 64 the threshold of 64. At two examples honest models reach infinity (a ReLU unit that
# one of the two examples fires), so a client of two examples cannot tell.
THRESHOLDS: dict[int, float] = {2: np.inf, 4: 70.0, 8: 5.0, 16: 3.0, 32: 0.8, 64: 0.7}


def threshold(batch_size: int) -> float:
    """The D-SNR threshold of a client with ``batch_size`` examples (NaN for one example)."""
    sizes = [size for size in THRESHOLDS if size <= batch_size]
    return THRESHOLDS[max(sizes)] if sizes else float("nan")


class Detection(NamedTuple):
    """A client's D-SNR check of one update: the model's D-SNR, the layer that gives it, and
    whether it exceeds the threshold."""

    dsnr: float
    layer: str
    flagged: bool


def example_gradients(
    model: keras.Model, images: tf.Tensor, targets: tf.Tensor
) -> list[np.ndarray]:
    """Each example's share of the batch gradient of the mean task loss, one array ``[B,
    *variable.shape]`` per trainable variable.

    Without BatchNorm the shares are the per-example gradients over ``B`` and sum to the batch
    gradient. With BatchNorm in training mode the examples interact only through each layer's
    batch statistics; the shares are then taken with those statistics held at the batch's
    values (each BatchNorm normalising by them as constants), so that example ``n``'s share is
    what flows through its own path: the part a layer's weights receive from that example's
    inputs, as a client checking its update would split it.
    """
    batch = int(images.shape[0])
    if not batch_norm_layers(model):
        return [np.asarray(g) / batch for g in per_example_gradients(model, images, targets)]
    statistics: dict[int, tuple[tf.Tensor, tf.Tensor]] = {}
    _walk(model, tf.convert_to_tensor(images), _normalising(statistics, record=True))
    frozen = _normalising(statistics, record=False)
    variables = model.trainable_variables
    shares = []
    for n in range(batch):
        with tf.GradientTape() as tape:
            logits = _walk(model, tf.convert_to_tensor(images[n : n + 1]), frozen)
            loss = -tf.reduce_sum(targets[n : n + 1] * tf.nn.log_softmax(logits, axis=-1)) / batch
        grads = tape.gradient(loss, variables, unconnected_gradients=tf.UnconnectedGradients.ZERO)
        shares.append([np.asarray(g) for g in grads])
    return [np.stack([share[i] for share in shares]) for i in range(len(variables))]


def _walk(model: keras.Model, images: tf.Tensor, operation_fn: Callable[[Any], Any]) -> tf.Tensor:
    """The model's forward pass with each layer called through ``operation_fn(layer)``."""
    if isinstance(model, keras.Sequential):
        out = images
        for layer in model.layers:
            out = operation_fn(layer)(out)
        return out
    return model._run_through_graph(images, operation_fn=operation_fn)  # noqa: SLF001


def _normalising(
    statistics: dict[int, tuple[tf.Tensor, tf.Tensor]], *, record: bool
) -> Callable[[Any], Any]:
    """An ``operation_fn`` that runs every layer as it is, except BatchNorm, which normalises
    by the statistics of its input (``record``: the batch's, kept in ``statistics``) or by
    those kept (the batch's, as constants)."""

    def operation(layer: Any) -> Any:
        if not isinstance(layer, keras.layers.BatchNormalization):
            return layer

        def normalise(inputs: tf.Tensor, **_: Any) -> tf.Tensor:
            if record:
                axes = list(range(len(inputs.shape) - 1))
                statistics[id(layer)] = tf.nn.moments(inputs, axes=axes)
            mean, variance = statistics[id(layer)]
            out = (inputs - mean) / tf.sqrt(variance + layer.epsilon)
            if layer.scale:
                out = out * layer.gamma
            if layer.center:
                out = out + layer.beta
            return out

        return normalise

    return operation


def unit_dsnr(shares: np.ndarray) -> np.ndarray:
    """The D-SNR of every output unit (the last axis) of one variable, from the examples'
    shares of its gradient, ``[B, ..., units]``; NaN for a batch of one."""
    shares = np.asarray(shares, np.float64)
    batch = shares.shape[0]
    units = shares.shape[-1] if shares.ndim > 1 else 1
    norms = np.sqrt(np.sum(shares.reshape(batch, -1, units) ** 2, axis=1))
    if batch < 2:
        return np.full(norms.shape[-1], np.nan)
    ordered = np.sort(norms, axis=0)
    largest, others = ordered[-1], ordered[:-1].sum(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(others > 0, largest / others, np.where(largest > 0, np.inf, 0.0))
    return ratio


def layer_dsnr(model: keras.Model, images: tf.Tensor, targets: tf.Tensor) -> dict[str, float]:
    """Each layer's D-SNR (the largest of its variables' units) on the batch ``images``, the
    output layer left out."""
    out: dict[str, float] = {}
    shares = example_gradients(model, images, targets)
    head = {id(v) for v in model.layers[-1].trainable_variables}
    for variable, share in zip(model.trainable_variables, shares, strict=True):
        if id(variable) in head:
            continue  # the output layer: one unit per class, owned by a class's lone example
        layer = variable.path.rsplit("/", 1)[0]
        value = float(np.max(unit_dsnr(share)))
        out[layer] = max(out.get(layer, -np.inf), value) if not np.isnan(value) else np.nan
    return out


def detect(
    model: keras.Model, images: tf.Tensor, targets: tf.Tensor, limit: float | None = None
) -> Detection:
    """The client's check of the batch ``images``: the model's D-SNR (its largest layer's)
    and whether it exceeds ``limit`` (default: `threshold` of the batch size); a batch of one
    is never flagged (NaN D-SNR)."""
    layers = layer_dsnr(model, images, targets)
    if not layers or any(np.isnan(v) for v in layers.values()):
        return Detection(float("nan"), "", False)
    limit = threshold(int(images.shape[0])) if limit is None else limit
    layer = max(layers, key=lambda name: layers[name])
    return Detection(layers[layer], layer, bool(layers[layer] > limit))
