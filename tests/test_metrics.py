"""Metrics against hand-computed values and scikit-image's reference implementations."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from skimage.metrics import peak_signal_noise_ratio, structural_similarity

from leakbench.components import metrics


def _pair(shape: tuple[int, ...], seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    a = rng.uniform(0, 1, size=shape).astype(np.float32)
    b = np.clip(a + rng.normal(0, 0.1, size=shape), 0, 1).astype(np.float32)
    return a, b


def test_mse_and_psnr_hand_computed() -> None:
    a = np.zeros((1, 2, 2, 1), np.float32)
    b = np.array([0.1, 0.1, 0.1, 0.1], np.float32).reshape(1, 2, 2, 1)
    assert metrics.mse(a, b) == pytest.approx([0.01])
    assert metrics.psnr(np.array([0.01])) == pytest.approx([20.0])
    # An exact reconstruction is capped, not infinite.
    assert metrics.psnr(np.array([0.0])) == pytest.approx([100.0])


def test_scores_clip_to_unit_range() -> None:
    a = np.full((1, 2, 2, 1), 1.0, np.float32)
    b = np.full((1, 2, 2, 1), 3.0, np.float32)
    assert metrics.mse(a, b) == pytest.approx([0.0])


@pytest.mark.parametrize("shape", [(3, 32, 32, 3), (2, 28, 28, 1), (2, 8, 8, 1), (2, 25, 25, 1)])
def test_psnr_and_ssim_agree_with_scikit_image(shape: tuple[int, ...]) -> None:
    a, b = _pair(shape)
    ours_psnr = metrics.psnr(metrics.mse(a, b))
    ours_ssim = metrics.ssim(a, b)
    size, sigma = metrics.ssim_window(shape[1], shape[2])
    for i in range(shape[0]):
        ref_psnr = peak_signal_noise_ratio(
            a[i].astype(np.float64), b[i].astype(np.float64), data_range=1.0
        )
        ref_ssim = structural_similarity(
            a[i],
            b[i],
            data_range=1.0,
            channel_axis=-1,
            gaussian_weights=True,
            sigma=sigma,
            use_sample_covariance=False,
        )
        assert ours_psnr[i] == pytest.approx(ref_psnr, abs=1e-4)
        assert ours_ssim[i] == pytest.approx(ref_ssim, abs=2e-4)
    assert size == (7 if shape[1] == 8 else 11)


@pytest.mark.parametrize("shape", [(1, 8, 8, 1), (1, 32, 32, 3), (6, 8, 8, 1), (3, 28, 28, 1)])
def test_compiled_ssim_is_the_eager_op(shape: tuple[int, ...]) -> None:
    """The compiled op scores as the eager one but for the folded window's rounding (the
    module docstring)."""
    a, b = _pair(shape, seed=5)
    size, sigma = metrics.ssim_window(shape[1], shape[2])
    eager = tf.image.ssim(a, b, max_val=1.0, filter_size=size, filter_sigma=sigma).numpy()
    np.testing.assert_allclose(metrics.ssim(a, b), eager, rtol=0, atol=1e-6)


def test_ssim_of_identical_images_is_one() -> None:
    a, _ = _pair((2, 8, 8, 1))
    assert metrics.ssim(a, a) == pytest.approx([1.0, 1.0], abs=1e-5)


def test_matching_undoes_a_permutation() -> None:
    a, _ = _pair((4, 8, 8, 1), seed=3)
    perm = np.array([2, 0, 3, 1])
    scores = metrics.score_batch(a, np.array([0, 1, 2, 3]), a[perm], np.array([2, 0, 3, 1]))
    assert np.all(a[perm][scores.order] == a)
    assert scores.psnr == pytest.approx([100.0] * 4)
    assert scores.label_acc == 1.0


def test_label_accuracy_counts_multisets() -> None:
    assert metrics.label_accuracy(np.array([1, 1, 2, 3]), np.array([3, 1, 2, 2])) == 0.75
    assert metrics.label_accuracy(np.array([4]), np.array([-1])) == 0.0
    assert metrics.label_accuracy(np.array([0, 9]), np.array([9, 0])) == 1.0


def test_mean_ci95_hand_computed() -> None:
    mean, half, n = metrics.mean_ci95(np.array([1.0, 2.0, 3.0, 4.0]))
    # t(0.975, 3) = 3.182446; std = 1.290994; half = t * std / 2.
    assert (mean, n) == (2.5, 4)
    assert half == pytest.approx(3.182446 * 1.290994 / 2, rel=1e-5)
    assert np.isnan(metrics.mean_ci95(np.array([5.0]))[1])
    assert metrics.mean_ci95(np.array([]))[2] == 0
