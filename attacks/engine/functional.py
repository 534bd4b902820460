"""A batched functional copy of a Keras model: N independent problems, each with its own weights.

A batched attack optimises N dummy inputs at once, and each needs the gradient of *its own* loss
with respect to the model's weights. With one shared set of weights, autodiff would return the
sum of those N gradients; here every problem gets its own copy of each weight tensor (a leading
axis of size N), so ``d(sum of losses) / d(weights[n])`` is problem ``n``'s gradient alone and no
op mixes problems: a NaN in one problem cannot reach another.

Convolutions are written as im2col (one gather of every kernel tap at every output position)
followed by a batched matrix product with the problem's kernel. Every op here has a first and
second derivative that XLA compiles, which the gradient-matching attacks need (they
differentiate the parameter gradient with respect to the input).

`batched_forward` supports Sequential models built from InputLayer, ZeroPadding2D, Conv2D,
Dense, Flatten and Activation layers, and returns None for any other model, so callers can fall
back to the Keras model itself.
"""

from __future__ import annotations

from collections.abc import Callable

import keras
import numpy as np
import tensorflow as tf

BatchedForward = Callable[[list[tf.Tensor], tf.Tensor], tf.Tensor]

_ACTIVATIONS: dict[str, Callable[[tf.Tensor], tf.Tensor]] = {
    "linear": lambda x: x,
    "sigmoid": tf.sigmoid,
    "relu": tf.nn.relu,
    "tanh": tf.tanh,
    "softplus": tf.nn.softplus,
}

Step = Callable[[tf.Tensor, list[tf.Tensor]], tf.Tensor]


@tf.autograph.experimental.do_not_convert
def batched_forward(model: keras.Model) -> BatchedForward | None:
    """A function ``(weights, x) -> logits`` for N problems, or None if a layer is unsupported.

    Args:
        model: A Keras Sequential model.

    The returned function takes ``weights``, ordered like ``model.trainable_variables`` with a
    leading problem axis ([N, *variable.shape] each), and ``x`` of shape [N, B, H, W, C]; it
    returns the logits [N, B, classes]: entry ``n`` equals ``model(x[n])`` evaluated with
    ``weights[i][n]``.
    """
    if not isinstance(model, keras.Sequential) or model.non_trainable_variables:
        return None
    steps: list[tuple[Step, int]] = []
    for layer in model.layers:
        step = _step(layer)
        if step is None:
            return None
        steps.append((step, len(layer.trainable_variables)))

    @tf.autograph.experimental.do_not_convert  # plain Python control flow over the layers
    def forward(weights: list[tf.Tensor], x: tf.Tensor) -> tf.Tensor:
        n, b = tf.shape(x)[0], x.shape[1]
        a = tf.reshape(x, [-1, *x.shape[2:]])  # problems and examples on one axis
        used = 0
        for step, count in steps:
            a = step(a, weights[used : used + count])
            used += count
        return tf.reshape(a, [n, b, a.shape[-1]])

    return forward


def _step(layer: keras.layers.Layer) -> Step | None:
    """The batched function of one layer, or None when it is not supported."""
    # One activation name per branch: a lambda keeps the `is None` narrowing of a variable only
    # when no later line assigns it again.
    if isinstance(layer, keras.layers.InputLayer):
        return lambda a, w: a
    if isinstance(layer, keras.layers.Flatten):
        return lambda a, w: tf.reshape(a, [-1, _size(a.shape[1:])])
    if isinstance(layer, keras.layers.Activation):
        only = _activation(layer.get_config()["activation"])
        return None if only is None else (lambda a, w: only(a))
    if isinstance(layer, keras.layers.ZeroPadding2D):
        if layer.data_format != "channels_last":
            return None
        (top, bottom), (left, right) = layer.padding
        return lambda a, w: tf.pad(a, [[0, 0], [top, bottom], [left, right], [0, 0]])
    if isinstance(layer, keras.layers.Dense):
        dense_act = _activation(layer.get_config()["activation"])
        if dense_act is None:
            return None
        return lambda a, w: dense_act(_dense(a, w, layer.use_bias))
    if isinstance(layer, keras.layers.Conv2D) and type(layer) is keras.layers.Conv2D:
        config = layer.get_config()
        act = _activation(config["activation"])
        if (
            act is None
            or config["data_format"] != "channels_last"
            or tuple(config["dilation_rate"]) != (1, 1)
            or config["groups"] != 1
            or config["padding"] not in ("valid", "same")
        ):
            return None
        strides = tuple(config["strides"])
        same = config["padding"] == "same"
        return lambda a, w: act(_conv(a, w, strides, same, layer.use_bias))
    return None


def _activation(config: object) -> Callable[[tf.Tensor], tf.Tensor] | None:
    return _ACTIVATIONS.get(config) if isinstance(config, str) else None


def _size(shape: tuple[int | None, ...]) -> int:
    out = 1
    for d in shape:
        out *= int(d)  # type: ignore[arg-type]
    return out


def _per_problem(a: tf.Tensor, n: tf.Tensor) -> tf.Tensor:
    """[N*B, ...] -> [N, B*..., last]: the rows of each problem together."""
    return tf.reshape(a, [n, -1, a.shape[-1]])


def _dense(a: tf.Tensor, w: list[tf.Tensor], use_bias: bool) -> tf.Tensor:
    n = tf.shape(w[0])[0]
    out = tf.matmul(_per_problem(a, n), w[0])  # [N, B, in] x [N, in, out]
    if use_bias:
        out += w[1][:, None, :]
    return tf.reshape(out, [-1, out.shape[-1]])


def _conv(
    a: tf.Tensor, w: list[tf.Tensor], strides: tuple[int, int], same: bool, use_bias: bool
) -> tf.Tensor:
    kernel = w[0]  # [N, kh, kw, C, O]
    kh, kw, channels, filters = kernel.shape[1:]
    height, width = a.shape[1], a.shape[2]
    index, out_h, out_w = _patch_index(height, width, kh, kw, strides, same)
    flat = tf.reshape(a, [-1, height * width, channels])
    # One extra all-zero pixel at the end stands for every padded position.
    flat = tf.concat([flat, tf.zeros_like(flat[:, :1])], axis=1)
    patches = tf.gather(flat, index, axis=1)  # [N*B, out_h*out_w*kh*kw, C]
    n = tf.shape(kernel)[0]
    patches = tf.reshape(patches, [n, -1, kh * kw * channels])  # rows ordered like the kernel
    out = tf.matmul(patches, tf.reshape(kernel, [n, kh * kw * channels, filters]))
    if use_bias:
        out += w[1][:, None, :]
    return tf.reshape(out, [-1, out_h, out_w, filters])


def _patch_index(
    height: int, width: int, kh: int, kw: int, strides: tuple[int, int], same: bool
) -> tuple[np.ndarray, int, int]:
    """im2col as one gather: for each output position and kernel tap, the flat input pixel it
    reads, or ``height * width`` (the zero pixel) where it falls into the padding.

    A single gather (whose gradient is a single scatter-add) measured about twice as fast under
    XLA on CPU as one strided slice per tap, whose gradients are one pad per tap.
    """
    sh, sw = strides
    if same:  # TensorFlow's "same": the extra row or column of padding goes at the bottom/right
        out_h, out_w = -(-height // sh), -(-width // sw)
        top = max((out_h - 1) * sh + kh - height, 0) // 2
        left = max((out_w - 1) * sw + kw - width, 0) // 2
    else:
        out_h, out_w = (height - kh) // sh + 1, (width - kw) // sw + 1
        top = left = 0
    rows = np.arange(out_h)[:, None, None, None] * sh + np.arange(kh)[None, None, :, None] - top
    cols = np.arange(out_w)[None, :, None, None] * sw + np.arange(kw)[None, None, None, :] - left
    inside = (rows >= 0) & (rows < height) & (cols >= 0) & (cols < width)
    index = np.where(inside, rows * width + cols, height * width)
    return index.reshape(-1).astype(np.int32), out_h, out_w
