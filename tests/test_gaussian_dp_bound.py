"""The Gaussian-DP epsilon lower bound (`leakbench.components.gaussian_dp_bound`): its epsilon
curve against the closed form, its coverage and tightness on a seeded Gaussian mechanism, and
its null."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import optimize, stats

from leakbench.components.epsilon_bound import epsilon_lower_bound
from leakbench.components.gaussian_dp_bound import gaussian_dp_lower_bound, gdp_epsilon

DELTA = 1e-5


def _closed_form_epsilon(mu: float, delta: float) -> float:
    """Dong, Roth and Su's Corollary 2.13: mu-GDP is (eps, delta(eps))-DP with
    delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2); solved for eps."""

    def gap(eps: float) -> float:
        return (
            stats.norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2)
        ) - delta

    return optimize.brentq(gap, 0.0, 100.0)


def _rounds(mu: float, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    included = rng.random(n) < 0.5
    return rng.normal(size=n) + mu * included, included


@pytest.mark.parametrize("mu", [0.25, 0.5, 1.0, 2.0])
def test_the_epsilon_of_mu_gdp_is_the_closed_form(mu: float) -> None:
    assert gdp_epsilon(mu, DELTA) == pytest.approx(_closed_form_epsilon(mu, DELTA), rel=1e-6)


def test_noise_multiplier_one_is_the_exact_one_step_epsilon() -> None:
    # One Gaussian step at z = 1 with no subsampling: 4.38 at delta 1e-5 (the figure).
    assert gdp_epsilon(1.0, DELTA) == pytest.approx(4.377, abs=1e-3)
    assert gdp_epsilon(0.0, DELTA) == 0.0
    assert gdp_epsilon(-1.0, DELTA) == 0.0


def test_a_seeded_gaussian_mechanism_lands_within_ten_percent_and_below_its_epsilon() -> None:
    # 40,000 judged trials (20,000 rounds of two canaries each) of the Gaussian mechanism at
    # z = 1, ten seeds: the bound is never above the truth and on average within 10% of it.
    exact = gdp_epsilon(1.0, DELTA)
    found = [
        gaussian_dp_lower_bound(*_rounds(1.0, 40_000, seed), delta=DELTA) for seed in range(10)
    ]
    for bound in found:
        assert 0.85 * exact <= bound.epsilon <= exact
        assert bound.mu <= bound.mu_estimate
    assert np.mean([b.epsilon for b in found]) >= 0.9 * exact
    # The distribution-free bound on the same rounds reads the far tail and stays below 2.5
    # (2.18 here), more than a whole unit of epsilon looser.
    free = epsilon_lower_bound(*_rounds(1.0, 40_000, 0), delta=DELTA).epsilon
    assert free < found[0].epsilon - 1.0


def test_the_bound_on_mu_holds_at_its_confidence() -> None:
    # 200 seeded audits of 2,000 rounds at mu = 1: the 95% bound exceeds the truth in about 5%.
    over = sum(
        gaussian_dp_lower_bound(*_rounds(1.0, 2_000, seed), delta=DELTA).mu > 1.0
        for seed in range(200)
    )
    assert over <= 20  # 10%: P(Binomial(200, 0.05) > 20) < 0.002


def test_null_scores_give_about_zero() -> None:
    rng = np.random.default_rng(7)
    included = rng.random(20_000) < 0.5
    bound = gaussian_dp_lower_bound(rng.normal(size=20_000), included, delta=DELTA)
    assert bound.epsilon < 0.2
    assert abs(bound.mu_estimate) < 0.1


def test_rounds_of_one_kind_prove_nothing() -> None:
    bound = gaussian_dp_lower_bound(np.arange(10.0), np.ones(10, dtype=bool), delta=DELTA)
    assert bound.epsilon == 0.0 and bound.mu == 0.0


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="finite"):
        gaussian_dp_lower_bound(np.array([0.0, np.nan]), np.array([True, False]), delta=DELTA)
    with pytest.raises(ValueError, match="confidence"):
        gaussian_dp_lower_bound(np.zeros(4), np.array([True, False] * 2), delta=DELTA, confidence=1)
    with pytest.raises(ValueError, match="delta"):
        gdp_epsilon(1.0, 0.0)


def test_with_no_error_the_estimate_is_unbounded_and_the_bound_finite() -> None:
    # Scores that separate perfectly: no false positive, no false negative in either half.
    included = np.arange(4000) % 2 == 0
    scores = np.where(included, 10.0, 0.0) + np.random.default_rng(0).uniform(0, 1, 4000)
    bound = gaussian_dp_lower_bound(scores, included, delta=1e-5, confidence=0.95)
    assert bound.mu_estimate == math.inf
    # The lower bound is what 1,000 clean trials of each kind prove: finite and positive.
    assert 3.0 < bound.mu < 8.0 and math.isfinite(bound.epsilon) and bound.epsilon > 0.0
