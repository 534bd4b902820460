"""The matching losses' numbers where attacks need them: near a match.

An attack stops where its loss stops telling it which way to go, so a loss that loses its
precision near zero caps how well an attack can do. The cosine distance was computed as
``1 - dot / (|a| |b|)`` up to engine 7: in float32 that cannot resolve an angle below about
3e-4 radians, and `idlg` with it stalled at 33 dB on digits (CIFAR-10: 9 dB) where the same
attack with the precise form recovers the image.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from leakbench.attacks import AttackTarget, make_attack
from leakbench.attacks.engine.losses import LOSSES, cosine_distance
from leakbench.attacks.text.matching import matching_distance
from leakbench.components import metrics
from leakbench.components.forward import model_gradients
from leakbench.components.models import build_model


def _pair(angle: float, size: int = 50, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Two float64 vectors at ``angle`` radians, of different lengths."""
    rng = np.random.default_rng(seed)
    u, w = rng.normal(size=(2, size))
    u /= np.linalg.norm(u)
    w -= (w @ u) * u
    w /= np.linalg.norm(w)
    return 3.0 * u, 0.5 * (np.cos(angle) * u + np.sin(angle) * w)


def _split(vector: np.ndarray) -> list[tf.Tensor]:
    """One problem's gradient as two float32 tensors, [1, 30] and [1, 4, 5]."""
    flat = vector.astype(np.float32)
    return [tf.constant(flat[:30][None]), tf.constant(flat[30:].reshape(1, 4, 5))]


@pytest.mark.parametrize("angle", [1e-1, 1e-2, 1e-3, 1e-4])
def test_cosine_distance_keeps_its_precision_at_small_angles(angle: float) -> None:
    a, b = _pair(angle)
    # The distance of the float32-rounded vectors, exact to float64's precision: the unit
    # vectors' difference carries no cancellation.
    a32, b32 = a.astype(np.float32).astype(np.float64), b.astype(np.float32).astype(np.float64)
    exact = 0.5 * np.sum((a32 / np.linalg.norm(a32) - b32 / np.linalg.norm(b32)) ** 2)
    got = float(cosine_distance(_split(a), _split(b)).numpy()[0])
    # At 1e-4 radians the distance is 5e-9: ``1 - dot / norms`` in float32 gives 0 or a
    # multiple of 6e-8 there (and is 10% off at 1e-3).
    np.testing.assert_allclose(got, exact, rtol=1e-3)


def test_cosine_distance_gradient_near_a_match() -> None:
    # d/da (1 - cos) = -(b / (|a||b|) - (a.b) a / (|a|^3 |b|)), in float64.
    a, b = _pair(1e-3)
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    expected = -(b / (na * nb) - (a @ b) * a / (na**3 * nb))
    dummy = _split(a)
    with tf.GradientTape() as tape:
        tape.watch(dummy)
        value = cosine_distance(dummy, _split(b))
    got = np.concatenate([g.numpy().ravel() for g in tape.gradient(value, dummy)])
    # The textbook form's gradient is about as precise (6.8e-5 of its length here against
    # 4.0e-5): it is the value it loses, which L-BFGS's line search and stall test compare.
    np.testing.assert_allclose(got, expected, atol=1e-3 * np.linalg.norm(expected))


def test_cosine_distance_of_a_zero_gradient_is_finite() -> None:
    _, b = _pair(0.5)
    zero = [tf.zeros_like(t) for t in _split(b)]
    with tf.GradientTape() as tape:
        tape.watch(zero)
        value = cosine_distance(zero, _split(b))
    # The zero vector is half a unit vector's squared length from it.
    np.testing.assert_allclose(value.numpy(), [0.5], rtol=1e-6)
    assert all(np.isfinite(g.numpy()).all() for g in tape.gradient(value, zero))


def test_cosine_distance_is_registered_and_per_problem() -> None:
    assert LOSSES.get("cosine") is cosine_distance
    a1, b1 = _pair(0.3, seed=1)
    a2, b2 = _pair(0.02, seed=2)
    both = cosine_distance(
        [tf.concat([x, y], 0) for x, y in zip(_split(a1), _split(a2), strict=True)],
        [tf.concat([x, y], 0) for x, y in zip(_split(b1), _split(b2), strict=True)],
    ).numpy()
    np.testing.assert_allclose(both, [1 - np.cos(0.3), 1 - np.cos(0.02)], rtol=1e-4)


def test_the_text_attacks_cosine_is_the_same_distance() -> None:
    a, b = _pair(1e-3)
    text = float(matching_distance(_split(a), _split(b), "cosine", 0.0))
    np.testing.assert_allclose(text, float(cosine_distance(_split(a), _split(b))[0]), rtol=1e-6)


def test_idlg_with_the_cosine_loss_recovers_a_digit(digits) -> None:
    # With ``1 - dot / norms`` this attack stalled at 33-35 dB on every digit (median 35.2 dB
    # over the 36 of results/board/mnist-lenet-init); with the precise form it recovers them.
    model = build_model("lenet", (8, 8, 1), 10, seed=0)
    x, y = digits.test.x[:1], digits.test.y[:1]
    grads = model_gradients(model, tf.constant(x), tf.one_hot(y, 10))
    target = AttackTarget(model, tuple(grads), (8, 8, 1), 1, 10)
    result = make_attack("idlg", loss="cosine")(target, seed=0)
    assert metrics.psnr(metrics.mse(x, result.images))[0] > 60.0
