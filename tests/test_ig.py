"""Inverting Gradients (`ig`) and batches: the issue's acceptance checks on embedded digits."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from scripts import load_script

from leakbench.attacks import AttackTarget, make_attack
from leakbench.attacks.engine.matching import cosine_distance
from leakbench.attacks.priors import make_prior
from leakbench.attacks.priors.tv import REFERENCE_MEAN, REFERENCE_STD, total_variation
from leakbench.components import metrics
from leakbench.components.forward import model_gradients
from leakbench.components.models import build_model
from leakbench.core.errors import ConfigError
from leakbench.core.seeds import attempt_draw

SHAPE = (8, 8, 1)
# The reference's total-variation weight is for CIFAR-10 images; on these 8x8 digits it smooths
# the reconstructions away (median 7.9 dB over the four digits of the first test at the default
# tv = 0.8, 41.7 dB at 1e-4, 57.8 dB at 0), so the digit tests keep the weight they were set for.
DIGIT_TV = 1e-4


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


def test_ig_defaults_are_the_reference_configuration_in_pixel_units() -> None:
    """The reference (breaching's invertinggradients.yaml) steps 0.1 and weighs the total
    variation by 0.2 in units normalised by the CIFAR-10 channel std; in [0, 1] pixels a step
    is std times as long and a difference 1 / std times as large (see the `ig` docstring)."""
    std = np.array([0.24703224003314972, 0.24348513782024384, 0.26158785820007324])
    mean = np.array([0.4914672374725342, 0.4822617471218109, 0.4467701315879822])
    np.testing.assert_array_equal(REFERENCE_STD, std)
    np.testing.assert_array_equal(REFERENCE_MEAN, mean)
    lr = 0.1 * std.mean()  # 0.025070
    tv = 0.2 * np.mean(1.0 / std)  # 0.79853
    attack = make_attack("ig")
    # The defaults are these rounded to two significant digits (0.3% and 0.2% off).
    assert attack.lr == 0.025 and abs(attack.lr / lr - 1) < 3e-3
    assert attack.tv == 0.8 and abs(attack.tv / tv - 1) < 3e-3
    assert attack.signed and attack.init == "gaussian" and attack.tv_padding == "mean"
    assert attack.iterations == 2000 and attack.starts == 1
    assert attack.objective_priors()[0].padding == "mean"
    assert make_attack("ig", tv_padding="none").objective_priors()[0].padding == "none"


def test_ig_gaussian_starts_follow_the_reference_statistics() -> None:
    attack = make_attack("ig", starts=2)
    shape = (2, 32, 32, 3)
    z = attack.start_points([attempt_draw(7, 1)], shape).numpy()
    assert z.shape == (2, 2 * 32 * 32 * 3)
    assert not np.allclose(z[0], z[1])  # each start its own draw
    pixels = z.reshape(-1, 3)  # flat NHWC: the channel varies fastest
    n = len(pixels)  # 4,096 draws per channel
    std = np.array(REFERENCE_STD)
    # Means within 4 standard errors, stds within 4 of their standard errors (std / sqrt(2n)).
    assert np.all(np.abs(pixels.mean(axis=0) - REFERENCE_MEAN) < 4 * std / np.sqrt(n))
    assert np.all(np.abs(pixels.std(axis=0) - std) < 4 * std / np.sqrt(2 * n))
    # Not clamped here (the box clamps before the first step): some lie outside [0, 1].
    assert (pixels < 0).any() and (pixels > 1).any()
    again = attack.start_points([attempt_draw(7, 1)], shape).numpy()
    np.testing.assert_array_equal(z, again)
    # Grey images: the channels' average statistics.
    grey = attack.start_points([attempt_draw(7, 1)], (1, 64, 64, 1)).numpy()
    assert abs(grey.mean() - np.mean(REFERENCE_MEAN)) < 4 * np.mean(std) / 64
    assert abs(grey.std() - np.mean(std)) < 4 * np.mean(std) / 64


def test_ig_uniform_starts_are_the_previous_draw() -> None:
    key = attempt_draw(3, 1)
    z = make_attack("ig", init="uniform", starts=2).start_points([key], (1, 4, 4, 3)).numpy()
    for k in range(2):
        seed = tf.random.experimental.stateless_fold_in(key, k)
        np.testing.assert_array_equal(z[k], tf.random.stateless_uniform([48], seed=seed))


def test_ig_starts_from_its_clamped_start_points() -> None:
    # One iteration from the start: the first loss is the objective at the clamped start.
    model = build_model("convnet", (8, 8, 3), 10, seed=0)
    x = tf.constant(np.random.default_rng(0).uniform(size=(1, 8, 8, 3)), tf.float32)
    observed = model_gradients(model, x, tf.one_hot([3], 10))
    target = AttackTarget(model, tuple(observed), (8, 8, 3), 1, 10, labels=np.array([3]))
    attack = make_attack("ig", iterations=1)
    start = attack.start_points([attempt_draw(5, 1)], (1, 8, 8, 3))
    images = tf.reshape(tf.clip_by_value(start, 0.0, 1.0), (1, 1, 8, 8, 3))
    dummy = model_gradients(model, images[0], tf.one_hot([3], 10))
    expected = cosine_distance([g[None] for g in dummy], [o[None] for o in observed])
    expected += 0.8 * attack.objective_priors()[0].penalty(images, None)
    rec = attack(target, seed=5)
    np.testing.assert_allclose(rec.loss_history[0], expected.numpy()[0], rtol=1e-4)


def test_ig_recovers_single_digits(digits, lenet) -> None:
    batches = _batches(digits, lenet, 4, 1)
    recs = make_attack("ig", iterations=400, tv=DIGIT_TV).attack_many(
        [b[2] for b in batches], [0, 1, 2, 3]
    )
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
    recs = make_attack("ig", iterations=600, tv=DIGIT_TV).attack_many(
        [b[2] for b in batches], list(range(6))
    )
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


def test_ig_takes_a_matching_loss_from_the_registry(digits, lenet) -> None:
    # The default is the paper's cosine, kept out of the parameters (and so the trial keys)
    # unless set; another registered loss is what the objective then minimises.
    assert make_attack("ig").loss == "cosine"
    assert "loss" not in make_attack("ig").params()
    assert make_attack("ig", loss="l2").params()["loss"] == "l2"
    target = _batches(digits, lenet, 1, 1, seed=3)[0][2]
    cosine = make_attack("ig", iterations=3)(target, seed=5)
    assert make_attack("ig", iterations=3, loss="cosine")(target, seed=5).loss == cosine.loss
    l2 = make_attack("ig", iterations=3, loss="l2")(target, seed=5)
    assert l2.status == "ok"
    assert np.isfinite(l2.loss) and l2.loss != cosine.loss


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
        ({"init": "zeros"}, "init"),
        ({"tv_padding": "zero"}, "tv_padding"),
        ({"loss": "l3"}, "loss"),
    ],
)
def test_ig_parameters_are_validated(params: dict, field: str) -> None:
    with pytest.raises(ConfigError, match=f"attack ig: {field}"):
        make_attack("ig", **params)


def _torch_reference():
    """``benchmarks/torch_reference.py``, the PyTorch implementations the benchmarks compare
    with; the test is skipped where PyTorch is not installed (it is no dependency)."""
    pytest.importorskip("torch", reason="PyTorch is not installed (pip install torch)")
    return load_script("torch_reference")


def test_the_pytorch_ig_sees_leakbench_gradients_and_objective() -> None:
    torch_reference = _torch_reference()
    shape = (32, 32, 3)
    model = build_model("convnet", shape, 10, seed=0)
    weights = [v.numpy() for v in model.trainable_variables]
    rng = np.random.default_rng(0)
    x = rng.uniform(size=shape).astype(np.float32)
    observed = model_gradients(model, tf.constant(x[None]), tf.one_hot([4], 10))
    theirs = torch_reference.convnet_gradients(weights, x, 4, 10)
    ours = torch_reference.to_torch_layout([g.numpy() for g in observed], shape)
    for a, b in zip(theirs, ours, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-4)
    # The same cosine objective at the same start (total variation off on both sides).
    attack = make_attack("ig", iterations=1, tv=0.0)
    target = AttackTarget(model, tuple(observed), shape, 1, 10, labels=np.array([4]))
    start = np.clip(attack.start_points([attempt_draw(2, 1)], (1, *shape)).numpy(), 0, 1)
    u = (start.reshape(shape) - np.array(REFERENCE_MEAN)) / np.array(REFERENCE_STD)
    first = torch_reference.ig_attack(weights, x, 4, 10, u, iterations=0, tv=0.0)
    np.testing.assert_allclose(first.initial_loss, attack(target, seed=2).loss_history[0], 1e-4)
    # The zero-padded total variation of both is the same function of the same values.
    u = rng.normal(size=(2, 5, 6, 3)).astype(np.float32)
    padded = torch_reference._total_variation(torch_reference._nhwc_to_nchw(u[:1], (5, 6, 3)), True)
    ours = total_variation(tf.constant(u[None, :1]), [0.0, 0.0, 0.0]).numpy()[0]
    np.testing.assert_allclose(float(padded), ours, rtol=1e-5)
