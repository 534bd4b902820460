"""An empirical epsilon: a lower bound on a mechanism's epsilon from an audit's guesses.

An ``(epsilon, delta)``-DP mechanism limits every test that tells its two neighbours apart:
with false-positive rate ``FPR`` and false-negative rate ``FNR``,
``FPR + e^eps * FNR >= 1 - delta`` and ``FNR + e^eps * FPR >= 1 - delta`` (Kairouz, Oh and
Viswanath, "The Composition Theorem for Differential Privacy", ICML 2015). A test that does
better than that proves the mechanism's epsilon is at least

    max( log((1 - delta - FNR) / FPR), log((1 - delta - FPR) / FNR) ).

The method is the one of Jagielski, Ullman and Oprea ("Auditing Differentially Private
Machine Learning: How Private is Private SGD?", NeurIPS 2020) and Nasr et al. (USENIX
Security 2021, 2023): the audit's rounds are split in two halves; the threshold test (the score
above, or below, a threshold means "the canary was in") is chosen on the first half, and on the
second half ``FPR`` and ``FNR`` are replaced by their one-sided Clopper-Pearson upper bounds
(scipy's exact binomial interval), each at level ``1 - (1 - confidence) / 2``, so that the bound
holds with probability at least ``confidence`` (a union bound over the two). Its assumptions:
the rounds are independent draws of the mechanism, and each round's membership is the coin the
audit tossed (`leakbench.core.seeds.audit_membership`). Nothing is assumed about the shape of
the score's distribution.

With ``n`` rounds, a perfect test reaches at most `cap`: about ``log(n / (4 * ln(2 / (1 -
confidence))))``, so that a mechanism with no privacy at all shows a finite bound set by the
rounds.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from scipy import stats

# The false-positive rate at which `EpsilonBound.tpr_at_low_fpr` is read.
LOW_FPR = 0.01


@dataclasses.dataclass(frozen=True)
class EpsilonBound:
    """What an audit's scores prove.

    Attributes:
        epsilon: The lower bound on epsilon (0 when the test does no better than chance).
        confidence: The probability with which it holds.
        cap: The largest bound these rounds could show (a perfect test on the second half).
        tpr_at_low_fpr: The share of canary rounds detected at a false-positive rate of at most
            `LOW_FPR`, over all rounds (the threshold is the out-rounds' quantile).
        auroc: The area under the ROC curve of the score, over all rounds (0.5: chance).
        rounds: Rounds used (both halves).
    """

    epsilon: float
    confidence: float
    cap: float
    tpr_at_low_fpr: float
    auroc: float
    rounds: int


def upper_rates(counts: np.ndarray | int, trials: int, level: float) -> np.ndarray:
    """One-sided Clopper-Pearson upper bounds of error rates (vectorised on ``counts``): the
    ``level`` quantile of Beta(k + 1, n - k), and 1 when every trial erred."""
    k = np.asarray(counts, dtype=np.float64)
    high = stats.beta.ppf(level, k + 1.0, np.maximum(trials - k, 1e-300))
    return np.where(k >= trials, 1.0, high)


def _epsilon(fpr: np.ndarray, fnr: np.ndarray, delta: float) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        one = np.log(np.clip(1.0 - delta - fnr, 0.0, None) / fpr)
        two = np.log(np.clip(1.0 - delta - fpr, 0.0, None) / fnr)
    return np.nan_to_num(np.maximum(np.maximum(one, two), 0.0), nan=0.0, neginf=0.0)


def errors(
    scores: np.ndarray, included: np.ndarray, thresholds: np.ndarray, above: bool
) -> tuple[np.ndarray, np.ndarray]:
    """False positives and false negatives of "in when the score is above (below) t", for each
    threshold ``t`` (scores equal to ``t`` count as in)."""
    inside = np.sort(scores[included])
    outside = np.sort(scores[~included])
    if above:
        false_pos = len(outside) - np.searchsorted(outside, thresholds, side="left")
        false_neg = np.searchsorted(inside, thresholds, side="left")
    else:
        false_pos = np.searchsorted(outside, thresholds, side="right")
        false_neg = len(inside) - np.searchsorted(inside, thresholds, side="right")
    return false_pos, false_neg


def checked_rounds(
    scores: np.ndarray, included: np.ndarray, confidence: float
) -> tuple[np.ndarray, np.ndarray]:
    """An audit's rounds as float scores and boolean memberships, refused with a ValueError
    unless they are two finite vectors of one length and ``confidence`` is in (0, 1)."""
    scores = np.asarray(scores, dtype=np.float64)
    included = np.asarray(included, dtype=bool)
    if scores.shape != included.shape or scores.ndim != 1:
        raise ValueError("scores and included must be vectors of one length")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if not np.all(np.isfinite(scores)):
        raise ValueError("every score must be finite")
    return scores, included


def epsilon_lower_bound(
    scores: np.ndarray, included: np.ndarray, *, delta: float, confidence: float = 0.95
) -> EpsilonBound:
    """The epsilon lower bound (module docstring) of an audit's rounds.

    Args:
        scores: One score per round (larger or smaller when the canary was in: both tests are
            tried on the first half).
        included: Whether each round held the canary.
        delta: The ``delta`` the bound is stated at.
        confidence: The probability with which the bound holds, in (0, 1).

    Returns:
        The bound, the most these rounds could show, and the test's TPR at low FPR and AUROC.
    """
    scores, included = checked_rounds(scores, included, confidence)
    rounds = len(scores)
    half = rounds // 2
    choose, judge = slice(0, half), slice(half, rounds)
    level = 1.0 - (1.0 - confidence) / 2.0
    best = (-1.0, True, math.inf)
    pick_scores, pick_in = scores[choose], included[choose]
    n_in, n_out = int(pick_in.sum()), int((~pick_in).sum())
    if n_in and n_out:
        thresholds = candidate_thresholds(pick_scores)
        for above in (True, False):
            false_pos, false_neg = errors(pick_scores, pick_in, thresholds, above)
            found = _epsilon(
                upper_rates(false_pos, n_out, level), upper_rates(false_neg, n_in, level), delta
            )
            # Of the thresholds that do best, the middle one: the widest margin to both sides.
            tied = np.flatnonzero(found == found.max())
            i = int(tied[len(tied) // 2])
            if found[i] > best[0]:
                best = (float(found[i]), above, float(thresholds[i]))
    test_scores, test_in = scores[judge], included[judge]
    m_in, m_out = int(test_in.sum()), int((~test_in).sum())
    epsilon = 0.0
    if m_in and m_out and best[0] >= 0.0:
        false_pos, false_neg = errors(test_scores, test_in, np.array([best[2]]), best[1])
        epsilon = float(
            _epsilon(
                upper_rates(false_pos, m_out, level), upper_rates(false_neg, m_in, level), delta
            )[0]
        )
    cap = (
        float(_epsilon(upper_rates(0, m_out, level), upper_rates(0, m_in, level), delta))
        if m_in and m_out
        else 0.0
    )
    return EpsilonBound(
        epsilon=epsilon,
        confidence=confidence,
        cap=cap,
        tpr_at_low_fpr=_tpr_at(scores, included, LOW_FPR),
        auroc=_auroc(scores, included),
        rounds=rounds,
    )


def candidate_thresholds(scores: np.ndarray) -> np.ndarray:
    """The thresholds worth trying: the midpoints between consecutive distinct scores, and one
    beyond each end (a threshold at a score itself would sit on the edge of a gap)."""
    values = np.unique(scores)
    if len(values) == 1:
        return np.array([values[0] - 1.0, values[0] + 1.0])
    mids = (values[:-1] + values[1:]) / 2.0
    step = float(values[-1] - values[0])
    return np.concatenate([[values[0] - step], mids, [values[-1] + step]])


def _auroc(scores: np.ndarray, included: np.ndarray) -> float:
    """The Mann-Whitney U statistic of in-rounds over out-rounds, over their count of pairs
    (ties count a half): the probability that a canary round scores higher."""
    inside, outside = scores[included], scores[~included]
    if not len(inside) or not len(outside):
        return math.nan
    u = stats.mannwhitneyu(inside, outside, alternative="two-sided").statistic
    return float(u / (len(inside) * len(outside)))


def _tpr_at(scores: np.ndarray, included: np.ndarray, fpr: float) -> float:
    """The share of in-rounds scoring above the out-rounds' ``1 - fpr`` quantile (the larger
    score means in, the direction of a Dirac canary)."""
    inside, outside = scores[included], scores[~included]
    if not len(inside) or not len(outside):
        return math.nan
    threshold = np.quantile(outside, 1.0 - fpr, method="higher")
    return float(np.mean(inside > threshold))
