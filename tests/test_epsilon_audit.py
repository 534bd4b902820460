"""The epsilon audit (issue 32): gradient canaries, the lower bound, the seeded bugs, the run."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import ClassVar

import numpy as np
import pandas as pd
import pytest
import tensorflow as tf

from leakbench.cli import main
from leakbench.client.canaries import (
    audit_rounds,
    canary_rounds,
    input_canary,
    reads_only_gradients,
)
from leakbench.components.epsilon_bound import epsilon_lower_bound
from leakbench.components.forward import model_gradients
from leakbench.components.models import build_model
from leakbench.core.errors import ConfigError
from leakbench.core.seeds import audit_draw, audit_membership, private_indices
from leakbench.datasets import load_dataset
from leakbench.defenses import DPSGD, Defense, Gradients, MixUp, make_defense, tensor_seed
from leakbench.run import store
from leakbench.run.config import parse_config
from leakbench.run.epsilon_audit import (
    audit_batches,
    audit_confidence,
    audit_defense,
    audit_key,
    batches_for,
    bound_of,
    canaries_for,
    canary_mu,
    exact_epsilon,
    update_epsilon,
    verdict,
)
from leakbench.run.plan import plan

DELTA = 1e-5


# --- the statistics ---------------------------------------------------------------------------


def test_a_perfect_test_reaches_the_clopper_pearson_ceiling_computed_by_hand() -> None:
    # 40 rounds: the first 20 choose the threshold, the last 20 (10 in, 10 out) are judged.
    included = np.array([True, False] * 20)
    scores = included.astype(float)
    found = epsilon_lower_bound(scores, included, delta=DELTA, confidence=0.95)
    # No error in 10 rounds: the one-sided Clopper-Pearson upper bound at level 0.975 is
    # 1 - 0.025 ** (1 / 10); both rates have it, so epsilon = log((1 - delta - p) / p).
    p = 1.0 - 0.025 ** (1.0 / 10.0)
    assert p == pytest.approx(0.308497, abs=1e-6)
    assert found.epsilon == pytest.approx(math.log((1.0 - DELTA - p) / p), rel=1e-9)
    assert found.epsilon == found.cap
    assert found.auroc == 1.0 and found.tpr_at_low_fpr == 1.0


def test_the_bound_is_valid_and_grows_with_the_rounds_on_a_gaussian_mechanism() -> None:
    # Scores N(0, 1) out and N(1, 1) in: the Gaussian mechanism with mu = 1, whose tight
    # epsilon at delta 1e-5 is 4.38 (dp-accounting's PLD accountant, one Gaussian of sigma 1).
    rng = np.random.default_rng(7)
    bounds = []
    for rounds in (2_000, 20_000):
        included = audit_membership(3, rounds)
        scores = rng.normal(size=rounds) + included
        bounds.append(epsilon_lower_bound(scores, included, delta=DELTA).epsilon)
    assert 0.5 < bounds[0] < bounds[1] < 4.38


def test_no_difference_between_the_neighbours_proves_nothing() -> None:
    rng = np.random.default_rng(11)
    included = audit_membership(0, 4_000)
    found = epsilon_lower_bound(rng.normal(size=4_000), included, delta=DELTA)
    assert found.epsilon < 0.3  # exceeded with probability at most 5% under no difference
    assert abs(found.auroc - 0.5) < 0.05


def test_bad_scores_are_refused() -> None:
    with pytest.raises(ValueError, match="finite"):
        epsilon_lower_bound(np.array([0.0, np.nan]), np.array([True, False]), delta=DELTA)
    with pytest.raises(ValueError, match="confidence"):
        epsilon_lower_bound(np.zeros(4), np.array([True, False] * 2), delta=DELTA, confidence=1)


def test_half_the_rounds_hold_the_canary_and_the_draw_is_seeded() -> None:
    first = audit_membership(5, 101)
    assert first.sum() == 50
    assert np.array_equal(first, audit_membership(5, 101))
    assert not np.array_equal(first, audit_membership(6, 101))


def test_the_verdict_and_the_accountant_of_one_update() -> None:
    assert verdict(math.nan, 9.0) == "no guarantee"
    assert verdict(2.0, 2.5) == "failed" and verdict(2.0, 1.5) == "passed"
    dpsgd = make_defense("dpsgd", norm=1.0, noise_multiplier=1.0)
    assert update_epsilon(dpsgd, DELTA) == pytest.approx(dpsgd.epsilon(1.0, 1, DELTA))
    assert math.isnan(update_epsilon(make_defense("gaussian", sigma=0.1), DELTA))


def _gaussian_delta(epsilon: float, mu: float) -> float:
    """The delta of mu-GDP at ``epsilon`` in closed form (Dong, Roth and Su 2022, Cor. 2.13)."""
    from scipy.stats import norm

    return float(
        norm.cdf(-epsilon / mu + mu / 2) - math.exp(epsilon) * norm.cdf(-epsilon / mu - mu / 2)
    )


@pytest.mark.parametrize("z", [0.5, 1.0, 2.0, 4.0])
def test_the_exact_epsilon_of_one_dpsgd_update_is_the_gaussian_mechanisms(z: float) -> None:
    dpsgd = make_defense("dpsgd", norm=1.0, noise_multiplier=z)
    exact = exact_epsilon(dpsgd, DELTA)
    # The Gaussian mechanism of sensitivity 1 and std z is 1/z-GDP: its delta at the PLD
    # epsilon is the one asked for, and the Renyi-DP accountant's value is looser.
    assert _gaussian_delta(exact, 1.0 / z) == pytest.approx(DELTA, rel=1e-3)
    assert exact < update_epsilon(dpsgd, DELTA)
    assert math.isnan(exact_epsilon(make_defense("gaussian", sigma=0.1), DELTA))
    chain = make_defense(
        "chain", steps=[{"name": "dpsgd", "norm": 1.0, "noise_multiplier": z}, {"name": "fp16"}]
    )
    assert exact_epsilon(chain, DELTA) == exact


def test_which_defenses_declare_a_gaussian_score() -> None:
    declared = {
        "dpsgd z 1": make_defense("dpsgd", norm=1.0, noise_multiplier=1.0),
        "gaussian 0.1": make_defense("gaussian", sigma=0.1),
        "clip then gaussian": make_defense(
            "chain", steps=[{"name": "clip", "norm": 1.0}, {"name": "gaussian", "sigma": 0.1}]
        ),
    }
    not_declared = {
        "dpsgd z 0": make_defense("dpsgd", norm=1.0, noise_multiplier=0.0),
        "gaussian 0": make_defense("gaussian", sigma=0.0),
        "gaussian then clip": make_defense(
            "chain", steps=[{"name": "gaussian", "sigma": 0.1}, {"name": "clip", "norm": 1.0}]
        ),
        "laplace": make_defense("laplace", b=0.1),
        "relative noise": make_defense("relative_noise", sigma=0.1),
        "clip": make_defense("clip", norm=1.0),
        "int8": make_defense("int8"),
    }
    assert all(d.gaussian_score() for d in declared.values())
    assert not any(d.gaussian_score() for d in not_declared.values())
    assert canaries_for(declared["dpsgd z 1"], 64) == 64
    assert canaries_for(declared["gaussian 0.1"], 64) == 64
    assert canaries_for(not_declared["laplace"], 64) == 1
    # A clip of the whole update before the noise couples the canaries: one per round.
    assert not declared["clip then gaussian"].independent_canaries()
    assert canaries_for(declared["clip then gaussian"], 64) == 1


def test_the_confidence_is_shared_out_over_the_guaranteed_audits() -> None:
    grid = [
        make_defense("none"),
        make_defense("dpsgd", norm=1.0, noise_multiplier=1.0),
        make_defense("dpsgd", norm=1.0, noise_multiplier=2.0),
        make_defense("gaussian", sigma=0.1),
    ]
    assert audit_confidence(grid, 0.95) == pytest.approx([0.95, 0.975, 0.975, 0.95])
    assert audit_confidence(grid[:1], 0.95) == [0.95]


# --- the rounds on a model --------------------------------------------------------------------


@pytest.fixture(scope="module")
def client() -> tuple[object, np.ndarray, np.ndarray]:
    data = load_dataset("digits")
    model = build_model("lenet", data.input_shape, data.num_classes, seed=0)
    x = data.test.x[:2]
    targets = tf.one_hot(data.test.y[:2], data.num_classes).numpy()
    return model, x, targets


def _audit(defense, client, rounds=400, **kwargs):
    model, x, targets = client
    return audit_defense(defense, model, x, targets, rounds=rounds, seed=0, delta=DELTA, **kwargs)


def test_rounds_are_reproducible_and_the_model_is_untouched(client) -> None:
    model, x, targets = client
    before = [v.numpy().copy() for v in model.trainable_variables]
    defense = make_defense("gaussian", sigma=0.5)
    one = canary_rounds(defense, model, x, targets, rounds=60, seed=1)
    two = canary_rounds(defense, model, x, targets, rounds=60, seed=1)
    assert np.array_equal(one.scores, two.scores)
    assert np.array_equal(one.included[:, 0], audit_membership(1, 60))
    after = [v.numpy() for v in model.trainable_variables]
    assert all(np.array_equal(b, a) for b, a in zip(before, after, strict=True))


def test_without_a_defense_the_canary_is_seen_in_every_round(client) -> None:
    found = _audit(make_defense("none"), client)
    assert found["epsilon_audit"] == found["epsilon_audit_cap"] > 3.0
    assert found["audit"] == "no guarantee"


def test_each_canary_has_its_own_coordinate_slot_and_half_of_the_rounds(client) -> None:
    model, x, targets = client
    found = canary_rounds(make_defense("none"), model, x, targets, rounds=40, seed=3, canaries=5)
    assert found.scores.shape == found.included.shape == (40, 5)
    assert np.array_equal(found.included.reshape(-1), audit_membership(3, 200))
    # The five coordinates where the batch's gradient is smallest, smallest first.
    first = np.abs(tf.reshape(model_gradients(model, x, targets)[0], [-1]).numpy())
    assert list(found.indices) == list(np.argsort(first, kind="stable")[:5])
    # Without a defense (batch level) the canaries share one extra slot: canary j moves only
    # its own coordinate, by its norm over B + 1, as the single canary does.
    base = tf.reshape(model_gradients(model, x, targets)[0], [-1]).numpy()
    shift = found.norm / (len(x) + 1)
    expected = base[list(found.indices)] * len(x) / (len(x) + 1) + found.included * shift
    np.testing.assert_allclose(found.scores, expected, rtol=1e-5, atol=1e-7)
    # DP-SGD (example level) gives each canary its own slot, clipped alone: with no noise, a
    # canary moves its coordinate by the clip norm over B + k slots (float32 sums wobble).
    clipped = make_defense("dpsgd", norm=1e-3, noise_multiplier=0.0)
    alone = canary_rounds(clipped, model, x, targets, rounds=40, seed=3, canaries=5)
    held = alone.included.astype(bool)
    assert alone.scores[~held].std() < 1e-6
    gap = alone.scores[held].mean() - alone.scores[~held].mean()
    assert gap == pytest.approx(1e-3 / (len(x) + 5), rel=1e-2)
    with pytest.raises(
        ConfigError, match=r"^epsilon_audit\.canaries must be an integer in \[1, 300\]"
    ):
        canary_rounds(make_defense("none"), model, x, targets, rounds=40, seed=3, canaries=301)


def test_one_canary_per_round_is_the_audit_as_it_was(client) -> None:
    model, x, targets = client
    defense = make_defense("dpsgd", norm=0.1, noise_multiplier=2.0)
    one = canary_rounds(defense, model, x, targets, rounds=60, seed=1)
    also = canary_rounds(defense, model, x, targets, rounds=60, seed=1, canaries=1)
    assert one.scores.shape == (60, 1) and np.array_equal(one.scores, also.scores)
    assert one.index == one.indices[0]


def test_gaussian_noise_without_clipping_gives_a_bound_that_falls_with_sigma(client) -> None:
    bounds = [
        _audit(make_defense("gaussian", sigma=s), client)["epsilon_audit"] for s in (0.25, 0.5, 1)
    ]
    assert bounds[0] > bounds[1] > bounds[2]


# --- several batches, input canaries, noise without clipping ---------------------------------


def _batches(count: int, size: int = 2) -> list[tuple[np.ndarray, np.ndarray]]:
    data = load_dataset("digits")
    return [
        (
            data.test.x[j * size : (j + 1) * size],
            tf.one_hot(data.test.y[j * size : (j + 1) * size], data.num_classes).numpy(),
        )
        for j in range(count)
    ]


def test_which_defenses_are_audited_on_one_batch_and_which_on_several() -> None:
    one = [
        make_defense("none"),
        make_defense("gaussian", sigma=0.1),
        make_defense("laplace", b=0.1),
        make_defense("dpsgd", norm=1.0, noise_multiplier=1.0),
        make_defense(
            "chain", steps=[{"name": "dpsgd", "norm": 1.0, "noise_multiplier": 1.0},
                            {"name": "gaussian", "sigma": 0.1}]
        ),
    ]  # fmt: skip
    several = [
        make_defense("relative_noise", sigma=0.1),
        make_defense("soteria", share=0.5),
        make_defense("prune", ratio=0.5),
        make_defense("topk", fraction=0.1),
        make_defense("clip", norm=1.0),
        make_defense("int8"),
        make_defense("mixup", mixed=2),
        make_defense(
            "chain", steps=[{"name": "clip", "norm": 1.0}, {"name": "gaussian", "sigma": 0.1}]
        ),
    ]
    assert [batches_for(d, 8) for d in one] == [1] * len(one)
    assert [batches_for(d, 8) for d in several] == [8] * len(several)
    assert [d.name for d in [*one, *several] if d.acts_on_data()] == ["mixup"]
    assert canaries_for(make_defense("mixup", mixed=2), 64) == 1


def test_rounds_over_several_batches_take_turns_and_are_read_against_each_batch(client) -> None:
    model = client[0]
    batches = _batches(3)
    defense = make_defense("relative_noise", sigma=0.5)
    spread = audit_rounds(defense, model, batches, rounds=30, seed=2, norm=2.0)
    assert spread.batches == 3 and spread.kind == "gradient"
    assert np.array_equal(spread.included[:, 0], audit_membership(2, 30))
    for b, (x, y) in enumerate(batches):
        alone = canary_rounds(defense, model, x, y, rounds=30, seed=2, norm=2.0)
        # Round r ran on batch r mod 3 with round r's own draw, and is read relative to what
        # the batch alone puts in its canary's coordinate (B / (B + 1) of its mean gradient).
        mean = tf.reshape(model_gradients(model, x, y)[0], [-1]).numpy()[alone.index]
        rows = np.arange(b, 30, 3)
        np.testing.assert_allclose(
            spread.scores[rows, 0], alone.scores[rows, 0] - mean * 2 / 3, rtol=1e-6, atol=1e-9
        )
    # One batch is the audit as it was, bit for bit.
    x, y = batches[0]
    one = audit_rounds(defense, model, batches[:1], rounds=30, seed=2, norm=2.0)
    assert np.array_equal(one.scores, canary_rounds(defense, model, x, y, rounds=30, seed=2,
                                                    norm=2.0).scores)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class BlindNoise(Defense):
    """A data-dependent null: it shares only noise whose scale is the batch's own largest
    gradient entry, so no canary moves the update (true epsilon 0) while the scores' spread
    differs from batch to batch."""

    name: ClassVar[str] = "blind_noise"

    def __call__(self, grads: Gradients, *, seed: tf.Tensor) -> Gradients:
        scale = tf.reduce_max(tf.abs(grads[-1]))
        return [
            tf.random.stateless_normal(tf.shape(g), seed=tensor_seed(seed, i)) * scale
            for i, g in enumerate(grads)
        ]


def test_a_defense_that_hides_the_canary_proves_nothing_over_several_batches(client) -> None:
    model = client[0]
    found = audit_defense(
        BlindNoise(), model, *map(list, zip(*_batches(4), strict=True)), rounds=2000, seed=5,
        delta=DELTA,
    )  # fmt: skip
    assert found["batches"] == 4
    assert found["epsilon_audit"] < 0.3 and abs(found["auroc"] - 0.5) < 0.05


def test_the_input_canary_is_an_example_the_defense_prepares(client) -> None:
    model, x, targets = client
    image, label, own = input_canary(model, tf.constant(x), 10)
    assert image.shape == (1, *x.shape[1:]) and float(tf.reduce_min(image)) == 1.0
    # The label whose gradient on the canary image is largest.
    norms = [
        float(tf.linalg.global_norm(model_gradients(model, image, tf.one_hot([k], 10))).numpy())
        for k in range(10)
    ]
    assert int(np.argmax(label.numpy())) == int(np.argmax(norms))
    defense = make_defense("mixup", mixed=2)
    found = audit_rounds(defense, model, [(x, targets)], rounds=6, seed=4)
    assert found.kind == "input" and found.norm == pytest.approx(max(norms), rel=1e-5)
    # Each round is the client's whole step (mixup included) on the batch with the canary
    # appended or without it, projected on the canary's own gradient direction.
    from leakbench.client.update import defended_gradients

    keys = audit_draw(4, 6)
    unit = [g / tf.linalg.global_norm(own) for g in own]
    for r in range(6):
        held = bool(found.included[r, 0])
        images = np.concatenate([x, image.numpy()]) if held else x
        labels = np.concatenate([targets, label.numpy()]) if held else targets
        shared = defended_gradients(defense, model, tf.constant(images), tf.constant(labels),
                                    keys[r])  # fmt: skip
        expected = sum(float(tf.reduce_sum(g * u)) for g, u in zip(shared, unit, strict=True))
        assert found.scores[r, 0] == pytest.approx(expected, rel=1e-4, abs=1e-6)
    with pytest.raises(ConfigError, match=r"^epsilon_audit\.canaries must be 1 for defense mixup"):
        audit_rounds(defense, model, [(x, targets)], rounds=6, seed=4, canaries=2)


@dataclasses.dataclass(frozen=True)
class MixesWithoutTheCanary(MixUp):
    """MixUp that drops every example past the first ``keep`` before it mixes: the input
    canary, appended last, never reaches the update (the null of the input-canary audit)."""

    name: ClassVar[str] = "mixup"
    keep: int = 2

    def prepare(self, images, targets, *, seed):
        return super().prepare(images[: self.keep], targets[: self.keep], seed=seed)


def test_the_input_canary_audit_of_mixup_sees_the_canary_and_nothing_without_it(client) -> None:
    model, x, targets = client
    seen = _audit(make_defense("mixup", mixed=2), client, rounds=2000)
    null = _audit(MixesWithoutTheCanary(mixed=2), client, rounds=2000)
    assert seen["canary_type"] == null["canary_type"] == "input"
    # Present against absent through the mixing: the canary shows (at most the ceiling).
    assert 1.5 < seen["epsilon_audit"] <= seen["epsilon_audit_cap"] and seen["auroc"] > 0.9
    # The same rounds with the canary dropped before the mixing: no bound beyond chance.
    assert null["epsilon_audit"] < 0.3 and abs(null["auroc"] - 0.5) < 0.05
    assert math.isnan(seen["canary_mu"]) and seen["bound_of"] == "canary"


def test_noise_without_clipping_reports_the_canarys_mu(client) -> None:
    model, x, targets = client
    found = _audit(make_defense("gaussian", sigma=0.5), client, rounds=2000, canaries=8)
    # The canary's shift in its coordinate is its norm over the B + 1 = 3 slots; over the
    # noise's std that is exactly the mu of the canary's Gaussian-DP, which the audit estimates.
    assert found["canary_mu"] == pytest.approx(found["canary_norm"] / 3 / 0.5, rel=1e-12)
    assert found["mu_estimate"] == pytest.approx(found["canary_mu"], rel=0.1)
    assert found["bound_of"] == "canary"
    laplace = make_defense("laplace", b=0.5)
    assert canary_mu(laplace, 3.0, 2, "gradient") == pytest.approx(1.0 / (0.5 * math.sqrt(2)))
    assert math.isnan(canary_mu(make_defense("prune", ratio=0.5), 3.0, 2, "gradient"))
    assert math.isnan(canary_mu(make_defense("dpsgd", norm=1.0, noise_multiplier=1.0), 3.0, 2,
                                "gradient"))  # fmt: skip
    assert bound_of(make_defense("dpsgd", norm=1.0, noise_multiplier=1.0)) == "defense"


# --- the seeded bugs --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SkipsClipping(DPSGD):
    """DP-SGD with its clipping forgotten: the noise is z * C, the sum unclipped."""

    name: ClassVar[str] = "dpsgd"

    def __call__(self, grads: Gradients, *, seed: tf.Tensor) -> Gradients:
        batch = tf.cast(tf.shape(grads[0])[0], grads[0].dtype)
        out = []
        for j, g in enumerate(grads):
            total = tf.reduce_sum(g, axis=0)
            noise = tf.random.stateless_normal(
                tf.shape(total), seed=tensor_seed(seed, j), stddev=self.noise_multiplier * self.norm
            )
            out.append((total + noise) / batch)
        return out


@dataclasses.dataclass(frozen=True)
class NoiseOnTheSquaredNorm(DPSGD):
    """DP-SGD whose noise is scaled to the clip norm squared (z * C**2, not z * C)."""

    name: ClassVar[str] = "dpsgd"

    def __call__(self, grads: Gradients, *, seed: tf.Tensor) -> Gradients:
        wrong = DPSGD(norm=self.norm, noise_multiplier=self.noise_multiplier * self.norm)
        return wrong(grads, seed=seed)


@pytest.mark.parametrize("broken", [SkipsClipping, NoiseOnTheSquaredNorm])
def test_a_broken_dpsgd_fails_its_audit_and_the_real_one_passes(client, broken) -> None:
    # Clip norm 0.1: the digits LeNet's per-example gradients are far larger (the canary, as
    # large as the largest of them, is clipped by a working DP-SGD only).
    params = {"norm": 0.1, "noise_multiplier": 2.0}
    real = _audit(DPSGD(**params), client)
    bug = _audit(broken(**params), client)
    assert real["canary_norm"] > 10 * params["norm"]
    assert real["epsilon_update"] == bug["epsilon_update"] == pytest.approx(2.1657, abs=1e-3)
    assert real["audit"] == "passed" and real["epsilon_audit"] < 1.0
    assert bug["audit"] == "failed" and bug["epsilon_audit"] > real["epsilon_update"]


@dataclasses.dataclass(frozen=True)
class FivePercentLessNoise(DPSGD):
    """DP-SGD that draws its noise at 0.95 z but accounts for z: epsilon 4.65, not 4.38, at
    z = 1 (a 6% inflation, below the 8% by which the Renyi-DP value overstates the exact one)."""

    name: ClassVar[str] = "dpsgd"

    def __call__(self, grads: Gradients, *, seed: tf.Tensor) -> Gradients:
        less = DPSGD(norm=self.norm, noise_multiplier=0.95 * self.noise_multiplier)
        return less(grads, seed=seed)


def test_five_percent_less_noise_fails_against_the_exact_epsilon(client) -> None:
    params = {"norm": 1.0, "noise_multiplier": 1.0}
    # 1,000 rounds of 256 canaries; confidence 0.9875: four audits' Bonferroni share of 0.95.
    kwargs = {"rounds": 1000, "canaries": 256, "confidence": 0.9875}
    real = _audit(DPSGD(**params), client, **kwargs)
    bug = _audit(FivePercentLessNoise(**params), client, **kwargs)
    assert real["epsilon_exact"] == bug["epsilon_exact"] == pytest.approx(4.3772, abs=1e-3)
    # The loose accountant would let the bug pass: its 4.73 is above the bug's true 4.65.
    assert bug["epsilon_update"] > exact_epsilon(DPSGD(norm=1.0, noise_multiplier=0.95), DELTA)
    assert real["audit"] == "passed" and 3.9 <= real["epsilon_audit_gdp"] <= real["epsilon_exact"]
    assert bug["audit"] == "failed" and bug["epsilon_audit_gdp"] > bug["epsilon_exact"]
    # The distribution-free bound on the same trials sees neither.
    assert real["epsilon_audit"] < 3.0 and bug["epsilon_audit"] < 3.0


@pytest.mark.parametrize(
    "name, params",
    [("mixup", {"mixed": 2}), ("precode", {"size": 16}), ("soteria", {"share": 0.5}), ("int8", {})],
)
def test_defenses_that_read_more_than_the_gradient_are_audited_as_the_client_runs_them(
    client, name, params
) -> None:
    from leakbench.components.bottleneck import with_architecture

    defense = make_defense(name, **params)
    model, x, targets = client
    if defense.architecture is not None:
        model = with_architecture(model, defense.architecture, 0)
    assert reads_only_gradients(defense) == (name in ("soteria", "int8"))
    found = audit_defense(defense, model, x, targets, rounds=200, seed=0, delta=DELTA)
    assert 0.0 <= found["epsilon_audit"] <= found["epsilon_audit_cap"]
    assert np.isfinite(found["auroc"])


# --- the config and the run -------------------------------------------------------------------

BASE = """
name = "audit"
suite = "listed"
images = 2
batch_size = 2
[[attack]]
name = "dlg"
iterations = 5
[[defense]]
name = "none"
[[defense]]
name = "dpsgd"
norm = 1.0
noise_multiplier = 1.0
[training]
enabled = false
"""


def test_the_audit_table_is_written_only_when_asked_and_round_trips() -> None:
    plain = parse_config(BASE)
    assert plain.epsilon_audit is None and "epsilon_audit" not in plain.to_toml()
    audited = parse_config(BASE + "[epsilon_audit]\nrounds = 100\n")
    assert audited.epsilon_audit is not None and audited.epsilon_audit.rounds == 100
    assert parse_config(audited.to_toml()) == audited


@pytest.mark.parametrize(
    "table, message",
    [
        (r"rounds = 5", r"epsilon_audit\.rounds must be an integer in \[20, 1000000\], got 5"),
        ("confidence = 1.0", r"epsilon_audit\.confidence must be a number in \[0\.5, 1\.0\)"),
        ("canaries = 0", r"epsilon_audit\.canaries must be an integer in \[1, 4096\], got 0"),
        ("canary = 3", "unknown key epsilon_audit.canary"),
    ],
)
def test_a_bad_audit_table_is_refused_in_one_line(table, message) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config(BASE + f"[epsilon_audit]\n{table}\n")


def test_fedavg_is_refused() -> None:
    text = BASE.replace("[training]", "[threat_model]\nlocal_steps = 2\n[training]")
    text = text.replace(
        'name = "dpsgd"\nnorm = 1.0\nnoise_multiplier = 1.0', 'name = "clip"\nnorm = 1.0'
    )
    with pytest.raises(ConfigError, match="epsilon_audit: audits a client's FedSGD update"):
        parse_config(text + "[epsilon_audit]\nrounds = 100\n")


def test_a_run_audits_every_defense_and_a_rerun_reuses_the_audit(tmp_path: Path, capsys) -> None:
    config = tmp_path / "c.toml"
    relative = '[[defense]]\nname = "relative_noise"\nsigma = 0.5\n'
    config.write_text(
        BASE + relative + "[epsilon_audit]\nrounds = 200\nbatches = 3\n", encoding="utf-8"
    )
    out = tmp_path / "out"
    assert main(["run", str(config), "--out", str(out), "--quiet", "--workers", "1"]) == 0
    audit = pd.read_csv(out / "epsilon_audit.csv")
    assert list(audit["defense"]) == ["none", "dpsgd", "relative_noise"]
    assert list(audit["audit"]) == ["no guarantee", "passed", "no guarantee"]
    # Relative noise depends on the batch: its rounds ran on three batches, the others on one.
    assert list(audit["batches"]) == [1, 1, 3]
    assert list(audit["bound_of"]) == ["canary", "defense", "canary"]
    assert list(audit["canary_type"]) == ["gradient"] * 3
    board = pd.read_csv(out / "leaderboard.csv")
    columns = list(board.columns)
    at = columns.index("delta")
    assert columns[at + 1 : at + 7] == [
        "epsilon_update", "epsilon_exact", "epsilon_audit", "epsilon_audit_gdp",
        "epsilon_audit_confidence", "audit",
    ]  # fmt: skip
    # One guaranteed configuration: its confidence is the run's; none's bound has no GDP reading.
    assert list(audit["epsilon_audit_confidence"]) == [0.95, 0.95, 0.95]
    assert math.isnan(audit["epsilon_audit_gdp"][0]) and audit["epsilon_audit_gdp"][1] >= 0
    held = json.loads((out / "epsilon_audit.json").read_text(encoding="utf-8"))
    # A rerun finds every audit in the record: the same rows, timings included.
    assert main(["run", str(config), "--out", str(out), "--quiet", "--workers", "1"]) == 0
    assert json.loads((out / "epsilon_audit.json").read_text(encoding="utf-8")) == held
    assert pd.read_csv(out / "epsilon_audit.csv").equals(audit)
    # The figure and the report's section.
    assert main(["figures", str(out)]) == 0
    assert (out / "figures" / "epsilon_audit.png").is_file()
    assert main(["report", str(out)]) == 0
    page = (out / "report.html").read_text(encoding="utf-8")
    assert "<h2>Measured privacy</h2>" in page and 'id="epsilon_audit"' in page


def test_the_audited_batches_continue_the_plans_and_too_many_are_refused() -> None:
    spec = parse_config(BASE + "[epsilon_audit]\nrounds = 100\n")
    data = load_dataset("digits")
    trials = plan(spec, data)
    parts = (spec.threat_model, spec.batch_size, spec.dataset, data)
    every = audit_batches(*parts, 0, 3)
    # Batch 0 is the one the seed's first trials attack; the next continue its permutation.
    assert every[0] == list(trials[0].indices)
    assert every == [list(b) for b in np.split(private_indices(len(data.test), 6, 0), 3)]
    most = len(data.test) // 2
    with pytest.raises(ConfigError, match=rf"^epsilon_audit\.batches must be at most {most} "):
        audit_batches(*parts, 0, most + 1)


def test_too_many_audit_batches_are_refused_before_the_run_writes(tmp_path: Path, capsys) -> None:
    config = tmp_path / "c.toml"
    relative = '[[defense]]\nname = "relative_noise"\nsigma = 0.5\n'
    config.write_text(BASE + relative + "[epsilon_audit]\nbatches = 1000\n", encoding="utf-8")
    out = tmp_path / "out"
    assert main(["run", str(config), "--out", str(out), "--quiet", "--workers", "1"]) == 2
    assert "epsilon_audit.batches must be at most" in capsys.readouterr().err
    assert not out.exists()
    # Without a defense that depends on the batch, one batch is all the audit reads.
    config.write_text(BASE + "[epsilon_audit]\nbatches = 1000\nrounds = 20\n", encoding="utf-8")
    assert main(["run", str(config), "--out", str(out), "--quiet", "--workers", "1"]) == 0


def test_one_batch_audits_keep_the_keys_of_the_committed_audit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The committed run's audits of defenses that read one batch are found under the keys this
    # code computes: a rerun reuses them, and their numbers are those of the committed CSV. A
    # key hashes the engine version, so the keys are computed with the committed run's (it may
    # be listed stale in results/README.md, waiting to be rerun by a newer engine).
    root = Path(__file__).resolve().parents[1]
    spec = parse_config((root / "benchmarks/epsilon_audit/digits-lenet.toml").read_text())
    folder = root / "results/epsilon_audit/digits-lenet"
    held = json.loads((folder / "epsilon_audit.json").read_text())
    engine = json.loads((folder / "environment.json").read_text())["engine_version"]
    monkeypatch.setattr(store, "ENGINE_VERSION", engine)
    data = load_dataset(spec.dataset)
    first = plan(spec, data)[0]
    grid = spec.defense_grid()
    levels = audit_confidence(grid, spec.epsilon_audit.confidence)
    one = [(d, c) for d, c in zip(grid, levels, strict=True) if batches_for(d, 8) == 1]
    assert len(one) == 15  # none, 7 Gaussian, 3 Laplace, 4 DP-SGD
    for defense, level in one:
        key = audit_key(spec.epsilon_audit, first.setting, defense, 0, [list(first.indices)], level)
        assert key in held, defense


def test_a_run_without_the_audit_keeps_its_leaderboard_columns(tmp_path: Path) -> None:
    from leakbench.outputs.tables import LEADERBOARD_COLUMNS

    config = tmp_path / "c.toml"
    config.write_text(BASE, encoding="utf-8")
    out = tmp_path / "out"
    assert main(["run", str(config), "--out", str(out), "--quiet", "--workers", "1"]) == 0
    assert list(pd.read_csv(out / "leaderboard.csv").columns) == LEADERBOARD_COLUMNS
    assert not (out / "epsilon_audit.csv").exists()
