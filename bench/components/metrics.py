"""Reconstruction metrics: one tested definition used everywhere.

Images and reconstructions are clipped to [0, 1] before scoring. Per image: MSE, PSNR
``10 log10(1 / MSE)`` with the MSE floored at 1e-10 (so an exact reconstruction scores 100 dB
rather than infinity, and means stay finite), and SSIM. For batches of more than one example the
reconstructions are first matched to the originals by the Hungarian algorithm on MSE, since a
gradient does not tell the order of the examples that produced it.

SSIM is ``tf.image.ssim`` (Gaussian window, K1 = 0.01, K2 = 0.03, data range 1), compiled once
per window (`compiled_ssim`; eager, one batch of an 8x8 image took 9 ms, compiled 0.8 ms). In a
graph TensorFlow folds the window's constants, so a value may differ from the eager op's in its
last bits (at most 2e-6 on the board's LFW cell). Its 11x11
window with sigma 1.5 does not fit small images (the 8x8 digits), so the window shrinks to the
largest odd size ``k <= min(11, height, width)`` and sigma to ``1.5 * k / 11``; for images of at
least 11 pixels a side this is the standard SSIM of Wang et al. (2004). This equals
scikit-image's ``structural_similarity(..., gaussian_weights=True, sigma=1.5 * k / 11,
use_sample_covariance=False, data_range=1)``, which the tests check.

LPIPS is `leakbench.components.lpips` (AlexNet by default); where its weights are not installed
(`leakbench.components.lpips_weights`) or a run chose ``lpips = "none"``, the scores are NaN.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import numpy as np
import tensorflow as tf
from scipy.optimize import linear_sum_assignment
from scipy.stats import t as student_t

from leakbench.components import lpips as lpips_metric
from leakbench.components.lpips_weights import available as lpips_available

MSE_FLOOR = 1e-10


def ssim_window(height: int, width: int) -> tuple[int, float]:
    """The SSIM window size and Gaussian sigma used for images of this size."""
    size = min(11, height, width)
    if size % 2 == 0:
        size -= 1
    return size, 1.5 * size / 11


def mse(originals: np.ndarray, reconstructions: np.ndarray) -> np.ndarray:
    """Per-image mean squared error of NHWC batches (clipped to [0, 1])."""
    a = np.clip(np.asarray(originals, np.float64), 0.0, 1.0)
    b = np.clip(np.asarray(reconstructions, np.float64), 0.0, 1.0)
    return np.mean((a - b) ** 2, axis=(1, 2, 3))


def psnr(mse_values: np.ndarray) -> np.ndarray:
    """PSNR in dB for images in [0, 1] from their MSE, with the MSE floored at `MSE_FLOOR`."""
    return 10.0 * np.log10(1.0 / np.maximum(np.asarray(mse_values, np.float64), MSE_FLOOR))


@functools.cache
def compiled_ssim(size: int, sigma: float) -> Callable[[tf.Tensor, tf.Tensor], tf.Tensor]:
    """``tf.image.ssim`` with this window as one ``tf.function`` (traced once per image shape
    and batch size: scoring calls it with few)."""

    def compute(a: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
        return tf.image.ssim(a, b, max_val=1.0, filter_size=size, filter_sigma=sigma)

    return tf.function(compute)


def ssim(originals: np.ndarray, reconstructions: np.ndarray) -> np.ndarray:
    """Per-image SSIM of NHWC batches (clipped to [0, 1]), window as in the module docstring."""
    a = np.clip(np.asarray(originals, np.float32), 0.0, 1.0)
    b = np.clip(np.asarray(reconstructions, np.float32), 0.0, 1.0)
    size, sigma = ssim_window(a.shape[1], a.shape[2])
    values = compiled_ssim(size, sigma)(tf.constant(a), tf.constant(b))
    return values.numpy().astype(np.float64)


def match(originals: np.ndarray, reconstructions: np.ndarray) -> np.ndarray:
    """Order of reconstructions that best matches the originals (Hungarian, on MSE).

    Returns ``perm`` such that ``reconstructions[perm[i]]`` is matched to ``originals[i]``.
    """
    n = len(originals)
    if n == 1:
        return np.zeros(1, np.int64)
    a = np.clip(np.asarray(originals, np.float64).reshape(n, -1), 0, 1)
    b = np.clip(np.asarray(reconstructions, np.float64).reshape(n, -1), 0, 1)
    # One original's row at a time: the [n, n, pixels] array of all pairs would be 4.9 GB for
    # 64 images of 224 x 224 x 3 (the same values; each row is reduced alike).
    cost = np.stack([((a[i][None, :] - b) ** 2).mean(axis=1) for i in range(n)])
    rows, cols = linear_sum_assignment(cost)
    return cols[np.argsort(rows)].astype(np.int64)


def label_accuracy(true_labels: np.ndarray, predicted: np.ndarray) -> float:
    """Share of a batch's labels recovered, counted as multisets (order is not observable)."""
    true_counts = np.bincount(np.asarray(true_labels, np.int64), minlength=1)
    pred = np.asarray(predicted, np.int64)
    pred_counts = np.bincount(pred[pred >= 0], minlength=len(true_counts))
    size = max(len(true_counts), len(pred_counts))
    true_counts = np.pad(true_counts, (0, size - len(true_counts)))
    pred_counts = np.pad(pred_counts, (0, size - len(pred_counts)))
    return float(np.minimum(true_counts, pred_counts).sum() / len(true_labels))


@dataclasses.dataclass(frozen=True)
class ImageScores:
    """Scores of one batch after matching; arrays have one entry per original image.

    ``order[i]`` is the reconstruction matched to original ``i``.
    """

    order: np.ndarray
    mse: np.ndarray
    psnr: np.ndarray
    ssim: np.ndarray
    label_acc: float
    lpips: np.ndarray


def score_batch(
    originals: np.ndarray,
    true_labels: np.ndarray,
    reconstructions: np.ndarray,
    predicted_labels: np.ndarray,
    lpips: str | None = lpips_metric.DEFAULT_VARIANT,
) -> ImageScores:
    """Matches a reconstructed batch to the originals and scores every image; ``lpips`` names
    the LPIPS backbone (None or ``"none"``: no LPIPS, NaN scores)."""
    perm = match(originals, reconstructions)
    matched = np.asarray(reconstructions)[perm]
    errors = mse(originals, matched)
    return ImageScores(
        order=perm,
        mse=errors,
        psnr=psnr(errors),
        ssim=ssim(originals, matched),
        label_acc=label_accuracy(true_labels, predicted_labels),
        lpips=perceptual(originals, matched, lpips),
    )


def perceptual(originals: np.ndarray, matched: np.ndarray, variant: str | None) -> np.ndarray:
    """Per-image LPIPS (`leakbench.components.lpips`), NaN where the weights are missing or for
    ``variant`` None or ``"none"``."""
    if variant in (None, "none") or not lpips_available(variant):
        return np.full(len(originals), np.nan)
    return lpips_metric.distance(originals, matched, variant)


def mean_ci95(values: np.ndarray) -> tuple[float, float, int]:
    """Mean, half-width of its 95% Student-t confidence interval, and count (NaNs ignored)."""
    x = np.asarray(values, np.float64)
    x = x[~np.isnan(x)]
    n = len(x)
    if n == 0:
        return float("nan"), float("nan"), 0
    if n == 1:
        return float(x[0]), float("nan"), 1
    half = student_t.ppf(0.975, n - 1) * x.std(ddof=1) / np.sqrt(n)
    return float(x.mean()), float(half), n
