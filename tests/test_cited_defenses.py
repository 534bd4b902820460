"""Soteria, MixUp and PRECODE: their transformations by hand, and the adaptive attacks on them."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import tensorflow as tf

from leakbench.attacks import make_attack
from leakbench.attacks.base import AttackTarget
from leakbench.attacks.engine.matching import matching_objective
from leakbench.client import check_model, defended_gradients, defended_step, observer
from leakbench.components.bottleneck import VariationalBottleneck, noise_width, with_architecture
from leakbench.components.forward import (
    head_kernel_index,
    head_start,
    loss_and_gradients,
    stateless_forward_and_penalty,
)
from leakbench.components.metrics import score_batch
from leakbench.components.models import build_model
from leakbench.core.errors import ConfigError
from leakbench.core.federated import LocalTraining
from leakbench.defenses import ClientView, make_defense, prepare_seed
from leakbench.defenses.mixup import mixing_weights, partners
from leakbench.defenses.soteria import unit_scores
from leakbench.outputs.tables import rank_defenses, utility_summary

SHAPE = (8, 8, 1)
CLASSES = 10


def batch(size: int, seed: int = 0) -> tuple[tf.Tensor, tf.Tensor]:
    rng = np.random.default_rng(seed)
    images = tf.constant(rng.uniform(size=(size, *SHAPE)), tf.float32)
    return images, tf.one_hot(rng.integers(0, CLASSES, size=size), CLASSES)


# --- Soteria ------------------------------------------------------------------------------------


def linear_view() -> ClientView:
    # r = x @ A for one example x = [1, 3]: r = [1, 3, 2]; dr_f/dx = A[:, f], of norms 1, 1, 2.
    a = tf.constant([[1.0, 0.0, 2.0], [0.0, 1.0, 0.0]])
    return ClientView(
        images=tf.constant([[1.0, 3.0]]), representation=lambda x: x @ a, head_kernel=1
    )


def test_soteria_scores_by_hand() -> None:
    # score_f = ||dr_f/dx|| / |r_f| = [1/1, 1/3, 2/2].
    np.testing.assert_allclose(unit_scores(linear_view()).numpy(), [1.0, 1 / 3, 1.0], rtol=1e-6)


@pytest.mark.parametrize(
    ("share", "zero_rows"),
    [(0.0, []), (1 / 3, [1]), (2 / 3, [0, 1]), (1.0, [0, 1, 2])],  # a tie: the lower unit first
)
def test_soteria_prunes_the_smallest_scores_rows_of_the_head_kernel(
    share: float, zero_rows: list[int]
) -> None:
    grads = [tf.constant([5.0, 6.0]), tf.reshape(tf.range(1.0, 7.0), (3, 2)), tf.constant([7.0])]
    out = make_defense("soteria", share=share).apply(
        grads, seed=tf.constant([0, 0]), view=linear_view()
    )
    expected = np.arange(1.0, 7.0).reshape(3, 2)
    expected[zero_rows] = 0.0
    np.testing.assert_array_equal(out[1].numpy(), expected)
    np.testing.assert_array_equal(out[0].numpy(), [5.0, 6.0])  # every other tensor passes
    np.testing.assert_array_equal(out[2].numpy(), [7.0])


def test_soteria_on_lenet_touches_only_the_head_kernel() -> None:
    model = build_model("lenet", SHAPE, CLASSES, seed=0)
    images, targets = batch(2)
    plain = loss_and_gradients(model, images, targets)[1]
    out = defended_gradients(
        make_defense("soteria", share=0.5), model, images, targets, tf.constant([1, 2])
    )
    head = head_kernel_index(model)
    units = plain[head].shape[0]  # 48 features of 8x8 digits
    zero = np.all(out[head].numpy() == 0.0, axis=1)
    assert zero.sum() == units // 2
    np.testing.assert_array_equal(out[head].numpy()[~zero], plain[head].numpy()[~zero])
    for i, (o, p) in enumerate(zip(out, plain, strict=True)):
        if i != head:
            np.testing.assert_array_equal(o.numpy(), p.numpy())


# --- MixUp --------------------------------------------------------------------------------------


def test_mixup_mixes_images_and_labels_with_the_same_weights() -> None:
    images, targets = batch(4)
    seed = tf.constant([3, 4], tf.int64)
    mixed_images, mixed_targets = make_defense("mixup", mixed=3, alpha=0.5).prepare(
        images, targets, seed=seed
    )
    weights = mixing_weights(tf.constant(4), 3, 0.5, prepare_seed(seed)).numpy()
    picks = partners(tf.constant(4), 3, prepare_seed(seed)).numpy()
    np.testing.assert_allclose(weights.sum(axis=1), 1.0, rtol=1e-6)
    assert (weights > 0).all()
    np.testing.assert_array_equal(picks[0], np.arange(4))
    offsets = set()
    for row in picks[1:]:
        offset = int(row[0])
        np.testing.assert_array_equal(row, (np.arange(4) + offset) % 4)  # a cyclic shift
        offsets.add(offset)
    assert len(offsets) == 2 and 0 not in offsets  # 3 distinct examples in every mix
    x, y = images.numpy(), targets.numpy()
    for b in range(4):
        want_x = sum(weights[b, j] * x[picks[j, b]] for j in range(3))
        want_y = sum(weights[b, j] * y[picks[j, b]] for j in range(3))
        np.testing.assert_allclose(mixed_images.numpy()[b], want_x, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(mixed_targets.numpy()[b], want_y, rtol=1e-5, atol=1e-6)


def test_mixup_weights_are_dirichlet() -> None:
    # Symmetric Dirichlet(alpha) over k: each weight has mean 1/k and variance
    # (k - 1) / (k^2 (k alpha + 1)); with k = 4, alpha = 1: 0.25 and 0.0375.
    w = mixing_weights(tf.constant(20_000), 4, 1.0, tf.constant([9, 9])).numpy()
    np.testing.assert_allclose(w.mean(axis=0), 0.25, atol=0.01)
    np.testing.assert_allclose(w.var(axis=0), 3 / 80, rtol=0.05)


def test_mixup_gradient_is_the_mixed_batchs() -> None:
    model = build_model("lenet", SHAPE, CLASSES, seed=1)
    images, targets = batch(4)
    seed = tf.constant([5, 6], tf.int64)
    defense = make_defense("mixup", mixed=2)
    x, y = defense.prepare(images, targets, seed=seed)
    expected = loss_and_gradients(model, x, y)[1]
    for o, e in zip(
        defended_gradients(defense, model, images, targets, seed), expected, strict=True
    ):
        np.testing.assert_array_equal(o.numpy(), e.numpy())
    other = defended_gradients(defense, model, images, targets, tf.constant([5, 7], tf.int64))
    assert not np.array_equal(other[-2].numpy(), expected[-2].numpy())


def test_mixup_needs_as_many_examples_as_it_mixes() -> None:
    model = build_model("lenet", SHAPE, CLASSES, seed=0)
    with pytest.raises(ConfigError, match="batch_size must be at least 4, got 2"):
        check_model(model, [make_defense("mixup", mixed=4)], batch_size=2)
    chain = make_defense(
        "chain", steps=[{"name": "mixup", "mixed": 3}, {"name": "clip", "norm": 1}]
    )
    with pytest.raises(ConfigError, match="at least 3"):
        check_model(model, [chain], batch_size=1)
    check_model(model, [make_defense("mixup", mixed=4)], batch_size=4)


# --- PRECODE ------------------------------------------------------------------------------------


def test_precode_model_shares_the_base_weights_and_adds_the_bottleneck() -> None:
    base = build_model("lenet", SHAPE, CLASSES, seed=2)
    model = with_architecture(base, ("variational_bottleneck", 6, 1e-3), seed=2)
    base_vars = base.trainable_variables
    ext = model.trainable_variables
    # Feature extractor: the same variables; then encoder, decoder; then a copy of the head.
    assert all(a is b for a, b in zip(ext[:6], base_vars[:6], strict=True))
    assert [tuple(v.shape) for v in ext[6:10]] == [(48, 12), (12,), (6, 48), (48,)]
    np.testing.assert_array_equal(ext[10].numpy(), base_vars[6].numpy())
    assert ext[10] is not base_vars[6]
    assert head_start(model) == 6 and head_start(base) == 6
    assert head_kernel_index(model) == 10 and noise_width(model) == 6 and noise_width(base) == 0
    # The same seed gives the same bottleneck weights.
    again = with_architecture(
        build_model("lenet", SHAPE, CLASSES, seed=2), ("variational_bottleneck", 6, 1e-3), 2
    )
    for a, b in zip(ext[6:10], again.trainable_variables[6:10], strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_bottleneck_forward_by_hand() -> None:
    base = build_model("lenet", SHAPE, CLASSES, seed=3)
    model = with_architecture(base, ("variational_bottleneck", 4, 1e-3), seed=3)
    images, _ = batch(2)
    seed = tf.constant([11, 12], tf.int32)
    values = [tf.convert_to_tensor(v) for v in model.non_trainable_variables]
    logits, _, penalty = stateless_forward_and_penalty(model, images, None, [seed])
    enc_k, enc_b, dec_k, dec_b, out_k, out_b = [v.numpy() for v in model.trainable_variables[6:]]
    trunk = model.layers[1]
    features = trunk(images).numpy()
    stats = features @ enc_k + enc_b
    mean, spread = stats[:, :4], np.log1p(np.exp(stats[:, 4:]))
    noise = tf.random.stateless_normal((2, 4), seed=seed).numpy()
    want = ((mean + spread * noise) @ dec_k + dec_b) @ out_k + out_b
    np.testing.assert_allclose(logits.numpy(), want, rtol=1e-4, atol=1e-5)
    # PRECODE's KL term in bits, times beta: the penalty the training loss adds.
    nats = -0.5 * (1 + 2 * np.log(spread) - mean**2 - spread**2).sum(axis=1)
    np.testing.assert_allclose(float(penalty), 1e-3 * nats.mean() / np.log(2), rtol=1e-4)
    assert values[0].numpy().tolist() == [0, 0]


def test_precode_client_draws_from_the_defense_seed_and_leaves_the_model() -> None:
    model = with_architecture(
        build_model("lenet", SHAPE, CLASSES, 0), ("variational_bottleneck", 8, 1e-3), 0
    )
    defense = make_defense("precode", size=8)
    images, targets = batch(1)
    one = defended_step(defense, model, images, targets, tf.constant([1, 1]))
    same = defended_gradients(defense, model, images, targets, tf.constant([1, 1]))
    other = defended_gradients(defense, model, images, targets, tf.constant([1, 2]))
    for a, b in zip(one.gradients, same, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert not np.array_equal(one.gradients[0].numpy(), other[0].numpy())
    # The noise seed is not state the step leaves behind: the variable keeps its value.
    layer = next(x for x in model.layers if isinstance(x, VariationalBottleneck))
    assert layer.noise_seed.numpy().tolist() == [0, 0]
    assert one.state[0].numpy().tolist() == [0, 0]


def test_precode_is_refused_where_it_cannot_run() -> None:
    model = build_model("lenet", SHAPE, CLASSES, 0)
    local = LocalTraining(steps=2, lr=0.1, batch_size=1)
    with pytest.raises(ConfigError, match="local_training.steps = 1"):
        check_model(model, [make_defense("precode")], 1, local)
    with pytest.raises(ConfigError, match="cannot follow an example-level step"):
        make_defense(
            "chain",
            steps=[{"name": "dpsgd", "norm": 1, "noise_multiplier": 1}, {"name": "precode"}],
        )


# --- adaptive attacks ---------------------------------------------------------------------------


def objective_at(model, observed, images, targets, **kwargs):
    """The matching objective of one problem at the model's weights."""
    weights = tuple(v.value[None] for v in model.trainable_variables)
    objective = matching_objective(
        model, weights, tuple(o[None] for o in observed), targets[None], input_shape=SHAPE,
        batch_size=int(images.shape[0]), num_classes=CLASSES, learn_labels=False, **kwargs,
    )  # fmt: skip
    return objective


def test_match_features_ignores_the_head() -> None:
    model = build_model("lenet", SHAPE, CLASSES, seed=4)
    images, targets = batch(1)
    observed = loss_and_gradients(model, images, targets)[1]
    spoiled = list(observed)
    spoiled[-2] = spoiled[-2] * 0.0 + 3.0  # Soteria-like damage to the head kernel
    z = tf.reshape(images, (1, -1))
    for match, zero in (("features", True), ("all", False)):
        objective = objective_at(model, spoiled, images, targets, match=match)
        loss, _ = objective(z)
        assert (float(loss[0]) < 1e-10) == zero


def test_learned_noise_makes_the_true_draw_a_zero_of_the_objective() -> None:
    model = with_architecture(
        build_model("lenet", SHAPE, CLASSES, 5), ("variational_bottleneck", 4, 1e-3), 5
    )
    images, targets = batch(1)
    seed = tf.constant([3, 4])
    observed = observer(make_defense("precode", size=4), model)(images, targets, seed)
    # The client's draw, as `leakbench.client` keys it.
    from leakbench.client import NOISE_STREAM
    from leakbench.components.bottleneck import with_noise_seed
    from leakbench.defenses import tensor_seed

    values = with_noise_seed(
        model, [tf.constant([0, 0], tf.int32)], tensor_seed(seed, NOISE_STREAM)
    )
    noise = tf.random.stateless_normal((1, 4), seed=values[0])
    objective = objective_at(model, observed, images, targets, learn_noise=True)
    z = tf.concat([tf.reshape(images, (1, -1)), tf.reshape(noise, (1, -1))], axis=1)
    assert float(objective(z)[0][0]) < 1e-10
    wrong = tf.concat([tf.reshape(images, (1, -1)), tf.zeros((1, 4))], axis=1)
    assert float(objective(wrong)[0][0]) > 1e-6
    sampled = objective_at(model, observed, images, targets)
    assert float(sampled(tf.reshape(images, (1, -1)))[0][0]) > 1e-6  # the server's own draw


def test_learned_mixing_makes_the_true_mix_a_zero_of_the_objective() -> None:
    model = build_model("lenet", SHAPE, CLASSES, seed=6)
    images, targets = batch(2)
    seed = tf.constant([8, 9])
    defense = make_defense("mixup", mixed=2)
    observed = defended_gradients(defense, model, images, targets, seed)
    weights = mixing_weights(tf.constant(2), 2, 1.0, prepare_seed(seed)).numpy()
    picks = partners(tf.constant(2), 2, prepare_seed(seed)).numpy()
    mix = np.zeros((2, 2))
    for b in range(2):
        for j in range(2):
            mix[b, picks[j, b]] += weights[b, j]
    objective = objective_at(model, observed, images, targets, learn_mixing=True)
    flat = tf.reshape(images, (1, -1))
    truth = tf.concat([flat, tf.constant(np.log(mix).reshape(1, -1), tf.float32)], axis=1)
    assert float(objective(truth)[0][0]) < 1e-9
    unmixed = tf.concat([flat, tf.constant([[0.0, -30.0, -30.0, 0.0]])], axis=1)
    assert float(objective(unmixed)[0][0]) > 1e-6  # the client's own examples do not fit


def attack(model, defense, images, labels, **params) -> float:
    observed = observer(defense, model)(images, tf.one_hot(labels, CLASSES), tf.constant([0, 1]))
    target = AttackTarget(
        model=model, gradients=tuple(observed), input_shape=SHAPE, batch_size=1,
        num_classes=CLASSES,
    )  # fmt: skip
    rec = make_attack("dlg", **params).attack_many([target], [7])[0]
    return float(score_batch(images.numpy(), labels, rec.images, rec.labels).psnr[0])


@pytest.fixture(scope="module")
def digit() -> tuple[tf.Tensor, np.ndarray]:
    from leakbench.datasets import load_dataset

    data = load_dataset("digits", None)
    return tf.constant(data.test.x[:1]), data.test.y[:1]


def test_adaptive_dlg_breaks_soteria(digit: tuple[tf.Tensor, np.ndarray]) -> None:
    images, labels = digit
    model = build_model("lenet", SHAPE, CLASSES, seed=0)
    soteria = make_defense("soteria", share=0.8)
    assert attack(model, soteria, images, labels) < 15.0
    assert attack(model, soteria, images, labels, match="features") > 40.0


def test_dlg_learning_the_draw_breaks_precode(digit: tuple[tf.Tensor, np.ndarray]) -> None:
    images, labels = digit
    model = with_architecture(
        build_model("lenet", SHAPE, CLASSES, 0), ("variational_bottleneck", 256, 1e-3), 0
    )
    precode = make_defense("precode")
    assert attack(model, precode, images, labels) < 15.0
    assert attack(model, precode, images, labels, match="features", noise="learn") > 40.0


# --- PRECODE on the leaderboard -----------------------------------------------------------------


def test_precode_is_ranked_against_its_base_model() -> None:
    """A board of two base models, each with none, gaussian and precode: PRECODE's rows carry
    the model they extend, its accuracy drop is against that model's ``none`` and it is ranked
    among that model's defenses only."""
    utility = pd.DataFrame(
        {
            "dataset": "d",
            "model": ["lenet"] * 3 + ["mlp"] * 3,
            "defense": ["none", "gaussian", "precode"] * 2,
            "defense_params": "{}",
            "seed": 0,
            "test_accuracy": [0.90, 0.86, 0.88, 0.70, 0.69, 0.60],
            "epsilon": np.nan,
            "delta": np.nan,
            "skipped_steps": 0,
        }
    )
    summary = utility_summary(utility)
    keys = zip(summary["model"], summary["defense"], strict=True)
    drops = dict(zip(keys, summary["accuracy_drop"], strict=True))
    assert drops[("lenet", "precode")] == pytest.approx(0.02)  # 0.90 - 0.88, not 0.70 - 0.88
    assert drops[("mlp", "precode")] == pytest.approx(0.10)
    adaptive = '{"match":"features","noise":"learn"}'  # PRECODE's adaptive attack ran
    board = summary.assign(
        strongest=True,
        attack="dlg",
        attack_params=["{}", "{}", adaptive] * 2,
        n=40,
        success_rate=[1.0, 0.0, 0.5, 1.0, 0.0, 0.0],
        leaked_rate=[1.0, 0.05, 0.5, 1.0, 0.05, 0.0],
        leaked_low=0.0,
        leaked_high=1.0,
        psnr_mean=[90.0, 10.0, 40.0, 80.0, 12.0, 9.0],
    )
    ranks = rank_defenses(board, max_accuracy_drop=0.05)
    # lenet: gaussian leaks 2 of 40 (1), precode is broken on half the images (2); none is the
    # unranked baseline. mlp: precode costs its base model 10 points (> 5), so it is not
    # ranked, although on the lenet board the same drop would have been 0.30.
    assert ranks["verdict"].tolist()[:3] == ["baseline", "leaks", "broken"]
    assert np.isnan(ranks["rank"].iloc[0]) and ranks["rank"].tolist()[1:3] == [1.0, 2.0]
    assert ranks["rank"].tolist()[4] == 1.0 and ranks["rank"].iloc[[3, 5]].isna().all()
