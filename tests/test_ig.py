"""Inverting Gradients (`ig`) and batches: the issue's acceptance checks on embedded digits."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from leakbench import metrics
from leakbench.attacks import AttackTarget, make_attack
from leakbench.attacks.engine.matching import cosine_distance
from leakbench.attacks.priors import make_prior
from leakbench.attacks.priors.tv import REFERENCE_MEAN, total_variation
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


def test_zero_padded_total_variation_by_hand() -> None:
    # The 2x3 image above, with a border of 0.25 below it and to its right. Horizontal
    # differences, H x W = 6 of them, by row: |1-0|, |1-1|, |0.25-1|; |0-0|, |1-0|, |0.25-1|
    # (sum 3.5); vertical ones by column: |0-0|, |0.25-0|; |0-1|, |0.25-0|; |1-1|, |0.25-1|
    # (sum 2.25); each direction's mean over its 6.
    image = tf.constant([[0.0, 1.0, 1.0], [0.0, 0.0, 1.0]])[None, None, :, :, None]
    np.testing.assert_allclose(total_variation(image, [0.25]).numpy(), [5.75 / 6], rtol=1e-6)
    # One border value per channel: a constant image equal to the border has none.
    flat = tf.ones([1, 2, 3, 4, 2]) * tf.constant([0.2, 0.7])
    np.testing.assert_allclose(total_variation(flat, [0.2, 0.7]).numpy(), [0.0], atol=1e-7)
    # Against another border b a constant H x W image differs at its last column (H of the
    # H x W horizontal differences) and last row (W of the vertical ones): |c - b| (1/W + 1/H)
    # per channel, here (0.3 + 0.2) / 2 * (1/4 + 1/3).
    np.testing.assert_allclose(
        total_variation(flat, [0.5, 0.5]).numpy(), [0.25 * 7 / 12], rtol=1e-6
    )


def test_tv_prior_pads_with_the_reference_mean() -> None:
    zeros = tf.zeros([1, 1, 4, 4, 3])
    padded = make_prior("tv", weight=1.0, padding="mean")
    # A black 4x4 RGB image: each channel's border term is its mean, (1/4 + 1/4) of the time.
    np.testing.assert_allclose(
        padded.penalty(zeros, None).numpy(), [0.5 * np.mean(REFERENCE_MEAN)], rtol=1e-6
    )
    at_mean = tf.ones([1, 1, 4, 4, 3]) * tf.constant(REFERENCE_MEAN, tf.float32)
    np.testing.assert_allclose(padded.penalty(at_mean, None).numpy(), [0.0], atol=1e-7)
    # Grey images use the channels' average; the prior's own default is unpadded.
    np.testing.assert_allclose(
        padded.penalty(tf.zeros([1, 1, 4, 4, 1]), None).numpy(),
        [0.5 * np.mean(REFERENCE_MEAN)],
        rtol=1e-6,
    )
    assert make_prior("tv").padding == "none"
    assert make_prior("tv").penalty(zeros, None).numpy() == [0.0]


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
