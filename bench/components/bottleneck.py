"""PRECODE's variational bottleneck and the models a defense's architecture change builds.

`with_architecture(model, ("variational_bottleneck", K, beta), seed)` returns the model with a
`VariationalBottleneck` between its representation and its output layer (Scheliga et al.,
"PRECODE", WACV 2022). The layer samples in every forward pass; its noise comes from a
stateless draw keyed by a non-trainable seed variable, so a forward pass is a pure function of
its inputs and that seed: the client puts the defense's draw there (`with_noise_seed`), the
server's attack evaluates the model with the seed the variable holds, which is not the client's.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from leakbench.components.forward import head_layer

# Noise given by the caller for the forward passes traced inside `given_noise` (the attacker
# that learns the client's draw); empty: every forward pass draws its own.
_GIVEN: list[tf.Tensor] = []


@contextlib.contextmanager
def given_noise(noise: tf.Tensor) -> Iterator[None]:
    """Inside the block, a model's bottleneck uses ``noise`` ([B, size]) as its ``eps``
    instead of drawing it: forward passes traced here are differentiable in the noise, which an
    attacker optimises with the images (`noise_width`). Only models with one bottleneck."""
    _GIVEN.append(noise)
    try:
        yield
    finally:
        _GIVEN.pop()


def noise_width(model: keras.Model) -> int:
    """How many noise values one example's forward pass draws (PRECODE's ``size``, 0 for a
    deterministic model)."""
    layers = _bottlenecks(model)
    if len(layers) > 1:
        raise ValueError(f"model {model.name} has {len(layers)} stochastic layers; 1 is supported")
    return layers[0].size if layers else 0


class VariationalBottleneck(keras.layers.Layer):
    """``h -> decoder(mu + softplus(s) * eps)`` with ``[mu, s] = encoder(h)`` and ``eps ~
    N(0, I)`` of width ``size``, as PRECODE's code samples (in training and inference alike).
    It adds ``beta`` times `kl_to_standard_normal` to the training loss (Keras ``add_loss``;
    `leakbench.components.forward.stateless_forward_and_penalty` collects it).

    ``eps`` is ``tf.random.stateless_normal`` keyed by the layer's ``noise_seed`` (an int32
    pair, not trainable).
    """

    # `leakbench.components.forward.head_start` counts a stochastic layer's variables as the head's.
    stochastic = True

    def __init__(self, size: int, beta: float = 1e-3, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.size = int(size)
        self.beta = float(beta)

    def build(self, input_shape: tuple[int | None, ...]) -> None:
        last = input_shape[-1]
        if last is None:
            raise ValueError(f"{self.name}: the last axis of the input must have a known size")
        width = int(last)
        self.encoder = keras.layers.Dense(2 * self.size, name="encoder")
        self.encoder.build((None, width))
        self.decoder = keras.layers.Dense(width, name="decoder")
        self.decoder.build((None, self.size))
        self.noise_seed = self.add_weight(
            shape=(2,), dtype="int32", initializer="zeros", trainable=False, name="noise_seed"
        )

    def call(self, features: tf.Tensor) -> tf.Tensor:
        statistics = self.encoder(features)
        mean, spread = statistics[:, : self.size], tf.nn.softplus(statistics[:, self.size :])
        if _GIVEN:
            noise = tf.cast(_GIVEN[-1], mean.dtype)
        else:
            noise = tf.random.stateless_normal(
                tf.shape(mean), seed=tf.convert_to_tensor(self.noise_seed), dtype=mean.dtype
            )
        if self.beta:
            self.add_loss(self.beta * kl_to_standard_normal(mean, spread))
        return self.decoder(mean + spread * noise)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "size": self.size, "beta": self.beta}


def kl_to_standard_normal(mean: tf.Tensor, spread: tf.Tensor) -> tf.Tensor:
    """``KL(N(mean, spread^2) || N(0, I))`` in bits, summed over the units and averaged over
    the batch, as PRECODE's code adds it (times ``beta``) to the training loss."""
    nats = -0.5 * tf.reduce_sum(
        1.0 + 2.0 * tf.math.log(spread) - tf.square(mean) - tf.square(spread), axis=-1
    )
    return tf.reduce_mean(nats) / math.log(2.0)


def with_architecture(model: keras.Model, architecture: tuple[Any, ...], seed: int) -> keras.Model:
    """``model`` extended as ``architecture`` says (a defense's `Defense.architecture`).

    The layers before the output layer are shared with ``model`` (same variables), the output
    layer is a copy with the same weights, so the extended model starts from the base model's
    weights; the new layers' weights are drawn from ``seed`` (PyTorch's default for linear
    layers, U(+-1 / sqrt(fan_in)), as PRECODE's code gets them).
    """
    kind, size, beta = architecture
    if kind != "variational_bottleneck":
        raise ValueError(f"unknown architecture change {kind!r}")
    head = head_layer(model)
    trunk = keras.Model(model.inputs, head.input, name=f"{model.name}_features")
    images = keras.Input(shape=model.input_shape[1:])
    bottleneck = VariationalBottleneck(size, beta, name="precode")
    output = keras.layers.Dense.from_config({**head.get_config(), "name": "output"})
    logits = output(bottleneck(trunk(images)))
    extended = keras.Model(images, logits, name=f"{model.name}_precode")
    output.set_weights(head.get_weights())
    rng = np.random.default_rng([seed, 0x9EC0DE])
    for layer in (bottleneck.encoder, bottleneck.decoder):
        bound = 1.0 / math.sqrt(int(layer.kernel.shape[0]))
        for var in (layer.kernel, layer.bias):
            var.assign(rng.uniform(-bound, bound, size=var.shape).astype(np.float32))
    return extended


def noise_seed_positions(model: keras.Model) -> list[int]:
    """Where the noise seeds of the model's stochastic layers sit in
    ``model.non_trainable_variables``."""
    seeds = {id(layer.noise_seed) for layer in _bottlenecks(model)}
    return [i for i, v in enumerate(model.non_trainable_variables) if id(v) in seeds]


def _bottlenecks(model: keras.Model) -> list[VariationalBottleneck]:
    """The model's variational bottlenecks, nested models included."""
    return [
        layer
        for layer in model._flatten_layers(include_self=False)  # noqa: SLF001 (Keras' own walk)
        if isinstance(layer, VariationalBottleneck)
    ]


def with_noise_seed(
    model: keras.Model, non_trainable: list[tf.Tensor], seed: tf.Tensor
) -> list[tf.Tensor]:
    """``non_trainable`` with every stochastic layer's noise seed replaced by ``seed`` (folded
    with the layer's position, so two such layers draw apart)."""
    out = list(non_trainable)
    for k, i in enumerate(noise_seed_positions(model)):
        folded = tf.random.experimental.stateless_fold_in(tf.cast(seed, tf.int64), k)
        out[i] = tf.cast(folded, tf.int32)
    return out
