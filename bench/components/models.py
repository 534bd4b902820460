"""Model zoo: ``build_model(name, input_shape, num_classes, seed)`` returns a Keras model of logits.

`MODELS` holds every model, of every modality (`leakbench.components.model_registry`): the image
zoo below, and the language models of `leakbench.components.text_models`, imported here so that
they are registered too; `build_model` builds the image ones.

Weights are drawn from a NumPy generator seeded by ``seed`` and assigned after building, one
draw per variable. This avoids a Keras pitfall: a seeded initializer *instance* returns the same
values for every variable of the same shape, so layers sharing it would get identical weights.
"""

from __future__ import annotations

import math
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from leakbench.components import text_models  # noqa: F401  (registers the text models)
from leakbench.components.model_registry import MODELS
from leakbench.components.saved_models import is_saved_model, load_saved_model
from leakbench.core.errors import ConfigError

InputShape = tuple[int, int, int]


def build_model(name: str, input_shape: InputShape, num_classes: int, seed: int) -> keras.Model:
    """Builds a registered model with seeded weights, or loads a saved one.

    Args:
        name: An image model of `MODELS` (a text model is refused), or ``keras:PATH``, a saved
            Keras model with its trained weights (`leakbench.components.saved_models`; ``seed``
            is then unused).
        input_shape: (height, width, channels) of one image.
        num_classes: Number of output logits.
        seed: Seed of every weight draw; the same seed gives the same weights.

    Raises:
        UnknownNameError: If ``name`` is not an image model of `MODELS`.
    """
    if is_saved_model(name):
        height, width, channels = (int(d) for d in input_shape)
        return load_saved_model(name, (height, width, channels), int(num_classes))
    factory = MODELS.get(name, modality="image")
    if len(input_shape) != 3 or min(input_shape) < 1:
        raise ConfigError(f"model {name}: input_shape must be (height, width, channels)")
    if num_classes < 2:
        raise ConfigError(f"model {name}: num_classes must be >= 2, got {num_classes}")
    height, width, channels = (int(d) for d in input_shape)
    return factory((height, width, channels), int(num_classes), int(seed))


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
    """A BatchNorm layer, run as Keras trains it (`leakbench.components.forward.forward_training`).

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
    # layer by name, and Keras' numbered default names would make the architecture's key
    # (`leakbench.components.forward.architecture_key`) differ between two builds of it.
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
