"""Model zoo: ``build_model(name, input_shape, num_classes, seed)`` returns a Keras model of logits.

Weights are drawn from a NumPy generator seeded by ``seed`` and assigned after building, one
draw per variable. This avoids a Keras pitfall: a seeded initializer *instance* returns the same
values for every variable of the same shape, so layers sharing it would get identical weights.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from leakbench.errors import ConfigError
from leakbench.registry import Registry

InputShape = tuple[int, int, int]
MODELS: Registry[Callable[[InputShape, int, int], keras.Model]] = Registry("model")


def build_model(name: str, input_shape: InputShape, num_classes: int, seed: int) -> keras.Model:
    """Builds a registered model with seeded weights.

    Args:
        name: Registered model name (see `MODELS`).
        input_shape: (height, width, channels) of one image.
        num_classes: Number of output logits.
        seed: Seed of every weight draw; the same seed gives the same weights.
    """
    factory = MODELS.get(name)
    if len(input_shape) != 3 or min(input_shape) < 1:
        raise ConfigError(f"model {name}: input_shape must be (height, width, channels)")
    if num_classes < 2:
        raise ConfigError(f"model {name}: num_classes must be >= 2, got {num_classes}")
    return factory(tuple(int(d) for d in input_shape), int(num_classes), int(seed))


def task_loss(logits: tf.Tensor, targets: tf.Tensor) -> tf.Tensor:
    """Mean cross-entropy of ``logits`` against (soft) label distributions ``targets``.

    Written as ``-sum(y * log_softmax(logits))`` on purpose: the fused
    ``softmax_cross_entropy_with_logits`` op has no correct second derivative with respect to
    soft labels, which DLG's joint image + label optimisation needs (DESIGN.md, pitfalls).
    """
    return tf.reduce_mean(-tf.reduce_sum(targets * tf.nn.log_softmax(logits, axis=-1), axis=-1))


def loss_and_gradients(
    model: keras.Model, images: tf.Tensor, targets: tf.Tensor
) -> tuple[tf.Tensor, list[tf.Tensor]]:
    """`task_loss` of the batch and its gradient with respect to ``model.trainable_variables``."""
    with tf.GradientTape() as tape:
        loss = task_loss(model(images, training=False), targets)
    return loss, tape.gradient(loss, model.trainable_variables)


def model_gradients(model: keras.Model, images: tf.Tensor, targets: tf.Tensor) -> list[tf.Tensor]:
    """Gradient of `task_loss` with respect to ``model.trainable_variables`` (a client's update)."""
    return loss_and_gradients(model, images, targets)[1]


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


@MODELS.register("lenet")
def lenet(input_shape: InputShape, num_classes: int, seed: int) -> keras.Model:
    """The LeNet variant of Zhu et al., "Deep Leakage from Gradients", NeurIPS 2019.

    Three 5x5 convolutions of 12 channels with strides 2, 2, 1 and zero padding 2 (written as an
    explicit padding layer so that every input size gives PyTorch's output sizes), sigmoid
    activations, then one dense layer to the logits. Every weight and bias is U(-0.5, 0.5), as in
    the paper's code; sigmoid keeps the network twice differentiable, which the attack needs.
    """
    layers: list[keras.layers.Layer] = [keras.Input(shape=input_shape)]
    for stride in (2, 2, 1):
        layers += [
            keras.layers.ZeroPadding2D(2),
            keras.layers.Conv2D(12, 5, strides=stride, padding="valid", activation="sigmoid"),
        ]
    layers += [keras.layers.Flatten(), keras.layers.Dense(num_classes)]
    model = keras.Sequential(layers, name="lenet")
    rng = np.random.default_rng(seed)
    for var in model.trainable_variables:
        var.assign(rng.uniform(-0.5, 0.5, size=var.shape).astype(np.float32))
    return model


@MODELS.register("mlp")
def mlp(input_shape: InputShape, num_classes: int, seed: int) -> keras.Model:
    """A multilayer perceptron: flatten, dense 256 (sigmoid, with bias), dense to the logits.

    The first layer has a bias, which makes the input exactly recoverable from one example's
    gradient (Phong et al., "Privacy-Preserving Deep Learning via Additively Homomorphic
    Encryption", 2017). Kernels are Glorot-uniform, biases U(-0.1, 0.1), all from ``seed``.
    """
    model = keras.Sequential(
        [
            keras.Input(shape=input_shape),
            keras.layers.Flatten(),
            keras.layers.Dense(256, activation="sigmoid"),
            keras.layers.Dense(num_classes),
        ],
        name="mlp",
    )
    rng = np.random.default_rng(seed)
    for var in model.trainable_variables:
        if len(var.shape) == 2:
            limit = np.sqrt(6.0 / (var.shape[0] + var.shape[1]))
            value = rng.uniform(-limit, limit, size=var.shape)
        else:
            value = rng.uniform(-0.1, 0.1, size=var.shape)
        var.assign(value.astype(np.float32))
    return model
