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
from leakbench.client.canaries import canary_rounds, reads_only_gradients
from leakbench.components.epsilon_bound import epsilon_lower_bound
from leakbench.components.forward import model_gradients
from leakbench.components.models import build_model
from leakbench.core.errors import ConfigError
from leakbench.core.seeds import audit_membership
from leakbench.datasets import load_dataset
from leakbench.defenses import DPSGD, Gradients, make_defense, tensor_seed
from leakbench.run.config import parse_config
from leakbench.run.epsilon_audit import (
    audit_confidence,
    audit_defense,
    canaries_for,
    exact_epsilon,
    update_epsilon,
    verdict,
)

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
    config.write_text(BASE + "[epsilon_audit]\nrounds = 200\n", encoding="utf-8")
    out = tmp_path / "out"
    assert main(["run", str(config), "--out", str(out), "--quiet", "--workers", "1"]) == 0
    audit = pd.read_csv(out / "epsilon_audit.csv")
    assert list(audit["defense"]) == ["none", "dpsgd"]
    assert list(audit["audit"]) == ["no guarantee", "passed"]
    board = pd.read_csv(out / "leaderboard.csv")
    columns = list(board.columns)
    at = columns.index("delta")
    assert columns[at + 1 : at + 7] == [
        "epsilon_update", "epsilon_exact", "epsilon_audit", "epsilon_audit_gdp",
        "epsilon_audit_confidence", "audit",
    ]  # fmt: skip
    # One guaranteed configuration: its confidence is the run's; none's bound has no GDP reading.
    assert list(audit["epsilon_audit_confidence"]) == [0.95, 0.95]
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


def test_a_run_without_the_audit_keeps_its_leaderboard_columns(tmp_path: Path) -> None:
    from leakbench.outputs.tables import LEADERBOARD_COLUMNS

    config = tmp_path / "c.toml"
    config.write_text(BASE, encoding="utf-8")
    out = tmp_path / "out"
    assert main(["run", str(config), "--out", str(out), "--quiet", "--workers", "1"]) == 0
    assert list(pd.read_csv(out / "leaderboard.csv").columns) == LEADERBOARD_COLUMNS
    assert not (out / "epsilon_audit.csv").exists()
