"""The analytic attack (Phong et al., 2017): exact recovery through a first dense layer."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from leakbench.attacks import AttackTarget, make_attack
from leakbench.attacks.analytic import rank_one_input
from leakbench.components import metrics
from leakbench.components.forward import model_gradients
from leakbench.components.models import build_model
from leakbench.core.errors import ConfigError
from leakbench.defenses import make_defense

SHAPE = (8, 8, 1)


def _target(model, data, index: int, defense=None, labels=None) -> AttackTarget:
    x = tf.constant(data.test.x[index : index + 1])
    grads = model_gradients(model, x, tf.one_hot(data.test.y[index : index + 1], 10))
    if defense is not None:
        grads = defense(grads, seed=tf.constant([0, index], tf.int64))
    return AttackTarget(model, tuple(grads), SHAPE, 1, 10, labels=labels)


def _mse(data, index: int, rec) -> float:
    return float(metrics.mse(data.test.x[index : index + 1], rec.images)[0])


def test_recovers_mlp_inputs_and_labels_exactly(digits) -> None:
    """Acceptance: MSE < 1e-8 on real digits without a defense, for several images and
    weights; the label from the last layer is right; no optimisation is run."""
    attack = make_attack("analytic")
    for i in range(6):
        model = build_model("mlp", SHAPE, 10, seed=i % 3)
        rec = attack(_target(model, digits, i), seed=i)
        assert rec.status == "ok" and rec.attempts == 1 and rec.evaluations == 0
        assert _mse(digits, i, rec) < 1e-8, i
        assert rec.labels.tolist() == [digits.test.y[i]]
        assert rec.images.shape == (1, *SHAPE) and rec.images.dtype == np.float32
        assert 0.0 <= rec.loss < 1e-10  # the rank-one fit explains the gradient
        assert rec.loss_history.shape == (1,)


def test_known_labels_are_used(digits) -> None:
    model = build_model("mlp", SHAPE, 10, seed=0)
    rec = make_attack("analytic")(_target(model, digits, 0, labels=np.array([7])), seed=0)
    assert rec.labels.tolist() == [7]


def test_rank_one_fit_is_exact_and_uses_every_unit() -> None:
    """Hand-made gradients ``dW = x d^T``, ``db = d`` with some units silent (d = 0)."""
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, 20)
    d = rng.normal(size=7)
    d[[1, 4]] = 0.0
    got, residual = rank_one_input(np.outer(x, d), d)
    np.testing.assert_allclose(got, x, rtol=1e-12)
    assert residual == pytest.approx(0.0, abs=1e-24)
    # The per-unit ratio of the paper gives the same x for any unit with d != 0.
    np.testing.assert_allclose(np.outer(x, d)[:, 2] / d[2], got, rtol=1e-12)
    flipped, _ = rank_one_input(-np.outer(x, d), -d)  # the sign of d cancels
    np.testing.assert_allclose(flipped, x, rtol=1e-12)


def test_gaussian_noise_breaks_exact_recovery(digits) -> None:
    """The attack is exact only without noise: the MSE and the attacker's residual grow."""
    attack = make_attack("analytic")
    model = build_model("mlp", SHAPE, 10, seed=0)
    noise = make_defense("gaussian", sigma=1e-2)
    for i in range(3):
        clean = attack(_target(model, digits, i), seed=i)
        noisy = attack(_target(model, digits, i, noise), seed=i)
        assert noisy.status == "ok"
        assert _mse(digits, i, noisy) > 1e-5 > 1e3 * _mse(digits, i, clean), i
        assert noisy.loss > 1e-3 > clean.loss


def test_norm_clipping_does_not_help(digits) -> None:
    """Clipping rescales dW and db alike; their ratio, the input, is unchanged."""
    model = build_model("mlp", SHAPE, 10, seed=1)
    rec = make_attack("analytic")(
        _target(model, digits, 4, make_defense("clip", norm=1e-3)), seed=0
    )
    assert _mse(digits, 4, rec) < 1e-8


def test_all_zero_first_layer_gradient_is_diverged(digits) -> None:
    model = build_model("mlp", SHAPE, 10, seed=0)
    grads = list(_target(model, digits, 0).gradients)
    grads[0], grads[1] = tf.zeros_like(grads[0]), tf.zeros_like(grads[1])
    rec = make_attack("analytic")(AttackTarget(model, tuple(grads), SHAPE, 1, 10), seed=0)
    assert rec.status == "diverged" and rec.attempts == 1  # deterministic: no retries
    assert np.all(np.isfinite(rec.images))


def test_refuses_lenet_with_a_clear_message(digits) -> None:
    lenet = build_model("lenet", SHAPE, 10, seed=0)
    attack = make_attack("analytic")
    pattern = r"attack analytic: needs .*Dense.*bias.*\(e\.g\. mlp\); got model lenet .*Conv2D"
    with pytest.raises(ConfigError, match=pattern):
        attack.check_model(lenet, SHAPE)
    with pytest.raises(ConfigError, match=pattern):  # and out of the attack itself
        attack(_target(lenet, digits, 0), seed=0)


def test_refuses_a_first_dense_layer_without_bias() -> None:
    model = keras.Sequential(
        [keras.Input(SHAPE), keras.layers.Flatten(), keras.layers.Dense(4, use_bias=False)]
    )
    with pytest.raises(ConfigError, match="attack analytic: .*no trainable bias"):
        make_attack("analytic").check_model(model, SHAPE)


def test_refuses_batches(digits) -> None:
    attack = make_attack("analytic")
    with pytest.raises(ConfigError, match="attack analytic: needs batch_size 1.*got 2"):
        attack.check_batch_size(2)
    model = build_model("mlp", SHAPE, 10, seed=0)
    x = tf.constant(digits.test.x[:2])
    grads = model_gradients(model, x, tf.one_hot(digits.test.y[:2], 10))
    with pytest.raises(ConfigError, match="batch_size 1"):
        attack(AttackTarget(model, tuple(grads), SHAPE, 2, 10), seed=0)


def test_parameters_are_validated() -> None:
    assert make_attack("analytic").retries == 0
    with pytest.raises(ConfigError, match="analytic"):
        make_attack("analytic", iterations=10)
    with pytest.raises(ConfigError, match="restarts"):
        make_attack("analytic", restarts=-1)
    with pytest.raises(ConfigError, match="retries"):
        make_attack("analytic", retries=-1)


def test_old_restarts_name_means_retries() -> None:
    with pytest.warns(FutureWarning, match="attack analytic: 'restarts' is deprecated"):
        assert make_attack("analytic", restarts=1).retries == 1
