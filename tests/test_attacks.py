"""Attacks: the issue's acceptance checks on real (embedded) digits, and the attack contract."""

from __future__ import annotations

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

from leakbench.attacks import ATTACKS, AttackTarget, make_attack
from leakbench.attacks.engine.matching import lbfgs_chunker, matching_objective
from leakbench.components import metrics
from leakbench.components.forward import model_gradients
from leakbench.components.models import build_model
from leakbench.core.errors import ConfigError
from leakbench.defenses import make_defense

SHAPE = (8, 8, 1)


def _target(model, data, index: int, defense=None, seed: int = 0) -> AttackTarget:
    x = tf.constant(data.test.x[index : index + 1])
    grads = model_gradients(model, x, tf.one_hot(data.test.y[index : index + 1], 10))
    if defense is not None:
        grads = defense(grads, seed=tf.constant([seed, index], tf.int64))
    return AttackTarget(model, tuple(grads), SHAPE, 1, 10)


def _idlg_traces(model, iterations: int) -> int:
    """How often idlg's compiled L-BFGS chunk (default history and tests) for ``model`` was
    traced."""
    loop = lbfgs_chunker(
        model,
        input_shape=SHAPE,
        batch_size=1,
        num_classes=10,
        learn_labels=False,
        iterations=iterations,
        history_size=100,
        stopping=make_attack("idlg", iterations=iterations).stopping(),
    )
    return loop.xla.experimental_get_tracing_count()


def _psnr(data, index: int, rec) -> float:
    return float(metrics.psnr(metrics.mse(data.test.x[index : index + 1], rec.images))[0])


def test_dlg_recovers_digits_without_defense(digits, lenet) -> None:
    """Acceptance 1: median PSNR >= 30 dB over 8 single images."""
    attack = make_attack("dlg")
    psnrs = [_psnr(digits, i, attack(_target(lenet, digits, i), seed=i)) for i in range(8)]
    assert np.median(psnrs) >= 30.0, psnrs


def test_gaussian_noise_costs_dlg_at_least_10_db(digits, lenet) -> None:
    """Acceptance 3: sigma 0.1 lowers the median PSNR by >= 10 dB on the same images."""
    attack = make_attack("dlg")
    noise = make_defense("gaussian", sigma=0.1)
    clean = [_psnr(digits, i, attack(_target(lenet, digits, i), seed=i)) for i in range(8)]
    noisy = [_psnr(digits, i, attack(_target(lenet, digits, i, noise), seed=i)) for i in range(8)]
    assert np.median(clean) - np.median(noisy) >= 10.0, (clean, noisy)


def test_idlg_recovers_every_label_of_50_images(digits) -> None:
    """Acceptance 2 (iDLG Table 1's claim), on 50 images and five model initialisations."""
    attack = make_attack("idlg", iterations=5)
    hits = []
    for i in range(50):
        model = build_model("lenet", SHAPE, 10, seed=i % 5)
        rec = attack(_target(model, digits, i), seed=i)
        hits.append(rec.labels[0] == digits.test.y[i])
    assert all(hits), f"{sum(hits)}/50"


def test_same_seed_same_reconstruction_and_model_untouched(digits, lenet) -> None:
    attack = make_attack("dlg", iterations=30)
    before = [w.copy() for w in lenet.get_weights()]
    a = attack(_target(lenet, digits, 3), seed=7)
    b = attack(_target(lenet, digits, 3), seed=7)
    c = attack(_target(lenet, digits, 3), seed=8)
    np.testing.assert_array_equal(a.images, b.images)
    assert not np.array_equal(a.images, c.images)
    for w0, w1 in zip(before, lenet.get_weights(), strict=True):
        np.testing.assert_array_equal(w0, w1)
    assert a.status == "ok" and 0.0 <= a.images.min() and a.images.max() <= 1.0
    assert a.images.shape == (1, *SHAPE) and a.images.dtype == np.float32


def test_non_finite_gradient_is_recorded_as_diverged(digits, lenet) -> None:
    target = _target(lenet, digits, 0)
    poisoned = list(target.gradients)
    poisoned[0] = poisoned[0] + float("nan")
    bad = AttackTarget(lenet, tuple(poisoned), SHAPE, 1, 10)
    with pytest.warns(FutureWarning, match="'restarts' is deprecated"):  # the old name still works
        attack = make_attack("dlg", iterations=10, restarts=2)
    rec = attack(bad, seed=0)
    assert rec.status == "diverged"
    assert rec.attempts == 3
    assert np.all(np.isfinite(rec.images))


def test_attacking_many_trials_traces_once(digits) -> None:
    """20 trials, on models of two different seeds, share one compiled loop."""
    attack = make_attack("idlg", iterations=7)
    for i in range(20):
        model = build_model("lenet", SHAPE, 10, seed=100 + i % 2)
        attack(_target(model, digits, i), seed=i)
    assert _idlg_traces(model, iterations=7) == 1


def test_dlg_gradient_matches_finite_differences() -> None:
    """The gradient of the matching loss (a second-order quantity) against central differences,
    in float64, for both the image and the soft-label part of the DLG variables."""
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("float64")
    try:
        model = build_model("lenet", SHAPE, 10, seed=2)
        rng = np.random.default_rng(0)
        x = tf.constant(rng.uniform(0, 1, (1, *SHAPE)))
        observed = tuple(model_gradients(model, x, tf.one_hot([3], 10, dtype=tf.float64)))
        weights = tuple(v.value[None] for v in model.trainable_variables)
        fn = matching_objective(
            model,
            weights,
            tuple(o[None] for o in observed),
            tf.zeros([1, 1, 10], tf.float64),
            input_shape=SHAPE,
            batch_size=1,
            num_classes=10,
            learn_labels=True,
        )
        z = tf.constant(rng.normal(size=(1, 64 + 10)))
        _, grad = fn(z)
        for _ in range(4):
            v = rng.normal(size=z.shape)
            eps = 1e-3
            up, _ = fn(z + eps * v)
            down, _ = fn(z - eps * v)
            numeric = (float(up[0]) - float(down[0])) / (2 * eps)
            assert float(np.sum(grad.numpy() * v)) == pytest.approx(numeric, rel=1e-4)
    finally:
        keras.config.set_dtype_policy(previous)


def test_dlg_line_search_is_validated() -> None:
    assert make_attack("dlg", line_search="none").line_search == "none"
    with pytest.raises(ConfigError, match="line_search"):
        make_attack("dlg", line_search="wolfe")


def test_idlg_refuses_batches() -> None:
    with pytest.raises(ConfigError, match="batch_size"):
        make_attack("idlg").check_batch_size(2)


@pytest.mark.parametrize("name", ATTACKS.names())
def test_every_attack_validates_its_parameters(name: str) -> None:
    with pytest.raises(ConfigError, match=name):
        make_attack(name, iterations=0)
    with pytest.raises(ConfigError, match="unknown parameter"):
        make_attack(name, learning_rate=1.0)


def _notices(name: str, **params: object) -> tuple[object, list[str]]:
    """The attack built from ``params`` and the FutureWarning messages that building it gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        attack = make_attack(name, **params)
    assert all(w.category is FutureWarning for w in caught)
    # The notice points at the code that passed the old name.
    assert all(w.filename == __file__ for w in caught)
    return attack, [str(w.message) for w in caught]


@pytest.mark.parametrize("name", ["dlg", "idlg", "analytic"])
def test_restarts_is_the_old_name_of_retries(name: str) -> None:
    attack, notices = _notices(name, restarts=1)
    assert attack == make_attack(name, retries=1)
    assert attack.retries == 1
    assert notices == [f"attack {name}: 'restarts' is deprecated; use 'retries' (same meaning)"]
    assert "restarts" not in attack.params()


def test_retries_defaults() -> None:
    assert make_attack("dlg").retries == make_attack("idlg").retries == 2
    assert make_attack("ig").retries == make_attack("analytic").retries == 0
    assert make_attack("ig").starts == 1


def test_ig_restarts_is_starts_minus_one() -> None:
    attack, notices = _notices("ig", restarts=2)
    assert attack == make_attack("ig", starts=3)
    assert (attack.starts, attack.retries) == (3, 0)
    assert notices == [
        "attack ig: 'restarts' is deprecated; use 'starts' (restarts = k is starts = k + 1)"
    ]
    assert _notices("ig", restarts=0)[0] == make_attack("ig")
    # For ig the old name is not retries, so both may be given.
    assert _notices("ig", restarts=1, retries=3)[0] == make_attack("ig", starts=2, retries=3)


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("dlg", {"restarts": 1, "retries": 1}),
        ("idlg", {"restarts": 2, "retries": 2}),
        ("ig", {"restarts": 0, "starts": 1}),
    ],
)
def test_the_old_and_the_new_name_together_are_refused(name: str, params: dict) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # and no notice comes before the error
        with pytest.raises(ConfigError, match=f"^attack {name}: restarts ") as info:
            make_attack(name, **params)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("name", ["dlg", "ig", "analytic"])
@pytest.mark.parametrize("value", [1.5, -1, 101, True, "2"])
def test_a_bad_old_name_value_names_restarts(name: str, value: object) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ConfigError) as info:
            make_attack(name, restarts=value)
    assert str(info.value) == (
        f"attack {name}: restarts must be an integer in [0, 100], got {value!r}"
    )


def test_batched_attacks_equal_one_at_a_time(digits, lenet) -> None:
    """Acceptance (issue 4): six trials with four in flight (slots refilled as trials finish)
    give the same reconstructions as six separate attacks with the same seeds; one trial whose
    gradient is NaN is marked diverged after its retries while the trials beside it succeed.
    (Batched arithmetic differs from single-problem arithmetic in the last bits; with 200
    iterations the attacks converge, so the images agree to far below one grey level.)"""
    with pytest.warns(FutureWarning, match="'restarts' is deprecated"):  # the old name still works
        attack = make_attack("dlg", iterations=200, restarts=1)
    targets = [_target(lenet, digits, i) for i in range(6)]
    poisoned = list(targets[2].gradients)
    poisoned[0] = poisoned[0] + float("nan")
    targets[2] = AttackTarget(lenet, tuple(poisoned), SHAPE, 1, 10)
    seeds = [11, 12, 13, 14, 15, 16]
    together = attack.attack_many(targets, seeds, width=4)
    alone = [attack(t, seed=s) for t, s in zip(targets, seeds, strict=True)]
    for i, (a, b) in enumerate(zip(together, alone, strict=True)):
        assert a.status == b.status, i
        np.testing.assert_allclose(a.images, b.images, atol=1e-4, err_msg=f"trial {i}")
        np.testing.assert_array_equal(a.labels, b.labels)
    assert together[2].status == "diverged" and together[2].attempts == 2
    ok = [i for i in range(6) if i != 2]
    assert all(together[i].status == "ok" and together[i].attempts == 1 for i in ok)
    assert np.median([_psnr(digits, i, together[i]) for i in ok]) > 30


def test_batched_loop_is_traced_once_for_twenty_trials(digits, lenet) -> None:
    """Acceptance (issue 4): 20 trials of one cell, 8 at a time, trace the compiled chunk once
    per program width (the lanes' width, and width 1 where the last few trials finish alone),
    and 40 more trials trace nothing new."""
    attack = make_attack("idlg", iterations=9)
    targets = [_target(lenet, digits, i) for i in range(20)]
    recs = attack.attack_many(targets, list(range(20)), width=8)
    assert all(r.status == "ok" for r in recs)
    traces = _idlg_traces(lenet, iterations=9)
    assert 1 <= traces <= 2
    more = [_target(lenet, digits, i) for i in range(20, 60)]
    assert all(r.status == "ok" for r in attack.attack_many(more, list(range(40)), width=8))
    assert _idlg_traces(lenet, iterations=9) == traces
