"""The composable objective: priors as terms of the matching loss, chosen in an attack's config."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import numpy as np
import pytest
import tensorflow as tf

from leakbench.attacks import make_attack
from leakbench.attacks.engine.matching import matching_objective
from leakbench.attacks.priors import PRIORS, Prior, PriorContext, make_prior
from leakbench.attacks.priors.tv import total_variation
from leakbench.components.forward import model_gradients
from leakbench.core.errors import ConfigError
from leakbench.run.config import parse_config

SHAPE = (8, 8, 1)


@pytest.fixture
def brightness() -> Iterator[type[Prior]]:
    """A prior registered for one test: the mean pixel value of each problem's images."""

    @PRIORS.register("test_brightness")
    @dataclasses.dataclass(frozen=True)
    class Brightness(Prior):
        name = "test_brightness"

        def penalty(self, images: tf.Tensor, context: PriorContext) -> tf.Tensor:
            assert context.weights and context.observed  # the context reaches the prior
            return tf.reduce_mean(images, axis=[1, 2, 3, 4])

    yield Brightness
    PRIORS.unregister("test_brightness")


def _objective(lenet, digits, **options):
    x, y = digits.test.x[:1], digits.test.y[:1]
    onehot = tf.one_hot(y, digits.num_classes)
    observed = tuple(g[None] for g in model_gradients(lenet, tf.constant(x), onehot))
    weights = tuple(v.value[None] for v in lenet.trainable_variables)
    return matching_objective(
        lenet, weights, observed, onehot[None], input_shape=SHAPE, batch_size=1,
        num_classes=digits.num_classes, learn_labels=False, **options,
    )  # fmt: skip


def test_priors_add_weight_times_penalty_to_the_matching_loss(lenet, digits, brightness) -> None:
    z = tf.constant(np.random.default_rng(0).uniform(size=(1, 64)), tf.float32)
    images = tf.reshape(z, (1, 1, *SHAPE))
    plain, plain_grad = _objective(lenet, digits)(z)
    priors = (make_prior("tv", weight=0.5), make_prior("test_brightness", weight=3.0))
    both, both_grad = _objective(lenet, digits, priors=priors)(z)
    expected = plain + 0.5 * total_variation(images) + 3.0 * tf.reduce_mean(images)
    np.testing.assert_allclose(both.numpy(), expected.numpy(), rtol=1e-6)
    # Brightness adds 3 / 64 to every pixel's gradient; TV adds a multiple of +-1/56 terms.
    assert not np.allclose(both_grad.numpy(), plain_grad.numpy())


def test_ig_tv_is_the_tv_prior(lenet, digits) -> None:
    ig = make_attack("ig", tv=0.25)
    # Padded with the mean past the edges, as the reference's total variation is by default.
    assert ig.objective_priors() == (make_prior("tv", weight=0.25, padding="mean"),)
    unpadded = make_attack("ig", tv=0.25, tv_padding="none")
    assert unpadded.objective_priors() == (make_prior("tv", weight=0.25),)
    assert make_attack("ig", tv=0.0).objective_priors() == ()
    with pytest.raises(ConfigError, match="total-variation weight once"):
        make_attack("ig", tv=0.1, priors=[{"name": "tv", "weight": 0.1}])


def test_attack_params_gain_priors_only_when_set() -> None:
    # Trial keys of attacks without priors stay what they were before priors existed.
    assert "priors" not in make_attack("dlg").params()
    with_prior = make_attack("dlg", priors=[{"name": "tv", "weight": 0.01}])
    assert with_prior.params()["priors"] == ({"name": "tv", "weight": 0.01},)


def test_a_config_selects_priors_without_sweeping_them() -> None:
    spec = parse_config(
        'dataset = "digits"\n[[attack]]\nname = "dlg"\niterations = [5, 6]\n'
        'priors = [{ name = "tv", weight = 0.01 }]\n'
    )
    grid = spec.attack_grid()
    assert [a.iterations for a in grid] == [5, 6]
    assert all(a.objective_priors() == (make_prior("tv", weight=0.01),) for a in grid)
    assert "priors" in spec.to_toml()
    assert "priors" not in parse_config('[[attack]]\nname = "dlg"\n').to_toml()


@pytest.mark.parametrize(
    ("priors", "needle"),
    [
        ([{"name": "nope"}], "attack dlg: priors[0]: unknown prior 'nope'; allowed: "),
        ([{"name": "tv", "weight": -1}], "attack dlg: priors[0]: prior tv: weight must be"),
        ([{"name": "tv", "scale": 1}], "unknown parameter 'scale'"),
        ([{"weight": 1}], "attack dlg: priors[0].name must be a string"),
        ("tv", "attack dlg: priors must be a list of tables"),
        ([{"name": "tv"}, {"name": "tv"}], "names a prior twice"),
    ],
)
def test_bad_priors_are_refused_in_one_line(priors, needle) -> None:
    with pytest.raises(Exception) as info:
        make_attack("dlg", priors=priors)
    message = str(info.value)
    assert needle in message and "\n" not in message
