"""Model zoo: ``build_model(name, input_shape, num_classes, seed)`` returns a Keras model of logits.

Weights are drawn from a NumPy generator seeded by ``seed`` and assigned after building, one
draw per variable. This avoids a Keras pitfall: a seeded initializer *instance* returns the same
values for every variable of the same shape, so layers sharing it would get identical weights.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from leakbench.core.errors import ConfigError
from leakbench.core.registry import Registry

InputShape = tuple[int, int, int]
MODELS: Registry[Callable[[InputShape, int, int], keras.Model]] = Registry("model")


def _adopt(name: str, obj: object) -> bool:
    """Registers a plugin's model function ``(input_shape, num_classes, seed) -> keras.Model``
    (a model of logits with seeded weights, like the zoo's) as the model ``name``."""
    from leakbench.core.plugins import adopt_function

    return adopt_function(MODELS, name, obj)


MODELS.use_entry_points("leakbench.models", _adopt)


def build_model(name: str, input_shape: InputShape, num_classes: int, seed: int) -> keras.Model:
    """Builds a registered model with seeded weights, or loads a saved one.

    Args:
        name: Registered model name (see `MODELS`), or ``keras:PATH``, a saved Keras model
            with its trained weights (`leakbench.components.saved_models`; ``seed`` is then
            unused).
        input_shape: (height, width, channels) of one image.
        num_classes: Number of output logits.
        seed: Seed of every weight draw; the same seed gives the same weights.
    """
    from leakbench.components.saved_models import is_saved_model, load_saved_model

    if is_saved_model(name):
        height, width, channels = (int(d) for d in input_shape)
        return load_saved_model(name, (height, width, channels), int(num_classes))
    factory = MODELS.get(name)
    if len(input_shape) != 3 or min(input_shape) < 1:
        raise ConfigError(f"model {name}: input_shape must be (height, width, channels)")
    if num_classes < 2:
        raise ConfigError(f"model {name}: num_classes must be >= 2, got {num_classes}")
    height, width, channels = (int(d) for d in input_shape)
    return factory((height, width, channels), int(num_classes), int(seed))


def task_loss(logits: tf.Tensor, targets: tf.Tensor) -> tf.Tensor:
    """Mean cross-entropy of ``logits`` against (soft) label distributions ``targets``.

    Written as ``-sum(y * log_softmax(logits))`` on purpose: the fused
    ``softmax_cross_entropy_with_logits`` op has no correct second derivative with respect to
    soft labels, which DLG's joint image + label optimisation needs (DESIGN.md, pitfalls).
    """
    return tf.reduce_mean(-tf.reduce_sum(targets * tf.nn.log_softmax(logits, axis=-1), axis=-1))


def forward_training() -> bool:
    """The ``training`` flag of every forward pass whose gradient leakbench computes: True.

    The one owner of the model's forward mode: the client's shared gradient
    (`leakbench.client`), the per-example gradients of example-level defenses, the attacker's
    dummy gradients (`leakbench.attacks.engine.matching`), label recovery and the utility
    training steps all ask here. Training mode is how Keras trains and how clients compute the
    gradients they share: BatchNorm normalises each batch with that batch's own mean and
    variance (the examples of a batch interact, and the attacker's dummy batch must be
    normalised by its own statistics too), and the training steps update the moving statistics
    that inference (`leakbench.client.training.evaluate`) then uses. Every forward pass here is
    stateless (`stateless_forward`): computing a gradient never changes a model's variables;
    only `leakbench.client.training.DefendedTrainer` writes the updated statistics back.
    """
    return True


def stateless_forward(
    model: keras.Model,
    images: tf.Tensor,
    trainable: list[tf.Tensor] | None = None,
    non_trainable: list[tf.Tensor] | None = None,
) -> tuple[tf.Tensor, list[tf.Tensor]]:
    """The logits of ``images`` in `forward_training`'s mode and the non-trainable values
    (BatchNorm's moving statistics) that forward pass would leave; the model is not changed.

    ``trainable`` and ``non_trainable`` are the values to evaluate the model at, ordered like
    its variables; None means the variables' current values.
    """
    logits, state, _ = stateless_forward_and_penalty(model, images, trainable, non_trainable)
    return logits, state


def stateless_forward_and_penalty(
    model: keras.Model,
    images: tf.Tensor,
    trainable: list[tf.Tensor] | None = None,
    non_trainable: list[tf.Tensor] | None = None,
) -> tuple[tf.Tensor, list[tf.Tensor], tf.Tensor]:
    """`stateless_forward` and the sum of the losses the model's layers add to the task loss
    (PRECODE's KL term; 0 for the other models): the training objective is `task_loss` plus
    this penalty, so the client's gradient, and an attacker's dummy gradient, include it."""
    if trainable is None:
        trainable = [tf.convert_to_tensor(v) for v in model.trainable_variables]
    if non_trainable is None:
        non_trainable = [tf.convert_to_tensor(v) for v in model.non_trainable_variables]
    logits, state, losses = model.stateless_call(
        trainable, non_trainable, images, training=forward_training(), return_losses=True
    )
    penalty = tf.add_n(list(losses)) if losses else tf.zeros([], logits.dtype)
    return logits, list(state), penalty


def loss_gradients_and_state(
    model: keras.Model,
    images: tf.Tensor,
    targets: tf.Tensor,
    non_trainable: list[tf.Tensor] | None = None,
) -> tuple[tf.Tensor, list[tf.Tensor], list[tf.Tensor]]:
    """The training loss of the batch (`task_loss` plus the layers' penalty,
    `stateless_forward_and_penalty`), its gradient with respect to
    ``model.trainable_variables``, and the updated non-trainable values of the forward pass (at
    ``non_trainable`` if given); the model is not changed."""
    trainable = [tf.convert_to_tensor(v) for v in model.trainable_variables]
    with tf.GradientTape() as tape:
        tape.watch(trainable)
        logits, state, penalty = stateless_forward_and_penalty(
            model, images, trainable, non_trainable
        )
        loss = task_loss(logits, targets) + penalty
    grads = tape.gradient(loss, trainable, unconnected_gradients=tf.UnconnectedGradients.ZERO)
    return loss, grads, state


def loss_and_gradients(
    model: keras.Model, images: tf.Tensor, targets: tf.Tensor
) -> tuple[tf.Tensor, list[tf.Tensor]]:
    """`task_loss` of the batch and its gradient with respect to ``model.trainable_variables``."""
    loss, grads, _ = loss_gradients_and_state(model, images, targets)
    return loss, grads


def model_gradients(model: keras.Model, images: tf.Tensor, targets: tf.Tensor) -> list[tf.Tensor]:
    """Gradient of `task_loss` with respect to ``model.trainable_variables`` (a client's update)."""
    return loss_and_gradients(model, images, targets)[1]


def batch_norm_layers(model: keras.Model) -> list[keras.layers.BatchNormalization]:
    """The model's BatchNorm layers in the order the forward pass reaches them."""
    return [
        layer
        for layer in model._flatten_layers(include_self=False)  # noqa: SLF001 (Keras' own walk)
        if isinstance(layer, keras.layers.BatchNormalization)
    ]


def examples_interact(model: keras.Model) -> bool:
    """Whether a training-mode forward pass mixes the examples of a batch (BatchNorm's batch
    statistics): then a batch's gradient is not the mean of its examples' gradients."""
    return bool(batch_norm_layers(model))


def head_layer(model: keras.Model) -> keras.layers.Dense:
    """The model's output layer: its last layer, a dense layer from the representation (a
    vector per example) to the logits. Every model of the zoo ends with one.

    Raises:
        ConfigError: If the model does not end with a dense layer on vectors.
    """
    head = model.layers[-1] if model.layers else None
    if not isinstance(head, keras.layers.Dense) or len(head.input.shape) != 2:
        raise ConfigError(
            f"model {model.name} does not end with a dense layer on a feature vector; Soteria, "
            'PRECODE and match = "features" need one'
        )
    return head


def _positions(model: keras.Model, variables: list[Any]) -> list[int]:
    """Where each of ``variables`` sits in ``model.trainable_variables``."""
    position = {id(v): i for i, v in enumerate(model.trainable_variables)}
    return [position[id(v)] for v in variables]


def head_start(model: keras.Model) -> int:
    """Index, in ``model.trainable_variables``, of the first variable of the model's head:
    its output layer, or the variational bottleneck before it (PRECODE). The variables before
    it are the feature extractor's, whose gradients an adaptive attack matches alone."""
    first = min(_positions(model, head_layer(model).trainable_variables))
    for layer in model.layers:
        if getattr(layer, "stochastic", False) and layer.trainable_variables:
            first = min(first, *_positions(model, layer.trainable_variables))
    return first


def head_kernel_index(model: keras.Model) -> int:
    """Index of the output layer's kernel in ``model.trainable_variables``."""
    return _positions(model, [head_layer(model).kernel])[0]


def _part(model: keras.Model, outputs: Any) -> Callable[[list[tf.Tensor], tf.Tensor], Any]:
    """``part(trainable, images)``: the functional sub-model from the model's inputs to
    ``outputs``, evaluated statelessly in `forward_training`'s mode at ``trainable`` (ordered
    like ``model.trainable_variables``), with the current non-trainable values."""
    inner = keras.Model(model.inputs, outputs)
    picks = _positions(model, inner.trainable_variables)
    frozen = [tf.convert_to_tensor(v) for v in inner.non_trainable_variables]

    def part(trainable: list[tf.Tensor], images: tf.Tensor) -> Any:
        out, _ = inner.stateless_call(
            [trainable[i] for i in picks], frozen, images, training=forward_training()
        )
        return out

    return part


_REPRESENTATION: dict[int, tuple[keras.Model, Callable[..., Any]]] = {}


def representation_fn(model: keras.Model) -> Callable[[list[tf.Tensor], tf.Tensor], tf.Tensor]:
    """``representation(trainable, images) -> [B, F]``: the input of the output layer
    (`head_layer`) at the given trainable values; the model is not changed."""
    cached = _REPRESENTATION.get(id(model))
    if cached is None or cached[0] is not model:
        cached = (model, _part(model, head_layer(model).input))
        _REPRESENTATION[id(model)] = cached
    return cached[1]


StatisticsFn = Callable[[list[tf.Tensor], tf.Tensor], list[tf.Tensor]]
_STATISTICS: dict[int, tuple[keras.Model, StatisticsFn]] = {}


def batch_statistics_fn(model: keras.Model) -> StatisticsFn:
    """``statistics(trainable, images) -> [mean_1, variance_1, mean_2, ...]``: per BatchNorm
    layer (`batch_norm_layers`), the per-channel mean and (biased) variance of its input over
    every axis but the channels, as the layer normalises a batch in training mode.

    ``trainable`` holds the model's trainable values, ordered like
    ``model.trainable_variables``; the statistics are evaluated at them, not at the variables.
    The client (what a server that knows them observes) and the attacker's BatchNorm prior
    (`leakbench.attacks.priors.bn_statistics`) both compute them here.
    """
    cached = _STATISTICS.get(id(model))
    if cached is not None and cached[0] is model:
        return cached[1]
    layers = batch_norm_layers(model)
    if not layers:
        raise ValueError(f"model {model.name} has no BatchNorm layer")
    # The inputs of BatchNorm layers do not depend on the moving statistics in training mode
    # (only on the batch's own), so fixed values serve every weight state.
    inputs = _part(model, [layer.input for layer in layers])

    def statistics(trainable: list[tf.Tensor], images: tf.Tensor) -> list[tf.Tensor]:
        features = inputs(trainable, images)
        if not isinstance(features, (list, tuple)):
            features = [features]
        out: list[tf.Tensor] = []
        for feature in features:
            mean, variance = tf.nn.moments(feature, axes=list(range(len(feature.shape) - 1)))
            out += [mean, variance]
        return out

    _STATISTICS[id(model)] = (model, statistics)
    return statistics


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


def _seed_relu_weights(model: keras.Model, seed: int) -> None:
    """Assigns every trainable variable of a ReLU + BatchNorm model a draw from ``seed``.

    Convolution kernels are He-uniform, U(+-sqrt(6 / fan_in)), which keeps the activation scale
    of a ReLU stack; the dense kernel is Glorot-uniform, as in `mlp`; biases follow PyTorch's
    default, U(+-1 / sqrt(fan_in)), so that two layers of one width still get different biases.
    BatchNorm's gamma and beta are 1 and 0 (constants, not draws); its moving statistics are
    not trainable and keep Keras' initial values, mean 0 and variance 1.

    Raises:
        TypeError: If the model has a trainable variable of another kind of layer; a new
            layer type must be given an initialisation here rather than keep Keras' default.
    """
    rng = np.random.default_rng(seed)
    assigned: set[int] = set()
    for layer in model.layers:
        if isinstance(layer, (keras.layers.Conv2D, keras.layers.Dense)):
            shape = tuple(layer.kernel.shape)
            fan_in, fan_out = math.prod(shape[:-1]), shape[-1]
            if isinstance(layer, keras.layers.Conv2D):
                limit = math.sqrt(6.0 / fan_in)
            else:
                limit = math.sqrt(6.0 / (fan_in + fan_out))
            layer.kernel.assign(rng.uniform(-limit, limit, size=shape).astype(np.float32))
            assigned.add(id(layer.kernel))
            if layer.use_bias:
                bound = 1.0 / math.sqrt(fan_in)
                layer.bias.assign(rng.uniform(-bound, bound, size=(fan_out,)).astype(np.float32))
                assigned.add(id(layer.bias))
        elif isinstance(layer, keras.layers.BatchNormalization):
            layer.gamma.assign(np.ones(layer.gamma.shape, np.float32))
            layer.beta.assign(np.zeros(layer.beta.shape, np.float32))
            assigned.update((id(layer.gamma), id(layer.beta)))
    missed = [v.path for v in model.trainable_variables if id(v) not in assigned]
    if missed:
        raise TypeError(f"model {model.name}: no seeded initialisation for {', '.join(missed)}")


def _batch_norm(name: str | None = None) -> keras.layers.BatchNormalization:
    """A BatchNorm layer, run as Keras trains it (see `forward_training`).

    Every gradient in this project comes from a forward pass in training mode: each BatchNorm
    layer normalises a batch with that batch's per-channel mean and variance, so the examples
    of a batch interact, and utility and ``train_steps`` training update the moving statistics
    (momentum 0.9) that inference uses. The moving statistics start at mean 0 and variance 1.
    """
    # PyTorch's BatchNorm2d defaults (momentum 0.1 there is 0.9 here, epsilon 1e-5), which the
    # reference implementations use; Keras' own default epsilon is 1e-3.
    return keras.layers.BatchNormalization(momentum=0.9, epsilon=1e-5, name=name)


@MODELS.register("convnet")
def convnet(input_shape: InputShape, num_classes: int, seed: int) -> keras.Model:
    """The ConvNet of Geiping et al., "Inverting Gradients", NeurIPS 2020, at width 8.

    Eight blocks of 3x3 convolution (stride 1, zero padding 1, with bias), BatchNorm and ReLU,
    of 8, 16, 16, 32, 32, 32, 32, 32 channels (the paper's multiples 1, 2, 2, 4, 4, 4, 4, 4 of
    the width), a 3x3 max pool of stride 3 after the sixth and after the eighth block, then one
    dense layer from the flattened features to the logits (32x32 inputs: 32 -> 10 -> 3, so
    3 * 3 * 32 = 288 features).

    Differences from the paper's code (``inversefed.nn.models.ConvNet``): the width is 8, not
    64, so that attacks run on a CPU (48,634 trainable parameters instead of 2,904,970 for
    CIFAR-10); where a feature map is smaller than 3 pixels the pool window shrinks to it, so
    that inputs smaller than 9x9 still give at least one feature per channel (for inputs of 9
    pixels or more nothing changes); weights are drawn from ``seed`` as in
    `_seed_relu_weights`, not by PyTorch's initialisers.

    BatchNorm in training mode (see `_batch_norm`).
    """
    return _convnet(input_shape, num_classes, seed, width=8, name="convnet")


@MODELS.register("convnet64")
def convnet64(input_shape: InputShape, num_classes: int, seed: int) -> keras.Model:
    """The ConvNet of Geiping et al. at the paper's width 64: `convnet` with eight times the
    channels (64, 128, 128, 256, 256, 256, 256, 256; 2,904,970 trainable parameters for
    CIFAR-10, as the paper's code). Weights are drawn from ``seed`` as in `_seed_relu_weights`;
    BatchNorm in training mode (see `_batch_norm`)."""
    return _convnet(input_shape, num_classes, seed, width=64, name="convnet64")


@keras.saving.register_keras_serializable(package="leakbench")
class TiledMaxPooling2D(keras.layers.MaxPooling2D):
    """``MaxPooling2D`` over non-overlapping windows (stride = window, no padding, channels
    last), written so that its second derivative is exact under XLA.

    The gradient-matching attacks differentiate the parameter gradient with respect to the
    input, and so the derivative of max pooling's gradient (``MaxPoolGradGrad``). XLA lowers
    that op (tf2xla, on every device) by comparing the window's inputs rounded to bfloat16: where
    two inputs of a window agree to 8 significant bits it may take the value of the wrong one,
    and the attack objectives' input gradients on `convnet` came out wrong by 0.2% and more
    (`docs/xla_gradients.md`).
    Here each window's maximum is picked by a mask of its first largest input (``argmax``, in
    row-major window order: the input ``MaxPoolGrad`` routes the gradient to, under XLA and
    TensorFlow alike), and the output is the selected input, summed with zeros: the values and
    the gradient are ``MaxPooling2D``'s bit for bit, ties included, and every derivative is a
    selection by that constant mask, which XLA computes exactly. Windows that overlap or pad
    run ``MaxPooling2D`` itself.
    """

    def __init__(self, pool_size: tuple[int, int], **kwargs: Any) -> None:
        kwargs.setdefault("strides", pool_size)
        kwargs.setdefault("padding", "valid")
        super().__init__(pool_size, **kwargs)

    def call(self, inputs: tf.Tensor) -> tf.Tensor:
        ph, pw = self.pool_size
        tiled = (
            tuple(self.strides) == (ph, pw)
            and self.padding == "valid"
            and self.data_format == "channels_last"
        )
        if not tiled:
            return super().call(inputs)
        rows, cols, channels = inputs.shape[1] // ph, inputs.shape[2] // pw, inputs.shape[-1]
        tiles = tf.reshape(inputs[:, : rows * ph, : cols * pw], [-1, rows, ph, cols, pw, channels])
        # [-1, rows, cols, window, channels], the window's inputs in row-major order.
        windows = tf.reshape(
            tf.transpose(tiles, [0, 1, 3, 2, 4, 5]), [-1, rows, cols, ph * pw, channels]
        )
        index = tf.argmax(windows, axis=3, output_type=tf.int32)[:, :, :, None]
        first = tf.equal(tf.range(ph * pw)[:, None], index)  # the first largest of each window
        return tf.reduce_sum(tf.where(first, windows, tf.zeros_like(windows)), axis=3)


def _convnet(
    input_shape: InputShape, num_classes: int, seed: int, *, width: int, name: str
) -> keras.Model:
    height, wide, _ = input_shape
    layers: list[keras.layers.Layer] = [keras.Input(shape=input_shape)]
    for index, multiple in enumerate((1, 2, 2, 4, 4, 4, 4, 4)):
        layers += [
            keras.layers.Conv2D(multiple * width, 3, padding="same"),
            _batch_norm(),
            keras.layers.ReLU(),
        ]
        if index in (5, 7):
            pool = (min(3, height), min(3, wide))
            layers.append(TiledMaxPooling2D(pool))
            height, wide = height // pool[0], wide // pool[1]
    layers += [keras.layers.Flatten(), keras.layers.Dense(num_classes)]
    model = keras.Sequential(layers, name=name)
    _seed_relu_weights(model, seed)
    return model


def _conv3x3(x: keras.KerasTensor, filters: int, stride: int, name: str) -> keras.KerasTensor:
    """A 3x3 convolution without bias (the BatchNorm after it has one) and PyTorch's padding."""
    if stride == 1:
        return keras.layers.Conv2D(filters, 3, padding="same", use_bias=False, name=name)(x)
    # Keras' "same" pads a strided convolution on the bottom and right only; an explicit
    # one-pixel border gives PyTorch's padding=1 geometry on every input size.
    x = keras.layers.ZeroPadding2D(1, name=f"{name}_pad")(x)
    conv = keras.layers.Conv2D(filters, 3, strides=stride, use_bias=False, name=name)
    return conv(x)


def _basic_block(x: keras.KerasTensor, filters: int, stride: int, name: str) -> keras.KerasTensor:
    """He et al.'s basic residual block: two 3x3 convolutions, with a 1x1 projection on the
    shortcut where the block changes the number of channels or the resolution."""
    y = _conv3x3(x, filters, stride, f"{name}_conv1")
    y = keras.layers.ReLU(name=f"{name}_relu1")(_batch_norm(f"{name}_bn1")(y))
    y = _batch_norm(f"{name}_bn2")(_conv3x3(y, filters, 1, f"{name}_conv2"))
    shortcut = x
    if stride != 1 or x.shape[-1] != filters:
        project = keras.layers.Conv2D(
            filters, 1, strides=stride, use_bias=False, name=f"{name}_proj"
        )
        shortcut = _batch_norm(f"{name}_proj_bn")(project(x))
    y = keras.layers.Add(name=f"{name}_add")([y, shortcut])
    return keras.layers.ReLU(name=f"{name}_relu2")(y)


@MODELS.register("resnet")
def resnet(input_shape: InputShape, num_classes: int, seed: int) -> keras.Model:
    """A small ResNet for 32x32 images (He et al., "Deep Residual Learning", CVPR 2016).

    A 3x3 stem convolution of 16 channels with BatchNorm and ReLU, then three stages of one
    basic block each, of 16, 32 and 64 channels with strides 1, 2 and 2 (a 3x3 convolution,
    BatchNorm, ReLU, a 3x3 convolution, BatchNorm, the shortcut added, ReLU; the shortcut is a
    1x1 convolution with BatchNorm where the shape changes, else the identity), global average
    pooling and one dense layer to the logits. It is the CIFAR ResNet-8 of the paper's section
    4.2 (n = 1), except that the shortcuts are projections rather than zero-padded identities.
    Convolutions have no bias (BatchNorm's beta follows each); padding is PyTorch's, one pixel
    on every side, so any input size builds. 78,042 trainable parameters for CIFAR-10. Weights
    are drawn from ``seed`` as in `_seed_relu_weights`. BatchNorm in training mode (see
    `_batch_norm`).
    """
    # Every layer is named: a functional model's config refers to the layers feeding each
    # layer by name, and Keras' numbered default names would make `architecture_key` differ
    # between two builds of the same architecture.
    stages = ((16, 1), (32, 2), (64, 2))
    return _resnet(input_shape, num_classes, seed, stages, blocks=1, name="resnet")


@MODELS.register("resnet18")
def resnet18(input_shape: InputShape, num_classes: int, seed: int) -> keras.Model:
    """ResNet-18 in its CIFAR form (He et al., 2016; as in Geiping et al.'s and breaching's
    code): a 3x3 stem convolution of 64 channels with BatchNorm and ReLU (no max pool), four
    stages of two basic blocks each, of 64, 128, 256 and 512 channels with strides 1, 2, 2 and
    2, global average pooling and one dense layer; 11,173,962 trainable parameters for
    CIFAR-10. Blocks and padding as in `resnet`; weights drawn from ``seed``; BatchNorm in
    training mode (see `_batch_norm`)."""
    stages = ((64, 1), (128, 2), (256, 2), (512, 2))
    return _resnet(input_shape, num_classes, seed, stages, blocks=2, name="resnet18")


def _resnet(
    input_shape: InputShape,
    num_classes: int,
    seed: int,
    stages: tuple[tuple[int, int], ...],
    *,
    blocks: int,
    name: str,
) -> keras.Model:
    inputs = keras.Input(shape=input_shape, name="images")
    stem = stages[0][0]
    x = _batch_norm("stem_bn")(_conv3x3(inputs, stem, 1, "stem_conv"))
    x = keras.layers.ReLU(name="stem_relu")(x)
    for stage, (filters, stride) in enumerate(stages, start=1):
        for block in range(blocks):
            # One block per stage keeps `resnet`'s layer names (and so its architecture key).
            label = f"stage{stage}" if blocks == 1 else f"stage{stage}_block{block + 1}"
            x = _basic_block(x, filters, stride if block == 0 else 1, label)
    x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
    model = keras.Model(inputs, keras.layers.Dense(num_classes, name="logits")(x), name=name)
    _seed_relu_weights(model, seed)
    return model
