"""BatchNorm as Keras trains it: batch statistics in every gradient, moving statistics learned by
training only, and the BatchNorm-statistics prior of the attacks."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from leakbench.attacks import AttackTarget, make_attack
from leakbench.attacks.engine.matching import matching_objective
from leakbench.attacks.labels import recover_labels
from leakbench.attacks.priors import PriorContext, make_prior
from leakbench.client import batch_statistics, defended_gradients
from leakbench.client.recipes import TrainingConfig
from leakbench.client.training import DefendedTrainer
from leakbench.components.forward import batch_norm_layers, batch_statistics_fn, model_gradients
from leakbench.components.models import build_model
from leakbench.core.errors import ConfigError
from leakbench.defenses import Defense, NoDefense
from leakbench.run.config import parse_config

SHAPE = (12, 12, 3)
CLASSES = 4


@pytest.fixture(scope="module")
def convnet():
    return build_model("convnet", SHAPE, CLASSES, seed=3)


def _batch(n: int, seed: int = 0) -> tuple[tf.Tensor, tf.Tensor]:
    rng = np.random.default_rng(seed)
    x = tf.constant(rng.uniform(0.0, 1.0, (n, *SHAPE)), tf.float32)
    return x, tf.one_hot(rng.integers(0, CLASSES, n), CLASSES)


def _values(variables) -> list[np.ndarray]:
    return [np.array(v.numpy()) for v in variables]


def test_a_batch_gradient_mixes_its_examples_and_changes_no_variable(convnet) -> None:
    x, y = _batch(4)
    before = _values(convnet.variables)
    batch = model_gradients(convnet, x, y)
    singles = [model_gradients(convnet, x[i : i + 1], y[i : i + 1]) for i in range(4)]
    mean = [np.mean([s[k] for s in singles], axis=0) for k in range(len(batch))]
    # In training mode each example is normalised by the batch's statistics: the batch
    # gradient is not the mean of the examples' own (it would be in inference mode).
    gap = max(float(np.max(np.abs(b.numpy() - m))) for b, m in zip(batch, mean, strict=True))
    assert gap > 1e-3
    recover_labels(convnet, batch, 4, CLASSES)  # label recovery runs forward passes too
    defended_gradients(NoDefense(), convnet, x, y, tf.constant([0, 0]))
    for b, a in zip(before, _values(convnet.variables), strict=True):
        np.testing.assert_array_equal(a, b)


def test_batch_statistics_are_the_moments_of_each_batchnorm_input(convnet) -> None:
    x, _ = _batch(3)
    stats = batch_statistics(convnet, x)
    assert len(stats) == 2 * len(batch_norm_layers(convnet)) == 16
    # By hand for the first layer: the first convolution's output, moments over batch and space.
    features = convnet.layers[0](x).numpy()
    np.testing.assert_allclose(stats[0], features.mean(axis=(0, 1, 2)), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(stats[1], features.var(axis=(0, 1, 2)), rtol=1e-4, atol=1e-6)
    # The statistics follow the weights they are given, not the model's variables.
    values = [v.value for v in convnet.trainable_variables]
    doubled = [2.0 * v if i == 0 else v for i, v in enumerate(values)]  # the first kernel
    moved = batch_statistics_fn(convnet)(doubled, x)
    np.testing.assert_allclose(
        moved[0], 2.0 * stats[0] - convnet.layers[0].bias.numpy(), rtol=1e-4, atol=1e-5
    )


def test_training_learns_the_moving_statistics_and_a_skipped_step_keeps_them() -> None:
    model = build_model("convnet", SHAPE, CLASSES, seed=5)
    x, y = _batch(8, seed=1)
    first = batch_statistics(model, x)  # at the initial weights, before the step
    trainer = DefendedTrainer(
        model, NoDefense(), TrainingConfig().make_optimizer(), num_classes=CLASSES, seed=0
    )
    labels = tf.argmax(y, axis=1)
    trainer.step(x, labels)
    bn = batch_norm_layers(model)[0]
    # Keras' rule with momentum 0.9 from mean 0 and variance 1.
    np.testing.assert_allclose(bn.moving_mean.numpy(), 0.1 * first[0].numpy(), atol=1e-6)
    np.testing.assert_allclose(bn.moving_variance.numpy(), 0.9 + 0.1 * first[1].numpy(), rtol=1e-5)

    @dataclasses.dataclass(frozen=True)
    class Poison(Defense):
        name = "test_poison"

        def __call__(self, grads, *, seed):
            return [g * float("nan") for g in grads]

    poisoned = DefendedTrainer(
        model, Poison(), TrainingConfig().make_optimizer(), num_classes=CLASSES, seed=0
    )
    before = _values(model.variables)
    result = poisoned.step(x, labels)
    assert bool(result.skipped)
    for b, a in zip(before, _values(model.variables), strict=True):
        np.testing.assert_array_equal(a, b)


def test_inference_uses_the_learned_statistics() -> None:
    model = build_model("convnet", SHAPE, CLASSES, seed=5)
    x, y = _batch(8, seed=1)
    untrained = model.predict(x, verbose=0)
    trainer = DefendedTrainer(
        model, NoDefense(), TrainingConfig().make_optimizer(), num_classes=CLASSES, seed=0
    )
    for _ in range(3):
        trainer.step(x, tf.argmax(y, axis=1))
    bn = batch_norm_layers(model)[0]
    assert not np.allclose(bn.moving_mean.numpy(), 0.0)
    assert not np.allclose(model.predict(x, verbose=0), untrained)


def _objective(model, x, y, observed, **options):
    weights = tuple(v.value[None] for v in model.trainable_variables)
    return matching_objective(
        model, weights, tuple(o[None] for o in observed), y[None], input_shape=SHAPE,
        batch_size=int(x.shape[0]), num_classes=CLASSES, learn_labels=False, loss="l2",
        **options,
    )  # fmt: skip


def test_secure_aggregation_simulates_each_clients_own_statistics(convnet) -> None:
    x, y = _batch(4, seed=2)
    halves = [model_gradients(convnet, x[k : k + 2], y[k : k + 2]) for k in (0, 2)]
    observed = [(a + b) / 2 for a, b in zip(*halves, strict=True)]
    z = tf.reshape(x, (1, -1))
    per_client, _ = _objective(convnet, x, y, observed, clients=2)(z)
    as_one_batch, _ = _objective(convnet, x, y, observed)(z)
    # The true images match the mean of the two clients' gradients only when each client's
    # half is normalised by its own statistics.
    assert float(per_client[0]) < 1e-8
    assert float(as_one_batch[0]) > 1e-4


def test_the_bn_prior_is_zero_at_the_private_batch_and_pulls_towards_it(convnet) -> None:
    x, y = _batch(2, seed=4)
    prior = make_prior("bn_statistics")
    assert prior.needs_statistics and prior.weight == 0.01
    known = tuple(s[None] for s in batch_statistics(convnet, x))
    weights = tuple(v.value[None] for v in convnet.trainable_variables)
    context = PriorContext(convnet, weights, (), y[None], lambda w, i: i, 1, known)
    noise = tf.random.stateless_uniform((1, 2, *SHAPE), seed=[1, 2])
    with tf.GradientTape() as tape:
        tape.watch(noise)
        far = prior.penalty(noise, context)
    grad = tape.gradient(far, noise)
    at_truth = prior.penalty(x[None], context)
    assert float(at_truth[0]) < 1e-4 < float(far[0])
    assert np.all(np.isfinite(grad.numpy())) and float(tf.reduce_max(tf.abs(grad))) > 0
    # A small step against the gradient lowers the penalty.
    step = noise - 1e-3 * grad / tf.reduce_max(tf.abs(grad))
    assert float(prior.penalty(step, context)[0]) < float(far[0])


def test_an_attack_reads_the_known_statistics_through_its_objective(convnet) -> None:
    x, y = _batch(2, seed=6)
    observed = model_gradients(convnet, x, y)
    stats = batch_statistics(convnet, x)
    priors = (make_prior("bn_statistics", weight=1.0),)
    z = tf.reshape(x, (1, -1))
    with_truth, _ = _objective(convnet, x, y, [*observed, *stats], priors=priors)(z)
    assert float(with_truth[0]) < 1e-4
    shifted = [s + 1.0 for s in stats]
    with_wrong, _ = _objective(convnet, x, y, [*observed, *shifted], priors=priors)(z)
    assert float(with_wrong[0]) > 1.0  # 16 statistics, each off by sqrt(channels) >= 2.8


def test_the_bn_prior_without_statistics_is_refused(convnet) -> None:
    x, y = _batch(1)
    attack = make_attack("ig", iterations=1, priors=({"name": "bn_statistics"},))
    target = AttackTarget(convnet, tuple(model_gradients(convnet, x, y)), SHAPE, 1, CLASSES)
    with pytest.raises(ConfigError, match="bn_statistics_known = true"):
        attack(target, seed=0)


@pytest.mark.parametrize(
    ("table", "needle"),
    [
        ("bn_statistics_known = true\nlocal_steps = 2", "bn_statistics_known with FedAvg"),
        ("bn_statistics_known = true\nclients = 2", "bn_statistics_known with clients above 1"),
        ('bn_statistics_known = "yes"', "threat_model.bn_statistics_known must be true or false"),
    ],
)
def test_statistics_the_threat_model_cannot_define_are_refused(table: str, needle: str) -> None:
    text = 'name = "bn"\nmodel = "convnet"\nsuite = "listed"\nimages = 4\nbatch_size = 2\n'
    text += f'[threat_model]\n{table}\n[[attack]]\nname = "ig"\niterations = 2\n'
    with pytest.raises(ConfigError, match=needle):
        parse_config(text)
