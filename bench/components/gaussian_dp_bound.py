"""A Gaussian-DP epsilon lower bound: a tighter reading of an audit whose score is Gaussian.

A mechanism is ``mu``-GDP (Dong, Roth and Su, "Gaussian Differential Privacy", JRSS B 2022)
when no test tells its neighbours apart better than one between N(0, 1) and N(mu, 1). For the
Gaussian mechanism itself that test is exact: a Dirac canary of norm ``C`` under Gaussian noise
of standard deviation ``z * C`` gives a score that is N(0, s) without the canary and N(C, s)
with it, so ``mu = 1 / z``. Where the score has that shape, one point of the test's trade-off
curve fixes the whole curve: a threshold ``t`` with false-positive rate ``FPR`` and
false-negative rate ``FNR`` gives

    mu = Phi^-1(1 - FPR) - Phi^-1(FNR)

and mu-GDP is (epsilon, delta)-DP for the epsilon where the Gaussian mechanism's privacy-loss
curve (dp-accounting's `GaussianPrivacyLoss` with standard deviation ``1 / mu``) reaches
``delta``. The distribution-free bound (`leakbench.components.epsilon_bound`) reads epsilon at
the curve's far tail, where a few thousand rounds say little; this one reads ``mu`` where the
rates are near 30% and well measured, which is what lets a white-box audit come close to the
accountant with tens of thousands of rounds instead of millions (the approach of Nasr et al.,
"Tight Auditing of Differentially Private Machine Learning", USENIX Security 2023).

**The assumption is stated, not tested by the bound:** the score is Gaussian with one variance
in and out (a shift family). Under it, the bound holds with probability at least
``confidence``: as in the distribution-free bound, the threshold is chosen on the first half of
the rounds (by a fixed rule: where the two error rates meet), and on the second half ``FPR``
and ``FNR`` are replaced by their one-sided Clopper-Pearson upper bounds at level
``1 - (1 - confidence) / 2`` each, which can only lower ``mu``. A mechanism whose score is
not Gaussian (clipping without noise, quantisation, a defense that acts on the data) is not
covered: the audit reports this bound only where its mechanism declares a Gaussian score.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from scipy import optimize, stats

from leakbench.components.epsilon_bound import (
    candidate_thresholds,
    checked_rounds,
    errors,
    upper_rates,
)

# mu beyond which the epsilon is not computed (a perfect test on the rounds: its bound is the
# rounds' own ceiling, about Phi^-1 of 1 over the rounds on each side).
_MU_MAX = 40.0


@dataclasses.dataclass(frozen=True)
class GaussianDPBound:
    """What an audit's scores prove under the Gaussian-score assumption.

    Attributes:
        epsilon: The lower bound on epsilon at ``delta`` (0 when ``mu`` is not above 0).
        mu: The lower confidence bound on the GDP parameter.
        mu_estimate: The point estimate of ``mu`` on the judged half (no confidence margin);
            infinite when the judged half shows no false positive or no false negative.
        confidence: The probability with which ``mu`` (and so ``epsilon``) holds.
        rounds: Rounds used (both halves).
    """

    epsilon: float
    mu: float
    mu_estimate: float
    confidence: float
    rounds: int


def gdp_epsilon(mu: float, delta: float) -> float:
    """The epsilon of ``mu``-GDP at ``delta``: where the Gaussian mechanism of standard deviation
    ``1 / mu`` (sensitivity 1; dp-accounting's exact privacy-loss curve) has that ``delta``.
    0 for ``mu <= 0``."""
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    if mu <= 0.0:
        return 0.0
    from dp_accounting.pld import privacy_loss_mechanism

    loss = privacy_loss_mechanism.GaussianPrivacyLoss(1.0 / min(mu, _MU_MAX), sensitivity=1.0)
    if loss.get_delta_for_epsilon(0.0) <= delta:
        return 0.0
    high = 1.0
    while loss.get_delta_for_epsilon(high) > delta:
        high *= 2.0
    return float(
        optimize.brentq(lambda e: loss.get_delta_for_epsilon(e) - delta, 0.0, high, xtol=1e-9)
    )


def _mu(fpr: np.ndarray, fnr: np.ndarray) -> np.ndarray:
    """``Phi^-1(1 - FPR) - Phi^-1(FNR)``, vectorised; rates of 0 or 1 are kept off the ends."""
    tiny = 1e-300
    fpr = np.clip(fpr, tiny, 1.0 - 1e-16)
    fnr = np.clip(fnr, tiny, 1.0 - 1e-16)
    return np.asarray(stats.norm.isf(fpr) - stats.norm.ppf(fnr))


def gaussian_dp_lower_bound(
    scores: np.ndarray, included: np.ndarray, *, delta: float, confidence: float = 0.95
) -> GaussianDPBound:
    """The Gaussian-DP lower bound (module docstring) of an audit's rounds.

    Args:
        scores: One score per round, larger when the canary was in (the direction of a Dirac
            canary's coordinate; a shift family has one direction).
        included: Whether each round held the canary.
        delta: The ``delta`` the epsilon is stated at.
        confidence: The probability with which the bound holds, in (0, 1).

    Returns:
        The epsilon and ``mu`` bounds and the point estimate of ``mu``.
    """
    scores, included = checked_rounds(scores, included, confidence)
    rounds = len(scores)
    half = rounds // 2
    level = 1.0 - (1.0 - confidence) / 2.0
    threshold = _chosen_threshold(scores[:half], included[:half])
    test_scores, test_in = scores[half:], included[half:]
    m_in, m_out = int(test_in.sum()), int((~test_in).sum())
    if threshold is None or not m_in or not m_out:
        return GaussianDPBound(0.0, 0.0, math.nan, confidence, rounds)
    false_pos, false_neg = errors(test_scores, test_in, np.array([threshold]), above=True)
    mu = float(_mu(upper_rates(false_pos, m_out, level), upper_rates(false_neg, m_in, level))[0])
    # With no error of one kind the point estimate is unbounded (only the lower bound says
    # something), not the value that clipping the rate at the float limit would give.
    if false_pos[0] == 0 or false_neg[0] == 0:
        estimate = math.inf
    else:
        estimate = float(_mu(false_pos / m_out, false_neg / m_in)[0])
    mu = max(mu, 0.0)
    return GaussianDPBound(gdp_epsilon(mu, delta), mu, estimate, confidence, rounds)


def _chosen_threshold(scores: np.ndarray, included: np.ndarray) -> float | None:
    """The equal-error threshold of these (the first half's) rounds: where the false-positive
    and false-negative rates meet. For a shift family that is where ``Phi^-1`` of the two rates
    is least noisy (both near ``Phi(-mu / 2)``), and a fixed rule picks no tail that looks good by
    chance, as maximising the bound over every threshold would. None without rounds of both
    kinds."""
    n_in, n_out = int(included.sum()), int((~included).sum())
    if not n_in or not n_out:
        return None
    thresholds = candidate_thresholds(scores)
    false_pos, false_neg = errors(scores, included, thresholds, above=True)
    gap = np.abs(false_pos / n_out - false_neg / n_in)
    tied = np.flatnonzero(gap == gap.min())
    return float(thresholds[int(tied[len(tied) // 2])])
