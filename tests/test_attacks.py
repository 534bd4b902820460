"""Attacks: the issue's acceptance checks on real (embedded) digits, and the attack contract."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import math
import sys
import types
import warnings
from collections.abc import Iterator
from typing import ClassVar

import keras
import numpy as np
import pytest
import tensorflow as tf

from leakbench.attacks import ATTACKS, Attack, AttackTarget, attacks_of, make_attack
from leakbench.attacks.engine.matching import lbfgs_chunker, matching_objective
from leakbench.attacks.text import TextAttack, TextResult, TextTarget
from leakbench.attacks.text.suite import make_text_attack
from leakbench.components import metrics
from leakbench.components.forward import model_gradients
from leakbench.components.models import build_model
from leakbench.components.text_models import build_text_model
from leakbench.core import plugins
from leakbench.core.errors import ConfigError, UnknownNameError
from leakbench.core.params import Int, param
from leakbench.datasets.text_base import PAD
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


@pytest.mark.parametrize("name", attacks_of("image").names())
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


# --- the contract of the text attacks (one registry, one final attack_many) ------------------

TEXT_V, TEXT_L = 40, 6


@pytest.fixture(scope="module")
def text_model() -> keras.Model:
    return build_text_model("gru", TEXT_V, TEXT_L, 0)


def _text_target(model: keras.Model, **changes: object) -> TextTarget:
    """A well-formed text target of zero gradients (the fake attacks below read nothing of it;
    the checks read only its shapes), with ``changes`` applied."""
    zeros = tuple(tf.zeros_like(v) for v in model.trainable_variables)
    target = TextTarget(model, zeros, 2, TEXT_L, TEXT_V, np.zeros((3, TEXT_L), np.int64))
    return dataclasses.replace(target, **changes)


# What the fake attack answers, per attempt: its loss, and whether its ids leave [0, V).
_ANSWERS: dict[int, tuple[float, bool]] = {}
_SEEDS: list[tuple[int, int]] = []


@dataclasses.dataclass(frozen=True)
class _FakeText(TextAttack):
    """A text attack whose answer per attempt is `_ANSWERS`'s (a test fixture)."""

    name: ClassVar[str] = "test_fake_text"
    level: int = param(4, Int(4, 39), doc="the id it answers")

    def run(self, target: TextTarget, seed: tf.Tensor) -> TextResult:
        attempt = int(seed.numpy()[1])
        _SEEDS.append((int(seed.numpy()[0]), attempt))
        loss, outside = _ANSWERS.get(attempt, (0.5, False))
        if math.isnan(loss) and outside:  # the fixture's way to fail a kernel
            raise tf.errors.InvalidArgumentError(None, None, "kernel failed\nsecond line")
        value = target.vocabulary_size if outside else self.level
        ids = np.full((target.batch_size, target.sequence_length), value, np.int64)
        return TextResult(ids, loss, "converged", attempt, 10, note=f"attempt {attempt}")


@pytest.fixture
def fake_text() -> Iterator[type[_FakeText]]:
    ATTACKS.register(_FakeText.name)(_FakeText)
    _ANSWERS.clear()
    _SEEDS.clear()
    yield _FakeText
    ATTACKS.unregister(_FakeText.name)


def test_every_attack_has_a_modality_and_the_base_of_it() -> None:
    bases = {"image": Attack, "text": TextAttack}
    for name in ATTACKS:
        cls = ATTACKS.get(name)
        assert issubclass(cls, bases[cls.modality]), name
        assert name in attacks_of(cls.modality)
        assert all(name not in attacks_of(m) for m in bases if m != cls.modality)
    assert {"bag_of_words", "span", "tag"} <= set(attacks_of("text"))


@pytest.mark.parametrize("name", attacks_of("text").names())
def test_a_text_attack_is_refused_where_an_image_attack_is_built(name: str) -> None:
    with pytest.raises(UnknownNameError) as info:
        make_attack(name)
    assert str(info.value).startswith(
        f"attack {name!r} is a text attack; this run's dataset is an image dataset; image attacks: "
    )
    assert "dlg" in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(UnknownNameError, match="'dlg' is an image attack"):
        make_text_attack("dlg")


@pytest.mark.parametrize("name", attacks_of("text").names())
def test_text_attack_is_frozen_hashable_and_its_params_round_trip(name: str) -> None:
    attack = make_text_attack(name)
    assert dataclasses.is_dataclass(attack)
    with pytest.raises(dataclasses.FrozenInstanceError):
        attack.retries = 5  # type: ignore[misc]
    assert hash(attack) == hash(make_text_attack(name))
    params = attack.params()
    assert "retries" not in params  # keyed only when set: the keys of older runs stay
    assert make_text_attack(name, **params) == attack
    again = make_text_attack(name, retries=3)
    assert again.params() == {**params, "retries": 3}
    assert make_text_attack(name, **again.params()) == again
    with pytest.raises(ConfigError, match="unknown parameter"):
        make_text_attack(name, learning_rate=1.0)


@pytest.mark.parametrize("name", attacks_of("text").names())
def test_text_attack_with_setting(name: str) -> None:
    attack = make_text_attack(name)
    assert attack.with_setting({}) == attack
    assert attack.with_setting({"no_such_parameter": 1}) is None
    assert attack.with_setting({"retries": 1}) == make_text_attack(name, retries=1)
    assert attack.with_setting({"retries": -1}) is None  # a refused value


@pytest.mark.parametrize("name", attacks_of("text").names())
@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"gradients": ()}, "0 gradients for"),
        ({"public_ids": np.zeros((3, TEXT_L + 1), np.int64)}, "public_ids must be"),
        ({"sequence_length": 1}, "L >= 2"),
        ({"clients": 3}, "must divide batch_size"),
    ],
    ids=["gradients", "public", "length", "clients"],
)
def test_text_attack_many_refuses_a_malformed_target(
    name: str, changes: dict, needle: str, text_model
) -> None:
    attack = make_text_attack(name)
    with pytest.raises(ValueError, match=needle):
        attack.attack_many([_text_target(text_model, **changes)], [0])
    with pytest.raises(ValueError, match="1 seeds for 2 targets"):
        attack.attack_many([_text_target(text_model)] * 2, [0])


def test_text_attack_retries_a_non_finite_attempt_from_a_fresh_start(fake_text, text_model) -> None:
    _ANSWERS.update({1: (math.nan, False), 2: (0.25, True)})  # NaN loss, then ids beyond V
    result = make_text_attack(fake_text.name)(_text_target(text_model), seed=17)
    assert _SEEDS == [(17, 1), (17, 2), (17, 3)]  # attempt k from attempt_draw(seed, k)
    assert (result.status, result.attempts, result.stop_reason) == ("ok", 3, "converged")
    assert result.loss == 0.5 and result.note == "attempt 3" and result.message == ""
    assert (result.ids == 4).all() and result.seconds > 0.0

    _SEEDS.clear()
    once = make_text_attack(fake_text.name, retries=1)(_text_target(text_model), seed=17)
    assert _SEEDS == [(17, 1), (17, 2)]
    assert (once.status, once.stop_reason, once.attempts) == ("diverged", "diverged", 2)
    assert once.note == f"{TextAttack.not_finite}; attempt 2"


def test_a_text_attack_without_a_loss_is_not_retried_for_its_nan(fake_text, text_model) -> None:
    _ANSWERS.update({1: (math.nan, False)})
    lossless = dataclasses.make_dataclass(
        "Lossless", [], bases=(fake_text,), frozen=True, namespace={"has_loss": False}
    )
    result = lossless()(_text_target(text_model), seed=3)
    assert (result.status, result.attempts, _SEEDS) == ("ok", 1, [(3, 1)])


def test_a_failing_kernel_is_a_text_attack_error(fake_text, text_model) -> None:
    _ANSWERS.update({1: (math.nan, True)})
    result = make_text_attack(fake_text.name)(_text_target(text_model), seed=5)
    assert (result.status, result.stop_reason, result.attempts) == ("error", "error", 1)
    assert result.message == "InvalidArgumentError: kernel failed" == result.note
    assert result.ids.shape == (2, TEXT_L) and (result.ids == PAD).all()
    assert math.isnan(result.loss)


def test_a_plugin_text_attack_is_adopted_from_its_entry_point(monkeypatch) -> None:
    module = types.ModuleType("lb_plugin_text_attack")
    module.FakeText = _FakeText  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "lb_plugin_text_attack", module)
    entry = importlib.metadata.EntryPoint(
        name=_FakeText.name, value="lb_plugin_text_attack:FakeText", group="leakbench.attacks"
    )
    try:
        plugins._load_entry(entry, plugins._attached["leakbench.attacks"])
        assert ATTACKS.get(_FakeText.name) is _FakeText
        assert _FakeText.name in attacks_of("text") and _FakeText.name not in attacks_of("image")
    finally:
        if ATTACKS.peek(_FakeText.name) is not None:
            ATTACKS.unregister(_FakeText.name)
