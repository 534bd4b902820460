"""DP training as its accountant analyses it: Poisson-sampled batches, the release normalised by
the expected batch size (an empty batch releases the noise alone), one trace for every batch
size, and the epsilon of the learning-rate search composed over its runs."""

from __future__ import annotations

import math

import keras
import numpy as np
import pytest
import tensorflow as tf

from leakbench.client.recipes import DPRecipe, Recipe, TrainingConfig
from leakbench.client.selection import select
from leakbench.client.training import (
    DefendedTrainer,
    StepResult,
    accounted,
    poisson_batches,
    run_epochs,
)
from leakbench.components.forward import task_loss
from leakbench.core.seeds import poisson_generator, sampled_draw, training_draw
from leakbench.defenses import make_defense, tensor_seed
from leakbench.defenses.chain import Chain

FEATURES, CLASSES = 4, 3


def _model(seed: int = 0) -> keras.Model:
    """A linear model small enough to differentiate by hand, example by example."""
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(CLASSES)])


def _data(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, FEATURES)).astype(np.float32)
    return x, (np.arange(n) % CLASSES).astype(np.int64)


def _trainer(defense_params: dict, model: keras.Model, learning_rate: float = 1.0, seed: int = 5):
    defense = make_defense("dpsgd", **defense_params)
    optimizer = keras.optimizers.SGD(learning_rate)
    return DefendedTrainer(model, defense, optimizer, num_classes=CLASSES, seed=seed)


class _Recorder:
    """Stands in for a trainer: records which examples each step got, and how."""

    def __init__(self, defense) -> None:
        self.defense = defense
        self.calls: list[tuple[str, np.ndarray, int | None, int | None]] = []
        self.step_count = tf.Variable(0, dtype=tf.int64)
        self.skipped_steps = tf.Variable(0, dtype=tf.int64)
        self.traces = 1

    def _done(self) -> StepResult:
        self.step_count.assign_add(1)
        zero = tf.constant(0.0)
        return StepResult(loss=zero, skipped=tf.constant(False), global_norm=zero)

    def step(self, images, labels) -> StepResult:
        self.calls.append(("fixed", np.asarray(images)[:, 0].astype(int), None, None))
        return self._done()

    def sampled_step(self, images, labels, expected_size, run=0) -> StepResult:
        self.calls.append(("poisson", np.asarray(images)[:, 0].astype(int), expected_size, run))
        return self._done()


def _indexed(n: int) -> tuple[np.ndarray, np.ndarray]:
    """A split whose images are their own indices (so a recorded batch names its examples)."""
    return np.arange(n, dtype=np.float32)[:, None], np.zeros(n, np.int64)


def test_poisson_batches_are_binomial_and_every_example_is_in_with_probability_q() -> None:
    n, q, steps = 1000, 0.1, 2000
    batches = list(poisson_batches(poisson_generator(3, 0), n, q, steps))
    sizes = np.array([len(b) for b in batches])
    # Binomial(1000, 0.1): mean 100, variance 90. Over 2000 steps the standard error of the
    # mean is 0.21 and that of the variance about 2.9: both tolerances are about 5 of them.
    assert abs(sizes.mean() - n * q) < 1.0
    assert abs(sizes.var(ddof=1) - n * q * (1 - q)) < 15.0
    membership = np.zeros(n)
    for batch in batches:
        assert np.all(np.diff(batch) > 0)  # distinct, in index order
        membership[batch] += 1
    frequency = membership / steps
    # Each example's frequency has standard error 0.0067; the largest of 1000 stays within 5.
    assert np.abs(frequency - q).max() < 0.035
    # Fixed-size batches would give every example the same count in every epoch.
    assert len(set(sizes)) > 20
    # The same seed and run: the same batches; another run or seed: others.
    again = list(poisson_batches(poisson_generator(3, 0), n, q, steps))
    assert all(np.array_equal(a, b) for a, b in zip(batches, again, strict=True))
    for other in (poisson_generator(3, 1), poisson_generator(4, 0)):
        first = next(poisson_batches(other, n, q, 1))
        assert not np.array_equal(first, batches[0])


def test_run_epochs_draws_poisson_batches_for_dpsgd_and_permutations_otherwise() -> None:
    n, recipe = 50, Recipe("dp", 2, 8, "sgd", (0.1,))
    steps = 2 * (50 // 8)
    dp = make_defense("dpsgd", norm=1.0, noise_multiplier=1.0)
    chain = make_defense(
        "chain", steps=[{"name": "dpsgd", "norm": 1.0, "noise_multiplier": 1.0},
                        {"name": "gaussian", "sigma": 0.01}],
    )  # fmt: skip
    for defense in (dp, chain):
        assert accounted(defense)
        recorder = _Recorder(defense)
        report = run_epochs(recorder, recipe, _indexed(n), seed=7, delta=1e-5, run=2)
        want = list(poisson_batches(poisson_generator(7, 2), n, 8 / 50, steps))
        assert [c[0] for c in recorder.calls] == ["poisson"] * steps
        assert all(np.array_equal(c[1], w) for c, w in zip(recorder.calls, want, strict=True))
        assert {(c[2], c[3]) for c in recorder.calls} == {(8, 2)}  # expected size, run
        assert report.steps == steps
        assert report.epsilon == pytest.approx(dp.epsilon(8 / 50, steps, 1e-5), rel=1e-12)
    # Without an accountant: a permutation per epoch cut into full batches, whatever the run.
    gaussian = make_defense("gaussian", sigma=0.1)
    assert not accounted(gaussian)
    for run in (0, 3):
        recorder = _Recorder(gaussian)
        run_epochs(recorder, recipe, _indexed(n), seed=7, delta=1e-5, run=run)
        rng = np.random.default_rng(7)
        want = []
        for _ in range(2):
            order = rng.permutation(n)
            want += [order[b * 8 : (b + 1) * 8] for b in range(50 // 8)]
        assert [c[0] for c in recorder.calls] == ["fixed"] * steps
        assert all(np.array_equal(c[1], w) for c, w in zip(recorder.calls, want, strict=True))


def _clipped_sum(model: keras.Model, x: np.ndarray, y: np.ndarray, norm: float) -> list:
    """The sum of the per-example gradients, each clipped to L2 ``norm``, one example at a time."""
    total = [np.zeros(v.shape, np.float64) for v in model.trainable_variables]
    for i in range(len(x)):
        with tf.GradientTape() as tape:
            logits = model(x[i : i + 1], training=True)
            loss = task_loss(logits, tf.one_hot(y[i : i + 1], CLASSES))
        grads = [
            g.numpy().astype(np.float64) for g in tape.gradient(loss, model.trainable_variables)
        ]
        size = math.sqrt(sum(float(np.sum(g**2)) for g in grads))
        factor = min(1.0, norm / size)
        assert factor < 1.0 or norm >= 0.3  # the bound below clips some examples
        total = [t + factor * g for t, g in zip(total, grads, strict=True)]
    return total


def test_a_dp_step_divides_the_clipped_sum_by_the_expected_batch_size() -> None:
    """Three examples drawn where eight are expected, no noise: SGD at rate 1 moves the weights
    by minus (the sum of the three clipped gradients) / 8, not / 3."""
    x, y = _data(3)
    model = _model()
    before = [v.numpy().astype(np.float64) for v in model.trainable_variables]
    expected = _clipped_sum(model, x, y, norm=0.2)
    trainer = _trainer({"norm": 0.2, "noise_multiplier": 0.0}, model)
    result = trainer.sampled_step(x, y, 8)
    assert not bool(result.skipped)
    after = [v.numpy().astype(np.float64) for v in model.trainable_variables]
    for b, a, s in zip(before, after, expected, strict=True):
        np.testing.assert_allclose(b - a, s / 8, rtol=1e-5, atol=1e-7)
        assert not np.allclose(b - a, s / 3, rtol=1e-2)
    # The attack side's dpsgd still divides by the realised batch size.
    model = _model()
    grads = [np.stack([g] * 3) for g in expected]  # any per-example gradients
    defense = make_defense("dpsgd", norm=1e6, noise_multiplier=0.0)
    seed = tf.constant([1, 2], tf.int64)
    for mean, sampled, g in zip(
        defense(grads, seed=seed),
        defense.apply_sampled(grads, seed=seed, expected_size=8),
        grads,
        strict=True,
    ):
        np.testing.assert_allclose(mean.numpy(), g.sum(axis=0) / 3, rtol=1e-6)
        np.testing.assert_allclose(sampled.numpy(), g.sum(axis=0) / 8, rtol=1e-6)


def test_an_empty_batch_releases_the_noise_over_the_expected_batch_size() -> None:
    z, norm, expected_size, run, seed = 1.5, 0.7, 8, 2, 5
    model = _model()
    before = [v.numpy() for v in model.trainable_variables]
    trainer = _trainer({"norm": norm, "noise_multiplier": z}, model, seed=seed)
    empty = np.zeros((0, FEATURES), np.float32), np.zeros(0, np.int64)
    result = trainer.sampled_step(*empty, expected_size, run)
    assert not bool(result.skipped) and math.isnan(float(result.loss))
    key = sampled_draw(
        training_draw(tf.constant(seed, tf.int64), tf.constant(0, tf.int64)),
        tf.constant(run, tf.int64),
    )
    for j, (b, v) in enumerate(zip(before, model.trainable_variables, strict=True)):
        noise = tf.random.stateless_normal(b.shape, seed=tensor_seed(key, j), stddev=z * norm)
        np.testing.assert_allclose(b - v.numpy(), noise.numpy() / expected_size, atol=1e-6)
        assert np.abs(noise.numpy()).max() > 0.1  # the noise is there
    assert int(trainer.step_count.numpy()) == 1 and int(trainer.skipped_steps.numpy()) == 0
    # Without noise an empty batch changes nothing, and is still a step.
    model = _model()
    before = [v.numpy() for v in model.trainable_variables]
    quiet = _trainer({"norm": norm, "noise_multiplier": 0.0}, model)
    quiet.sampled_step(*empty, expected_size)
    for b, v in zip(before, model.trainable_variables, strict=True):
        np.testing.assert_array_equal(b, v.numpy())
    assert int(quiet.step_count.numpy()) == 1


def test_poisson_steps_of_every_size_share_one_trace_and_non_finite_ones_are_skipped() -> None:
    x, y = _data(40)
    model = _model()
    trainer = _trainer({"norm": 1.0, "noise_multiplier": 1.0}, model, learning_rate=0.1, seed=2)
    recipe = Recipe("dp", 3, 4, "sgd", (0.1,))
    sizes = {len(b) for b in poisson_batches(poisson_generator(2, 0), 40, 0.1, 30)}
    assert len(sizes) >= 4 and 0 in sizes  # sizes vary, and one draw is empty
    report = run_epochs(trainer, recipe, (x, y), seed=2, delta=1e-5)
    assert report.steps == 30 and report.traces == 1 and report.skipped_steps == 0
    # A NaN example makes the release non-finite: the step is skipped, bit for bit.
    before = [v.numpy() for v in model.trainable_variables]
    poisoned = x[:3].copy()
    poisoned[1, 0] = np.nan
    result = trainer.sampled_step(poisoned, y[:3], 4)
    assert bool(result.skipped) and int(trainer.skipped_steps.numpy()) == 1
    for b, v in zip(before, model.trainable_variables, strict=True):
        np.testing.assert_array_equal(b, v.numpy())
    trainer.sampled_step(x[:5], y[:5], 4)
    assert trainer.traces == 1


def test_a_chain_releases_its_private_step_over_the_expected_batch_size() -> None:
    rng = np.random.default_rng(1)
    grads = [
        rng.normal(size=(3, 4, 2)).astype(np.float32),
        rng.normal(size=(3, 5)).astype(np.float32),
    ]
    seed = tf.constant([9, 4], tf.int64)
    dp = make_defense("dpsgd", norm=1.0, noise_multiplier=0.5)
    noise = make_defense("gaussian", sigma=0.01)
    chain = Chain(steps=(dp, noise))
    got = chain.apply_sampled(grads, seed=seed, expected_size=8)
    private = dp.apply_sampled(grads, seed=tensor_seed(seed, 0), expected_size=8)
    want = noise(private, seed=tensor_seed(seed, 1))
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g.numpy(), w.numpy())
    with pytest.raises(NotImplementedError, match="gaussian"):
        noise.apply_sampled(grads, seed=seed, expected_size=8)


def test_the_search_epsilon_composes_every_rate_by_hand() -> None:
    """Three rates of 1 epoch each on 90 examples in batches of 9 (q = 0.1, 10 steps per run):
    the search's epsilon is the accountant's for 30 Poisson-sampled Gaussian steps."""
    import dp_accounting
    from dp_accounting import rdp

    x, y = _data(100)
    z, delta = 1.0, 1e-5
    rates = (0.1, 0.2, 0.4)
    config = TrainingConfig(
        validation=0.1, delta=delta, edge_extensions=0,
        dp=DPRecipe(epochs=1, batch_size=9, learning_rates=rates),
    )  # fmt: skip
    defense = make_defense("dpsgd", norm=1.0, noise_multiplier=z)
    chosen = select(_model, defense, config, (x, y), num_classes=CLASSES, seed=0)
    assert chosen.report.steps == 10 and chosen.rates == rates
    accountant = rdp.RdpAccountant()
    sampled = dp_accounting.PoissonSampledDpEvent(0.1, dp_accounting.GaussianDpEvent(z))
    accountant.compose(dp_accounting.SelfComposedDpEvent(sampled, 30))
    assert chosen.epsilon_search == pytest.approx(accountant.get_epsilon(delta), rel=1e-9)
    assert chosen.epsilon_search > chosen.report.epsilon
    assert chosen.report.epsilon == pytest.approx(defense.epsilon(0.1, 10, delta), rel=1e-12)
    # One rate: no search, the two agree; without an accountant there is neither.
    single = TrainingConfig(
        validation=0.1, dp=DPRecipe(epochs=1, batch_size=9, learning_rates=(0.1,))
    )
    one = select(_model, defense, single, (x, y), num_classes=CLASSES, seed=0)
    assert one.epsilon_search == pytest.approx(one.report.epsilon, rel=1e-12)
    other = select(
        _model, make_defense("gaussian", sigma=0.01),
        TrainingConfig(epochs=1, batch_size=9, learning_rates=(0.1, 0.2)),
        (x, y), num_classes=CLASSES, seed=0,
    )  # fmt: skip
    assert other.epsilon_search is None and other.report.epsilon is None


def test_the_runs_of_a_search_draw_independent_noise() -> None:
    key = training_draw(tf.constant(5, tf.int64), tf.constant(3, tf.int64))
    draws = {tuple(sampled_draw(key, tf.constant(r, tf.int64)).numpy()) for r in range(8)}
    assert len(draws) == 8 and tuple(key.numpy()) not in draws
