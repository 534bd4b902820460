"""Inverting Gradients (`ig`) and batches: the issue's acceptance checks on embedded digits."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from leakbench import metrics
from leakbench.attacks import AttackTarget, make_attack
from leakbench.attacks.engine.matching import cosine_distance
from leakbench.attacks.priors.tv import total_variation
from leakbench.errors import ConfigError
from leakbench.models import model_gradients

SHAPE = (8, 8, 1)


def _batches(data, model, count: int, size: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        idx = rng.choice(len(data.test), size, replace=False)
        x, y = data.test.x[idx], data.test.y[idx]
        grads = model_gradients(model, tf.constant(x), tf.one_hot(y, 10))
        out.append((x, y, AttackTarget(model, tuple(grads), SHAPE, size, 10)))
    return out


def test_cosine_distance_by_hand() -> None:
    # Layers [1, 0] and [2] against [0, 1] and [2]: dot 4, norms sqrt(5) and sqrt(5).
    dummy = [tf.constant([[1.0, 0.0]]), tf.constant([[2.0]])]
    observed = [tf.constant([[0.0, 1.0]]), tf.constant([[2.0]])]
    np.testing.assert_allclose(cosine_distance(dummy, observed).numpy(), [1 - 4 / 5], rtol=1e-6)
    # Blind to positive scale, as norm clipping needs.
    scaled = [3.0 * o for o in observed]
    np.testing.assert_allclose(cosine_distance(dummy, scaled).numpy(), [1 - 4 / 5], rtol=1e-6)


def test_total_variation_by_hand() -> None:
    # One 2x3 image [[0, 1, 1], [0, 0, 1]]: vertical |diffs| 0, 1, 0 (mean 1/3), horizontal
    # 1, 0, 0, 1 (mean 1/2).
    image = tf.constant([[0.0, 1.0, 1.0], [0.0, 0.0, 1.0]])[None, None, :, :, None]
    np.testing.assert_allclose(total_variation(image).numpy(), [1 / 3 + 1 / 2], rtol=1e-6)


def test_ig_recovers_single_digits(digits, lenet) -> None:
    batches = _batches(digits, lenet, 4, 1)
    recs = make_attack("ig", iterations=400).attack_many([b[2] for b in batches], [0, 1, 2, 3])
    psnrs = [
        metrics.psnr(metrics.mse(x, r.images))[0]
        for (x, _, _), r in zip(batches, recs, strict=True)
    ]
    assert all(r.status == "ok" for r in recs)
    assert np.median(psnrs) > 30
    assert [int(r.labels[0]) for r in recs] == [int(y[0]) for _, y, _ in batches]


def test_batches_of_four_labels_and_ig_psnr(digits, lenet) -> None:
    """Acceptance 3: batch size 4 on digits, labels recovered from the gradient (>= 90% over
    the multiset) and a median PSNR above 20 dB for ig without a defense, images matched to
    the originals before scoring."""
    batches = _batches(digits, lenet, 6, 4, seed=1)
    recs = make_attack("ig", iterations=600).attack_many([b[2] for b in batches], list(range(6)))
    scores = [
        metrics.score_batch(x, y, r.images, r.labels)
        for (x, y, _), r in zip(batches, recs, strict=True)
    ]
    assert np.mean([s.label_acc for s in scores]) >= 0.9
    assert np.median(np.concatenate([s.psnr for s in scores])) > 20


def test_ig_starts_keep_the_lowest_matching_loss(digits, lenet) -> None:
    # Start 0 of a run with several starts is the start of a run with one: with more starts
    # the kept loss can only be lower or equal, and it is the minimum over the starts.
    target = _batches(digits, lenet, 1, 1, seed=3)[0][2]
    one = make_attack("ig", iterations=60)(target, seed=5)
    three = make_attack("ig", iterations=60, starts=3)(target, seed=5)
    assert three.loss <= one.loss
    assert three.evaluations == 3 * 61 and one.evaluations == 61
    # The old name: restarts = 2 is starts = 3, the same attack.
    with pytest.warns(FutureWarning, match="use 'starts'"):
        old = make_attack("ig", iterations=60, restarts=2)
    assert old == make_attack("ig", iterations=60, starts=3)


def test_ig_and_dlg_take_batches_up_to_64() -> None:
    for name in ("ig", "dlg"):
        make_attack(name).check_batch_size(64)
        with pytest.raises(ConfigError, match="batch_size must be <= 64"):
            make_attack(name).check_batch_size(65)


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"lr": 0}, "lr"),
        ({"tv": -1.0}, "tv"),
        ({"signed": "yes"}, "signed"),
        ({"match": "some"}, "match"),
        ({"iterations": 0}, "iterations"),
        ({"starts": 0}, "starts"),
        ({"retries": -1}, "retries"),
    ],
)
def test_ig_parameters_are_validated(params: dict, field: str) -> None:
    with pytest.raises(ConfigError, match=f"attack ig: {field}"):
        make_attack("ig", **params)
